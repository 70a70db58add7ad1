"""The step-time model T(b, c, kv) = a + beta*b + gamma*c + eta*kv, and its online fit.

One implementation serves both sources of the model: a `tuned profile` fit (offline,
:meth:`tuned.curves.profile.Profile.step_model`) and a small least-squares fit
refreshed every few seconds from the engine's own step ring
(:func:`fit_recent_steps`), for engines that run without a profile or on a host
the profile was not made on. ``b`` is the number of decodes in a step, ``c`` its
prefill tokens and ``kv`` the KV tokens resident (read by attention).

The coefficients are fitted non-negative (scipy's ``nnls``): a step never gets
faster with more work, and a model that said so would size the token budget
without bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


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

    def to_dict(self) -> dict:
        return {"a": self.a, "beta": self.beta, "gamma": self.gamma, "eta": self.eta,
                "r2": self.r2, "n_samples": self.n_samples, "source": self.source}


def fit_step_times(b: Sequence[float], c: Sequence[float], kv: Sequence[float],
                   t: Sequence[float], *, min_samples: int = 50,
                   source: str = "online") -> LinearStepModel | None:
    """Non-negative least squares of step times on (1, b, c, kv); None with fewer than
    ``min_samples`` finite samples or a singular design (e.g. every step alike)."""
    from scipy.optimize import nnls

    X = np.column_stack([np.ones(len(t)), np.asarray(b, float), np.asarray(c, float),
                         np.asarray(kv, float)])
    y = np.asarray(t, float)
    ok = np.isfinite(X).all(axis=1) & np.isfinite(y)
    X, y = X[ok], y[ok]
    if len(y) < min_samples:
        return None
    # scale columns so the solver sees numbers of one size (kv is in the thousands)
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    try:
        coef, _ = nnls(X / scale, y, maxiter=50 * X.shape[1])
    except RuntimeError:
        return None
    coef = coef / scale
    pred = X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None
    return LinearStepModel(float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]),
                           r2, int(len(y)), source)


def fit_recent_steps(steps: Sequence, *, min_samples: int = 50) -> LinearStepModel | None:
    """The online fit over ring samples (:class:`~tuned.core.ring.StepSample`) of
    busy steps; kv is the step's resident KV tokens."""
    busy = [s for s in steps if s.num_decode or s.prefill_tokens]
    return fit_step_times([s.num_decode for s in busy], [s.prefill_tokens for s in busy],
                          [s.kv_tokens_resident for s in busy], [s.step_s for s in busy],
                          min_samples=min_samples)
