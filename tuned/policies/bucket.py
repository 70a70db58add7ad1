"""BucketServe (Zheng et al.): adaptive length buckets and a safe batch size.

Memory (Section IV):

* KV bytes per token = 2·L·H·D·B (Eq. 1 per token: layers, KV heads, head dim,
  bytes per element) — :func:`kv_bytes_per_token`;
* M_safe = 0.9 × M_remain (Eq. 5) — :func:`safe_memory`;
* N_max = max{N : Σ_{i≤N} S_i ≤ M_safe / (2LHDB)} (Eq. 6) with S_i the sequence
  lengths — :func:`n_max_exact`; with the mean sequence length S̄ this is
  N_max = ⌊0.9 × M_remain / (bytes per token × S̄)⌋ — :func:`n_max`.

Adaptive bucketing (Algorithm 1, :func:`adjust_buckets`): one bucket [0, L_max]
to start; when the number of waiting requests reaches N_max, a bucket is split at
its midpoint if more than θ (0.5) of its requests lie below the midpoint and it
holds more than N_max requests; when the total falls below N_max, all buckets merge
back into one. Online work serves the bucket holding the earliest arrival first
(arrival order inside); offline work orders inside a bucket shortest-first (SJF,
requests per second) or longest-first (LJF, tokens per second); the paper does not
say how offline work chooses among buckets, so it uses the same earliest-arrival
rule.

Mapping onto vLLM's continuous batching:

* A request's sequence length S is prompt + predicted output (the KV it will
  hold at its end); BucketServe pads static batches to S_max, vLLM's paged cache
  does not pad, so buckets here group similar lengths rather than save padding.
* M_remain is the GPU memory left, as the paper reads it from the device: for N_max
  (the bucket split/merge threshold), NVML's free device memory in KV tokens
  (``AdmitContext.gpu_free_tokens``: the lowest GPU's free bytes over the KV bytes
  per token on one GPU) where NVML and the engine's bytes per token are known,
  never more than the free KV cache (vLLM allocates KV only from its pool); without
  NVML, the free KV cache at the start of the step (``kv_free_tokens``). Memory is
  counted in tokens (the byte factors cancel). Under vLLM most device memory is
  the KV pool, reserved at start (``gpu_memory_utilization``), so NVML's free figure
  is the memory outside it: a tenant or fragmentation taking it shrinks N_max.
  BucketServe dispatches one batch from one bucket with Σ S_i ≤ M_safe; here one
  admission round (one ``schedule()`` step) takes requests from one bucket
  (``one_bucket_per_step``) while their Σ S_i stays within 0.9 × the free KV.
  Running requests keep growing into the free KV, which the paper's static batch
  does not; the 10 % margin and vLLM's preemption cover that.
* Eq. 6 admission (:meth:`BucketPolicy.admit`) reads the free KV cache, the
  allocator's own limit, with or without NVML.
* AdjustBuckets runs periodically, at most every ``adjust_interval_s`` (one pass,
  so a bucket splits at most once per adjustment), not on every engine step.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict

MODES = ("online", "offline_sjf", "offline_ljf")


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype_bytes: int) -> int:
    """Eq. 1 for one token: 2 (K and V) × layers × heads × head dim × bytes per element."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def safe_memory(remaining: float, safe_fraction: float = 0.9) -> float:
    """Eq. 5: M_safe = 0.9 × M_remain."""
    return safe_fraction * remaining


def n_max(remaining_kv_bytes: float, bytes_per_token: float, mean_seq_tokens: float,
          safe_fraction: float = 0.9) -> int:
    """N_max = ⌊safe_fraction × M_remain / (bytes per token × mean sequence length)⌋."""
    if mean_seq_tokens <= 0 or bytes_per_token <= 0:
        raise ValueError("bytes_per_token and mean_seq_tokens must be > 0")
    return max(math.floor(safe_memory(remaining_kv_bytes, safe_fraction)
                          / (bytes_per_token * mean_seq_tokens) + 1e-9), 0)


