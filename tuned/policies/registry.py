"""The one registry of policies: ``batch_policy`` and ``queue_policy`` in the config ->
the objects the controller and the engines' queues call.

Which policies exist, their options, reasons and bench runs are read, without running
their code, by :mod:`tuned.policies.catalog` from each policy module's ``POLICY``
declaration (built-in modules of this package, and third-party modules named by the
``tuned.policies`` entry-point group). This module imports a policy's module only to
build it: adding a policy is adding its module.

Batch policies (``decide(observation) -> Decision``, built by
:func:`build_batch_policy`): the declared ones, and ``package.module:Class``: any class
built as ``Class(cfg=..., ceiling=..., max_num_batched_tokens=..., block_size=...,
profile=...)`` with a ``decide`` method (a custom policy that returns its own token
budget; the fault-injection tests use this).

Every policy is then composed in the wrappers of :data:`WRAPPERS`, innermost first:
the SLA token budget (:class:`~tuned.policies.budget.TokenBudget`, for a declared
policy with ``token_budget_policy = "sla"``), the raise damper
(:class:`~tuned.policies.damping.CapDamper`: a raise of the cap applies once it has
been wanted for ``cap_raise_hold_s``; a fall at once) and the GPU-memory guard
(:class:`~tuned.policies.gpu_memory.GpuMemoryGuard`: NVML's free memory lowers the
cap under pressure; without NVML a pass-through), outermost so that its recovery is
not held a second time. Every policy returns a :class:`~tuned.core.types.Decision`;
the controller checks it (an invalid cap becomes the fallback, see
:mod:`tuned.control.controller`).

Queue policies (:class:`~tuned.core.queue_policy.QueuePolicy` subclasses, built by
:func:`make_policy`).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tuned.core.queue_policy import QueuePolicy
from tuned.policies import catalog
from tuned.policies.batch import feasibility_patience, settle_ticks
from tuned.policies.budget import TokenBudget
from tuned.policies.damping import CapDamper, hold_ticks
from tuned.policies.gpu_memory import GpuMemoryGuard
from tuned.policies.static import StaticPolicy

__all__ = ["WRAPPERS", "StaticPolicy", "build_batch_policy", "feasibility_patience",
           "is_builtin", "load_plugin", "make_policy", "policy_class", "settle_ticks",
           "wants_step_fit"]


def _attr(spec: catalog.PolicySpec) -> Any:
    return getattr(importlib.import_module(spec.module), spec.build)


def load_plugin(spec: str) -> type:
    """The class ``package.module:Class`` names; ``ValueError`` when it cannot be
    imported or is not a policy class (a class with a ``decide`` method): a plain
    function such as ``os:system`` is refused here, before anything calls it."""
    from tuned.base.inputs import clip, clip_text

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
    """A declared batch policy (built in or from an entry point), not a
    ``package.module:Class`` plugin."""
    return catalog.find("batch", name) is not None


def wants_step_fit(name: str) -> bool:
    """Whether the batch policy ``name`` reads the controller's online step model when
    an SLA is set (its declaration's ``step_fit``)."""
    spec = catalog.find("batch", name)
    return spec is not None and spec.step_fit


# ------------------------------------------------------------------ composition

@dataclass(frozen=True)
class Build:
    """What a wrapper sees: the validated config, the engine's sizes, the profile and
    the policy's declaration (None for a ``package.module:Class`` plugin)."""

    cfg: Any
    ceiling: int
    max_num_batched_tokens: int
    block_size: int
    profile: Any
    spec: catalog.PolicySpec | None


@dataclass(frozen=True)
class Wrapper:
    name: str
    applies: Callable[[Build], bool]
    wrap: Callable[[Any, Build], Any]


def _token_budget(policy: Any, b: Build) -> TokenBudget:
    cfg, paper = b.cfg, b.cfg.sla_mode == "paper"
    sla_s = cfg.tbt_sla_s if cfg.sla_enabled and b.spec.budget_sla else 0.0
    # "auto": chunks sized for the SLA where the step time is a staircase in the
    # tokens (a granule, a GPU's GEMM tiles), the full budget where it is a line (a
    # CPU host). On a line a prompt's tokens cost the running requests the same time
    # in one step or in many, so a request's TPOT, the mean of the steps it decodes
    # in, is the same either way, while each extra chunk delays the prompt's first
    # token by a step; the cap holds TPOT there.
    line = cfg.token_budget_policy == "auto" and not paper and not cfg.token_budget_granule
    return TokenBudget(policy, max_num_batched_tokens=b.max_num_batched_tokens,
                       min_chunk_tokens=cfg.min_chunk_tokens, sla_s=sla_s, control=not line,
                       step_model=b.profile.step_model() if b.profile is not None else None,
                       decode_budget="batch" if paper else "running",
                       margin_s=0.0 if paper else cfg.eps_d_s,
                       granule=0 if paper else cfg.token_budget_granule)


#: the wrappers every batch policy is composed in, innermost first
WRAPPERS: tuple[Wrapper, ...] = (
    Wrapper("token_budget",
            lambda b: (b.spec is not None and b.spec.token_budget
                       and b.cfg.token_budget_policy in ("sla", "auto")),
            _token_budget),
    Wrapper("cap_damper", lambda b: True,
            lambda p, b: CapDamper(p, hold_ticks=hold_ticks(b.cfg.cap_raise_hold_s,
                                                            b.cfg.interval_s),
                                   ceiling=b.ceiling)),
    Wrapper("gpu_memory", lambda b: True,
            lambda p, b: GpuMemoryGuard(p, floor=b.cfg.gpu_memory_floor, b_min=b.cfg.b_min,
                                        ceiling=b.ceiling)),
)


def build_batch_policy(cfg: Any, *, ceiling: int, max_num_batched_tokens: int,
                       block_size: int, profile: Any = None) -> tuple[Any, str | None]:
    """The batch policy named by ``cfg.batch_policy`` composed in :data:`WRAPPERS`,
    and the reason of its first decision when the profile warm-starts it (else None).
    ``cfg`` is a validated :class:`tuned.config.Config` (with the SLA already
    derived)."""
    name = cfg.batch_policy
    spec = catalog.find("batch", name)
    sizes = dict(ceiling=ceiling, max_num_batched_tokens=max_num_batched_tokens,
                 block_size=block_size, profile=profile)
    if spec is None:   # a package.module:Class plugin
        policy, first_reason = load_plugin(name)(cfg=cfg, **sizes), None
    else:
        made = _attr(spec)(cfg, options=spec.with_defaults(cfg.batch_options), **sizes)
        policy, first_reason = made if isinstance(made, tuple) else (made, None)
    b = Build(cfg, ceiling, max_num_batched_tokens, block_size, profile, spec)
    for w in WRAPPERS:
        if w.applies(b):
            policy = w.wrap(policy, b)
    return policy, first_reason


# ------------------------------------------------------------------ queue policies

def policy_class(name: str) -> type[QueuePolicy]:
    """The queue-policy class registered under ``name``; ``ValueError`` lists the known
    names."""
    spec = catalog.find("queue", name)
    if spec is None:
        raise ValueError(f"unknown queue policy {name!r} "
                         f"(known: {', '.join(catalog.names('queue'))})")
    return _attr(spec)


def make_policy(name: str, options: Mapping[str, Any] | None = None,
                rng_seed: int = 0) -> QueuePolicy:
    """Build the named queue policy from its options, with a seeded RNG (deterministic)."""
    return policy_class(name).from_options(options, rng=random.Random(rng_seed))


def __getattr__(name: str) -> Any:
    # the name tables, read from the catalog when asked (older imports)
    if name == "BATCH_POLICIES":
        return catalog.names("batch")
    if name == "QUEUE_POLICIES":
        return {s.name: f"{s.module}:{s.build}" for s in catalog.of_kind("queue")}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
