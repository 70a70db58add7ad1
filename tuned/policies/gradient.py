"""``batch_policy = "gradient"``: Netflix's Gradient2 concurrency limit with the decode
step time (TBT, what each running request waits per token) as its round-trip time.

Reproduces ``Gradient2Limit._update`` of Netflix/concurrency-limits,
``concurrency-limits-core/src/main/java/com/netflix/concurrency/limits/limit/
Gradient2Limit.java`` @ f2528defbbf080dcaf5567861faec1506bac0aa2, and its long-term
average ``limit/measurement/ExpAvgMeasurement.java`` @ 11c70606 (Apache-2.0). Per
sample the source does::

    longRtt = expavg.add(rtt)                 # mean of the first 10, then an EMA with
                                              # factor 2 / (longWindow + 1)
    if longRtt / rtt > 2: expavg *= 0.95      # recover quickly after a long overload
    if inflight < limit / 2: return limit     # app-limited: the limit is not binding
    gradient = max(0.5, min(1.0, tolerance * longRtt / rtt))
    new = limit * gradient + queueSize
    limit = clamp(limit * (1 - smoothing) + new * smoothing, minLimit, maxLimit)

with smoothing 0.2, queueSize 4, rttTolerance 1.5 and longWindow 600 by default.

Here a sample is one controller tick; "rtt" is the window's decode step time (its mean,
or its 90th percentile with ``sla_statistic = "p90"`` or ``"auto"``), "inflight" the running requests,
the limit the batch cap, bounded by ``b_min`` and ``b_max``. What differs:

* **the reference**: with a TBT SLO (``tbt_sla_s``) the gradient is ``tbt_sla_s / rtt``
  -- the SLO is the latency the operator accepts, where the source infers it as
  ``tolerance`` x the long-term average; without an SLO it is the source's
  ``tolerance * longRtt / rtt``. So the limit shrinks while the step time is over the
  SLO (by at most half per sample before smoothing) and grows by ``queue_size`` x
  ``smoothing`` per tick while under it: at equilibrium ``1 - gradient =
  queue_size / limit``, a step time a few percent over the reference at large caps;
  with ``token_budget_policy = "sla"`` tuned's token budget sizes prefill chunks for
  the SLO beside it;
* **app-limited holds only a rise**: the source returns the limit unchanged whenever
  fewer than half of it are in flight; its comment says the intent is not to *grow*
  it then. An engine whose cap starts at ``b_max`` may run well under half of it while
  the step time is already over the SLO, and holding then would never lower the cap:
  so a fall applies, a rise waits for the limit to bind;
* **no step in the window** (idle, start-up): the limit is held, nothing is sampled.
"""

from __future__ import annotations

from typing import Any

from tuned.core.types import Decision, Observation

#: the source's ExpAvgMeasurement(longWindow, 10): samples averaged before the EMA starts
WARMUP_SAMPLES = 10


