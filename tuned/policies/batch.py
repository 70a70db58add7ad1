"""Batch-size decisions from Pang et al. (Pang, Li, Wang: *Optimizing LLM Inference
Throughput via Memory-aware and SLA-constrained Dynamic Batching*).

This module is their combination and its declaration as the named policies
``tuned``, ``memory`` and ``sla``; Algorithm 1 is :mod:`tuned.policies.memory_bound`,
Algorithm 2 (with tuned's evidence-based search and feasibility check)
:mod:`tuned.policies.sla_bound`.

Pure functions and small state holders: no vLLM, NVML or threads. The controller
feeds them an :class:`Observation` and gets back a :class:`Decision` carrying the
target, its bounds and the reason.

* :class:`~tuned.policies.memory_bound.MemoryBound` is Algorithm 1 (memory-constrained dynamic batching).
* :class:`~tuned.policies.sla_bound.SlaBound` is Algorithm 2 (SLA-constrained dynamic batching).
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
from dataclasses import dataclass
from typing import Any

from tuned.core.types import Decision, Observation, StepModel
from tuned.policies.memory_bound import MemoryBound
from tuned.policies.sla_bound import EvidenceSlaBound, Feasibility, SlaBound, lift_target


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
                      and cfg.late_queue_mode in ("lift", "lift_tpot") else 0.0),
        late_to_tpot=cfg.late_queue_mode == "lift_tpot",
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
