"""Batch-size decisions from Pang et al. (Pang, Li, Wang: *Optimizing LLM Inference
Throughput via Memory-aware and SLA-constrained Dynamic Batching*).

One module, past the usual size, because it is one published algorithm (Pang et
al.'s Algorithms 1 and 2 and their combination), as the style asks.

Pure functions and small state holders: no vLLM, NVML or threads. The controller
feeds them an :class:`Observation` and gets back a :class:`Decision` carrying the
target, its bounds and the reason.

* :class:`MemoryBound` is Algorithm 1 (memory-constrained dynamic batching).
* :class:`SlaBound` is Algorithm 2 (SLA-constrained dynamic batching).
* :class:`BatchPolicy` combines them as the paper does, b* = min(b_mem, b_SLA),
  clamped to [B_min, ceiling]; the batch size it reports, b_t, is never below the
  running decodes (Alg. 1 line 6, Alg. 2 line 15).
* The per-step token budget (the paper's adaptive chunk size under PD fusion) is
  a wrapper around any batch policy: :class:`tuned.policies.budget.TokenBudget`.

Where continuous batching differs from the paper's model (noted per class): the
paper reasons about a batch of b requests each holding l_in + l_out tokens for its
whole life; vLLM admits and retires requests every step, so a running request holds
only l_in + (tokens so far), and the b running at once are at different points of
their lives. The full l_in + l_out per request is conservative by about l_out/2 per
request, more so with a CPU engine's 128-token blocks, so by default the demand the CLT bound sums is
the blocks a request holds at a random decode step (``memory_demand =
"occupancy"``, :func:`tuned.core.window.occupancy_moments`); ``"lifetime"`` keeps
the paper's rule (the paper runs use it).

The floor b_t >= N^d exists in the paper so that a smaller batch never evicts a
running request. vLLM's admission gate (``max_num_active_reqs``) never evicts: a
gate below the running count only stops admissions until requests finish. And vLLM
admits at every step, so between two controller ticks finished requests are
replaced at once; a gate floored at the running count would therefore stay pinned
at its old value under sustained load and the SLA bound could never lower it. So
the floor is kept where it belongs, in the batch size b_t the decision reports
(``Decision.batch``), and the gate the scheduler applies is the un-floored
b* (``Decision.cap``): running requests drain to it, none is preempted.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from tuned.core.types import Decision, Observation, StepModel
from tuned.policies.catalog import SLA_STATISTICS


def clt_theta(eps_m: float) -> float:
    """theta = Phi^-1(1 - eps_M), the one-sided normal quantile (Pang et al., eq. 12)."""
    if not 0.0 < eps_m < 1.0:
        raise ValueError(f"eps_m must be in (0, 1), got {eps_m}")
    return NormalDist().inv_cdf(1.0 - eps_m)


def memory_batch_limit(n_tokens: float, mean: float, std: float, theta: float) -> tuple[int, float]:
    """Largest b with b*mu + theta*sqrt(b)*sigma <= n, and the safety buffer L0.

    Pang et al. eqs. (8)-(14): S = sum of b i.i.d. demands, mu_S = b*mu,
    sigma_S = sqrt(b)*sigma; P(S > n) <= eps_M under the CLT gives
        sqrt(b) = (-theta*sigma + sqrt(theta^2 sigma^2 + 4 mu n)) / (2 mu)   (12)
    and the buffer L0 = theta*sigma_S at that b, so that Algorithm 1 line 5 reads
        b = floor((n - L0) / (E[l_in] + E[l_out])).                         (14)
    For theta*sigma > 0, L0 comes from (12) in its rationalised form
        L0 = theta*sigma*sqrt(b) = 2n / (1 + sqrt(theta^2 sigma^2 + 4 mu n) / (theta*sigma)),
    which neither goes negative by cancellation nor overflows when theta*sigma dwarfs
    mu*n (then L0 -> n and b -> 0). Non-finite inputs, mean <= 0 and sigma < 0 raise
    ``ValueError``.
    """
    for name, v in (("n_tokens", n_tokens), ("mean demand", mean), ("demand std", std),
                    ("theta", theta)):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    if mean <= 0:
        raise ValueError(f"mean demand must be > 0, got {mean}")
    if std < 0:
        raise ValueError(f"demand std must be >= 0, got {std}")
    if n_tokens <= 0:
        return 0, 0.0
    ts = theta * std
    if math.isinf(ts):
        if ts < 0:
            raise ValueError(f"theta * demand std must be finite, got {theta} * {std}")
        return 0, float(n_tokens)  # sigma beyond float range: no batch is safe
    disc = math.hypot(ts, 2.0 * math.sqrt(mean) * math.sqrt(n_tokens))  # no overflow
    if ts > 0:
        l0 = 2.0 * n_tokens / (1.0 + disc / ts)
    elif ts == 0:
        l0 = 0.0
    else:  # theta < 0 (eps_M > 0.5): the buffer is a bonus; no cancellation here
        l0 = ts * (disc - ts) / (2.0 * mean)
    # 1e-9 guards the floor against the float error of the round trip through (12);
    # a quotient beyond float range (mean near 0) is capped, the caller caps b anyway.
    q = min((n_tokens - l0) / mean + 1e-9, sys.float_info.max)
    return max(0, math.floor(q)), l0


def _usable_demand(obs: Observation) -> bool:
    """A demand estimate Algorithm 1 can use: finite mean > 0, finite std >= 0 (or none)."""
    mean, std = obs.demand_mean, obs.demand_std
    return (mean is not None and math.isfinite(mean) and mean > 0
            and (std is None or (math.isfinite(std) and std >= 0)))


class MemoryBound:
    """Pang et al., Algorithm 1: memory-constrained dynamic batching.

    State: the previous batch size b_{t-1} (starts at B_max, what static batching
    would run). Each tick, only when requests are both waiting (N^p > 0) and running
    (N^d > 0), b_t = floor((n - L0) / (E[l_in] + E[l_out])); otherwise b_t = b_{t-1}.
    Line 6, b_t = min(max(b_t, N^d), B_max), is applied by :class:`BatchPolicy` to the
    reported batch size; the bound returned (and kept as b_{t-1}) is capped at B_max
    only (see the module docstring for why the floor must not reach vLLM's gate).

    Units are KV blocks, as the paper suggests for vLLM ("our algorithm can be
    implemented using blocks rather than relying on the number of tokens"): n is
    the blocks the cache holds for requests, and a request's demand is counted in
    whole blocks, what vLLM's paged allocator actually gives it: ceil((l_in + t) /
    block_size) at a random decode step t by default, ceil((l_in + l_out) /
    block_size) with ``memory_demand = "lifetime"`` (the controller computes the
    moments, :func:`tuned.core.window.occupancy_moments`).
    With 16-token GPU blocks this is close to the token count; with the CPU
    build's 128-token blocks a token count would over-admit several-fold. Until
    ``min_samples`` requests have finished there is no demand estimate and the bound
    stays at its previous value (reason ``memory_no_data``); so it does while the
    estimate is unusable (a non-finite or non-positive mean, a non-finite or negative
    standard deviation).
    """

    def __init__(self, eps_m: float, b_max: int, min_samples: int = 8):
        self.theta = clt_theta(eps_m)
        self.b_max = b_max
        self.min_samples = min_samples
        self.prev = b_max
        self.last_l0 = 0.0

    def update(self, obs: Observation) -> tuple[int, str]:
        if obs.demand_samples < self.min_samples or not _usable_demand(obs):
            reason = "memory_no_data"
            b = self.prev
        elif obs.num_waiting > 0 and obs.num_running > 0:
            b, self.last_l0 = memory_batch_limit(
                obs.kv_capacity_blocks, obs.demand_mean, obs.demand_std or 0.0, self.theta)
            reason = "memory"
        else:
            reason = "hold_no_queue"
            b = self.prev
        b = min(b, self.b_max)
        self.prev = b
        return b, reason


class SlaBound:
    """Pang et al., Algorithm 2: SLA-constrained dynamic batching (TBT binary search).

    Keeps a search interval [b_low, b_high] within [B_min, B_max]. Each tick, with
    T the recent mean decode latency and b-bar the recent mean decode batch:
      T > D_SLA + eps_D:  b_high <- max(b-bar, b_low + alpha); b_low <- max(b_low - delta, B_min)
      T < D_SLA - eps_D:  b_low <- min(b-bar, b_high - alpha); b_high <- min(b_high + delta, B_max)
      otherwise:          b_high <- min(b-bar + ceil(alpha/2), B_max); b_low <- max(b-bar - floor(alpha/2), B_min)
      b_t = floor((b_low + b_high) / 2)
    Line 15's b_t = min(max(b_t, N^d), B_max) is applied by :class:`BatchPolicy` to
    the reported batch size, not to the admission gate (module docstring). b-bar is
    rounded to the nearest integer (the paper treats it as one). The paper
    leaves implicit that the interval stays inside [B_min, B_max] and ordered; we
    clamp both ends so, which changes nothing when the paper's updates already hold.
    With no decode step in the window (idle engine), or a non-finite T or b-bar, the
    interval is kept (reason ``initial``).
    """

    def __init__(self, sla_s: float, eps_s: float, alpha: int, delta: int,
                 b_min: int, b_max: int):
        self.sla_s = sla_s
        self.eps_s = eps_s
        self.alpha = alpha
        self.delta = delta
        self.b_min = b_min
        self.b_max = b_max
        self.low = b_min
        self.high = b_max
        self.statistic = "mean"     # the paper holds the mean decode step to D_SLA
        self.margin: AttainmentMargin | None = None   # a learnt margin (attainment)

    @property
    def held(self) -> str:
        """The statistic held this tick (the decision's ``sla_statistic``)."""
        return self.statistic

    @property
    def setpoint_s(self) -> float:
        """What the measured statistic is held to: D_SLA, or the learnt margin x D_SLA."""
        return self.margin.setpoint_s if self.margin is not None else self.sla_s

    def warm_start(self, b: int) -> None:
        """Centre the interval on a prediction (e.g. a profile's b for the SLA)."""
        b = min(max(b, self.b_min), self.b_max)
        self.low = self.high = b

    def update(self, obs: Observation) -> tuple[int, str]:
        t, bbar = obs.tbt_mean_s, obs.decode_batch_mean
        # a NaN or infinite mean (a broken clock, an empty window divided) is no
        # measurement: keep the interval, as with an idle engine
        if t is None or bbar is None or not (math.isfinite(t) and math.isfinite(bbar)):
            reason = "initial"
        else:
            bb = int(math.floor(bbar + 0.5))
            if t > self.sla_s + self.eps_s:
                reason = self._fall(bb)
            elif t < self.sla_s - self.eps_s:
                self.low = min(bb, self.high - self.alpha)
                self.high = min(self.high + self.delta, self.b_max)
                reason = "sla_under"
            else:
                reason = self._narrow(bb)
        return self._midpoint(), reason

    # the paper's branches, shared with EvidenceSlaBound
    def _fall(self, bb: int) -> str:
        self.high = max(bb, self.low + self.alpha)
        self.low = max(self.low - self.delta, self.b_min)
        return "sla_over"

    def _hold_interval(self, bb: int) -> tuple[int, int]:
        """The paper's hold interval around b-bar: [b-bar - floor(alpha/2),
        b-bar + ceil(alpha/2)], unclamped."""
        return bb - self.alpha // 2, bb + math.ceil(self.alpha / 2)

    def _narrow(self, bb: int) -> str:
        low, high = self._hold_interval(bb)
        self.high = min(high, self.b_max)
        self.low = max(low, self.b_min)
        return "sla_hold"

    def _midpoint(self) -> int:
        """Clamp the interval into [B_min, B_max], ordered; its midpoint b_t."""
        self.low = min(max(self.low, self.b_min), self.b_max)
        self.high = min(max(self.high, self.low), self.b_max)
        return (self.low + self.high) // 2


#: the margin's change per finished request, as a share of the SLA: a request over the
#: SLO lowers it by this times the target, one within raises it by this times the rest
ATTAINMENT_STEP = 0.01
#: the margin's range: never above the SLO itself (then it is the mean's setpoint),
#: never below half of it
ATTAINMENT_MARGIN_RANGE = (0.5, 1.0)
#: finished requests the decision's share within the SLO is reported over
ATTAINMENT_RECENT = 100


class AttainmentMargin:
    """The margin m below the TPOT SLO at which the SLA search holds the mean decode
    step (``sla_statistic = "attainment"``): the setpoint is m x D_SLA, with m learnt
    online from finished requests' TPOT against D_SLA.

    The SLO judges each request's TPOT, and a request's TPOT is about the mean of the
    steps it decoded in; holding the mean step at D_SLA leaves about half the
    requests just over it. Each finished request's TPOT t moves m by a stochastic
    approximation of a quantile (Robbins-Monro):

        m <- m - step * (1[t > D_SLA] - (1 - q))

    with q the target share within the SLO (``sla_attainment_target``): a request
    over the SLO lowers m by step * q, one within raises it by step * (1 - q), so m
    settles where the share over is 1 - q. m stays in ``[lo, hi]``; ``hi`` = 1 makes
    the setpoint never looser than the mean's. Whatever spreads requests' TPOT around
    the mean step (prefill chunks beside them, the engine's time between steps that
    the step ring does not see, a host that drifts) is in what it learns from.

    It learns only from requests that decoded mostly at a binding cap (the
    controller filters :attr:`Observation.finished_tpot_s` so): under a cap that does
    not bind the batch is the offered load, or that of a cap the search has since
    left, and a request's TPOT says nothing of the setpoint (under a light load every
    request is within, and m would climb on no evidence; after a burst every request
    that decoded before the cap fell is over, and m would fall for the search's
    transient, not its setpoint).
    """

    def __init__(self, sla_s: float, target: float, *, step: float = ATTAINMENT_STEP,
                 lo: float = ATTAINMENT_MARGIN_RANGE[0],
                 hi: float = ATTAINMENT_MARGIN_RANGE[1]) -> None:
        if not 0.0 < target < 1.0:
            raise ValueError(f"target: must be in (0, 1), got {target!r}")
        if not 0.0 < lo <= hi:
            raise ValueError(f"margin range: must be 0 < lo <= hi, got [{lo!r}, {hi!r}]")
        self.sla_s, self.target, self.step, self.lo, self.hi = sla_s, target, step, lo, hi
        self.margin = hi
        self.learnt = 0                  # finished requests it has learnt from
        self._recent: list[bool] = []    # the last ATTAINMENT_RECENT outcomes (True: within)

    @property
    def setpoint_s(self) -> float:
        return self.margin * self.sla_s

    def learn(self, tpots: Sequence[float]) -> None:
        """Each finished request's TPOT, in order; non-finite ones are skipped."""
        m = self.margin
        for t in tpots:
            if not math.isfinite(t):
                continue
            over = t > self.sla_s
            m = min(max(m - self.step * ((1.0 if over else 0.0) - (1.0 - self.target)),
                        self.lo), self.hi)
            self.learnt += 1
            self._recent.append(not over)
        del self._recent[:-ATTAINMENT_RECENT]
        self.margin = m

    def inputs(self) -> dict:
        """What the decision says of it."""
        r = self._recent
        return {"sla_margin": round(self.margin, 4),
                "sla_attainment_target": self.target,
                "tpot_within_share": round(sum(r) / len(r), 4) if r else None,
                "tpot_samples": self.learnt}


class EvidenceSlaBound(SlaBound):
    """Algorithm 2 where its assumptions hold in a continuous-batching engine
    (``sla_mode = "evidence"``, the default; ``"paper"`` is :class:`SlaBound`).

    The paper reads the mean decode batch b-bar as the batch the system would run:
    true in its offline setting, where requests always wait. Under continuous
    batching b-bar is the *offered load* whenever nothing waits, so narrowing the
    interval around it (the hold branch) or raising the low end to it (the under
    branch) drags the cap down to the load of a quiet moment, from where it climbs
    back by delta per tick when the load returns. Here the interval moves only on
    evidence:

    * over the SLA (T > D_SLA + eps_D): the high end falls as in the paper, unless
      the decode-only steps meet the SLA (T_decode <= D_SLA - eps_D; measured, or
      predicted by the online step model when every step carried prefill) and the
      token budget is controlled: then prefill chunks, not the batch, caused the
      violation and the token budget is the knob (reason ``sla_over_prefill``,
      interval kept). ``budget_controlled`` is set by :class:`BatchPolicy` each tick
      from what its :class:`~tuned.policies.budget.TokenBudget` wrapper says:
      off where no chunk size can hold the SLA (a CPU host), since the budget is the
      full one there and acts on nothing, so the cap falls: fewer prompts per step,
      fewer decodes exposed to each prefill;
    * a fall from a cap that was not binding halves it (high <- max(b-bar, low +
      alpha, cap / 2)) rather than dropping the high end to b-bar: with nothing
      waiting at the cap b-bar is the offered load, not what the engine can run (the
      argument of the next point), and a window that long prompts pushed over the SLA
      at three decodes would set a cap of 16 to 2, where requests then queue past
      their TTFT while the search climbs back;
    * a fall that prefill caused where the budget could not act (the decode-only
      steps met the SLA, as for ``sla_over_prefill``) is undone once the prefill has
      left the window: when what prefill added to the mean step (the window's mean
      step less its decode-only mean) is at most half what it added at the fall, and
      T is under the SLA, the interval goes back to what it was before the fall
      (reason ``sla_restore``). The fall answered a load of long prompts, not the
      decodes; without the undo the cap stays where the prompts left it, and the
      chat load that follows them queues while the search climbs back by a quarter
      per binding tick. A fall the decodes caused drops the undo;
    * after a fall, ``settle_ticks`` ticks pass before the next one (reason
      ``sla_over_settling``, interval kept): the window still holds the steps that
      caused the fall, and a tick every ``interval_s`` over a ``tbt_window_s``
      window would otherwise answer one slow window several times over (the
      registry sets it to the window's length in ticks, less the tick of the fall);
    * under or within the SLA: the paper's update only on ticks where the cap was
      binding (requests waited while the cap was full for at least ``bind_share``
      of the window's steps, or wait at a full cap now); otherwise the interval is
      kept (``sla_idle``); the under branch raises the low end to b-bar, never
      lowers it;
    * under the SLA while binding, once the low end has reached the top of the
      interval (high - low <= 2 alpha + 1), the high end grows by max(delta, high / 4)
      (``sla_expand``) instead of delta: the paper's delta = 1 per tick is a noise
      correction, too slow to follow a load that doubled.

    ``statistic`` picks T: the mean step time of decode steps (the paper's), their
    90th percentile (``p90``), which holds most requests' TPOT, not only the average,
    the mean held to a margin below D_SLA learnt from finished requests' TPOT
    (``attainment``, :class:`AttainmentMargin`, aiming at ``attainment_target`` of
    them within the SLO), or ``decode_p90``: the 90th percentile of the decode steps
    that carried no prefill plus the window's mean step less their mean (what prefill
    added per step). Where a prefilling step takes several decode steps' time (a CPU
    host), the plain p90 reads a prefill step once more than a tenth of the steps
    prefill and the cap swings; a request's TPOT spreads the prefill over its steps,
    as ``decode_p90`` does. With ``decode_p90`` the decode-only steps' p90 (not their
    mean) also decides whether prefill caused a violation. ``auto`` (the default) is
    ``p90`` on ticks where the token budget acts and ``decode_p90`` where it does not
    (:attr:`held`, in the decision's ``sla_statistic``). The SLA itself stays what
    feasibility is judged against.
    The warm start seeds the midpoint and keeps an interval of width max(alpha, b)
    around it, so a wrong prediction is corrected by bisection, not by delta per tick.
    """

    def __init__(self, sla_s: float, eps_s: float, alpha: int, delta: int, b_min: int,
                 b_max: int, *, statistic: str = "mean", bind_share: float = 0.5,
                 budget_controlled: bool = True, settle_ticks: int = 0,
                 attainment_target: float = 0.9) -> None:
        super().__init__(sla_s, eps_s, alpha, delta, b_min, b_max)
        if statistic not in SLA_STATISTICS:
            raise ValueError(f"statistic: must be one of {', '.join(SLA_STATISTICS)}, "
                             f"got {statistic!r}")
        if settle_ticks < 0:
            raise ValueError(f"settle_ticks: must be >= 0, got {settle_ticks!r}")
        self.statistic = statistic
        self.bind_share = bind_share
        self.budget_controlled = budget_controlled
        self.settle_ticks = settle_ticks
        self.settling = 0       # ticks left before another fall may follow the last one
        # the interval before a prefill-caused fall, and what prefill added to the mean
        # step then (sla_restore), or None
        self.undo: tuple[int, int, float] | None = None
        self.margin = (AttainmentMargin(sla_s, attainment_target)
                       if statistic == "attainment" else None)

    def warm_start(self, b: int) -> None:
        b = min(max(b, self.b_min), self.b_max)
        w = max(self.alpha, b // 2)
        self.low = max(self.b_min, b - w)
        self.high = min(self.b_max, b + w)

    @property
    def held(self) -> str:
        """The statistic held this tick: ``auto`` is ``p90`` while the token budget
        sizes prefill chunks for the SLA (a prefilling step is then within it, and the
        p90 may read one) and ``decode_p90`` while it does not (the full budget on a
        line, a CPU host: a prefilling step is several decode steps' time, which a
        request's TPOT spreads over its steps and the p90 reads whole once a tenth of
        the steps prefill)."""
        if self.statistic == "auto":
            return "p90" if self.budget_controlled else "decode_p90"
        return self.statistic

    def measured(self, obs: Observation) -> float | None:
        held = self.held
        if held == "decode_p90" and obs.decode_only_p90_s is not None \
                and obs.decode_only_tbt_s is not None and obs.tbt_mean_s is not None:
            t = obs.decode_only_p90_s + obs.tbt_mean_s - obs.decode_only_tbt_s
        else:
            t = obs.tbt_p90_s if held == "p90" else obs.tbt_mean_s
        return t if t is not None and math.isfinite(t) else None

    def learn_lifted(self, obs: Observation) -> None:
        """While a late queue holds the cap lifted (and until the window has turned
        over), the search does not answer the window, but it keeps what the window
        proves: the lifted batch ran at b-bar and took T. Within the setpoint, b-bar
        holds the SLA, so the low end rises to it (and the high end stays above it by
        alpha); inside the band (within eps_D of the setpoint) the interval rises to
        the paper's hold interval around b-bar. Only upward: the drain after a lift
        (b-bar falling to the old cap) cannot drag the interval down, and a window
        over the SLA is left to the search once the hold ends (the paper's fall to
        b-bar from a lifted window halves the cap while the queue is late: on the
        simulator's h100-llama2-70b Azure row it took the cap from the memory bound's
        290 to 21). Without this the search comes back from every lift to the
        interval it had before it, the queue is late again within a second and the
        cap cycles between the two."""
        t, bbar = self.measured(obs), obs.decode_batch_mean
        if t is None or bbar is None or not math.isfinite(bbar):
            return
        bb = min(max(int(math.floor(bbar + 0.5)), self.b_min), self.b_max)
        setpoint = self.setpoint_s
        if t <= setpoint + self.eps_s:
            # within: b-bar holds the SLA (the paper's under branch, low <- b-bar); in
            # the band: b-bar is at it (its hold branch, the interval around b-bar)
            low, high = ((bb, bb + self.alpha) if t < setpoint - self.eps_s
                         else self._hold_interval(bb))
            if low > self.low:
                self.low = low
                self.high = max(self.high, high)
        self._midpoint()

    def update(self, obs: Observation) -> tuple[int, str]:
        # binding over the window, or now: requests wait at a full cap (a queue that
        # formed since the last tick reaches bind_share of the window's steps only a
        # window later, and the decision already says the cap binds)
        cap = (self.low + self.high) // 2     # the cap the search set last tick
        binding = obs.binding >= self.bind_share or obs.waits_at_full(cap)
        if self.margin is not None:
            self.margin.learn(obs.finished_tpot_s)
        t, bbar = self.measured(obs), obs.decode_batch_mean
        if t is None or bbar is None or not math.isfinite(bbar):
            return cap, "initial"
        bb = int(math.floor(bbar + 0.5))
        setpoint = self.setpoint_s
        settling, self.settling = self.settling, max(self.settling - 1, 0)
        added = _prefill_added(obs)
        if (self.undo is not None and not settling and t < setpoint - self.eps_s
                and added is not None and added <= self.undo[2] / 2):
            # the prompts that caused the fall have left the window: undo it, up to
            # the batch the online step model puts within the setpoint (at the
            # window's measured excess over it): a high end the search never tested
            # (the first interval's b_max, carried from restore to restore) is not
            # evidence, and back there the memory bound sets the cap while the
            # running requests grow past the SLO for a window before the next fall
            # (without a model lift_target is b_max: the interval before the fall)
            high = min(self.undo[1], lift_target(obs, obs.step_model, setpoint, self.b_max))
            self.high = max(self.high, high)
            self.low = min(max(self.low, self.undo[0]), self.high)
            self.undo = None
            return self._midpoint(), "sla_restore"
        if t > setpoint + self.eps_s:
            dec = obs.decode_only_tbt_s
            if self.held == "decode_p90" and obs.decode_only_p90_s is not None:
                dec = obs.decode_only_p90_s
            if dec is None and obs.step_model is not None:
                # every step carried prefill: what would the decodes alone take?
                dec = obs.step_model.predict_step_s(bbar, 0.0, obs.kv_tokens_resident)
            prefill_caused = dec is not None and dec <= setpoint - self.eps_s
            if self.budget_controlled and prefill_caused:
                reason = "sla_over_prefill"
            elif settling:
                reason = "sla_over_settling"
            else:
                if not prefill_caused:
                    self.undo = None
                else:
                    # every step prefilled (no decode-only mean): against the decodes'
                    # predicted step
                    was = added if added is not None else max(t - dec, 0.0)
                    # a second fall in the same episode undoes to before the first
                    self.undo = ((self.low, self.high, was) if self.undo is None
                                 else (*self.undo[:2], max(self.undo[2], was)))
                if binding:
                    reason = self._fall(bb)
                else:   # b-bar is the offered load: halve the cap instead
                    reason = self._fall(max(bb, cap // 2))
                self.settling = self.settle_ticks
        elif not binding:
            reason = "sla_idle"
        elif t < setpoint - self.eps_s:
            # b-bar held the SLA; a low end already above it stays (binding only now,
            # b-bar is the window's mean over steps before the queue formed)
            self.low = max(self.low, min(bb, self.high - self.alpha))
            if self.high - self.low <= 2 * self.alpha + 1:
                self.high = min(self.high + max(self.delta, math.ceil(self.high / 4)),
                                self.b_max)
                reason = "sla_expand"
            else:
                self.high = min(self.high + self.delta, self.b_max)
                reason = "sla_under"
        else:
            reason = self._narrow(bb)
        return self._midpoint(), reason


def _prefill_added(obs: Observation) -> float | None:
    """What prefill added to the window's mean step: its mean step less the mean of
    its decode-only steps (None without both)."""
    if obs.tbt_mean_s is None or obs.decode_only_tbt_s is None:
        return None
    added = obs.tbt_mean_s - obs.decode_only_tbt_s
    return max(added, 0.0) if math.isfinite(added) else None


class Feasibility:
    """Is the TBT SLA reachable at all? (``tuned_sla_feasible``, reason
    ``sla_infeasible``.)

    Infeasible when the step model (online fit, else the profile) predicts that even
    b_min decodes with no prefill exceed D_SLA at the current context, or when the
    decode-only steps measured at the lowest batches tried (b-bar <= b_min + alpha),
    brought down to b_min (x T(b_min) / T(b-bar) on the step model, x b_min / b-bar,
    a lower bound, without one), exceed D_SLA + eps_D on ``patience`` consecutive
    ticks (the controller's: more than one TBT window's worth of ticks,
    :func:`tuned.control.controller.feasibility_patience`, so that one slow window read by
    several ticks is not enough). An infeasible SLA is reported, not obeyed into the
    ground: the SLA bound steps aside (the memory bound decides, the token budget is
    the full one), which maximises throughput where no request can meet its TPOT
    anyway. Feasible again once the model predicts b_min within D_SLA - eps_D.
    """

    def __init__(self, sla_s: float, eps_s: float, b_min: int, alpha: int,
                 patience: int = 3) -> None:
        self.sla_s, self.eps_s, self.b_min, self.alpha = sla_s, eps_s, b_min, alpha
        self.patience = patience
        self.feasible = True
        self._strikes = 0
        self.why = ""

    def update(self, obs: Observation, model) -> bool:
        kv_seq = obs.kv_tokens_resident / obs.num_running if obs.num_running else 0.0
        t_min = (model.predict_step_s(self.b_min, 0.0, self.b_min * kv_seq)
                 if model is not None else None)
        dec, bbar = obs.decode_only_tbt_s, obs.decode_batch_mean
        low = dec is not None and bbar is not None and bbar <= self.b_min + self.alpha
        if low and bbar > self.b_min:
            # the step measured at b-bar, brought down to b_min: along the model's shape
            # (the measurement carries the host's speed, the model only the ratio), or
            # without a model by b_min / b-bar, a lower bound (a step's fixed cost does
            # not shrink with the batch). An SLA that binds at batch 3 on a host 10 %
            # slower than its profile is missed at b-bar = 2.8 and still met at b_min:
            # judged at b-bar it was set aside and the cap went to the memory bound
            t_bbar = (model.predict_step_s(bbar, 0.0, bbar * kv_seq)
                      if model is not None else 0.0)
            dec *= t_min / t_bbar if t_bbar > 0 else self.b_min / bbar
        if low and dec > self.sla_s + self.eps_s:
            self._strikes += 1
        elif low:
            self._strikes = 0
        if self.feasible:
            if t_min is not None and t_min > self.sla_s:
                self.feasible = False
                self.why = (f"predicted step at b_min={self.b_min} without prefill is "
                            f"{t_min * 1e3:.1f} ms > SLA {self.sla_s * 1e3:.1f} ms")
            elif self._strikes >= self.patience:
                self.feasible = False
                self._strikes = 0
                self.why = (f"measured decode steps at batch {bbar:.1f} take "
                            f"{obs.decode_only_tbt_s * 1e3:.1f} ms, "
                            f"{dec * 1e3:.1f} ms at b_min={self.b_min} > "
                            f"SLA {self.sla_s * 1e3:.1f} ms")
        elif t_min is not None and t_min < self.sla_s - self.eps_s and self._strikes == 0:
            self.feasible = True
            self.why = ""
        return self.feasible


def lift_target(obs: Observation, model: StepModel | None, sla_s: float, b_mem: int) -> int:
    """The cap a late queue lifts to with ``late_queue = "lift_tpot"``, the default:
    the largest batch whose mean step the step model puts within the TPOT SLO, at the
    running requests' context and with the window's measured excess over the model's
    decode-only step (the prefill the steps carried, a host slower than the fit) taken
    off the SLO; never above the memory bound. :class:`EvidenceSlaBound` also stops a
    restore here, at its setpoint and with ``b_max`` for the memory bound.

    A request whose first token is already late is lost to goodput whatever the cap;
    lifting past this batch to drain the queue faster makes every request decoding
    meanwhile miss its TPOT as well. Up to it the queue drains as fast as the running
    requests' TPOT allows, so slower than at the memory bound (``lift``): the TTFT
    tail and the throughput may pay. It is the default because on the real engine's
    three-phase load its margin over the best static cap stood above the host's
    noise, and the simulator's rows do not move with it. Without a model
    or a measured window the lift is to the memory bound, as with ``lift``."""
    if (model is None or obs.tbt_mean_s is None
            or obs.decode_batch_mean is None or not math.isfinite(obs.tbt_mean_s)
            or not math.isfinite(obs.decode_batch_mean)):
        return b_mem
    # nothing running now (the window's steps ran before it emptied): no context
    kv_seq = obs.kv_tokens_resident / obs.num_running if obs.num_running else 0.0
    bbar = max(obs.decode_batch_mean, 1.0)
    excess = max(obs.tbt_mean_s - model.predict_step_s(bbar, 0.0, bbar * kv_seq), 0.0)
    return min(max(model.largest_batch_within(sla_s - excess, b_mem, kv_seq), 1), b_mem)


@dataclass
class BatchPolicy:
    """b* = min(b_mem, b_SLA), clamped; owns the two algorithms' state."""

    ceiling: int                      # vLLM's max_num_seqs
    b_min: int
    b_max: int
    memory: MemoryBound | None       # None: Algorithm 2 alone (batch_policy = "sla")
    sla: SlaBound | None
    max_num_batched_tokens: int
    min_chunk_tokens: int
    step_model: StepModel | None = None   # the profile's T(b, c, kv), if any
    feasibility: Feasibility | None = None    # None: the paper's Algorithm 2 (no check)
    budget_acts: bool = False                 # set each tick by a TokenBudget wrapper:
                                              # whether the token budget can act
    late_after_s: float = 0.0                 # lift_after_s, else half the TTFT SLO:
                                              # once the longest-waiting request has
                                              # waited longer, the cap goes to the memory
                                              # bound (0: never)
    late_to_tpot: bool = False                # lift to lift_target, not to the memory
                                              # bound (late_queue = "lift_tpot")
    late_hold_ticks: int = 0                  # ticks the SLA search stays held after
    _late_hold: int = 0                       # the last of those (one TBT window)

    wants_active = False

    def decide(self, obs: Observation) -> Decision:
        if self.memory is not None:
            b_mem, mem_reason = self.memory.update(obs)
        else:
            b_mem, mem_reason = self.b_max, "no_memory_bound"
        # the online fit of this engine's own steps wins over a profile made elsewhere
        model = obs.step_model if obs.step_model is not None else self.step_model
        feasible = True
        if self.sla is not None and self.feasibility is not None:
            feasible = self.feasibility.update(obs, model)
        late = (self.late_after_s > 0 and obs.oldest_wait_s is not None
                and obs.oldest_wait_s > self.late_after_s)
        lift = None             # the cap a late queue lifts to, where it is lifted
        if late and self.sla is not None and feasible:
            held_cap = (self.sla.low + self.sla.high) // 2
            to = (lift_target(obs, model, self.sla.sla_s, b_mem) if self.late_to_tpot
                  else b_mem)
            if held_cap < b_mem and to > held_cap:
                lift = to
        if self.sla is not None and feasible:
            if isinstance(self.sla, EvidenceSlaBound):
                self.sla.budget_controlled = self.budget_acts
            if lift is not None or self._late_hold:
                # the SLA search is held while the cap is lifted and until the TBT
                # window has turned over: its steps ran at a batch the search did not
                # choose, and answering them would collapse the interval; it keeps
                # only what they prove about the batch that ran
                if isinstance(self.sla, EvidenceSlaBound):
                    self.sla.learn_lifted(obs)
                b_sla, sla_reason = (self.sla.low + self.sla.high) // 2, "ttft_late_settling"
                self._late_hold = (self.late_hold_ticks if lift is not None
                                   else max(self._late_hold - 1, 0))
            else:
                b_sla, sla_reason = self.sla.update(obs)
            lower, upper = self.sla.low, min(self.sla.high, b_mem)
        else:
            b_sla, sla_reason = None, ""
            lower, upper = self.b_min, b_mem
        if b_sla is not None and b_sla < b_mem:
            target, reason = b_sla, sla_reason
        elif not feasible:
            target, reason = b_mem, "sla_infeasible"
        else:
            target, reason = b_mem, mem_reason
        if lift is not None and lift > target:
            target, reason, upper = lift, "ttft_late", lift
        cap = min(max(target, self.b_min), self.ceiling)
        # Alg. 1 line 6 / Alg. 2 line 15: the batch never drops below the running
        # decodes; they drain to the gate (cap) as they finish.
        batch = min(max(cap, obs.num_running), self.ceiling)
        lower = min(lower, upper)
        inputs = self._decision_inputs(obs, model, cap=cap, feasible=feasible)
        # the full budget: a TokenBudget wrapper sizes it for the SLA
        return Decision(target=target, lower=lower, upper=upper, cap=cap, batch=batch,
                        token_budget=self.max_num_batched_tokens, reason=reason,
                        b_mem=b_mem, b_sla=b_sla, inputs=inputs)

    def _decision_inputs(self, obs: Observation, model: StepModel | None, *, cap: int,
                         feasible: bool) -> dict:
        """What the decision was made from, for ``/decisions`` and the logs."""
        inputs = _inputs(obs, self)
        inputs["draining"] = obs.num_running > cap
        if self.feasibility is not None:
            inputs["sla_feasible"] = feasible
            if not feasible:
                inputs["sla_infeasible_why"] = self.feasibility.why
        if model is not None:
            inputs["step_model"] = {k: v for k, v in model.to_dict().items()
                                    if k != "n_samples"} if hasattr(model, "to_dict") else None
        return inputs


def _inputs(obs: Observation, pol: BatchPolicy) -> dict:
    d = {"running": obs.num_running, "waiting": obs.num_waiting,
         "kv_capacity_blocks": obs.kv_capacity_blocks, "kv_usage": round(obs.kv_usage, 4),
         "demand_mean_blocks": obs.demand_mean, "demand_std_blocks": obs.demand_std,
         "demand_samples": obs.demand_samples, "tbt_mean_s": obs.tbt_mean_s,
         "tbt_p90_s": obs.tbt_p90_s, "decode_only_tbt_s": obs.decode_only_tbt_s,
         "decode_only_p90_s": obs.decode_only_p90_s,
         "binding": round(obs.binding, 3), "kv_tokens_resident": obs.kv_tokens_resident,
         "mixed_tbt_s": obs.mixed_tbt_s,
         "decode_batch_mean": obs.decode_batch_mean,
         "safety_buffer_blocks": round(pol.memory.last_l0, 2) if pol.memory else None}
    if pol.sla is not None:
        d["sla_s"] = pol.sla.sla_s
        d["search"] = [pol.sla.low, pol.sla.high]
        # which statistic the search held, and to what (the SLA, or a learnt margin)
        d["sla_statistic"] = pol.sla.held
        d["sla_setpoint_s"] = round(pol.sla.setpoint_s, 6)
        if pol.sla.margin is not None:
            d.update(pol.sla.margin.inputs())
    return d


# ------------------------------------------------------------------ as a named policy

def feasibility_patience(cfg: Any) -> int:
    """Ticks of measured violation before an SLA is declared infeasible: more than one
    TBT window's worth, so that the steps of the last strike were not yet run at the
    first. A window is seen by ``tbt_window_s / interval_s`` ticks in a row, so three
    strikes at short ticks would read one slow window three times and set aside an
    SLA that the steps before and after it met. At least 3."""
    return max(3, math.ceil(cfg.tbt_window_s / cfg.interval_s) + 1)


def settle_ticks(cfg: Any) -> int:
    """Ticks after a fall of the SLA search before the next one: the TBT window's
    length in ticks less the tick of the fall, so that the steps which caused a fall
    have left the window before they can cause another."""
    return max(0, math.ceil(round(cfg.tbt_window_s / cfg.interval_s, 9)) - 1)


def _build(name: str, cfg: Any, *, ceiling: int, max_num_batched_tokens: int,
           profile: Any) -> tuple[BatchPolicy, str | None]:
    """Pang et al.'s policy for ``batch_policy`` ``name`` (tuned: both bounds, memory:
    Algorithm 1 alone, sla: Algorithm 2 alone) and the reason of its first decision
    when the profile warm-starts it."""
    b_max = min(cfg.effective_b_max, ceiling)
    sla = None
    first_reason = None
    paper = cfg.sla_mode == "paper"
    if cfg.sla_enabled and name in ("tuned", "sla"):
        if paper:
            sla = SlaBound(cfg.tbt_sla_s, cfg.eps_d_s, cfg.alpha, cfg.delta, cfg.b_min, b_max)
        else:
            sla = EvidenceSlaBound(cfg.tbt_sla_s, cfg.eps_d_s, cfg.alpha, cfg.delta,
                                   cfg.b_min, b_max, statistic=cfg.sla_statistic,
                                   settle_ticks=settle_ticks(cfg),
                                   attainment_target=cfg.sla_attainment_target)
        if profile is not None:
            # Pang et al.'s use of Fig. 3: read the batch for the SLA off the curve.
            sla.warm_start(profile.largest_batch_within(cfg.tbt_sla_s, b_max))
            first_reason = "profile_initial"
    memory = (MemoryBound(cfg.eps_m, b_max, cfg.min_demand_samples)
              if name in ("tuned", "memory") else None)
    policy = BatchPolicy(
        ceiling=ceiling, b_min=cfg.b_min, b_max=b_max, memory=memory, sla=sla,
        max_num_batched_tokens=max_num_batched_tokens,
        min_chunk_tokens=cfg.min_chunk_tokens,
        step_model=profile.step_model() if profile is not None else None,
        late_after_s=((cfg.lift_after_s or cfg.ttft_sla_s / 2) if sla is not None and not paper
                      and cfg.late_queue in ("lift", "lift_tpot") else 0.0),
        late_to_tpot=cfg.late_queue == "lift_tpot",
        late_hold_ticks=settle_ticks(cfg) + 1,
        feasibility=(None if paper or sla is None else
                     Feasibility(cfg.tbt_sla_s, cfg.eps_d_s, cfg.b_min, cfg.alpha,
                                 patience=feasibility_patience(cfg))))
    return policy, first_reason


def build_tuned(cfg: Any, *, ceiling: int, max_num_batched_tokens: int, profile: Any = None,
                **_: Any) -> tuple[BatchPolicy, str | None]:
    return _build("tuned", cfg, ceiling=ceiling,
                  max_num_batched_tokens=max_num_batched_tokens, profile=profile)


def build_memory(cfg: Any, *, ceiling: int, max_num_batched_tokens: int,
                 profile: Any = None, **_: Any) -> tuple[BatchPolicy, str | None]:
    return _build("memory", cfg, ceiling=ceiling,
                  max_num_batched_tokens=max_num_batched_tokens, profile=profile)


def build_sla(cfg: Any, *, ceiling: int, max_num_batched_tokens: int, profile: Any = None,
              **_: Any) -> tuple[BatchPolicy, str | None]:
    return _build("sla", cfg, ceiling=ceiling,
                  max_num_batched_tokens=max_num_batched_tokens, profile=profile)


#: the reasons every policy of Pang et al.'s emits (tuned.policies.catalog reads this)
PANG_REASONS = {
    "initial": "no decode step in the TBT window yet (start-up or idle): SLA search kept",
    "profile_initial": "first decision, read off the profile's TBT curve at the SLA",
    "memory": "the KV-cache memory bound (Pang et al.'s Algorithm 1) is the "
              "tighter limit",
    "memory_no_data": "fewer than min_demand_samples finished requests: memory bound held",
    "sla_over": "TBT above the SLA plus its tolerance eps_d_s: the SLA search moves "
                "down",
    "sla_under": "TBT below the SLA less its tolerance eps_d_s: the SLA search "
                 "moves up",
    "sla_hold": "TBT within the SLA tolerance: the search narrows around the batch",
    "hold_no_queue": "nothing waiting or nothing running: memory bound held",
    "no_memory_bound": "batch_policy = sla: the SLA bound alone decides",
    "sla_over_prefill": "TBT over the SLA but decode-only steps within it: prefill chunks "
                        "caused it, the token budget shrinks, the cap holds",
    "sla_restore": "a fall that prefill caused (decode-only steps within the SLA, the "
                   "token budget unable to act) undone: what prefill adds to the mean "
                   "step is at most half what it added then, and TBT is under the SLA",
    "sla_idle": "the cap was not binding (nothing waited at the cap): SLA search kept",
    "sla_over_settling": "TBT still over the SLA on a window that holds the steps of the "
                         "last fall: the search waits for the window to turn over",
    "sla_expand": "TBT under the SLA at a collapsed search interval while the cap binds: "
                  "the upper end grows by a quarter",
    "ttft_late": "the longest-waiting request has waited past lift_after_s (half of "
                 "ttft_sla_s by default; late_queue = lift): the SLA bound steps aside, "
                 "the memory bound sets the cap, and the backlog drains at the engine's "
                 "throughput (lift_tpot: the largest batch the step model puts within "
                 "tbt_sla_s sets it)",
    "ttft_late_settling": "the SLA search held for one TBT window after the cap was lifted "
                          "for late requests: its steps ran at a batch it did not choose; "
                          "it keeps only what they prove upward (a mean decode batch "
                          "b-bar whose steps met the SLA raises the low end to it; one "
                          "whose steps were within eps_d_s of it, the interval around it)",
    "sla_infeasible": "the TBT SLA cannot be met even at b_min (the lowest batch "
                      "tuned may choose): SLA bound set aside, memory bound and full "
                      "token budget maximise throughput",
}

#: what tuned knows of these policies without importing this module
#: (:mod:`tuned.policies.catalog`); their options are the config's own fields
POLICIES = [
    {"name": "tuned", "kind": "batch", "build": "build_tuned", "order": 10,
     "summary": "min of the memory and SLA bounds", "step_fit": True,
     "reasons": PANG_REASONS},
    {"name": "memory", "kind": "batch", "build": "build_memory", "order": 20,
     "summary": "the memory bound alone (Pang et al.'s Algorithm 1)",
     "budget_sla": False, "reasons": PANG_REASONS,
     "bench": [{"name": "tuned-memory", "kind": "tuned",
                "config": {"batch_policy": "memory"}}]},
    {"name": "sla", "kind": "batch", "build": "build_sla", "order": 30,
     "summary": "the SLA bound alone (Pang et al.'s Algorithm 2)",
     "step_fit": True, "reasons": PANG_REASONS,
     "bench": [{"name": "tuned-sla", "kind": "tuned", "config": {"batch_policy": "sla"}}]},
]