class GradientLimit:
    """Gradient2's limit on TBT samples; :meth:`decide` runs once per controller tick."""

    wants_active = False

    def __init__(self, *, min_limit: int, max_limit: int, ceiling: int,
                 max_num_batched_tokens: int, reference_s: float = 0.0,
                 statistic: str = "mean", smoothing: float = 0.2, queue_size: int = 4,
                 tolerance: float = 1.5, long_window: int = 600,
                 initial_limit: int = 0) -> None:
        self.min_limit, self.max_limit = min_limit, max(max_limit, min_limit)
        self.ceiling = ceiling
        self.max_num_batched_tokens = max_num_batched_tokens
        self.reference_s = reference_s
        self.statistic = statistic
        self.smoothing = smoothing
        self.queue_size = queue_size
        self.tolerance = tolerance
        self.factor = 2.0 / (long_window + 1)
        start = initial_limit or self.max_limit
        self.limit = float(min(max(start, self.min_limit), self.max_limit))
        self.long_s = 0.0
        self._count = 0
        self._sum = 0.0

    def _long(self, rtt: float) -> float:
        """The source's ExpAvgMeasurement.add."""
        if self._count < WARMUP_SAMPLES:
            self._count += 1
            self._sum += rtt
            self.long_s = self._sum / self._count
        else:
            self.long_s = self.long_s * (1 - self.factor) + rtt * self.factor
        return self.long_s

    def update(self, rtt: float | None, inflight: int) -> tuple[float, str, dict]:
        """One sample: the new limit, the reason and what it was computed from."""
        if rtt is None or rtt <= 0:
            return self.limit, "gradient_no_data", {}
        long_s = self._long(rtt)
        if long_s / rtt > 2:
            self.long_s = long_s * 0.95
        reference = self.reference_s or self.tolerance * long_s
        gradient = max(0.5, min(1.0, reference / rtt))
        seen = {"rtt_s": rtt, "long_s": round(long_s, 9), "reference_s": round(reference, 9),
                "gradient": round(gradient, 6)}
        new = self.limit * gradient + self.queue_size
        new = self.limit * (1 - self.smoothing) + new * self.smoothing
        new = max(self.min_limit, min(self.max_limit, new))
        if inflight < self.limit / 2 and new >= self.limit:
            return self.limit, "gradient_app_limited", seen
        self.limit = new
        return self.limit, "gradient_down" if gradient < 1.0 else "gradient_up", seen

    def decide(self, obs: Observation) -> Decision:
        # "auto" is the p90 here: this policy has no token budget to tell it apart
        rtt = obs.tbt_p90_s if self.statistic in ("p90", "auto") else obs.tbt_mean_s
        limit, reason, seen = self.update(rtt, obs.num_running)
        cap = min(max(int(limit), self.min_limit), self.ceiling)
        return Decision(target=cap, lower=self.min_limit, upper=self.max_limit, cap=cap,
                        batch=min(max(cap, obs.num_running), self.ceiling),
                        token_budget=self.max_num_batched_tokens, reason=reason,
                        inputs={"running": obs.num_running, "waiting": obs.num_waiting,
                                "limit": round(limit, 3), "queue_size": self.queue_size,
                                **seen})


def build(cfg: Any, *, ceiling: int, max_num_batched_tokens: int, options: dict,
          **_: Any) -> GradientLimit:
    return GradientLimit(min_limit=cfg.b_min, max_limit=min(cfg.effective_b_max, ceiling),
                         ceiling=ceiling, max_num_batched_tokens=max_num_batched_tokens,
                         reference_s=cfg.tbt_sla_s if cfg.sla_enabled else 0.0,
                         statistic=cfg.sla_statistic, **options)


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "gradient", "kind": "batch", "build": "build", "order": 45,
    "summary": "Netflix's Gradient2 limit on the decode step time",
    "options": {
        "smoothing": {"type": "float", "default": 0.2, "lo": 0.0, "hi": 1.0,
                      "lo_open": True, "doc": "share of each new estimate taken (1 = all)"},
        "queue_size": {"type": "int", "default": 4, "lo": 0, "hi": 4096,
                       "doc": "headroom added to each estimate: how fast the cap grows "
                              "while the step time is under the reference"},
        "tolerance": {"type": "float", "default": 1.5, "lo": 1.0, "hi": 100.0,
                      "doc": "without tbt_sla_s: the step time accepted, as a multiple of "
                             "its long-term average"},
        "long_window": {"type": "int", "default": 600, "lo": 1, "hi": 1000000,
                        "doc": "ticks the long-term average spans (its EMA factor is "
                               "2 / (long_window + 1))"},
        "initial_limit": {"type": "int", "default": 0, "lo": 0, "hi": 4096,
                          "doc": "the cap at start (0 = b_max)"},
    },
    "reasons": {
        "gradient_down": "batch_policy = gradient: the step time is over the reference "
                         "(tbt_sla_s, else tolerance x its long-term average): the cap "
                         "shrinks by the gradient, smoothed",
        "gradient_up": "batch_policy = gradient: the step time is within the reference: "
                       "the cap grows by queue_size, smoothed",
        "gradient_app_limited": "batch_policy = gradient: fewer than half the cap are "
                                "running: a rise waits until the cap binds",
        "gradient_no_data": "batch_policy = gradient: no decode step in the window: the "
                            "cap is held",
    },
    "bench": [
        {"name": "gradient2", "kind": "peer",
         "config": {"batch_policy": "gradient", "queue_policy": "fcfs",
                    "queue_options": {}}},
        {"name": "tuned-gradient", "kind": "tuned", "config": {"batch_policy": "gradient"}},
    ],
}
