"""The one registry of policy names: ``batch_policy`` and ``queue_policy`` in the config
-> the objects the controller and the engines' queues call. Config validation,
``check-config --explain``, the controller and the simulator all read these tables.

Batch policies (``decide(observation) -> Decision``, built by
:func:`build_batch_policy`):

* ``tuned`` / ``memory`` / ``sla``: seed 000 (:mod:`tuned.policies.batch`): both
  bounds, Algorithm 1 alone, Algorithm 2 alone;
* ``static``: the ceiling (B_max), never moved -- what a hand-set ``max_num_seqs``
  is, run through tuned's scheduler;
* ``trtllm``: TensorRT-LLM's dynamic batch-size tuner
  (:mod:`tuned.policies.trtllm`, ``cpp/tensorrt_llm/executor/dynamicBatchTuner.cpp``);
* ``package.module:Class``: any class built as ``Class(cfg=..., ceiling=...,
  max_num_batched_tokens=..., block_size=..., profile=...)`` with a ``decide``
  method (a custom policy; the fault-injection tests use this).

Every built-in policy decides the cap; with ``token_budget_policy = "sla"``
:func:`build_batch_policy` wraps it in :class:`~tuned.policies.budget.TokenBudget`,
which sizes the per-step token budget for the SLA (a plugin returns its own budget).
Every policy, plugins included, is then wrapped in
:class:`~tuned.policies.damping.CapDamper` (a raise of the cap applies once it has been
wanted for ``cap_raise_hold_s``; a fall at once) and that inside
:class:`~tuned.policies.gpu_memory.GpuMemoryGuard` (GPU memory from NVML lowers the
cap under pressure; without NVML a pass-through), outermost so that its recovery is
not held a second time.
Every policy returns a :class:`~tuned.core.types.Decision`; the controller checks it
(an invalid cap becomes the fallback, see :mod:`tuned.controller`).

Queue policies (:class:`~tuned.core.queue_policy.QueuePolicy` subclasses, built by
:func:`make_policy`): :data:`QUEUE_POLICIES` maps each name to ``module:Class``,
resolved on demand so that reading the names imports no policy module.
"""

from __future__ import annotations

import importlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuned.core.queue_policy import QueuePolicy
from tuned.core.types import Decision, Observation
from tuned.policies.batch import (BatchPolicy, EvidenceSlaBound, Feasibility, MemoryBound,
                                  SlaBound)
from tuned.policies.budget import TokenBudget
from tuned.policies.damping import CapDamper, hold_ticks
from tuned.policies.gpu_memory import GpuMemoryGuard
from tuned.policies.trtllm import TrtllmDynamicBatchTuner

#: the built-in batch policies (``batch_policy``); any other value is a
#: ``package.module:Class`` plugin
BATCH_POLICIES: tuple[str, ...] = ("tuned", "memory", "sla", "trtllm", "static")

#: queue policy name -> "module:Class"
QUEUE_POLICIES: dict[str, str] = {
    "fcfs": "tuned.policies.fcfs:FCFSPolicy",
    "mcsf": "tuned.policies.mcsf:MCSFPolicy",
    "multibin": "tuned.policies.multibin:MultiBinPolicy",
    "bucket": "tuned.policies.bucket:BucketPolicy",
    "saber": "tuned.policies.saber:SaberPolicy",
    "sglang": "tuned.policies.sglang:SglangPolicy",
}


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


