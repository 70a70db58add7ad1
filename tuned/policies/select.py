"""The batch-policy registry: ``batch_policy`` in the config -> the object the
controller's decide step calls, ``decide(observation) -> Decision``.

* ``tuned`` / ``memory`` / ``sla``: seed 000 (:mod:`tuned.policies.batch`): both
  bounds, Algorithm 1 alone, Algorithm 2 alone;
* ``static``: the ceiling (B_max), never moved -- what a hand-set ``max_num_seqs``
  is, run through tuned's scheduler;
* ``trtllm``: TensorRT-LLM's dynamic batch-size tuner
  (:mod:`tuned.policies.trtllm`, ``cpp/tensorrt_llm/executor/dynamicBatchTuner.cpp``);
* ``package.module:Class``: any class built as ``Class(cfg=..., ceiling=...,
  max_num_batched_tokens=..., block_size=..., profile=...)`` with a ``decide``
  method (a custom policy; the fault-injection tests use this).

Every policy returns a :class:`~tuned.policies.batch.Decision`; the controller
checks it (an invalid cap becomes the fallback, see :mod:`tuned.controller`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from tuned.policies.batch import Decision, Observation
from tuned.policies.trtllm import TrtllmDynamicBatchTuner


@dataclass
class StaticPolicy:
    """A fixed cap (B_max) and the full token budget: static batching's hand-set cap."""

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
    latency input, and the token budget stays at ``max_num_batched_tokens`` (the
    source's token tuning is a separate flag, off by default).
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
    return name in ("tuned", "memory", "sla", "trtllm", "static")


def build_plugin(spec: str, **kw: Any):
    return load_plugin(spec)(**kw)
