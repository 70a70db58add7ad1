"""MC-SF: Memory-Constrained Shortest First (seed 003, Jaillet et al., Algorithm 1).

Waiting requests are tried in ascending predicted output length õ; a candidate i
joins the batch only if inequality (5) holds for S = running requests and
U = requests admitted this round plus i, at every predicted completion time t' of
S ∪ U (memory grows linearly between completions, so these are the only peaks):

    Σ_{i∈S} (s_i + t' − p_i)·1[õ_i ≥ t' − p_i] + Σ_{i∈U} (s_i + t' − t)·1[õ_i ≥ t' − t] ≤ M

with time in decode steps (one token per request per step), s_i the prompt
tokens, p_i the step at which i started, M the KV-cache capacity in tokens. The
first candidate that does not fit ends the round (no skipping).

Mapping onto vLLM's continuous batching:

* t − p_i is the number of tokens request i generated so far (``output_tokens``),
  so with d = t' − t steps ahead a request holds s_i + o_i + d tokens while
  õ_i ≥ o_i + d. For a request admitted this round o_i = 0 and the second sum is
  recovered; a resumed (preempted) request keeps its o_i, which is the memory it
  will hold again after recomputation.
* A running request that already outran its prediction (o_i ≥ õ_i) is planned to
  finish in one more step (its memory is real until it finishes) instead of being
  treated as already gone.
* M is ``kv_capacity_tokens`` × (1 − ``reserve_fraction``): Section 5.2.2 of the
  paper reserves αM (α = 0.1) against under-predicted lengths; here α defaults to
  0 because the predictor runs in over-estimating mode (a high quantile), which is
  the paper's õ ≥ o assumption. Block rounding and prefix-cache sharing of the real
  KV cache are not modelled (the paper's memory is token-exact).
* The paper processes one round per time unit; here a round is one ``schedule()``
  step, and vLLM's own cap and token budget may end the round earlier.

Cost: one check sorts the remaining-step counts of |S ∪ U| requests once and sums
them with a running prefix, O(n log n) for n running (the paper: O(M²) per round).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tuned.policies.queues import AdmitContext, QueuePolicy, ReqInfo, Verdict


def lookahead_peak(items: Iterable[tuple[int, int]]) -> tuple[int, int]:
    """Largest left-hand side of inequality (5) over all completion times.

    ``items``: (tokens held now, remaining decode steps) per request; a request
    holding h tokens with r steps left holds h + d tokens at d steps ahead while
    d ≤ r. Returns (peak tokens, d at which the peak occurs; 0 if no request).
    """
    by_rem = sorted(((r, h) for h, r in items if r > 0), reverse=True)
    peak, peak_d = 0, 0
    base_sum, count = 0, 0
    i, n = 0, len(by_rem)
    while i < n:
        d = by_rem[i][0]
        # every request with remaining >= d is alive at d steps ahead
        while i < n and by_rem[i][0] == d:
            base_sum += by_rem[i][1]
            count += 1
            i += 1
        mem = base_sum + count * d
        if mem > peak:
            peak, peak_d = mem, d
    return peak, peak_d


def _held_and_remaining(r: ReqInfo) -> tuple[int, int]:
    return r.prompt_tokens + r.output_tokens, r.remaining_predicted


class MCSFPolicy(QueuePolicy):
    """Shortest predicted output first with the inequality-(5) look-ahead.

    Options: ``reserve_fraction`` (α of Section 5.2.2, plan with (1 − α)·M),
    ``overestimate`` (plan with the predictor's over-estimating quantile).
    """

    name = "mcsf"
    uses_running_progress = True

    def __init__(self, *, reserve_fraction: float = 0.0, overestimate: bool = True,
                 rng=None) -> None:
        super().__init__(rng=rng)
        if not (0.0 <= reserve_fraction < 1.0):
            raise ValueError(f"mcsf: reserve_fraction must be in [0, 1), got {reserve_fraction!r}")
        self.reserve_fraction = float(reserve_fraction)
        self.overestimate = bool(overestimate)

    def memory_limit_tokens(self, ctx: AdmitContext) -> int:
        """M of inequality (5)."""
        return int(ctx.kv_capacity_tokens * (1.0 - self.reserve_fraction))

    def order_key(self, info: ReqInfo) -> tuple[int, float]:
        # ascending õ; ties by arrival (stable for equal arrivals)
        return (info.predicted_output, info.arrival_s)

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        return sorted(waiting, key=self.order_key)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        m = self.memory_limit_tokens(ctx)
        items = [_held_and_remaining(r) for r in running]
        items += [_held_and_remaining(r) for r in admitted_this_step]
        items.append(_held_and_remaining(candidate))
        peak, d = lookahead_peak(items)
        if peak <= m:
            return Verdict(True, f"mcsf: fits, peak {peak} <= M={m} tokens at +{d} steps")
        return Verdict(False, f"mcsf: KV look-ahead overflow, {peak} > M={m} tokens "
                              f"at +{d} steps")
