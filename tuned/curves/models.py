"""Pure shape functions for tuned's speed curves.

Each function takes numbers or numpy arrays and returns the same shape; none of
them fits, reads files or keeps state (fits live in :mod:`tuned.curves.fit`).
The names here are the ``FitResult.name`` values stored in profile files, so
:data:`MODELS` maps a stored fit back to the function that evaluates it.
"""

from __future__ import annotations

import numpy as np


def usl_throughput(n, lam, sigma, kappa):
    """Universal Scalability Law throughput (SABER, section IV-B, ref. [50]).

    X(N) = lam * N / (1 + sigma * (N - 1) + kappa * N * (N - 1))

    ``n`` is the number of requests in flight, ``lam`` the throughput of one request
    alone (tokens/s), ``sigma`` contention (serial fraction) and ``kappa`` coherency
    (crosstalk) cost.
    """
    n = np.asarray(n, dtype=float)
    return lam * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


def usl_speed(n, lam, sigma, kappa):
    """Per-request token speed under the USL: v(N) = X(N) / N
    = lam / (1 + sigma * (N - 1) + kappa * N * (N - 1))."""
    n = np.asarray(n, dtype=float)
    return lam / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))


def usl_peak_concurrency(sigma, kappa):
    """Concurrency of peak USL throughput, N* = sqrt((1 - sigma) / kappa) (inf if kappa = 0)."""
    if kappa <= 0:
        return float("inf")
    return float(np.sqrt(max(1.0 - sigma, 0.0) / kappa))


def linear_speed(n, a, b):
    """Linear per-request speed v(N) = a + b * N (SABER's linear baseline)."""
    n = np.asarray(n, dtype=float)
    return a + b * n


def logistic_speed(n, vmax, k, n0):
    """Logistic per-request speed v(N) = vmax / (1 + exp(k * (N - n0))) (SABER's logistic
    baseline): about vmax at low load, vmax / 2 at N = n0, falling with slope set by k."""
    n = np.asarray(n, dtype=float)
    # Clip the exponent so that a wild trial k during fitting cannot overflow.
    return vmax / (1.0 + np.exp(np.clip(k * (n - n0), -700.0, 700.0)))


def step_time(b, c, a, beta, gamma):
    """Engine step time T(b, c) = a + beta * b + gamma * c (seconds) for a step with
    ``b`` decoding sequences and ``c`` prefill tokens (Pang et al., PD fusion)."""
    return a + beta * np.asarray(b, dtype=float) + gamma * np.asarray(c, dtype=float)


def step_time_kv(b, c, kv_tokens, a, beta, gamma, eta):
    """Step time with an attention term: T = a + beta * b + gamma * c + eta * kv_tokens,
    where ``kv_tokens`` are the KV-cache tokens resident (read by attention) in the step."""
    return step_time(b, c, a, beta, gamma) + eta * np.asarray(kv_tokens, dtype=float)


#: model name (as stored in profiles) -> (function, names of the independent variables)
MODELS = {
    "usl_throughput": (usl_throughput, ("n",)),
    "usl_speed": (usl_speed, ("n",)),
    "linear_speed": (linear_speed, ("n",)),
    "logistic_speed": (logistic_speed, ("n",)),
    "step_time": (step_time, ("b", "c")),
    "step_time_kv": (step_time_kv, ("b", "c", "kv_tokens")),
}