class TrtllmPolicy:
    """TensorRT-LLM's dynamic batch-size tuner as a batch policy.

    The source feeds its 128-sample windows with every active request's prompt
    length and ``max_new_tokens`` once per executor iteration; here once per
    controller tick (``Observation.active``), which samples the same population at
    a coarser rate. Capacity is the whole KV pool in blocks over the blocks one
    sequence needs at the averages, snapped by the batch-size table; it has no
    latency input, and its own token budget is ``max_num_batched_tokens`` (the
    source's token tuning is a separate flag, off by default); tuned's
    ``token_budget_policy`` may wrap it like any other policy.
    """

    wants_active = True

    def __init__(self, ceiling: int, max_num_batched_tokens: int, block_size: int) -> None:
        self.tuner = TrtllmDynamicBatchTuner(max_batch_size=ceiling)
        self.ceiling = ceiling
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = block_size

    def decide(self, obs: Observation) -> Decision:
        for prompt, max_new in obs.active:
            self.tuner.observe_request(prompt, max_new)
        cap = min(max(self.tuner.batch_size(obs.kv_capacity_blocks, self.block_size), 1),
                  self.ceiling)
        return Decision(target=cap, lower=1, upper=self.ceiling, cap=cap,
                        batch=min(max(cap, obs.num_running), self.ceiling),
                        token_budget=self.max_num_batched_tokens, reason="trtllm",
                        inputs={"running": obs.num_running, "waiting": obs.num_waiting,
                                "avg_input_tokens": self.tuner.avg_input_len,
                                "avg_output_tokens": self.tuner.avg_output_len,
                                "samples": self.tuner.samples,
                                "kv_capacity_blocks": obs.kv_capacity_blocks})


def load_plugin(spec: str) -> type:
    """The class ``package.module:Class`` names; ``ValueError`` when it cannot be
    imported or is not a policy class (a class with a ``decide`` method): a plain
    function such as ``os:system`` is refused here, before anything calls it."""
    from tuned.inputs import clip, clip_text

    module, _, name = spec.partition(":")
    try:
        obj = getattr(importlib.import_module(module), name)
    except Exception as e:  # ImportError, AttributeError, or whatever its import raises
        raise ValueError(f"batch_policy: cannot load {clip(spec)}: "
                         f"{clip_text(f'{type(e).__name__}: {e}')}") from None
    if not isinstance(obj, type) or not callable(getattr(obj, "decide", None)):
        what = "a class without a decide method" if isinstance(obj, type) else \
            f"a {type(obj).__name__}, not a class"
        raise ValueError(f"batch_policy: {clip(spec)} must name a policy class (with "
                         f"decide(observation) -> Decision), got {what}")
    return obj


def is_builtin(name: str) -> bool:
    return name in BATCH_POLICIES


def build_plugin(spec: str, **kw: Any):
    return load_plugin(spec)(**kw)


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


def build_batch_policy(cfg: Any, *, ceiling: int, max_num_batched_tokens: int,
                       block_size: int, profile: Any = None) -> tuple[Any, str | None]:
    """The batch policy named by ``cfg.batch_policy`` (with its token budget), its
    raises damped (:class:`tuned.policies.damping.CapDamper`, ``cap_raise_hold_s``),
    inside the GPU-memory guard (:class:`tuned.policies.gpu_memory.GpuMemoryGuard`, a
    pass-through without NVML), and the reason of its first decision when the profile
    warm-starts it (else None). ``cfg`` is a validated :class:`tuned.config.Config`
    (with the SLA already derived)."""
    policy, first_reason = _named_policy(cfg, ceiling=ceiling,
                                         max_num_batched_tokens=max_num_batched_tokens,
                                         block_size=block_size, profile=profile)
    damped = CapDamper(policy, hold_ticks=hold_ticks(cfg.cap_raise_hold_s, cfg.interval_s),
                       ceiling=ceiling)
    guard = GpuMemoryGuard(damped, floor=cfg.gpu_memory_floor, b_min=cfg.b_min,
                           ceiling=ceiling)
    return guard, first_reason