def n_max_exact(remaining_kv_bytes: float, bytes_per_token: float,
                seq_tokens: Sequence[int], safe_fraction: float = 0.9) -> int:
    """Eq. 6: the largest N with Σ_{i≤N} S_i ≤ M_safe / bytes per token, S in queue order."""
    limit = safe_memory(remaining_kv_bytes, safe_fraction) / bytes_per_token
    total, n = 0, 0
    for s in seq_tokens:
        total += s
        if total > limit:
            break
        n += 1
    return n


Bounds = list[tuple[float, float]]


def bucket_index(seq: float, bounds: Bounds) -> int:
    """Algorithm 1, lines 3-6: the bucket with low ≤ S < up; the last bucket also
    takes S ≥ its upper bound (a sequence longer than L_max)."""
    for i, (_, up) in enumerate(bounds):
        if seq < up:
            return i
    return len(bounds) - 1


def adjust_buckets(bounds: Bounds, seqs: Sequence[float], n_max_requests: int,
                   l_max: float, theta: float = 0.5, min_width: float = 2.0) -> Bounds:
    """AdjustBuckets (Algorithm 1, lines 10-29), one pass.

    total < N_max → one bucket [0, L_max]; else each bucket b with
    |{S < m_b}| / |b| > θ and |b| > N_max (m = N_max) splits at m_b = (low + up)/2.
    ``min_width`` stops splitting buckets narrower than that many tokens.
    """
    if len(seqs) < n_max_requests:
        return [(0.0, float(l_max))]
    members: list[list[float]] = [[] for _ in bounds]
    for s in seqs:
        members[bucket_index(s, bounds)].append(s)
    out: Bounds = []
    for (lo, up), ms in zip(bounds, members):
        mid = (lo + up) / 2
        below = sum(1 for s in ms if s < mid)
        if ms and below / len(ms) > theta and len(ms) > n_max_requests and up - lo >= min_width:
            out += [(lo, mid), (mid, up)]
        else:
            out.append((lo, up))
    return out


