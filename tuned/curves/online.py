"""The step-time model T(b, c, kv) = a + beta*b + gamma*c + eta*kv, and its online fit.

One implementation serves both sources of the model: a `tuned profile` fit (offline,
:meth:`tuned.curves.profile.Profile.step_model`) and a small least-squares fit
refreshed every few seconds from the engine's own step ring
(:func:`fit_recent_steps`), for engines that run without a profile or on a host
the profile was not made on. ``b`` is the number of decodes in a step, ``c`` its
prefill tokens and ``kv`` the KV tokens resident (read by attention).

A profile with no step samples to fit (a plain vLLM endpoint, schema 1) times a step
by its speed curve instead, T(b) = 1 / v(b): :class:`SpeedStepModel`, with the same
three questions answered (this is the only other step-time model).

Both are fitted by the one fitter, :func:`tuned.curves.fit.fit_step_time`: by
ordinary least squares for a profile, non-negative (``method="nnls"``) online.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuned.curves.fit import FitError, fit_step_time


@dataclass(frozen=True)
class LinearStepModel:
    """T(b, c, kv) in seconds; see the module docstring."""

    a: float
    beta: float
    gamma: float
    eta: float = 0.0
    r2: float | None = None
    n_samples: int = 0
    source: str = ""

    def predict_step_s(self, b: float, c: float = 0.0, kv_tokens: float = 0.0) -> float:
        return self.a + self.beta * b + self.gamma * c + self.eta * kv_tokens

    def largest_chunk_within(self, b: int, tbt_s: float, lo: int, hi: int,
                             kv_tokens: float = 0.0) -> int:
        """Largest prefill chunk c in [lo, hi] with T(b, c, kv) <= tbt_s (the chunk's
        own tokens join the KV), ``lo`` if none fits, ``hi`` if all do."""
        lo, hi = int(lo), int(hi)
        if hi < lo:
            raise ValueError(f"largest_chunk_within: lo ({lo}) > hi ({hi})")
        room = tbt_s - self.predict_step_s(b, 0.0, kv_tokens)
        per_token = self.gamma + self.eta
        if per_token <= 0:
            return hi if room >= 0 else lo
        c = math.floor(room / per_token) if math.isfinite(room) else lo
        return min(max(c, lo), hi)

    def largest_batch_within(self, tbt_s: float, b_max: int, kv_tokens_per_seq: float = 0.0,
                             chunk_tokens: float = 0.0) -> int:
        """Largest b in [1, b_max] with T(b, chunk, b * kv_per_seq) <= tbt_s; 0 if even
        b = 1 does not fit (the SLA is infeasible on this model)."""
        per_seq = self.beta + self.eta * kv_tokens_per_seq
        room = tbt_s - self.a - self.gamma * chunk_tokens
        if room < per_seq:
            return 0
        if per_seq <= 0:
            return int(b_max)
        return int(min(math.floor(room / per_seq), b_max))

    @classmethod
    def from_fit(cls, fit, source: str) -> "LinearStepModel":
        """The model a step-time :class:`~tuned.curves.fit.FitResult` describes (its KV
        term only when the fit kept it)."""
        p = fit.params
        return cls(p["a"], p["beta"], p["gamma"],
                   p.get("eta", 0.0) if fit.name == "step_time_kv" else 0.0,
                   fit.r2, fit.n_samples, source)

    def to_dict(self) -> dict:
        return {"a": self.a, "beta": self.beta, "gamma": self.gamma, "eta": self.eta,
                "r2": self.r2, "n_samples": self.n_samples, "source": self.source}


class SpeedStepModel:
    """T(b) = 1 / v(b): the time per token of one request at load ``b`` from a speed
    curve ``speed_tok_s(n)``; it ignores ``c`` and ``kv``. See the module docstring."""

    def __init__(self, speed_tok_s: Callable[[int], float]) -> None:
        self.speed_tok_s = speed_tok_s

    def predict_step_s(self, b: float, c: float = 0.0, kv_tokens: float = 0.0) -> float:
        v = self.speed_tok_s(max(int(b), 1))
        return 1.0 / v if v > 0 else math.inf

    def largest_chunk_within(self, b: int, tbt_s: float, lo: int, hi: int,
                             kv_tokens: float = 0.0) -> int:
        """The step time does not depend on c: ``hi`` if T(b) fits, else ``lo``."""
        if int(hi) < int(lo):
            raise ValueError(f"largest_chunk_within: lo ({lo}) > hi ({hi})")
        return int(hi) if self.predict_step_s(b) <= tbt_s else int(lo)

    def largest_batch_within(self, tbt_s: float, b_max: int, kv_tokens_per_seq: float = 0.0,
                             chunk_tokens: float = 0.0) -> int:
        """Largest b in [1, b_max] with T(b) <= tbt_s; 0 if none does."""
        fits = [b for b in range(1, int(b_max) + 1) if self.predict_step_s(b) <= tbt_s]
        return fits[-1] if fits else 0


#: the busy steps an online fit needs; one from fewer (the controller's first, made
#: as soon as it can be) is provisional: :func:`provisional`
MIN_SAMPLES = 50


def provisional(model) -> bool:
    """Whether ``model`` is an online fit from fewer than :data:`MIN_SAMPLES` steps:
    good enough to predict a first token, not to declare an SLA out of reach."""
    return (getattr(model, "source", None) == "online"
            and getattr(model, "n_samples", MIN_SAMPLES) < MIN_SAMPLES)


def fit_step_times(b: Sequence[float], c: Sequence[float], kv: Sequence[float],
                   t: Sequence[float], *, min_samples: int = MIN_SAMPLES,
                   source: str = "online") -> LinearStepModel | None:
    """The online fit: :func:`tuned.curves.fit.fit_step_time` by non-negative least
    squares on (1, b, c, kv); None with fewer than ``min_samples`` finite samples or a
    singular design (e.g. every step alike)."""
    try:
        fit = fit_step_time(b, c, t, kv, method="nnls")
    except FitError:
        return None
    if fit.n_samples < min_samples:
        return None
    return LinearStepModel.from_fit(fit, source)


def fit_recent_steps(steps: Sequence, *, min_samples: int = MIN_SAMPLES
                     ) -> LinearStepModel | None:
    """The online fit over ring samples (:class:`~tuned.core.ring.StepSample`) of
    busy steps; kv is the step's resident KV tokens."""
    busy = [s for s in steps if s.num_decode or s.prefill_tokens]
    return fit_step_times([s.num_decode for s in busy], [s.prefill_tokens for s in busy],
                          [s.kv_tokens_resident for s in busy], [s.step_s for s in busy],
                          min_samples=min_samples)
