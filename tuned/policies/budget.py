"""The per-step token budget (vLLM's ``max_num_scheduled_tokens``) as a wrapper
around any batch policy: the inner policy decides the cap, :class:`TokenBudget` sizes
the prefill chunk beside it.

Pang et al.'s PD-fusion variant picks the chunk size so that a mixed step still meets
the TBT SLA (:func:`token_budget`). The budget is a knob of its own, orthogonal to the
cap: ``token_budget_policy = "sla"`` wraps whichever ``batch_policy`` is chosen
(``tuned``, ``memory``, ``sla``, ``static``, ``trtllm``); ``"max"`` leaves the budget
at ``max_num_batched_tokens``; ``"auto"`` (the default) is ``"sla"`` where the step
time is a staircase in the tokens (``token_budget_granule`` > 0, a GPU) and the full
budget, still wrapped and reported (``budget_bound = "line"``), where it is a line. A ``package.module:Class`` plugin returns its own
budget and is not wrapped.

One piece of protocol joins the two: an inner policy with a ``budget_acts``
attribute (:class:`tuned.policies.batch.BatchPolicy`) is told, before it decides,
whether the budget can act this tick, because Pang et al.'s SLA bound answers a
violation caused by prefill with the budget where the budget can act and with the
cap where it cannot (:class:`tuned.policies.sla_bound.EvidenceSlaBound`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from tuned.core.types import Decision, Observation, StepModel


def token_budget(batch: int, max_num_batched_tokens: int, min_chunk_tokens: int,
                 sla_s: float = 0.0, step_model: StepModel | None = None,
                 kv_tokens: float = 0.0, granule: int = 0) -> int:
    """Tokens the scheduler may put in one step (vLLM's ``max_num_scheduled_tokens``).

    Pang et al.'s PD-fusion variant picks the chunk size so a mixed step still meets
    the TBT SLA: with a step-time model T(b, c, kv) the chunk is the largest c with
    T(b, c, kv + c) <= D_SLA at the decode batch b and the KV resident, and the
    budget is b decode tokens plus that chunk. Always clamped to
    [b + min_chunk_tokens, max_num_batched_tokens] so running decodes plus at least
    one prefill chunk fit (less would starve them).

    ``granule`` > 0 rounds an SLA-sized budget down to a multiple of that many
    tokens (where the multiple still holds the decodes and a chunk). A GPU runs a
    step's linear layers as GEMMs tiled along the tokens, so the step time is a
    staircase in the token count, not the line the step model fits: a step just past
    a multiple of the tile pays a whole tile more (Vidur's H100 tables for
    Llama-2-70B: the linear layers take half as long again at 520 tokens as at 512).
    Rounding down keeps each step on the cheap side of a stair the fit cannot see.

    :class:`TokenBudget` closes a loop around it: the window's mean step time (what a
    request's TPOT averages) above D_SLA - 2 eps_D shrinks the chunks' target by the
    integral of the excess. Where the paper holds every mixed step to D_SLA, a loop on
    the mixed steps alone holds the mean far below it under load: chunks sit at their
    floor and requests queue past their TTFT.
    """
    lo = batch + min_chunk_tokens
    hi = max_num_batched_tokens
    if lo >= hi:
        return hi
    if step_model is None or sla_s <= 0:
        return hi
    chunk = step_model.largest_chunk_within(batch, sla_s, min_chunk_tokens, hi - batch,
                                            kv_tokens)
    budget = min(max(batch + chunk, lo), hi)
    if granule and budget < hi and budget // granule * granule >= lo:
        budget = budget // granule * granule
    return budget


def ttft_step_target(sla_s: float, mean_s: float | None, decode_s: float | None,
                     mixed_s: float | None) -> float:
    """The time a prefilling step may take while requests wait for their first token:
    the longest that keeps the window's mean decode step at the TPOT SLO, never below
    the SLO itself.

    A request's TPOT is the mean of the steps it decodes in. Over the window, a share
    f of the decode steps also prefilled (mean time ``mixed_s``), the rest did not
    (``decode_s``), so the mean is (1 - f) * decode_s + f * mixed_s and
    f = (mean - decode_s) / (mixed_s - decode_s). With the decode-only steps as they
    are, the prefilling steps may take mixed_s + (SLA - mean) / f before the mean
    reaches the SLA. Larger chunks also mean fewer prefilling steps for the same
    prompts (in steady state the prompt tokens a second are set by the arrivals), so
    the mean does not rise by what a single step does. Without that room (the mean at
    or above the SLA, or no prefilling step measured) the target is the SLA, as for
    any step.
    """
    if mean_s is None or decode_s is None or mixed_s is None or mean_s >= sla_s:
        return sla_s
    if mixed_s <= decode_s or mean_s <= decode_s:
        return sla_s
    target = mixed_s + (sla_s - mean_s) * (mixed_s - decode_s) / (mean_s - decode_s)
    return max(sla_s, target) if math.isfinite(target) else sla_s


#: share of the window's steps with requests waiting at a full cap from which the cap,
#: not the budget, is what holds them (the SLA search's own ``bind_share``)
BINDING_SHARE = 0.5


@dataclass
class TokenBudget:
    """Wraps a batch policy: its decision, with the token budget sized for the SLA.

    ``sla_s`` is the TBT SLA the chunks are sized for (0: none, the full budget);
    ``decode_budget`` is the b of the budget: ``running`` (the decodes running now,
    tuned) or ``batch`` (the decision's b_t, the paper's PD fusion); chunks are sized
    for ``sla_s - margin_s``. An inner decision with ``inputs["sla_feasible"]`` false
    gets the full budget (no chunk size holds an infeasible SLA).
    """

    inner: Any
    max_num_batched_tokens: int
    min_chunk_tokens: int
    sla_s: float = 0.0
    step_model: StepModel | None = None      # the profile's T(b, c, kv), if any
    control: bool = True                     # False: the full budget (policy "auto"
                                             # on a host whose step time is a line)
    decode_budget: str = "running"
    margin_s: float = 0.0
    granule: int = 0                         # round the SLA-sized budget down to this
    bias_s: float = 0.0                      # learnt: the window's mean step time over
                                             # D_SLA - 2 eps_D (integral of the excess)
    bound: str = "none"                      # what sized the last budget: "tpot" (the
                                             # TBT SLA less margin and bias), "ttft"
                                             # (requests wait, not held by the cap: the
                                             # SLA, or past it by the window's room,
                                             # ttft_step_target), "none" (the full one)
                                             # or "line" (the full one: control off, the
                                             # step time a line in the tokens)

    @property
    def wants_step_fit(self) -> bool:
        """Sizing chunks for an SLA reads the controller's online step model."""
        return self.control and self.sla_s > 0

    @property
    def wants_active(self) -> bool:
        return getattr(self.inner, "wants_active", False)

    def _no_chunk_holds(self, model: StepModel | None) -> bool:
        """Whether even one decode beside the smallest chunk misses the SLA, so that
        the token budget cannot act; then a violation caused by prefill moves the cap
        (:class:`tuned.policies.sla_bound.EvidenceSlaBound`): with the budget unable to
        act, keeping the cap leaves those violations unanswered, and on a CPU host
        that drifts from its profile a falling cap serves more requests within both
        SLOs (``tools/host_drift.py`` compares the two)."""
        if self.sla_s <= 0 or self.decode_budget != "running" or model is None:
            return False
        sla_s = self.sla_s - self.margin_s
        return model.predict_step_s(1, self.min_chunk_tokens, self.min_chunk_tokens) > sla_s

    def decide(self, obs: Observation) -> Decision:
        # the online fit of this engine's own steps wins over a profile made elsewhere
        model = obs.step_model if obs.step_model is not None else self.step_model
        acts = self.control and not self._no_chunk_holds(model)
        if hasattr(self.inner, "budget_acts"):
            self.inner.budget_acts = acts
        d = self.inner.decide(obs)
        feasible = bool((d.inputs or {}).get("sla_feasible", True))
        budget = self._budget(obs, model, cap=d.cap, batch=d.batch, feasible=feasible,
                              acts=acts)
        inputs = dict(d.inputs or {})
        inputs["budget_bias_s"] = round(self.bias_s, 6)
        inputs["budget_bound"] = self.bound
        inputs["prefilling"] = obs.prefilling
        if obs.prefill_residual_s is not None:
            inputs["prefill_residual_s"] = round(obs.prefill_residual_s, 6)
        # vLLM needs the budget to hold every admitted decode plus a token (DESIGN.md:
        # keep it >= the active cap plus room for a chunk, or running requests starve).
        # Where the SLA-sized budget is below the inner cap + 1 the cap yields, down to
        # the budget less one chunk (never below the requests running: the budget holds
        # them and a chunk by construction), instead of the budget being held at
        # cap + 1. Without this, a cap that does not bind (the memory bound at 512 with
        # 50 running) keeps the budget above its SLA size, where the step time can
        # jump (a GPU's GEMM tiles: the linear layers of a step are one shape to 512
        # tokens and a larger, slower one past it).
        cap, batch, reason = d.cap, d.batch, d.reason
        if self.control and budget < self.max_num_batched_tokens and budget <= cap:
            cap = max(min(cap, budget - self.min_chunk_tokens), min(obs.num_running, cap), 1)
            batch = min(max(cap, obs.num_running), batch)
            if cap < d.cap:
                inputs["cap_before_budget"] = d.cap
                reason = "budget_room"
        budget = min(max(budget, cap + 1), self.max_num_batched_tokens)
        return dataclasses.replace(d, token_budget=budget, cap=cap, batch=batch,
                                   reason=reason, inputs=inputs)

    def _budget(self, obs: Observation, model: StepModel | None, *, cap: int, batch: int,
                feasible: bool, acts: bool) -> int:
        """The step's token budget for ``cap`` and ``batch``: the largest that keeps a
        step with the decodes beside it within the SLA (less the closed-loop bias),
        at least the decodes it is sized for plus one chunk."""
        sla_s = self.sla_s - self.margin_s if (self.sla_s > 0 and feasible) else 0.0
        b_budget = batch if self.decode_budget == "batch" else min(max(obs.num_running, 1), cap)
        self.bound = "tpot"
        if not self.control:
            sla_s = 0.0
        elif sla_s > 0 and not acts:
            # even one decode beside the smallest chunk misses the SLA (a CPU host's
            # fixed step cost and per-token prefill cost): no chunk size can hold it,
            # and each extra chunk pays the step's fixed cost again, so prefill
            # throughput drops and queues (TTFT) grow for nothing; the full budget
            # serves more within the SLOs. (At a large batch on a GPU the cap, not
            # the budget, makes room: there the smallest chunk stays.)
            sla_s = 0.0
        elif (sla_s > 0 and self.decode_budget == "running"
              and (obs.num_waiting > 0 or (obs.prefilling > 0 and not self.granule))
              and obs.binding < BINDING_SHARE):
            # requests wait and the cap is not what holds them (it was full on less than
            # half the window's steps): the budget is, and their first tokens are what
            # is at stake. Where the step time grows smoothly with the tokens (no
            # ``granule``: a CPU host), a prompt admitted and part-computed waits for its
            # first token as much as a queued one: sized for the TPOT margin, a long
            # prompt admitted alone came a few dozen tokens a step while the decodes
            # beside it had room. (Where a GPU's step jumps past a GEMM tile, chunks
            # grown for every prompt under way cross the stair the linear fit cannot
            # see, on almost every step of a loaded engine.) The chunks are sized to the TPOT SLO itself, without the
            # margin and the closed-loop bias: holding the mean step below
            # D_SLA - 2 eps_D here makes the waiting requests miss their TTFT to keep a
            # TPOT margin the running ones do not need (docs/results.md, "A step time
            # that drifts"). Where the window's mean step has room below the SLO, the
            # prefilling steps may run past it by what keeps that mean at the SLO
            # (:func:`ttft_step_target`): a request's TPOT averages the steps it
            # decodes in, so the room is spent on first tokens.
            self.bias_s = 0.0
            sla_s = ttft_step_target(self.sla_s, obs.tbt_mean_s, obs.decode_only_tbt_s,
                                     obs.mixed_tbt_s)
            if obs.prefill_residual_s is not None and obs.step_model is model:
                # the chunk is sized on the fit; where the window's prefilling steps ran
                # faster (or slower) than the fit predicts for them, the target moves
                # by that much, so that the chunk is what the steps measured now allow
                # (an online fit's intercept or KV term can over-read a window by as
                # much as the room itself). Never to 0 or below, which would mean no
                # SLA and the full budget: at worst the smallest chunk.
                sla_s = max(sla_s - obs.prefill_residual_s, 1e-6)
            self.bound = "ttft"
        elif sla_s > 0 and self.decode_budget == "running" and obs.tbt_mean_s is not None:
            # close the loop on what a request's TPOT averages, the mean time of the
            # window's decode steps, held to D_SLA - 2 eps_D (sla_s already has one
            # eps_D off): above it the next chunks shrink by the excess (integral
            # action, bounded to [0, sla_s / 2]). Not on the mixed steps alone: they
            # run over the target under load while the mean stays well below it
            # (chunks at the floor, prefill throughput lost, requests queueing past
            # their TTFT). The bias does not go negative: mixed steps past the SLA,
            # even when the mean has room, push the requests decoding in them past
            # their TPOT.
            err = obs.tbt_mean_s - (sla_s - self.margin_s)
            self.bias_s = min(max(self.bias_s + 0.5 * err, 0.0), sla_s / 2)
            sla_s -= self.bias_s
        if sla_s <= 0 or model is None:
            self.bound = "none" if self.control else "line"
        return token_budget(b_budget, self.max_num_batched_tokens, self.min_chunk_tokens,
                            sla_s, model, obs.kv_tokens_resident, granule=self.granule)
