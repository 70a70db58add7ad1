"""Pang et al.'s Algorithm 1, memory-constrained dynamic batching (Pang, Li, Wang:
*Optimizing LLM Inference Throughput via Memory-aware and SLA-constrained Dynamic
Batching*): the largest batch whose KV demand overflows the cache with probability at
most ``eps_m``, by the central limit theorem. :class:`tuned.policies.batch.BatchPolicy`
combines it with the SLA bound (:mod:`tuned.policies.sla_bound`); the module
docstring there says where continuous batching differs from the paper's model."""

from __future__ import annotations

import math
import sys
from statistics import NormalDist

from tuned.core.types import Observation


def clt_theta(eps_m: float) -> float:
    """theta = Phi^-1(1 - eps_M), the one-sided normal quantile (Pang et al., eq. 12)."""
    if not 0.0 < eps_m < 1.0:
        raise ValueError(f"eps_m must be in (0, 1), got {eps_m}")
    return NormalDist().inv_cdf(1.0 - eps_m)


def memory_batch_limit(n_tokens: float, mean: float, std: float, theta: float) -> tuple[int, float]:
    """Largest b with b*mu + theta*sqrt(b)*sigma <= n, and the safety buffer L0.

    Pang et al. eqs. (8)-(14): S = sum of b i.i.d. demands, mu_S = b*mu,
    sigma_S = sqrt(b)*sigma; P(S > n) <= eps_M under the CLT gives
        sqrt(b) = (-theta*sigma + sqrt(theta^2 sigma^2 + 4 mu n)) / (2 mu)   (12)
    and the buffer L0 = theta*sigma_S at that b, so that Algorithm 1 line 5 reads
        b = floor((n - L0) / (E[l_in] + E[l_out])).                         (14)
    For theta*sigma > 0, L0 comes from (12) in its rationalised form
        L0 = theta*sigma*sqrt(b) = 2n / (1 + sqrt(theta^2 sigma^2 + 4 mu n) / (theta*sigma)),
    which neither goes negative by cancellation nor overflows when theta*sigma dwarfs
    mu*n (then L0 -> n and b -> 0). Non-finite inputs, mean <= 0 and sigma < 0 raise
    ``ValueError``.
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
    if math.isinf(ts):
        if ts < 0:
            raise ValueError(f"theta * demand std must be finite, got {theta} * {std}")
        return 0, float(n_tokens)  # sigma beyond float range: no batch is safe
    disc = math.hypot(ts, 2.0 * math.sqrt(mean) * math.sqrt(n_tokens))  # no overflow
    if ts > 0:
        l0 = 2.0 * n_tokens / (1.0 + disc / ts)
    elif ts == 0:
        l0 = 0.0
    else:  # theta < 0 (eps_M > 0.5): the buffer is a bonus; no cancellation here
        l0 = ts * (disc - ts) / (2.0 * mean)
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
    """Pang et al., Algorithm 1: memory-constrained dynamic batching.

    State: the previous batch size b_{t-1} (starts at B_max, what static batching
    would run). Each tick, only when requests are both waiting (N^p > 0) and running
    (N^d > 0), b_t = floor((n - L0) / (E[l_in] + E[l_out])); otherwise b_t = b_{t-1}.
    Line 6, b_t = min(max(b_t, N^d), B_max), is applied by :class:`BatchPolicy` to the
    reported batch size; the bound returned (and kept as b_{t-1}) is capped at B_max
    only (see the module docstring for why the floor must not reach vLLM's gate).

    Units are KV blocks, as the paper suggests for vLLM ("our algorithm can be
    implemented using blocks rather than relying on the number of tokens"): n is
    the blocks the cache holds for requests, and a request's demand is counted in
    whole blocks, what vLLM's paged allocator actually gives it: ceil((l_in + t) /
    block_size) at a random decode step t by default, ceil((l_in + l_out) /
    block_size) with ``memory_demand = "lifetime"`` (the controller computes the
    moments, :func:`tuned.core.window.occupancy_moments`).
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