class BucketPolicy(QueuePolicy):
    """BucketServe's adaptive buckets and Eq.-6 admission; see the module doc.

    Options: ``mode`` (online | offline_sjf | offline_ljf), ``theta``,
    ``max_len_tokens`` (L_max; 0 = the longest predicted sequence seen so far),
    ``safe_fraction`` (0.9 of Eq. 5), ``one_bucket_per_step``, ``min_width_tokens``,
    ``adjust_interval_s`` (period of AdjustBuckets; 0 = every step).
    """

    name = "bucket"

    def __init__(self, *, mode: str = "online", theta: float = 0.5, max_len_tokens: int = 0,
                 safe_fraction: float = 0.9, one_bucket_per_step: bool = True,
                 min_width_tokens: int = 2, adjust_interval_s: float = 0.1,
                 rng=None) -> None:
        super().__init__(rng=rng)
        if mode not in MODES:
            raise ValueError(f"bucket: mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not (0.0 <= theta < 1.0) or not (0.0 < safe_fraction <= 1.0):
            raise ValueError(f"bucket: need 0 <= theta < 1 and 0 < safe_fraction <= 1, "
                             f"got theta={theta!r}, safe_fraction={safe_fraction!r}")
        if max_len_tokens < 0 or min_width_tokens < 1 or adjust_interval_s < 0:
            raise ValueError("bucket: need max_len_tokens >= 0, min_width_tokens >= 1 and "
                             "adjust_interval_s >= 0")
        self.adjust_interval_s = float(adjust_interval_s)
        self._last_adjust_s = -math.inf
        self.mode = mode
        self.theta = float(theta)
        self.safe_fraction = float(safe_fraction)
        self.one_bucket_per_step = bool(one_bucket_per_step)
        self.min_width = float(min_width_tokens)
        self._fixed_l_max = int(max_len_tokens)
        self._seen_l_max = 1
        self.bounds: Bounds = [(0.0, float(self.l_max))]
        self.n_max: int | None = None

    @property
    def l_max(self) -> int:
        return self._fixed_l_max or self._seen_l_max

    def observe_arrival(self, info: ReqInfo) -> None:
        if info.seq_tokens > self._seen_l_max:
            self._seen_l_max = info.seq_tokens
            if not self._fixed_l_max:
                lo, _ = self.bounds[-1]
                self.bounds[-1] = (lo, float(self._seen_l_max))

    def compute_n_max(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> int:
        """N_max for this step: M_remain (see the module docstring: NVML's free memory
        in KV tokens where known, at most the free KV, else the free KV) and the mean
        S of waiting requests."""
        remain = ctx.kv_free_tokens
        if ctx.gpu_free_tokens is not None:
            remain = min(remain, ctx.gpu_free_tokens)
        if not waiting:
            return n_max(remain, 1, 1, self.safe_fraction)
        mean = sum(r.seq_tokens for r in waiting) / len(waiting)
        return n_max(remain, 1, mean, self.safe_fraction)

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        """Run AdjustBuckets if ``adjust_interval_s`` passed; True if the buckets changed."""
        if ctx.now_s - self._last_adjust_s < self.adjust_interval_s:
            return False
        self._last_adjust_s = ctx.now_s
        self.n_max = self.compute_n_max(waiting, ctx)
        new = adjust_buckets(self.bounds, [r.seq_tokens for r in waiting], self.n_max,
                             self.l_max, self.theta, self.min_width)
        changed = new != self.bounds
        self.bounds = new
        return changed

    def bucket_of(self, info: ReqInfo) -> int:
        return bucket_index(info.seq_tokens, self.bounds)

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        groups: dict[int, list[ReqInfo]] = {}
        for r in waiting:
            groups.setdefault(self.bucket_of(r), []).append(r)
        self.stats.buckets_in_use = len(groups)
        if self.mode == "offline_sjf":
            inner = lambda r: (r.seq_tokens, r.arrival_s)  # noqa: E731
        elif self.mode == "offline_ljf":
            inner = lambda r: (-r.seq_tokens, r.arrival_s)  # noqa: E731
        else:
            inner = lambda r: r.arrival_s  # noqa: E731
        ranked = sorted(groups.items(),
                        key=lambda kv: (min(r.arrival_s for r in kv[1]), kv[0]))
        out: list[ReqInfo] = []
        for _, members in ranked:
            out.extend(sorted(members, key=inner))
        return out

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        b = self.bucket_of(candidate)
        if self.one_bucket_per_step and admitted_this_step:
            fb = self.bucket_of(admitted_this_step[0])
            if fb != b:
                return Verdict(False, f"bucket: one bucket per step (this step serves bucket "
                                      f"{fb + 1}, head is in bucket {b + 1} of {len(self.bounds)})")
        limit = safe_memory(ctx.kv_free_tokens, self.safe_fraction)
        total = sum(r.seq_tokens for r in admitted_this_step) + candidate.seq_tokens
        if total > limit:
            return Verdict(False, f"bucket: Eq. 6 safe KV exceeded, {total} > "
                                  f"{self.safe_fraction:g} x {ctx.kv_free_tokens} free tokens")
        return Verdict(True, f"bucket: bucket {b + 1} of {len(self.bounds)}, "
                             f"{total} <= {limit:g} safe tokens")


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "bucket", "kind": "queue", "build": "BucketPolicy", "order": 40,
    "summary": "adaptive length buckets and a safe batch size (BucketServe)",
    "options": {
        "mode": {"type": "str", "default": "online", "choices": MODES,
                 "doc": "online, or offline shortest / longest bucket first"},
        "theta": {"type": "float", "default": 0.5, "lo": 0.0, "hi": 1.0, "hi_open": True,
                  "doc": "bucket split threshold"},
        "max_len_tokens": {"type": "int", "default": 0, "lo": 0,
                           "doc": "longest sequence bucketed (0 = the longest seen)"},
        "safe_fraction": {"type": "float", "default": 0.9, "lo": 0.0, "hi": 1.0,
                          "lo_open": True, "doc": "share of free memory planned with"},
        "one_bucket_per_step": {"type": "bool", "default": True,
                                "doc": "admit from one bucket per engine step"},
        "min_width_tokens": {"type": "int", "default": 2, "lo": 1,
                             "doc": "narrowest bucket in tokens"},
        "adjust_interval_s": {"type": "float", "default": 0.1, "lo": 0.0,
                              "doc": "seconds between bucket adjustments"},
    },
    "bench": [{"name": "tuned-bucket", "kind": "tuned",
               "config": {"queue_policy": "bucket", "queue_options": {}}}],
}
