"""Algorithm 1 of Pang et al. (*Optimizing LLM Inference Throughput via Memory-aware
and SLA-constrained Dynamic Batching*) as one of its authors published it: a patch
to vLLM's (v0) scheduler in the public repository ``KevinLee1110/dynamic-batching``
(README only, Apache-2.0; read, not copied). At the top of every scheduling pass,
when requests both wait and run::

    blocks_per_seq = used_blocks / running
    max_num_seqs   = floor(total_blocks × memory_factor / blocks_per_seq)
    max_num_seqs   = min(max(max(max_num_seqs, running), lower), upper)

and the value is kept until the next pass that has both (it starts at the
configured ``max_num_seqs``). Unlike the paper's pseudo-code (each request planned
at its whole E[l_in] + E[l_out] with a CLT safety buffer, tuned's ``memory`` bound
with ``memory_demand = "lifetime"``), it divides by the blocks the running requests
hold *now*, with a constant ``memory_factor`` (the README's example: 0.95) in place
of the buffer, and it runs on every step rather than on a controller tick.

:class:`PatchEngine` is the simulator with that rule in its waiting pass: the cap
used to admit is the patch's value, or the minimum of it and the controller's cap
(Algorithm 2 beside it, b* = min(b_mem, b_SLA)) when the config runs a batch policy.
Bench-only: tuned ships the paper's reading, not this one.
"""

from __future__ import annotations

import math

from tuned.sim.engine import SimEngine, simulate

#: the README's example constant ("can be calculated dynamically or just be a constant
#: (e.g., 0.95)")
MEMORY_FACTOR = 0.95


def patch_max_num_seqs(prev: int, *, total_blocks: int, used_blocks: int, running: int,
                       waiting: int, memory_factor: float = MEMORY_FACTOR,
                       lower: int = 1, upper: int) -> int:
    """The patch's ``max_num_seqs`` for this pass (see the module docstring): ``prev``
    unchanged unless requests both wait and run."""
    if not (waiting and running):
        return prev
    per_seq = used_blocks / running
    new = math.floor(total_blocks * memory_factor / per_seq) if per_seq > 0 else upper
    new = max(new, running)
    return min(max(new, lower), upper)


class PatchEngine(SimEngine):
    """The simulator admitting under the patch's ``max_num_seqs`` (module docstring).

    ``upper``: the patch's ``batch_size_upper`` (default the config's
    ``max_num_seqs``); ``lower`` its ``batch_size_lower``; ``with_controller``: take
    the minimum with the controller's cap (its batch policy, e.g. Algorithm 2);
    without it the controller's cap is ignored, as in the patch alone."""

    def __init__(self, *args, memory_factor: float = MEMORY_FACTOR, lower: int = 1,
                 upper: int | None = None, with_controller: bool = False, **kw) -> None:
        super().__init__(*args, **kw)
        self.memory_factor = float(memory_factor)
        self.lower = int(lower)
        self.upper = int(upper if upper is not None else self.cfg.max_num_seqs)
        self.with_controller = with_controller
        self.patch_cap = int(self.cfg.max_num_seqs)

    def _schedule_waiting(self, budget, scheduled) -> None:
        total = self.num_gpu_blocks - 1
        self.patch_cap = patch_max_num_seqs(
            self.patch_cap, total_blocks=total, used_blocks=total - self.free_blocks,
            running=len(self.running), waiting=len(self.waiting),
            memory_factor=self.memory_factor, lower=self.lower, upper=self.upper)
        ctrl = self.cap
        self.cap = min(ctrl, self.patch_cap) if self.with_controller else self.patch_cap
        try:
            super()._schedule_waiting(budget, scheduled)
        finally:
            self.cap = ctrl


def simulate_patch(cfg, hardware, requests, **kw):
    """:func:`tuned.sim.engine.simulate` on a :class:`PatchEngine` (``kw``: the
    engine's options, e.g. ``with_controller``, ``record_steps``)."""
    return simulate(cfg, hardware, requests, engine_cls=PatchEngine, **kw)
