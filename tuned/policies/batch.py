"""Batch-size decisions from seed 000 (Pang, Li, Wang: *Optimizing LLM Inference
Throughput via Memory-aware and SLA-constrained Dynamic Batching*).

Pure functions and small state holders: no vLLM, NVML or threads. The controller
feeds them an :class:`Observation` and gets back a :class:`Decision` carrying the
target, its bounds and the reason.

* :class:`MemoryBound` is Algorithm 1 (memory-constrained dynamic batching).
* :class:`SlaBound` is Algorithm 2 (SLA-constrained dynamic batching).
* :class:`BatchPolicy` combines them as the paper does, b* = min(b_mem, b_SLA),
  clamped to [B_min, ceiling]; the batch size it reports, b_t, is never below the
  running decodes (Alg. 1 line 6, Alg. 2 line 15).
* :func:`token_budget` is the per-step token budget (the paper's adaptive chunk
  size under PD fusion), from a profile's step-time model when one is given.

Where continuous batching differs from the paper's model (noted per class): the
paper reasons about a batch of b requests each holding l_in + l_out tokens for its
whole life; vLLM admits and retires requests every step, so a running request holds
only l_in + (tokens so far). Using the full l_in + l_out per request, as the paper
does, is therefore conservative by about l_out/2 per request; we keep the paper's
rule and let the overflow probability eps_M absorb the rest.

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
import sys
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Protocol


@dataclass(frozen=True)
class Observation:
    """What the controller saw over its window (all numbers, no engine objects)."""

    num_running: int                 # N^d: requests running (decoding or mid-prefill)
    num_waiting: int                 # N^p: requests waiting for admission (prefill pending)
    kv_capacity_blocks: int          # n: KV blocks the cache holds for requests
    demand_mean: float | None        # mean KV blocks a finished request held (l_in + l_out)
    demand_std: float | None         # its standard deviation (seed 000 eq. 9)
    demand_samples: int              # how many finished requests the two numbers come from
    tbt_mean_s: float | None         # T: mean step time of recent steps that ran decodes
    decode_batch_mean: float | None  # b-bar: mean decode batch of those steps
    kv_usage: float = 0.0
    active: tuple = ()               # (prompt tokens, max tokens) of running requests,
                                     # read only for policies that ask (wants_active)


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


def clt_theta(eps_m: float) -> float:
    """theta = Phi^-1(1 - eps_M), the one-sided normal quantile (seed 000, eq. 12)."""
    if not 0.0 < eps_m < 1.0:
        raise ValueError(f"eps_m must be in (0, 1), got {eps_m}")
    return NormalDist().inv_cdf(1.0 - eps_m)


def memory_batch_limit(n_tokens: float, mean: float, std: float, theta: float) -> tuple[int, float]:
    """Largest b with b*mu + theta*sqrt(b)*sigma <= n, and the safety buffer L0.

    Seed 000 eqs. (8)-(14): S = sum of b i.i.d. demands, mu_S = b*mu,
    sigma_S = sqrt(b)*sigma; P(S > n) <= eps_M under the CLT gives
        sqrt(b) = (-theta*sigma + sqrt(theta^2 sigma^2 + 4 mu n)) / (2 mu)   (12)
    and the buffer L0 = theta*sigma_S at that b, so that Algorithm 1 line 5 reads
        b = floor((n - L0) / (E[l_in] + E[l_out])).                         (14)
    For theta*sigma >= 0, (12) is evaluated in its rationalised form
        sqrt(b) = 2n / (theta*sigma + sqrt(theta^2 sigma^2 + 4 mu n)),
    which cannot go negative by cancellation when theta*sigma dwarfs mu*n.
    Non-finite inputs, mean <= 0 and sigma < 0 raise ``ValueError``.
    """
    for name, v in (("n_tokens", n_tokens), ("mean demand", mean), ("demand std", std),
                    ("theta", theta)):
        if not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    if mean <= 0:
        raise ValueError(f"mean demand must be > 0, got {mean}")
    if std < 0:
        raise ValueError(f"demand std must be >= 0, got {std}")
    if n_tokens <= 0:
        return 0, 0.0
    ts = theta * std
    disc = math.hypot(ts, 2.0 * math.sqrt(mean) * math.sqrt(n_tokens))  # no overflow
    root_b = 2.0 * n_tokens / (ts + disc) if ts >= 0 else (disc - ts) / (2.0 * mean)
    l0 = ts * root_b
    # 1e-9 guards the floor against the float error of the round trip through (12);
    # a quotient beyond float range (mean near 0) is capped, the caller caps b anyway.
    q = min((n_tokens - l0) / mean + 1e-9, sys.float_info.max)
    return max(0, math.floor(q)), l0


def _usable_demand(obs: Observation) -> bool:
    """A demand estimate Algorithm 1 can use: finite mean > 0, finite std >= 0 (or none)."""
    mean, std = obs.demand_mean, obs.demand_std
    return (mean is not None and math.isfinite(mean) and mean > 0
            and (std is None or (math.isfinite(std) and std >= 0)))


class MemoryBound:
    """Seed 000, Algorithm 1: memory-constrained dynamic batching.

    State: the previous batch size b_{t-1} (starts at B_max, what static batching
    would run). Each tick, only when requests are both waiting (N^p > 0) and running
    (N^d > 0), b_t = floor((n - L0) / (E[l_in] + E[l_out])); otherwise b_t = b_{t-1}.
    Line 6, b_t = min(max(b_t, N^d), B_max), is applied by :class:`BatchPolicy` to the
    reported batch size; the bound returned (and kept as b_{t-1}) is capped at B_max
    only (see the module docstring for why the floor must not reach vLLM's gate).

    Units are KV blocks, as the paper suggests for vLLM ("our algorithm can be
    implemented using blocks rather than relying on the number of tokens"): n is
    the blocks the cache holds for requests, and a request's demand is
    ceil((l_in + l_out) / block_size), what vLLM's paged allocator actually gives it.
    With 16-token GPU blocks this is close to the token count; with the CPU
    build's 128-token blocks a token count would over-admit several-fold. Until
    ``min_samples`` requests have finished there is no demand estimate and the bound
    stays at its previous value (reason ``memory_no_data``); so it does while the
    estimate is unusable (a non-finite or non-positive mean, a non-finite or negative
    standard deviation).
    """

    def __init__(self, eps_m: float, b_max: int, min_samples: int = 8):
        self.theta = clt_theta(eps_m)
        self.b_max = b_max
        self.min_samples = min_samples
        self.prev = b_max
        self.last_l0 = 0.0

    def update(self, obs: Observation) -> tuple[int, str]:
        if obs.demand_samples < self.min_samples or not _usable_demand(obs):
            reason = "memory_no_data"
            b = self.prev
        elif obs.num_waiting > 0 and obs.num_running > 0:
            b, self.last_l0 = memory_batch_limit(
                obs.kv_capacity_blocks, obs.demand_mean, obs.demand_std or 0.0, self.theta)
            reason = "memory"
        else:
            reason = "hold_no_queue"
            b = self.prev
        b = min(b, self.b_max)
        self.prev = b
        return b, reason


class SlaBound:
    """Seed 000, Algorithm 2: SLA-constrained dynamic batching (TBT binary search).

    Keeps a search interval [b_low, b_high] within [B_min, B_max]. Each tick, with
    T the recent mean decode latency and b-bar the recent mean decode batch:
      T > D_SLA + eps_D:  b_high <- max(b-bar, b_low + alpha); b_low <- max(b_low - delta, B_min)
      T < D_SLA - eps_D:  b_low <- min(b-bar, b_high - alpha); b_high <- min(b_high + delta, B_max)
      otherwise:          b_high <- min(b-bar + ceil(alpha/2), B_max); b_low <- max(b-bar - floor(alpha/2), B_min)
      b_t = floor((b_low + b_high) / 2)
    Line 15's b_t = min(max(b_t, N^d), B_max) is applied by :class:`BatchPolicy` to
    the reported batch size, not to the admission gate (module docstring). b-bar is
    rounded to the nearest integer (the paper treats it as one). The paper
    leaves implicit that the interval stays inside [B_min, B_max] and ordered; we
    clamp both ends so, which changes nothing when the paper's updates already hold.
    With no decode step in the window (idle engine), or a non-finite T or b-bar, the
    interval is kept (reason ``initial``).
    """

    def __init__(self, sla_s: float, eps_s: float, alpha: int, delta: int,
                 b_min: int, b_max: int):
        self.sla_s = sla_s
        self.eps_s = eps_s
        self.alpha = alpha
        self.delta = delta
        self.b_min = b_min
        self.b_max = b_max
        self.low = b_min
        self.high = b_max

    def warm_start(self, b: int) -> None:
        """Centre the interval on a prediction (e.g. a profile's b for the SLA)."""
        b = min(max(b, self.b_min), self.b_max)
        self.low = self.high = b

    def update(self, obs: Observation) -> tuple[int, str]:
        t, bbar = obs.tbt_mean_s, obs.decode_batch_mean
        # a NaN or infinite mean (a broken clock, an empty window divided) is no
        # measurement: keep the interval, as with an idle engine
        if t is None or bbar is None or not (math.isfinite(t) and math.isfinite(bbar)):
            reason = "initial"
        else:
            bb = int(math.floor(bbar + 0.5))
            if t > self.sla_s + self.eps_s:
                self.high = max(bb, self.low + self.alpha)
                self.low = max(self.low - self.delta, self.b_min)
                reason = "sla_over"
            elif t < self.sla_s - self.eps_s:
                self.low = min(bb, self.high - self.alpha)
                self.high = min(self.high + self.delta, self.b_max)
                reason = "sla_under"
            else:
                self.high = min(bb + math.ceil(self.alpha / 2), self.b_max)
                self.low = max(bb - self.alpha // 2, self.b_min)
                reason = "sla_hold"
        self.low = min(max(self.low, self.b_min), self.b_max)
        self.high = min(max(self.high, self.low), self.b_max)
        return (self.low + self.high) // 2, reason


class StepTimeModel(Protocol):
    def largest_chunk_within(self, b: int, tbt_s: float, lo: int, hi: int) -> int: ...


def token_budget(batch: int, max_num_batched_tokens: int, min_chunk_tokens: int,
                 sla_s: float = 0.0, step_model: StepTimeModel | None = None) -> int:
    """Tokens the scheduler may put in one step (vLLM's ``max_num_scheduled_tokens``).

    Seed 000's PD-fusion variant picks the chunk size so a mixed step still meets
    the TBT SLA: with a step-time model T(b, c) the chunk is the largest c with
    T(b, c) <= D_SLA at the decode batch b, and the budget is b decode tokens plus
    that chunk. Always clamped to [b + min_chunk_tokens, max_num_batched_tokens] so
    running decodes plus at least one prefill chunk fit (less would starve them).
    """
    cap = batch
    lo = cap + min_chunk_tokens
    hi = max_num_batched_tokens
    if lo >= hi:
        return hi
    if step_model is None or sla_s <= 0:
        return hi
    chunk = step_model.largest_chunk_within(cap, sla_s, min_chunk_tokens, hi - cap)
    return min(max(cap + chunk, lo), hi)


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
    step_model: StepTimeModel | None = None

    wants_active = False

    def decide(self, obs: Observation) -> Decision:
        if self.memory is not None:
            b_mem, mem_reason = self.memory.update(obs)
        else:
            b_mem, mem_reason = self.b_max, "no_memory_bound"
        if self.sla is not None:
            b_sla, sla_reason = self.sla.update(obs)
            lower, upper = self.sla.low, min(self.sla.high, b_mem)
        else:
            b_sla, sla_reason = None, ""
            lower, upper = self.b_min, b_mem
        if b_sla is not None and b_sla < b_mem:
            target, reason = b_sla, sla_reason
        else:
            target, reason = b_mem, mem_reason
        cap = min(max(target, self.b_min), self.ceiling)
        # Alg. 1 line 6 / Alg. 2 line 15: the batch never drops below the running
        # decodes; they drain to the gate (cap) as they finish.
        batch = min(max(cap, obs.num_running), self.ceiling)
        lower = min(lower, upper)
        budget = token_budget(batch, self.max_num_batched_tokens, self.min_chunk_tokens,
                              self.sla.sla_s if self.sla else 0.0, self.step_model)
        inputs = _inputs(obs, self)
        inputs["draining"] = obs.num_running > cap
        return Decision(target=target, lower=lower, upper=upper, cap=cap, batch=batch,
                        token_budget=budget, reason=reason, b_mem=b_mem, b_sla=b_sla,
                        inputs=inputs)


def _inputs(obs: Observation, pol: BatchPolicy) -> dict:
    d = {"running": obs.num_running, "waiting": obs.num_waiting,
         "kv_capacity_blocks": obs.kv_capacity_blocks, "kv_usage": round(obs.kv_usage, 4),
         "demand_mean_blocks": obs.demand_mean, "demand_std_blocks": obs.demand_std,
         "demand_samples": obs.demand_samples, "tbt_mean_s": obs.tbt_mean_s,
         "decode_batch_mean": obs.decode_batch_mean,
         "safety_buffer_blocks": round(pol.memory.last_l0, 2) if pol.memory else None}
    if pol.sla is not None:
        d["sla_s"] = pol.sla.sla_s
        d["search"] = [pol.sla.low, pol.sla.high]
    return d
