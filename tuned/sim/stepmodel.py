"""Step-time models: how long one engine step takes, given what it carries.

A step-time model is the simulator's only source of time. Two kinds exist:

* :class:`ProfileStepModel`: the fitted T(b, c, kv) of a `tuned profile` run
  (measured on this host, through vLLM), and
* the GPU-shaped models of :mod:`tuned.sim.gpu`, built from Vidur's per-operator
  timings of Llama-2 on A100 / H100.

Every model implements :class:`StepTimeModel`; the engine describes each step by a
:class:`StepShape`.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol


class StepShape(NamedTuple):
    """What one engine step computes.

    ``num_decode``: requests that decode one token; ``decode_context_tokens``: the
    KV tokens those decodes attend to (sum of their context lengths, the new token
    excluded); ``prefill_tokens``: prompt tokens computed this step over all
    prefill chunks; ``num_prefill_reqs``: how many chunks; ``prefill_attn_pairs``:
    query-key pairs of the prefill chunks, sum over chunks of c * (p + (c + 1) / 2)
    for a chunk of c tokens after p tokens already computed (causal attention);
    ``kv_tokens``: KV tokens resident in running requests after the step.
    """

    num_decode: int
    decode_context_tokens: int
    prefill_tokens: int
    num_prefill_reqs: int
    prefill_attn_pairs: float
    kv_tokens: int


class StepTimeModel(Protocol):
    """Seconds one engine step takes. Pure: same shape, same time."""

    name: str

    def step_s(self, shape: StepShape) -> float: ...