def _named_policy(cfg: Any, *, ceiling: int, max_num_batched_tokens: int,
                  block_size: int, profile: Any = None) -> tuple[Any, str | None]:
    """The named policy, a built-in one with its token budget."""
    name = cfg.batch_policy
    if not is_builtin(name):   # a plugin returns its own token budget
        return build_plugin(name, cfg=cfg, ceiling=ceiling,
                            max_num_batched_tokens=max_num_batched_tokens,
                            block_size=block_size, profile=profile), None
    cap_policy, sla, first_reason = _cap_policy(cfg, ceiling=ceiling,
                                                max_num_batched_tokens=max_num_batched_tokens,
                                                block_size=block_size, profile=profile)
    if cfg.token_budget_policy != "sla":
        return cap_policy, first_reason
    paper = cfg.sla_mode == "paper"
    if sla is not None:
        sla_s = sla.sla_s
    else:   # memory alone has no SLA; the other policies take the configured one
        sla_s = cfg.tbt_sla_s if cfg.sla_enabled and name != "memory" else 0.0
    return TokenBudget(cap_policy, max_num_batched_tokens=max_num_batched_tokens,
                       min_chunk_tokens=cfg.min_chunk_tokens, sla_s=sla_s,
                       step_model=profile.step_model() if profile is not None else None,
                       decode_budget="batch" if paper else "running",
                       margin_s=0.0 if paper else cfg.eps_d_s,
                       granule=0 if paper else cfg.token_budget_granule), first_reason


def _cap_policy(cfg: Any, *, ceiling: int, max_num_batched_tokens: int, block_size: int,
                profile: Any) -> tuple[Any, Any, str | None]:
    """The built-in policy that decides the cap, its SLA bound (or None) and the
    reason of its first decision when the profile warm-starts it."""
    b_max = min(cfg.effective_b_max, ceiling)
    name = cfg.batch_policy
    if name == "static":
        return StaticPolicy(b_max, max_num_batched_tokens), None, None
    if name == "trtllm":
        return TrtllmPolicy(ceiling, max_num_batched_tokens, block_size), None, None
    sla = None
    first_reason = None
    paper = cfg.sla_mode == "paper"
    if cfg.sla_enabled and name in ("tuned", "sla"):
        if paper:
            sla = SlaBound(cfg.tbt_sla_s, cfg.eps_d_s, cfg.alpha, cfg.delta, cfg.b_min, b_max)
        else:
            sla = EvidenceSlaBound(cfg.tbt_sla_s, cfg.eps_d_s, cfg.alpha, cfg.delta,
                                   cfg.b_min, b_max, statistic=cfg.sla_statistic,
                                   settle_ticks=settle_ticks(cfg))
        if profile is not None:
            # seed 000's use of Fig. 3: read the batch for the SLA off the curve.
            sla.warm_start(profile.largest_batch_within(cfg.tbt_sla_s, b_max))
            first_reason = "profile_initial"
    memory = (MemoryBound(cfg.eps_m, b_max, cfg.min_demand_samples)
              if name in ("tuned", "memory") else None)
    policy = BatchPolicy(
        ceiling=ceiling, b_min=cfg.b_min, b_max=b_max, memory=memory, sla=sla,
        max_num_batched_tokens=max_num_batched_tokens,
        min_chunk_tokens=cfg.min_chunk_tokens,
        step_model=profile.step_model() if profile is not None else None,
        feasibility=(None if paper or sla is None else
                     Feasibility(cfg.tbt_sla_s, cfg.eps_d_s, cfg.b_min, cfg.alpha,
                                 patience=feasibility_patience(cfg))))
    return policy, sla, first_reason


def policy_class(name: str) -> type[QueuePolicy]:
    """The queue-policy class registered under ``name``; ``ValueError`` lists the known
    names."""
    try:
        target = QUEUE_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r} "
                         f"(known: {', '.join(QUEUE_POLICIES)})") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def make_policy(name: str, options: Mapping[str, Any] | None = None,
                rng_seed: int = 0) -> QueuePolicy:
    """Build the named queue policy from its options, with a seeded RNG (deterministic)."""
    return policy_class(name).from_options(options, rng=random.Random(rng_seed))
