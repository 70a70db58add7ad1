"""MC-SF: Memory-Constrained Shortest First (Jaillet et al., Algorithm 1).

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
* Memory is planned in KV blocks, the unit vLLM's paged allocator hands out: a
  request holding h tokens holds ceil(h / block_size) blocks, so at d steps ahead
  S ∪ U holds Σ ceil((h_i + d) / B) blocks, and M is the cache's blocks
  (``kv_capacity_tokens / block_size``) × (1 − α). The paper's memory is
  token-exact; planning in tokens over-admits when blocks are large (47 blocks of
  128 tokens hold 6016 tokens, enough for 30 requests of 200 tokens in tokens, but
  those requests need 60 blocks). Prefix-cache sharing is not modelled.
* α (``reserve_fraction``, Section 5.2.2 reserves αM against under-predicted
  lengths, α = 0.1 in the paper): by default (``reserve_fraction = "auto"``) the
  predictor's measured under-prediction: the share of finished requests that
  outran their prediction times their mean relative excess (the expected memory
  those requests take beyond the plan), capped at 0.5; a number fixes it.
* The paper processes one round per time unit; here a round is one ``schedule()``
  step, and vLLM's own cap and token budget may end the round earlier.

Cost: one check sorts the remaining-step counts of |S ∪ U| requests once and sums
them with a running prefix, O(n log n) for n running (the paper: O(M²) per round).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict


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


def lookahead_peak_blocks(items: Iterable[tuple[int, int]], block_size: int) -> tuple[int, int]:
    """Largest Σ ceil((h_i + d) / B) over the completion times d of ``items``
    ((tokens held now, remaining decode steps) per request), and that d.

    Between two completions memory only grows, so the completion times are the
    only peaks. With h_i + B − 1 = q_i·B + r_i and d = D·B + e (0 <= r_i, e < B),
    ceil((h_i + d) / B) = q_i + D + [r_i + e >= B]: the sum over the requests alive
    at d is Σq + n·D + #{r_i >= B − e}, kept exact in O(n log B) by adding
    requests in order of falling remaining steps to a Fenwick tree over r.
    """
    bs = max(int(block_size), 1)
    if bs == 1:
        return lookahead_peak(items)
    by_rem = sorted(((r, h) for h, r in items if r > 0), reverse=True)
    tree = [0] * (bs + 1)          # Fenwick over r in [0, bs)

    def add(r: int) -> None:
        i = r + 1
        while i <= bs:
            tree[i] += 1
            i += i & -i

    def count_below(r: int) -> int:   # #{r_i < r}
        i, c = r, 0
        while i > 0:
            c += tree[i]
            i -= i & -i
        return c

    peak, peak_d = 0, 0
    q_sum = count = 0
    i, n = 0, len(by_rem)
    while i < n:
        d = by_rem[i][0]
        while i < n and by_rem[i][0] == d:
            q, r = divmod(by_rem[i][1] + bs - 1, bs)
            q_sum += q
            add(r)
            count += 1
            i += 1
        big_d, e = divmod(d, bs)
        mem = q_sum + count * big_d + (count - count_below(bs - e) if e else 0)
        if mem > peak:
            peak, peak_d = mem, d
    return peak, peak_d


def _held_and_remaining(r: ReqInfo) -> tuple[int, int]:
    return r.prompt_tokens + r.output_tokens, r.remaining_predicted


class MCSFPolicy(QueuePolicy):
    """Shortest predicted output first with the inequality-(5) look-ahead.

    Options: ``reserve_fraction`` (α of Section 5.2.2, plan with (1 − α)·M; "auto":
    the predictor's measured under-prediction, see the module docstring),
    ``overestimate`` (plan with the predictor's over-estimating quantile).
    """

    name = "mcsf"
    uses_running_progress = True
    MAX_AUTO_RESERVE = 0.5

    def __init__(self, *, reserve_fraction: float | str = "auto", overestimate: bool = True,
                 rng=None) -> None:
        super().__init__(rng=rng)
        if reserve_fraction != "auto" and (
                isinstance(reserve_fraction, bool)
                or not isinstance(reserve_fraction, (int, float))
                or not 0.0 <= reserve_fraction < 1.0):
            raise ValueError(f"mcsf: reserve_fraction must be \"auto\" or in [0, 1), got "
                             f"{reserve_fraction!r}")
        self.reserve_fraction = reserve_fraction if reserve_fraction == "auto" \
            else float(reserve_fraction)
        self.overestimate = bool(overestimate)

    def reserve(self, ctx: AdmitContext) -> float:
        """α: fixed, or the measured under-prediction carried by the context."""
        if self.reserve_fraction == "auto":
            return min(max(ctx.under_prediction, 0.0), self.MAX_AUTO_RESERVE)
        return self.reserve_fraction

    def memory_limit_blocks(self, ctx: AdmitContext) -> int:
        """M of inequality (5), in KV blocks."""
        bs = max(ctx.block_size, 1)
        return int(ctx.kv_capacity_tokens // bs * (1.0 - self.reserve(ctx)))

    def order_key(self, info: ReqInfo) -> tuple[int, float]:
        # ascending õ; ties by arrival (stable for equal arrivals)
        return (info.predicted_output, info.arrival_s)

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        return sorted(waiting, key=self.order_key)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        m = self.memory_limit_blocks(ctx)
        items = [_held_and_remaining(r) for r in running]
        items += [_held_and_remaining(r) for r in admitted_this_step]
        items.append(_held_and_remaining(candidate))
        peak, d = lookahead_peak_blocks(items, ctx.block_size)
        unit = "blocks" if ctx.block_size > 1 else "tokens"
        if peak <= m:
            return Verdict(True, f"mcsf: fits, peak {peak} <= M={m} {unit} at +{d} steps")
        return Verdict(False, f"mcsf: KV look-ahead overflow, {peak} > M={m} {unit} "
                              f"at +{d} steps")


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "mcsf", "kind": "queue", "build": "MCSFPolicy", "order": 20,
    "summary": "memory-constrained shortest first (MC-SF, Jaillet et al.)",
    "options": {
        "reserve_fraction": {"type": "float", "default": "auto", "lo": 0.0, "hi": 1.0,
                             "hi_open": True, "also": ["auto"],
                             "doc": "share of the KV cache kept free for under-predicted "
                                    "outputs (auto: the measured under-prediction)"},
        "overestimate": {"type": "bool", "default": True,
                         "doc": "plan with an over-estimating output prediction"},
    },
    "bench": [{"name": "tuned-mcsf", "kind": "tuned",
               "config": {"queue_policy": "mcsf", "queue_options": {}}}],
}
