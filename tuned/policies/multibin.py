"""Multi-bin batching: group requests into k length bins, serve bin by bin.

Algorithm 1 of the paper: estimate each request's service time l (here the
predicted output length õ, in decode steps), put it in bin i with
l_{i-1} ≤ l < l_i, form batches of size B inside a bin, and serve completed batches
"first completed batch, first served". Lemma 4.1: throughput is maximal when the
bins hold equal probability mass, so the boundaries are quantiles of the length
distribution; here, of the empirical distribution of recent predictions
(:func:`equal_mass_boundaries`). Theorem 4.2 gives the throughput with k bins for
l ~ U[l_min, l_max] (:func:`multibin_throughput`), Theorem 4.3 the smallest k that
reaches a target c_max − ε (:func:`bins_for_target`).

Serving rule chosen here (the paper leaves the serving policy open):

1. requests waiting longer than ``max_wait_s`` come first, oldest first (the
   paper's remark on a maximum batch waiting time; it overrides the bin order);
2. then the bin whose batch *completed* first: among bins holding at least B
   requests (B = the current batch cap), the one whose B-th oldest member arrived
   earliest — the paper's "first completed batch, first served";
3. if no bin holds a full batch, the bin whose head (oldest member) is oldest, so
   an underloaded engine never idles waiting for a batch to fill;
4. then the remaining bins by the same rule; inside a bin, arrival order.

What carries over to vLLM's continuous batching and what does not:

* Carries over: equal-mass boundaries, and admitting a wave of similar lengths.
  Each admission round (one ``schedule()`` step) takes requests from one bin only
  (``one_bin_per_step``), the closest analogue of forming a batch inside a bin; the
  next step may take the next bin, so no slot stays empty longer than one step.
* Does not carry over: the paper's batch lasts as long as its longest member
  (service time = max over the batch), which is where Theorem 4.2's gain comes
  from. Under continuous batching a finished request's slot is refilled at the
  next step, so the gain is much smaller (mostly less KV-cache fragmentation and
  fewer long requests blocking memory at once); Theorems 4.2/4.3 and Lemma 5.1
  are exported for the static-batching mode of the simulator and to choose k.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Collection, Sequence

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict


def _gap(batch: int, l_min: float, l_max: float) -> float:
    """B/(B+1)·l_max + 1/(B+1)·l_min − (l_max + l_min)/2 (Theorem 4.2's bracket)."""
    return batch / (batch + 1) * l_max + 1 / (batch + 1) * l_min - (l_max + l_min) / 2


def multibin_throughput(k: int, batch: int, l_min: float, l_max: float) -> float:
    """Theorem 4.2 (Eq. 4): requests per unit time with k equal-mass bins,
    B / ((l_max+l_min)/2 + (1/k)(B/(B+1)·l_max + 1/(B+1)·l_min − (l_max+l_min)/2))."""
    if k < 1 or batch < 1:
        raise ValueError(f"k and batch must be >= 1, got k={k}, batch={batch}")
    return batch / ((l_max + l_min) / 2 + _gap(batch, l_min, l_max) / k)


def c_max(batch: int, l_min: float, l_max: float) -> float:
    """Eq. 5: the limit of Throughput_k as k → ∞, B / ((l_max + l_min)/2)."""
    return batch / ((l_max + l_min) / 2)


def bins_for_target(target_fraction: float, batch: int, l_min: float, l_max: float,
                    k_max: int = 64) -> int:
    """Theorem 4.3 (Eq. 6): smallest k with Throughput_k ≥ c_max − ε, for
    ε = (1 − target_fraction)·c_max:

        k ≥ (c_max − ε)·(B/(B+1)·l_max + 1/(B+1)·l_min − (l_max+l_min)/2) / (ε·(l_max+l_min)/2)

    clamped to [1, k_max]."""
    if not (0.0 < target_fraction < 1.0):
        raise ValueError(f"target_fraction must be in (0, 1), got {target_fraction!r}")
    mean = (l_max + l_min) / 2
    gap = _gap(batch, l_min, l_max)
    if mean <= 0 or gap <= 0:
        return 1
    cm = c_max(batch, l_min, l_max)
    eps = (1.0 - target_fraction) * cm
    bound = (cm - eps) * gap / (eps * mean)
    return int(min(max(math.ceil(bound - 1e-9), 1), k_max))


def expected_latency(k: int, batch: int, l_min: float, l_max: float,
                     arrival_rate: float) -> float:
    """Lemma 5.1 (Eq. 7): expected latency with k bins, infinite servers, Poisson(λ):
    (l_max+l_min)/2 + (1/k)(gap) + (B−1)·k / (2λ)."""
    return (l_max + l_min) / 2 + _gap(batch, l_min, l_max) / k + (batch - 1) * k / (
        2 * arrival_rate)


def equal_mass_boundaries(sample: Sequence[float], k: int) -> list[float]:
    """Lemma 4.1 on an empirical sample: the k − 1 inner boundaries l_1 … l_{k−1}.

    l_j is the value of rank ⌊j·n/k⌋ (0-based) of the sorted sample, so with
    l_{i−1} ≤ l < l_i each bin holds n/k of the sample when n is a multiple of k and
    values are distinct. Repeated values collapse boundaries (fewer bins in use).
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    s = sorted(sample)
    n = len(s)
    if n == 0 or k == 1:
        return []
    out: list[float] = []
    for j in range(1, k):
        b = s[(j * n) // k]
        if not out or b > out[-1]:
            out.append(b)
    # a boundary equal to the sample minimum would leave bin 0 empty
    return [b for b in out if b > s[0]]


def bin_of(length: float, boundaries: Sequence[float]) -> int:
    """Algorithm 1, line 3: the i with l_{i−1} ≤ length < l_i (0-based)."""
    return bisect.bisect_right(boundaries, length)


class MultiBinPolicy(QueuePolicy):
    """k length bins with equal-mass boundaries, served as described in the module doc.

    Options: ``k`` (bins; 0 = from Theorem 4.3 with ``target_fraction`` of c_max,
    B = the current cap and l_min/l_max of recent predictions), ``k_max``,
    ``window`` (recent predictions kept for the boundaries), ``max_wait_s``
    (starvation bound; 0 = none), ``one_bin_per_step``.
    """

    name = "multibin"

    def __init__(self, *, k: int = 4, target_fraction: float = 0.9, k_max: int = 16,
                 window: int = 512, max_wait_s: float = 30.0, one_bin_per_step: bool = True,
                 rng=None) -> None:
        super().__init__(rng=rng)
        if k < 0 or k_max < 1 or (k and k > k_max):
            raise ValueError(f"multibin: need 0 <= k <= k_max and k_max >= 1, "
                             f"got k={k}, k_max={k_max}")
        if not (0.0 < target_fraction < 1.0):
            raise ValueError(f"multibin: target_fraction must be in (0, 1), "
                             f"got {target_fraction!r}")
        if window < 1 or max_wait_s < 0:
            raise ValueError("multibin: window must be >= 1 and max_wait_s >= 0")
        self.k_option = int(k)
        self.target_fraction = float(target_fraction)
        self.k_max = int(k_max)
        self.max_wait_s = float(max_wait_s)
        self.one_bin_per_step = bool(one_bin_per_step)
        self._recent: deque[int] = deque(maxlen=window)
        self.boundaries: list[float] = []
        self.k = max(self.k_option, 1)
        self._bin_of_id: dict[str, int] = {}
        self._next_starve_s = math.inf

    # ------------------------------------------------------------ bins
    def observe_arrival(self, info: ReqInfo) -> None:
        self._recent.append(info.predicted_output)

    def _choose_k(self, cap: int | None) -> int:
        if self.k_option:
            return self.k_option
        if not self._recent or not cap:
            return 1
        return bins_for_target(self.target_fraction, cap, min(self._recent),
                               max(self._recent), self.k_max)

    def update_boundaries(self, cap: int | None = None) -> list[float]:
        """Recompute k and the equal-mass boundaries from recent predictions."""
        self.k = self._choose_k(cap)
        self.boundaries = equal_mass_boundaries(list(self._recent), self.k)
        return self.boundaries

    def bin_index(self, info: ReqInfo) -> int:
        return bin_of(info.predicted_output, self.boundaries)

    # ------------------------------------------------------------ order
    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        cap = ctx.cap if ctx is not None else None
        self.update_boundaries(cap)
        starved: list[ReqInfo] = []
        bins: dict[int, list[ReqInfo]] = {}
        self._bin_of_id = {}
        next_starve = math.inf
        for r in sorted(waiting, key=lambda r: r.arrival_s):
            b = self.bin_index(r)
            self._bin_of_id[r.request_id] = b
            if self.max_wait_s and now_s - r.arrival_s >= self.max_wait_s:
                starved.append(r)
            else:
                bins.setdefault(b, []).append(r)
                if self.max_wait_s:
                    next_starve = min(next_starve, r.arrival_s + self.max_wait_s)
        self._next_starve_s = next_starve
        self.stats.bins_in_use = len({self._bin_of_id[r.request_id] for r in waiting})
        batch = max(cap or 1, 1)

        def key(item: tuple[int, list[ReqInfo]]) -> tuple[int, float, int]:
            b, members = item
            if len(members) >= batch:
                # completed batch: the time its B-th member arrived
                return (0, members[batch - 1].arrival_s, b)
            return (1, members[0].arrival_s, b)

        out = starved
        for _, members in sorted(bins.items(), key=key):
            out.extend(members)
        return out

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        return ctx.now_s >= self._next_starve_s

    # ------------------------------------------------------------ admit
    def _is_starved(self, r: ReqInfo, now_s: float) -> bool:
        return bool(self.max_wait_s) and now_s - r.arrival_s >= self.max_wait_s

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        b = self._bin_of_id.get(candidate.request_id, self.bin_index(candidate))
        if self._is_starved(candidate, ctx.now_s):
            return Verdict(True, f"multibin: waited >= {self.max_wait_s:g}s, "
                                 f"starvation bound overrides bins")
        if self.one_bin_per_step:
            # the bin of this step's first admission that was not a starvation override
            for first in admitted_this_step:
                if self._is_starved(first, ctx.now_s):
                    continue
                fb = self._bin_of_id.get(first.request_id, self.bin_index(first))
                if fb != b:
                    return Verdict(False, f"multibin: one bin per step (this step serves "
                                          f"bin {fb + 1}, head is in bin {b + 1} of {self.k})")
                break
        return Verdict(True, f"multibin: bin {b + 1} of {self.k}")

    def forget(self, request_id: str) -> None:
        self._bin_of_id.pop(request_id, None)


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "multibin", "kind": "queue", "build": "MultiBinPolicy", "order": 30,
    "summary": "length bins served bin by bin (Multi-bin batching)",
    "options": {
        "k": {"type": "int", "default": 4, "lo": 0, "hi": 4096, "at_most": "k_max",
              "doc": "number of bins (0 = the smallest k reaching target_fraction)"},
        "target_fraction": {"type": "float", "default": 0.9, "lo": 0.0, "hi": 1.0,
                            "lo_open": True, "hi_open": True,
                            "doc": "throughput target of the automatic k"},
        "k_max": {"type": "int", "default": 16, "lo": 1, "hi": 4096,
                  "doc": "largest k the automatic choice may take"},
        "window": {"type": "int", "default": 512, "lo": 1, "hi": 1048576,
                   "doc": "recent predictions the bin boundaries are quantiles of"},
        "max_wait_s": {"type": "float", "default": 30.0, "lo": 0.0,
                       "doc": "starvation bound: a bin waiting longer is served next"},
        "one_bin_per_step": {"type": "bool", "default": True,
                             "doc": "admit from one bin per engine step"},
    },
    "bench": [{"name": "tuned-multibin", "kind": "tuned",
               "config": {"queue_policy": "multibin", "queue_options": {}}}],
}
