"""``batch_policy = "static"``: a fixed cap (B_max), never moved -- what a hand-set
``max_num_seqs`` is, run through tuned's scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuned.core.types import Decision, Observation


@dataclass
class StaticPolicy:
    """A fixed cap (B_max): static batching's hand-set cap. Its token budget is the
    full one, unless a :class:`~tuned.policies.budget.TokenBudget` wraps it
    (``token_budget_policy = "sla"`` with an SLA set)."""

    cap: int
    max_num_batched_tokens: int
    wants_active = False

    def decide(self, obs: Observation) -> Decision:
        return Decision(target=self.cap, lower=self.cap, upper=self.cap, cap=self.cap,
                        batch=max(self.cap, obs.num_running), token_budget=self.max_num_batched_tokens,
                        reason="static", inputs={"running": obs.num_running,
                                                 "waiting": obs.num_waiting})


def build(cfg: Any, *, ceiling: int, max_num_batched_tokens: int, **_: Any) -> StaticPolicy:
    return StaticPolicy(min(cfg.effective_b_max, ceiling), max_num_batched_tokens)


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "static", "kind": "batch", "build": "build", "order": 50,
    "summary": "the ceiling, never moved",
    "reasons": {"static": "batch_policy = static: the ceiling, never moved"},
}
