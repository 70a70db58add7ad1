"""Batch policies the bench's ablations need and the config cannot name.

``tuned-budget-only`` holds the cap at the ceiling, as a static cap does, and moves
only the token budget, as tuned does. The built-in ``static`` policy gives the full
budget and tuned's own policy moves the cap, so this wraps tuned's policy
(:func:`tuned.policies.registry.build_batch_policy` with ``batch_policy = "sla"``)
with its lowest batch raised to its highest: every decision's cap is the ceiling,
and the token budget is the one tuned's policy computes for that cap. The SLA's
feasibility is still judged at the config's ``b_min``, as tuned judges it.

It asks the controller for the online step model (``wants_step_fit``), which the
controller otherwise fits for the built-in ``tuned`` and ``sla`` policies only.

Loaded by name as a batch-policy plugin (``batch_policy =
"tuned.bench.ablations:FixedCapBudget"``), so the simulator and a real server build
it the same way. It imports only the policy registry.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tuned.policies.registry import build_batch_policy

#: the plugin name of :class:`FixedCapBudget` in a config
FIXED_CAP_BUDGET = "tuned.bench.ablations:FixedCapBudget"


class FixedCapBudget:
    """tuned's token budget at a cap fixed at the ceiling (B_max)."""

    wants_active = False
    wants_step_fit = True     # the controller's online step model, as tuned's policy reads

    def __init__(self, *, cfg: Any, ceiling: int, max_num_batched_tokens: int,
                 block_size: int, profile: Any = None) -> None:
        inner = dataclasses.replace(cfg, batch_policy="sla")
        self.policy, _ = build_batch_policy(inner, ceiling=ceiling,
                                            max_num_batched_tokens=max_num_batched_tokens,
                                            block_size=block_size, profile=profile)
        # the cap is max(target, b_min) capped at the ceiling: b_min = b_max pins it
        self.policy.b_min = self.policy.b_max

    def decide(self, obs):
        return self.policy.decide(obs)
