"""The types every floor speaks: what the controller observed, what it decided, and
the step-time model its rules read. Plain data; no engine, thread or I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class GpuMemory(NamedTuple):
    """One GPU's memory as NVML reports it (or the simulator's stand-in for NVML)."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class Observation:
    """What the controller saw over its window (all numbers, no engine objects)."""

    num_running: int                 # N^d: requests running (decoding or mid-prefill)
    num_waiting: int                 # N^p: requests waiting for admission (prefill pending)
    kv_capacity_blocks: int          # n: KV blocks the cache holds for requests
    demand_mean: float | None        # mean KV blocks of recent finished requests: held at a
                                     # random decode step, or l_in + l_out (memory_demand)
    demand_std: float | None         # its standard deviation (Pang et al. eq. 9)
    demand_samples: int              # how many finished requests the two numbers come from
    tbt_mean_s: float | None         # T: mean step time of recent steps that ran decodes
    decode_batch_mean: float | None  # b-bar: mean decode batch of those steps
    kv_usage: float = 0.0
    active: tuple = ()               # (prompt tokens, max tokens) of running requests,
                                     # read only for policies that ask (wants_active)
    tbt_p90_s: float | None = None   # 90th percentile of those step times
    decode_only_tbt_s: float | None = None  # mean step time of decode steps without prefill
    decode_only_p90_s: float | None = None  # their 90th percentile
    binding: float = 0.0             # share of the window's steps that ended with requests
                                     # waiting while the cap was full (the cap was binding)
    kv_tokens_resident: int = 0      # KV tokens held by running requests (newest step)
    step_model: object = None        # T(b, c, kv) fitted online on the step ring, or None
    mixed_tbt_s: float | None = None # mean time of the window's decode steps with prefill
    gpu_free_fraction: float | None = None  # device free memory over total (NVML), the
                                     # lowest over visible GPUs; None without NVML
    prefill_residual_s: float | None = None  # the window's prefilling steps' time over
                                     # step_model's prediction for them (mean)
    finished_tpot_s: tuple = ()      # TPOT of each request that finished since the last
                                     # tick having decoded mostly at a binding cap
                                     # (two output tokens or more), oldest first
    oldest_wait_s: float | None = None  # how long the longest-waiting request has waited
                                     # for admission (None: nothing waits, or unknown)
    prefilling: int = 0              # running requests still without a first token (a
                                     # chunked prefill under way): admitted, not waiting
    held: tuple | None = None        # admissions held since the last tick, by who held
                                     # them ((reason, n), ...; tuned.core.admission.
                                     # holds_between); None: unknown (vLLM's own queue)

    def waits_at_full(self, cap: int) -> bool:
        """Requests wait now with ``cap`` or more running: the cap holds them back at
        this tick, whatever the window's share of such steps says."""
        return self.num_waiting > 0 and self.num_running >= cap


@dataclass(frozen=True)
class Decision:
    """A recommendation: target with bounds, the cap to apply, and why."""

    target: int         # b* = min(b_mem, b_SLA)
    lower: int
    upper: int
    cap: int            # admission gate applied in vLLM: b* clamped to [B_min, ceiling]
    batch: int          # the paper's b_t: max(cap, running decodes), at most the ceiling
    token_budget: int
    reason: str
    b_mem: int | None = None
    b_sla: int | None = None
    inputs: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"target": self.target, "lower": self.lower, "upper": self.upper,
                "cap": self.cap, "batch": self.batch, "token_budget": self.token_budget,
                "reason": self.reason,
                "b_mem": self.b_mem, "b_sla": self.b_sla, "inputs": dict(self.inputs)}



class StepModel(Protocol):
    """The engine's step time T(b, c, kv) = a + beta*b + gamma*c + eta*kv as the control
    core reads it (Pang et al.'s PD fusion, with a KV term): ``b`` decodes, ``c`` prefill
    tokens and ``kv`` resident KV tokens in one step. The token-budget rule asks for the
    largest prefill chunk that keeps a step within the SLA; the admission guard reads
    the per-decode and per-prefill-token costs. One implementation:
    :class:`tuned.curves.online.LinearStepModel` (fitted offline by `tuned profile` or
    online on the step ring). The simulator's clock (:mod:`tuned.sim.stepmodel`) is
    another thing: it times a whole step shape, GPU operators included."""

    beta: float
    gamma: float
    eta: float

    def predict_step_s(self, b: float, c: float = 0.0, kv_tokens: float = 0.0) -> float: ...

    def largest_chunk_within(self, b: int, tbt_s: float, lo: int, hi: int,
                             kv_tokens: float = 0.0) -> int: ...

    def largest_batch_within(self, tbt_s: float, b_max: int, kv_tokens_per_seq: float = 0.0,
                             chunk_tokens: float = 0.0) -> int: ...


__all__ = ["Decision", "GpuMemory", "Observation", "StepModel"]
