"""Step-time models: how long one engine step takes, given what it carries.

A step clock is the simulator's only source of time. These kinds exist:

* :class:`LinearStepClock`: a fitted T(b, c, kv), evaluated by the control core's
  one step model, :class:`tuned.curves.online.LinearStepModel`: a `tuned profile`
  run's (:class:`ProfileStepModel`, measured on this host, through vLLM) or the one
  `tuned bench --engine vllm` measures before its contenders;
* the GPU-shaped models of :mod:`tuned.sim.gpu`, built from Vidur's per-operator
  timings of Llama-2 on A100 / H100;
* :class:`ConstantStepModel`, Multi-bin batching's unit-time steps.

Every clock implements :class:`StepClock`; the engine describes each step by a
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


class StepClock(Protocol):
    """Seconds one engine step takes. Pure: same shape, same time.

    ``gap_s`` (optional, 0 when absent): engine time between back-to-back steps that
    the step time does not include (vLLM's ``schedule()``, output handling, the
    busy loop). The simulator adds it to the clock before each step but reports
    only ``step_s`` as the step's time, as the vLLM adapter measures it."""

    name: str

    def step_s(self, shape: StepShape) -> float: ...


class LinearStepClock:
    """T(b, c, kv) = ``a + beta*b + gamma*c + eta*kv`` of a
    :class:`~tuned.curves.online.LinearStepModel`, the control core's one step model:
    a profile's fit (:class:`ProfileStepModel`) or the one `tuned bench --engine vllm`
    measures on the engine before its contenders.

    ``b`` is the step's decode count, ``c`` its prefill tokens and ``kv`` the KV
    tokens resident after the step, the same quantities the engine's step records
    hold. Predictions are floored at 0.1 ms: a linear fit can go below zero far
    outside its data. ``gap_s``: the engine's time between steps (see
    :class:`StepClock`).
    """

    MIN_STEP_S = 1e-4

    def __init__(self, model, name: str, gap_s: float = 0.0) -> None:
        self.model = model
        self.name = name
        self._t = model.predict_step_s
        self.gap_s = float(gap_s)

    def step_s(self, shape: StepShape) -> float:
        t = self._t(shape.num_decode, shape.prefill_tokens, shape.kv_tokens)
        return t if t > self.MIN_STEP_S else self.MIN_STEP_S

    def describe(self) -> dict:
        return {"kind": "fit", "fit": self.model.to_dict(), "gap_s": self.gap_s}


class ProfileStepModel(LinearStepClock):
    """The fitted T(b, c, kv) of a `tuned profile` run (measured on this host, through
    vLLM), with the profile's step gap."""

    def __init__(self, profile) -> None:
        self.profile = profile
        st = profile.step_time
        if st is None:
            raise ValueError(f"{profile.source or 'profile'}: no step-time fit (the profile "
                             "has no engine step samples); re-run `tuned profile` against "
                             "tuned serve")
        super().__init__(profile.step_model(), f"profile:{profile.source or 'in-memory'}",
                         profile.step_gap_s)

    def describe(self) -> dict:
        st = self.profile.step_time
        return {"kind": "profile", "source": self.profile.source, "fit": st.to_dict(),
                "gap_s": self.gap_s}


class ConstantStepModel:
    """Every step that decodes takes ``step_s`` and prefill is free: the time model of
    Multi-bin batching (a request's service time is its output length in steps)."""

    def __init__(self, step_s: float = 1.0) -> None:
        self.name = f"constant:{step_s:g}"
        self._t = float(step_s)

    def step_s(self, shape: StepShape) -> float:
        return self._t if shape.num_decode else 0.0

    def describe(self) -> dict:
        return {"kind": "constant", "step_s": self._t}
