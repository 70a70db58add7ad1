"""The Section 5.2 baselines of Jaillet et al., shared by the paper's
discrete-time model (:mod:`tuned.bench.papers.mcsf`) and the simulator's Table 1
(:mod:`tuned.bench.papers.mcsf_table1`), so that each rule has one implementation.

* :class:`ArrivalOrderMCSF`: MC-Benchmark (Appendix C, Algorithm 2), the shipped
  MC-SF check with candidates in arrival order.
* :class:`AlphaProtectionPolicy`: the admission rule of the α-protection greedy and
  α-protection β-clearing baselines: new prompts first-come first-served, admitted
  while "adding a new prompt i with initial memory s_i + 1" keeps the batch's
  memory within (1 − α)M; the first that does not fit ends the round.
* :func:`clear_on_overflow`: what both do when the KV cache overflows: greedy
  (β = 1) clears every running request, β-clearing each one independently with
  probability β.

The batch's memory after this round is Σ_{running} (s_j + g_j + 1) + Σ_{admitted}
(s_j + 1) (g_j: tokens generated so far), counted as MC-SF counts it: in the
allocator's blocks, a request holding h tokens holding ceil(h / block_size) (one
token per block in the paper's model, so there it is the paper's token count), and
M = the cache's blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from tuned.policies.mcsf import MCSFPolicy
from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict

T = TypeVar("T")


class ArrivalOrderMCSF(MCSFPolicy):
    """MC-Benchmark: the shipped MC-SF admission check with candidates in arrival order."""

    name = "mc-benchmark"

    def order_key(self, info: ReqInfo) -> tuple[float]:
        return (info.arrival_s,)

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        return sorted(waiting, key=self.order_key)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class AlphaProtectionPolicy(QueuePolicy):
    """α-protection admission (Section 5.2): arrival order, a prompt joins while the
    batch's memory after this round stays within (1 − α)M (see the module docstring)."""

    name = "alpha-protection"
    uses_running_progress = True

    def __init__(self, *, alpha: float, rng=None) -> None:
        super().__init__(rng=rng)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) \
                or not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha-protection: alpha must be in [0, 1), got {alpha!r}")
        self.alpha = float(alpha)

    def memory_limit_blocks(self, ctx: AdmitContext) -> int:
        """(1 − α)M in blocks, rounded down (memory is whole blocks)."""
        return int(ctx.kv_capacity_tokens // max(ctx.block_size, 1) * (1.0 - self.alpha))

    def order_key(self, info: ReqInfo) -> tuple[float]:
        return (info.arrival_s,)

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        return sorted(waiting, key=self.order_key)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        bs = max(ctx.block_size, 1)
        need = sum(_blocks(r.prompt_tokens + r.output_tokens + 1, bs) for r in running)
        need += sum(_blocks(r.prompt_tokens + 1, bs) for r in admitted_this_step)
        need += _blocks(candidate.prompt_tokens + 1, bs)
        limit = self.memory_limit_blocks(ctx)
        unit = "blocks" if bs > 1 else "tokens"
        if need <= limit:
            return Verdict(True, f"alpha-protection: {need} <= (1 - {self.alpha:g})M = "
                                 f"{limit} {unit}")
        return Verdict(False, f"alpha-protection: {need} > (1 - {self.alpha:g})M = "
                              f"{limit} {unit}")


class _Uniform(Protocol):
    def random(self) -> float: ...


def clear_on_overflow(running: Sequence[T], beta: float, rng: _Uniform | None) -> list[T]:
    """The running requests an overflow clears: all of them for greedy (β = 1), else
    each independently with probability β (one ``rng.random()`` draw per request,
    in running order)."""
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1], got {beta!r}")
    if beta >= 1.0:
        return list(running)
    if rng is None:
        raise ValueError("beta-clearing needs an rng")
    return [r for r in running if rng.random() < beta]


#: (label, α, β) of the Section 5.2 baselines, as Table 1 names them; β = 1 is greedy.
BASELINES: tuple[tuple[str, float, float], ...] = (
    ("greedy a=0.3", 0.3, 1.0),
    ("greedy a=0.25", 0.25, 1.0),
    ("clear a=0.2 b=0.2", 0.2, 0.2),
    ("clear a=0.2 b=0.1", 0.2, 0.1),
    ("clear a=0.1 b=0.2", 0.1, 0.2),
    ("clear a=0.1 b=0.1", 0.1, 0.1),
)


__all__ = ["AlphaProtectionPolicy", "ArrivalOrderMCSF", "BASELINES", "clear_on_overflow"]
