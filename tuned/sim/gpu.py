"""GPU-shaped step-time models: Llama-2 7B and 70B on A100-80GB and H100-80GB (Vidur's
tables), and Llama-2-7B, Qwen2.5-Coder-3B and -1.5B on one H200 (tuned's own).

One module, past the usual size, because the step formula below, the reading of
Vidur's tables and the decode-attention fit are one model whose numbers this
docstring explains together.

Built from per-operator timings that Vidur (microsoft/vidur, MIT) measured on real
GPUs, so that simulated results speak of A100 / H100 rather than of the host the
simulator runs on. The data ships in ``tuned/data/vidur/`` (:mod:`tuned.data`; another
folder of Vidur tables can be named with ``data_dir``):
``{a100,h100}/{Llama-2-7b-hf,Llama-2-70b-hf}/mlp.csv`` (per-layer operator times in
ms by token count and tensor-parallel degree, reduced to :data:`PROFILE_COLUMNS`) and
``decode_step_llama2_7b.md`` (A100 decode-attention timings of Llama-2-7B, read from
Vidur's attention table).

One engine step of vLLM's continuous batching, for a :class:`StepShape` with
``n = num_decode + prefill_tokens`` tokens, takes (milliseconds)::

    step_ms = forward_ms(n)                                   # linear ops, emb, all-reduce
            + L * [num_decode > 0] * a0                       # decode attention
            + L * (a_req * num_decode + a_kv * decode_context_tokens)
            + L * 4 * head_dim * n_head / TP / (eff * peak) * prefill_attn_pairs
            + max(2 * s * n_embd * V / TP / (eff * peak),     # lm_head, s = num_decode
                  2 * n_embd * V / TP / hbm_bandwidth)        #   + num_prefill_reqs
            + cpu_overhead_ms

Approximations, each with its number (all in :meth:`GpuStepModel.describe`):

* Linear operators per layer: the sum of the medians of input_layernorm,
  attn_pre_proj, attn_rope, attn_post_proj, post_attention_layernorm, mlp_up_proj,
  mlp_act, mlp_down_proj and add, from the rows of the model's tensor-parallel degree
  (TP 1 for 7B, TP 4 for 70B), linearly interpolated between profiled token counts
  (1, 2, 4, 8, then every 8 to 1024, every 16 to 2048, every 32 to 4096). Token
  counts profiled twice (2048, 4096) take the mean of the two rows. Above 4096 the
  time grows with the least-squares slope of the rows at >= 2048 tokens: the slope of
  the last two rows (4064, 4096) is negative (noise) in three of the four tables used
  (all but H100 70B), so it cannot be used.
* ``emb`` (the token-embedding lookup) is one operator per model, not per layer
  (0.002 ms at one token to 0.42 ms at 4096), so it is added once per step.
* Monotone envelope: the profiles dip (kernel choice and wave quantisation, e.g.
  A100 7B: 0.557 ms per layer at 160 tokens, 0.519 at 168; H100 70B at TP 4: 0.376 at
  312, 0.315 at 320), but a simulator must never find that one more token makes a
  step faster. ``step_s``
  therefore uses the isotonic (pool-adjacent-violators, least-squares) non-decreasing
  fit of the per-step forward time over the profiled token counts (largest change
  per step: A100 7B 2.2 ms, H100 7B 1.7, A100 70B 10.1, H100 70B 5.1).
  :meth:`GpuStepModel.linear_ms_per_layer` keeps the raw interpolation, equal to the
  CSV medians at profiled counts; ``describe()`` gives the largest gap between them.
* Decode attention per layer ``a0 * [num_decode > 0] + a_req * num_decode + a_kv *
  decode_context_tokens``, fitted to the 20 A100 Llama-2-7B rows of the ``.md`` file
  (:data:`A100_LLAMA2_7B_DECODE_ATTN_MS`) by non-negative least squares on relative
  error (each row weighted 1 / measured ms). Unweighted least squares is ruled by the
  few rows of 1-4 ms and puts a0 at 0.062 ms, 7 times the 0.009 ms measured at one
  request of 32 tokens. The fit's R² (on the unweighted ms) is in ``describe()``.
  The decode and prefill parts of a mixed batch are timed separately and added
  (vLLM runs them in one kernel).
* H200 (:data:`MEASURED_HARDWARE`): tables tuned measured itself in Vidur's format
  (``tools/measure_gpu_ops.py``; ``tuned/data/measured``, provenance in its README),
  with decode attention measured too: fitted in the same form on that GPU's and
  model's own rows, those where requests x KV heads >= the card's 132
  multiprocessors (vLLM's split-context decode kernels reach that bandwidth-bound
  regime at any batch; the PyTorch kernel that was timed does not), unscaled. The
  composition (no CPU overhead) against whole decode steps timed on the same card:
  0.84-0.99 of them for Llama-2-7B, 0.60-0.89 for the Qwen models (the step has
  kernels the operator list lacks; ``tests/sim/test_gpu_measured.py``).
* Other hardware and models scale the reference fit: ``a_req`` and ``a_kv`` by memory
  bandwidth (A100 80GB SXM 2.039 TB/s, H100 SXM 3.35 TB/s: x 0.609 on H100); ``a_kv``
  also by the KV bytes one card reads per token per layer, n_kv_head / TP x head_dim
  relative to 7B's 32 x 128 (70B at TP 4: 8 / 4 / 32 = 1/16). ``a0`` (a kernel-launch
  scale fixed cost) and ``a_req`` keep their A100 7B values otherwise.
* Prefill attention: 4 FLOPs per query-key pair per head dimension per head
  (QK^T and PV), over TP cards, at :data:`MATMUL_EFFICIENCY` (0.5) of the peak dense
  bf16 rate (A100 312 TFLOP/s, H100 989 TFLOP/s).
* lm_head: one matmul per sampled token (vLLM v1 computes logits for every scheduled
  request, partial prefill chunks included, so ``s = num_decode + num_prefill_reqs``),
  vocabulary-parallel over TP, timed by the larger of its FLOPs at the same efficiency
  and the read of its weights at full memory bandwidth. The vocabulary is the CSV's
  ``vocab_size`` (32768, Vidur's padded size; Llama-2 has 32000).
* :data:`CPU_OVERHEAD_MS` (1.0 ms) per step for sampling, scheduling and input
  preparation: the ``.md`` table excludes these, and vLLM's own figure depends on
  its version and on CUDA graphs.
* Tensor parallelism: two all-reduces per layer of ``n * n_embd * 2`` bytes at an
  effective NVLink bandwidth (A100 300 GB/s, H100 450 GB/s) plus
  :data:`ALLREDUCE_LATENCY_S` (10 us) each.
* Consequence worth knowing: 70B at TP 4 reads 1/16 of 7B's KV bytes per card per
  token, so for KV-heavy decode batches (64 requests of 1728 tokens) its step is
  shorter than 7B's on one card, though it is longer whenever linear operators rule.
* KV capacity: 80 GiB per card (nvidia-smi: 81920 MiB on A100-80GB; H100-80GB SXM
  reports 81559 MiB, 0.4 % less, ignored) x gpu_memory_utilization, less the card's
  share of the bf16 weights (7B 6.74e9 parameters, 70B 68.98e9, split over TP) and an
  activation reserve of 2 GiB per card (:data:`ACTIVATION_RESERVE_BYTES`: vLLM's
  profiled peak activations, CUDA graphs, NCCL and cuBLAS workspaces), summed over
  the TP cards and divided by the KV bytes per token, 2 (K and V) x layers x
  n_kv_head x head_dim x 2 bytes.
"""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import numpy as np
from scipy.optimize import nnls

from tuned.data import MEASURED_DIR, VIDUR_DIR, data_root
from tuned.sim.catalog import GpuSpec, HardwareManifest, gpus, hardware_help, manifests  # noqa: F401
from tuned.sim.stepmodel import StepShape

BF16_BYTES = 2
GPU_MEMORY_BYTES = 80 * 2**30
ACTIVATION_RESERVE_BYTES = 2 * 2**30
MATMUL_EFFICIENCY = 0.5
CPU_OVERHEAD_MS = 1.0
ALLREDUCE_LATENCY_S = 10e-6
ALLREDUCES_PER_LAYER = 2
TABLE_MAX_TOKENS = 8192
EXTRAPOLATION_FROM_TOKENS = 2048

LINEAR_OPS: tuple[str, ...] = (
    "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
    "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
)
"""Per-layer operators of ``mlp.csv`` whose medians sum to the linear time."""

SHAPE_COLUMNS: tuple[str, ...] = ("n_head", "n_kv_head", "n_embd", "vocab_size")
"""Columns of ``mlp.csv`` that name the model's shape."""

PROFILE_COLUMNS: tuple[str, ...] = (
    "num_tensor_parallel_workers", "num_tokens", *SHAPE_COLUMNS, "time_stats.emb.median",
    *(f"time_stats.{op}.median" for op in LINEAR_OPS),
)
"""Every column of ``mlp.csv`` that :func:`read_operator_profile` reads; the packaged
copies (``tools/reduce_vidur_profiles.py``) keep only these."""

# (num_decode, context tokens per request, attn_decode ms per layer), A100, Llama-2-7B,
# copied from decode_step_llama2_7b.md (tests check the copy against the file).
A100_LLAMA2_7B_DECODE_ATTN_MS: tuple[tuple[int, int, float], ...] = (
    (1, 32, 0.009), (8, 32, 0.018), (16, 32, 0.028), (32, 32, 0.048), (64, 32, 0.097),
    (64, 800, 0.471), (128, 800, 0.855), (1, 832, 0.018),
    (1, 1728, 0.025), (8, 1728, 0.184), (16, 1728, 0.291), (32, 1728, 0.519),
    (64, 1728, 1.017), (128, 1664, 1.752),
    (1, 4032, 0.054), (8, 4032, 0.407), (16, 4032, 0.676), (32, 4032, 1.231),
    (57, 4032, 2.137), (128, 3968, 4.151),
)
REFERENCE_KV_HEADS_X_HEAD_DIM = 32 * 128  # Llama-2-7B, TP 1: KV per token per layer / 2 / 2 B


MANIFESTS: dict[str, HardwareManifest] = manifests()
"""The packaged hardware, by name (``tuned/data/hardware``)."""
GPUS: dict[str, GpuSpec] = gpus()
REFERENCE_GPU = "a100"
HARDWARE: tuple[str, ...] = tuple(MANIFESTS)
VIDUR_HARDWARE: tuple[str, ...] = tuple(n for n, m in MANIFESTS.items()
                                        if m.data_folder == VIDUR_DIR)
"""Models built from Vidur's tables (``tuned/data/vidur``)."""
MEASURED_HARDWARE: tuple[str, ...] = tuple(n for n, m in MANIFESTS.items()
                                           if m.data_folder == MEASURED_DIR)
"""Models built from tables tuned measured itself (``tuned/data/measured``)."""


class DecodeAttentionFit(NamedTuple):
    """Per-layer decode attention ms = fixed_ms + per_request_ms * b + per_kv_token_ms * kv."""

    fixed_ms: float
    per_request_ms: float
    per_kv_token_ms: float
    r2: float
    max_rel_error: float
    num_rows: int


class OperatorProfile(NamedTuple):
    """The rows of one tensor-parallel degree of an ``mlp.csv``, duplicates averaged."""

    num_tokens: tuple[int, ...]
    linear_ms_per_layer: tuple[float, ...]
    emb_ms: tuple[float, ...]
    n_head: int
    n_kv_head: int
    n_embd: int
    vocab_size: int


def fit_decode_attention(
        rows: tuple[tuple[int, int, float], ...] = A100_LLAMA2_7B_DECODE_ATTN_MS,
) -> DecodeAttentionFit:
    """Fit ms = a0 + a_req * b + a_kv * (b * ctx) to (b, ctx, ms) rows.

    Non-negative least squares on relative error (rows weighted by 1 / ms), so that
    the one-request rows of 0.01 ms count as much as the 128-request rows of 4 ms and
    no coefficient can make time fall with load. R² is that of the fitted ms.
    """
    b = np.array([r[0] for r in rows], dtype=float)
    kv = b * np.array([r[1] for r in rows], dtype=float)
    y = np.array([r[2] for r in rows], dtype=float)
    design = np.column_stack([np.ones_like(b), b, kv])
    coef, _ = nnls(design / y[:, None], np.ones_like(y))
    y_hat = design @ coef
    r2 = 1.0 - float(np.sum((y - y_hat) ** 2)) / float(np.sum((y - y.mean()) ** 2))
    return DecodeAttentionFit(float(coef[0]), float(coef[1]), float(coef[2]), r2,
                              float(np.max(np.abs(y_hat - y) / y)), len(rows))


ATTENTION_CSV = "attention.csv"
"""Measured attention per layer beside a measured GPU's ``mlp.csv``: columns ``kind``
(decode or prefill), ``num_decode``, ``context``, ``prefill_tokens``, ``ms_per_layer``."""


@functools.lru_cache(maxsize=8)
def read_decode_attention(path: Path) -> tuple[tuple[int, int, float], ...]:
    """The decode rows of a measured ``attention.csv`` as (num_decode, context, ms)."""
    if not path.is_file():
        raise FileNotFoundError(f"decode attention table not found at {path}")
    with open(path, newline="") as f:
        rows = tuple((int(r["num_decode"]), int(r["context"]), float(r["ms_per_layer"]))
                     for r in csv.DictReader(f) if r["kind"] == "decode")
    if not rows:
        raise ValueError(f"{path} has no decode rows")
    return rows


@functools.lru_cache(maxsize=1)
def _reference_decode_attention() -> DecodeAttentionFit:
    return fit_decode_attention()


def isotonic_increasing(y: list[float] | np.ndarray) -> np.ndarray:
    """Least-squares non-decreasing fit of equally weighted points (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in map(float, y):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


@functools.lru_cache(maxsize=32)
def read_operator_profile(csv_path: Path, tensor_parallel: int) -> OperatorProfile:
    """Parse the rows of ``tensor_parallel`` from a Vidur ``mlp.csv`` (cached per path)."""
    by_tokens: dict[int, list[tuple[float, float]]] = {}
    shape: dict[str, int] = {}
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) != tensor_parallel:
                continue
            linear = sum(float(row[f"time_stats.{op}.median"]) for op in LINEAR_OPS)
            emb = float(row["time_stats.emb.median"])
            by_tokens.setdefault(int(row["num_tokens"]), []).append((linear, emb))
            shape = {k: int(row[k]) for k in SHAPE_COLUMNS}
    if not by_tokens:
        raise ValueError(f"{csv_path} has no rows for "
                         f"num_tensor_parallel_workers={tensor_parallel}")
    tokens = tuple(sorted(by_tokens))
    linear_ms = tuple(sum(r[0] for r in by_tokens[n]) / len(by_tokens[n]) for n in tokens)
    emb_ms = tuple(sum(r[1] for r in by_tokens[n]) / len(by_tokens[n]) for n in tokens)
    return OperatorProfile(tokens, linear_ms, emb_ms, **shape)


def _tail_slope(tokens: np.ndarray, values: np.ndarray) -> float:
    """Least-squares slope (per token) of the profiled points at >= 2048 tokens, >= 0."""
    tail = tokens >= EXTRAPOLATION_FROM_TOKENS
    return max(0.0, float(np.polyfit(tokens[tail], values[tail], 1)[0]))


def _interpolate(tokens: np.ndarray, values: np.ndarray, slope: float, n: np.ndarray) -> np.ndarray:
    """Linear interpolation inside the profile, ``slope`` beyond its last point."""
    out = np.interp(n, tokens, values)
    beyond = n > tokens[-1]
    out[beyond] = values[-1] + slope * (n[beyond] - tokens[-1])
    return out


@dataclass(frozen=True)
class GpuStepModel:
    """Step time of vLLM serving a Llama-2 model on A100 / H100, from Vidur's profiles.

    Implements :class:`tuned.sim.stepmodel.StepClock`. The fields are the inputs
    (operator profile, hardware, fitted decode-attention coefficients, constants);
    construction precomputes a per-token-count table of the forward time (linear
    operators x layers + emb + all-reduce, made non-decreasing) so that
    :meth:`step_s` is a few float operations; ``dataclasses.replace(model,
    cpu_overhead_ms=2.0)`` gives a variant with its tables rebuilt. The approximations
    and their numbers are listed in the module docstring and returned by
    :meth:`describe`.
    """

    name: str
    gpu: str
    model: str
    tensor_parallel: int
    num_layers: int
    num_params: float
    profile: OperatorProfile = field(repr=False)
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    gpu_memory_bytes: int
    allreduce_bytes_per_s: float
    attn_decode_fixed_ms_per_layer: float
    attn_decode_ms_per_request_per_layer: float
    attn_decode_ms_per_kv_token_per_layer: float
    attn_decode_fit: DecodeAttentionFit = field(repr=False)
    matmul_efficiency: float = MATMUL_EFFICIENCY
    cpu_overhead_ms: float = CPU_OVERHEAD_MS
    allreduce_latency_s: float = ALLREDUCE_LATENCY_S
    activation_reserve_bytes: int = ACTIVATION_RESERVE_BYTES
    table_max_tokens: int = TABLE_MAX_TOKENS
    decode_attention_measured: bool = False  # fitted on this GPU's and model's own rows
    # Derived in __post_init__; step_s reads only these.
    _forward_ms: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _forward_slope_ms: float = field(init=False, repr=False, compare=False)
    _linear_slope_ms: float = field(init=False, repr=False, compare=False)
    _isotonic_max_gap_ms: float = field(init=False, repr=False, compare=False)
    _attn_fixed_ms: float = field(init=False, repr=False, compare=False)
    _attn_request_ms: float = field(init=False, repr=False, compare=False)
    _attn_kv_token_ms: float = field(init=False, repr=False, compare=False)
    _prefill_pair_ms: float = field(init=False, repr=False, compare=False)
    _lm_head_token_ms: float = field(init=False, repr=False, compare=False)
    _lm_head_floor_ms: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = self.profile
        tokens = np.array(p.num_tokens, dtype=float)
        linear = np.array(p.linear_ms_per_layer)
        forward = (self.num_layers * (linear + self._allreduce_ms_per_layer(tokens))
                   + np.array(p.emb_ms))
        monotone = isotonic_increasing(forward)
        slope = _tail_slope(tokens, monotone)
        n = np.arange(self.table_max_tokens + 1, dtype=float)
        # The running maximum only removes rounding-level dips of np.interp.
        table = np.maximum.accumulate(_interpolate(tokens, monotone, slope, n))
        table[0] = 0.0
        peak = self.matmul_efficiency * self.peak_bf16_flops
        lm_head_weight_bytes = p.n_embd * p.vocab_size * BF16_BYTES / self.tensor_parallel
        derived = {
            "_forward_ms": tuple(table.tolist()),
            "_forward_slope_ms": slope,
            "_linear_slope_ms": _tail_slope(tokens, linear),
            "_isotonic_max_gap_ms": float(np.max(np.abs(monotone - forward))),
            "_attn_fixed_ms": self.num_layers * self.attn_decode_fixed_ms_per_layer,
            "_attn_request_ms": self.num_layers * self.attn_decode_ms_per_request_per_layer,
            "_attn_kv_token_ms": self.num_layers * self.attn_decode_ms_per_kv_token_per_layer,
            "_prefill_pair_ms": (self.num_layers * 4.0 * self.head_dim * p.n_head
                                 / self.tensor_parallel / peak * 1e3),
            "_lm_head_token_ms": 2.0 * p.n_embd * p.vocab_size / self.tensor_parallel / peak * 1e3,
            "_lm_head_floor_ms": lm_head_weight_bytes / self.hbm_bytes_per_s * 1e3,
        }
        for k, v in derived.items():
            object.__setattr__(self, k, v)

    @property
    def head_dim(self) -> int:
        return self.profile.n_embd // self.profile.n_head

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers and cards: 2 x L x n_kv_head x head_dim x 2 B."""
        return 2 * self.num_layers * self.profile.n_kv_head * self.head_dim * BF16_BYTES

    def _allreduce_ms_per_layer(self, num_tokens: np.ndarray) -> np.ndarray:
        """Two all-reduces of num_tokens x n_embd bf16 values per layer when TP > 1."""
        if self.tensor_parallel == 1:
            return np.zeros_like(num_tokens)
        each_s = (self.allreduce_latency_s
                  + num_tokens * self.profile.n_embd * BF16_BYTES / self.allreduce_bytes_per_s)
        return ALLREDUCES_PER_LAYER * each_s * 1e3

    def step_s(self, shape: StepShape) -> float:
        """Seconds for one step of ``shape``; 0.0 for a step with no tokens."""
        num_decode, context, prefill, prefill_reqs, pairs, _ = shape
        n = num_decode + prefill
        if n <= 0:
            return 0.0
        table = self._forward_ms
        if n < len(table):
            ms = table[n]
        else:
            ms = table[-1] + self._forward_slope_ms * (n - len(table) + 1)
        if num_decode > 0:
            ms += (self._attn_fixed_ms + self._attn_request_ms * num_decode
                   + self._attn_kv_token_ms * context)
        ms += self._prefill_pair_ms * pairs
        lm_head = self._lm_head_token_ms * (num_decode + prefill_reqs)
        if lm_head < self._lm_head_floor_ms:
            lm_head = self._lm_head_floor_ms
        return (ms + lm_head + self.cpu_overhead_ms) * 1e-3

    def linear_ms_per_layer(self, num_tokens: int) -> float:
        """Per-layer linear-operator ms at ``num_tokens``, interpolated from ``mlp.csv``.

        Equal to the sum of the CSV medians at profiled counts (the mean of the two
        rows where a count was profiled twice); not made monotone; beyond 4096 tokens
        extended with the least-squares slope of the rows at >= 2048 tokens.
        """
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        if num_tokens == 0:
            return 0.0
        p = self.profile
        return float(_interpolate(np.array(p.num_tokens, dtype=float),
                                  np.array(p.linear_ms_per_layer), self._linear_slope_ms,
                                  np.array([float(num_tokens)]))[0])

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """KV tokens the cache holds over all TP cards.

        Per card: memory x utilization - weights / TP - activation reserve; times TP;
        divided by :attr:`kv_bytes_per_token`. ValueError when nothing is left.
        """
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1], "
                             f"got {gpu_memory_utilization}")
        per_card_bytes = (self.gpu_memory_bytes * gpu_memory_utilization
                          - self.num_params * BF16_BYTES / self.tensor_parallel
                          - self.activation_reserve_bytes)
        if per_card_bytes <= 0:
            raise ValueError(
                f"{self.name}: no memory left for the KV cache at gpu_memory_utilization="
                f"{gpu_memory_utilization} ({per_card_bytes / 2**30:.1f} GiB per card)")
        return int(per_card_bytes * self.tensor_parallel // self.kv_bytes_per_token)

    def num_gpu_blocks(self, block_size: int = 16, gpu_memory_utilization: float = 0.9) -> int:
        """KV-cache blocks of ``block_size`` tokens: kv_capacity_tokens // block_size."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.kv_capacity_tokens(gpu_memory_utilization) // block_size

    def describe(self) -> dict[str, Any]:
        """Every number the model uses and each approximation, as plain JSON types."""
        p, fit = self.profile, self.attn_decode_fit
        return {
            "name": self.name, "gpu": self.gpu, "model": self.model,
            "tensor_parallel": self.tensor_parallel, "num_layers": self.num_layers,
            "num_params": self.num_params,
            "model_shape": {"n_head": p.n_head, "n_kv_head": p.n_kv_head, "n_embd": p.n_embd,
                            "head_dim": self.head_dim, "vocab_size": p.vocab_size},
            "hardware": {"peak_bf16_flops": self.peak_bf16_flops,
                         "hbm_bytes_per_s": self.hbm_bytes_per_s,
                         "gpu_memory_bytes": self.gpu_memory_bytes,
                         "allreduce_bytes_per_s": self.allreduce_bytes_per_s},
            "linear_ops": {
                "source": f"mlp.csv rows num_tensor_parallel_workers={self.tensor_parallel}, "
                          "sum of medians of " + ", ".join(LINEAR_OPS),
                "profiled_token_counts": len(p.num_tokens),
                "min_tokens": p.num_tokens[0], "max_tokens": p.num_tokens[-1],
                "ms_per_layer_at_1_token": p.linear_ms_per_layer[0],
                "ms_per_layer_at_max_tokens": p.linear_ms_per_layer[-1],
                "duplicates": "mean of the rows",
                "interpolation": "linear between profiled token counts",
                "extrapolation": "least-squares slope of rows >= "
                                 f"{EXTRAPOLATION_FROM_TOKENS} tokens",
                "linear_slope_ms_per_token_per_layer": self._linear_slope_ms,
                "emb": "once per step (one embedding per model)",
                "monotone": "isotonic (PAVA) fit of the per-step forward ms over profiled counts",
                "isotonic_max_gap_ms_per_step": self._isotonic_max_gap_ms,
                "forward_slope_ms_per_token_per_step": self._forward_slope_ms,
                "table_max_tokens": self.table_max_tokens,
            },
            "decode_attention": {
                "form": "per layer: a0*[num_decode>0] + a_req*num_decode"
                        " + a_kv*decode_context_tokens",
                "fit_source": (f"{ATTENTION_CSV}, this GPU's and model's measured decode rows"
                               if self.decode_attention_measured else
                               "decode_step_llama2_7b.md, A100 Llama-2-7B attn_decode rows"),
                "fit_method": "non-negative least squares on relative error (weights 1/ms)",
                "fit_rows": fit.num_rows, "fit_r2": fit.r2, "fit_max_rel_error": fit.max_rel_error,
                "reference_a0_ms": fit.fixed_ms, "reference_a_req_ms": fit.per_request_ms,
                "reference_a_kv_ms": fit.per_kv_token_ms,
                "a0_ms_per_layer": self.attn_decode_fixed_ms_per_layer,
                "a_req_ms_per_layer": self.attn_decode_ms_per_request_per_layer,
                "a_kv_ms_per_layer": self.attn_decode_ms_per_kv_token_per_layer,
                "scaling": ("none (measured on this GPU and model)" if self.decode_attention_measured
                            else "a_req, a_kv x A100/GPU memory bandwidth; a_kv x (n_kv_head/TP"
                                 " x head_dim)/(32 x 128); a0 unscaled"),
            },
            "prefill_attention": {
                "form": "4 * prefill_attn_pairs * head_dim * n_head / TP FLOPs per layer",
                "matmul_efficiency": self.matmul_efficiency,
                "ms_per_pair_per_step": self._prefill_pair_ms,
            },
            "lm_head": {
                "form": "max(2*s*n_embd*vocab/TP FLOPs at efficiency, n_embd*vocab*2 B/TP at HBM "
                        "bandwidth), s = num_decode + num_prefill_reqs",
                "ms_per_sampled_token": self._lm_head_token_ms,
                "weight_read_floor_ms": self._lm_head_floor_ms,
            },
            "cpu_overhead_ms": self.cpu_overhead_ms,
            "allreduce": {"per_layer": ALLREDUCES_PER_LAYER if self.tensor_parallel > 1 else 0,
                          "bytes_per_token": p.n_embd * BF16_BYTES,
                          "latency_s": self.allreduce_latency_s,
                          "bytes_per_s": self.allreduce_bytes_per_s},
            "kv_cache": {
                "gpu_memory_bytes_per_card": self.gpu_memory_bytes,
                "weight_bytes_per_card": self.num_params * BF16_BYTES / self.tensor_parallel,
                "activation_reserve_bytes_per_card": self.activation_reserve_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "kv_capacity_tokens_at_0.9": self.kv_capacity_tokens(0.9),
                "num_gpu_blocks_at_0.9_block_16": self.num_gpu_blocks(16, 0.9),
            },
        }


def manifest(name: str) -> HardwareManifest:
    """The manifest of hardware ``name``; ``ValueError`` names the known ones."""
    if name not in MANIFESTS:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return MANIFESTS[name]


def default_data_dir(name: str | None = None) -> Path:
    """The packaged folder holding the tables of hardware ``name`` (``tuned/data/vidur``
    for Vidur's, ``tuned/data/measured`` for tuned's own; Vidur's without a name)."""
    return data_root() / (manifest(name).data_folder if name is not None else VIDUR_DIR)


def load_hardware(name: str, data_dir: Path | None = None) -> GpuStepModel:
    """The GPU-shaped step-time model called ``name`` (one of :data:`HARDWARE`).

    ``data_dir`` holds ``<gpu>/<model folder>/mlp.csv`` (and, for a hardware whose
    decode attention was measured, ``attention.csv`` beside it); by default
    :func:`default_data_dir`. Models are cached per (name, data_dir).
    """
    manifest(name)
    data_dir = default_data_dir(name) if data_dir is None else Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"Vidur profiling data not found at {data_dir}")
    return _build(name, data_dir.resolve())


def profile_relpath(name: str) -> PurePosixPath:
    """Where the ``mlp.csv`` of hardware ``name`` lies inside a data dir:
    ``<gpu>/<model folder>/mlp.csv``."""
    return manifest(name).profile_relpath


@functools.lru_cache(maxsize=16)
def _build(name: str, data_dir: Path) -> GpuStepModel:
    m = manifest(name)
    gpu = m.gpu
    csv_path = data_dir / m.profile_relpath
    if not csv_path.is_file():
        raise FileNotFoundError(f"operator profile not found at {csv_path}")
    profile = read_operator_profile(csv_path, m.tensor_parallel)
    if m.decode_attention_measured:
        # Only rows whose kernel fills the GPU (one block per request and KV head, at
        # least one per multiprocessor): vLLM's decode kernels split the context over
        # blocks (flash-decoding) and reach this bandwidth-bound regime at any batch;
        # PyTorch's SDPA, which measured the table, does not split it, so with 2 KV
        # heads its small batches take time in proportion to one request's context.
        rows = tuple(r for r in read_decode_attention(csv_path.with_name(ATTENTION_CSV))
                     if r[0] * profile.n_kv_head >= gpu.multiprocessors)
        ref = fit_decode_attention(rows)
        bandwidth_scale = kv_scale = 1.0
    else:
        ref = _reference_decode_attention()
        bandwidth_scale = GPUS[REFERENCE_GPU].hbm_bytes_per_s / gpu.hbm_bytes_per_s
        head_dim = profile.n_embd // profile.n_head
        kv_scale = (profile.n_kv_head / m.tensor_parallel * head_dim
                    / REFERENCE_KV_HEADS_X_HEAD_DIM)
    return GpuStepModel(
        name=name, gpu=gpu.name, model=m.model, tensor_parallel=m.tensor_parallel,
        num_layers=m.num_layers, num_params=m.num_params, profile=profile,
        peak_bf16_flops=gpu.peak_bf16_flops, hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        gpu_memory_bytes=gpu.memory_bytes, allreduce_bytes_per_s=gpu.allreduce_bytes_per_s,
        attn_decode_fixed_ms_per_layer=ref.fixed_ms,
        attn_decode_ms_per_request_per_layer=ref.per_request_ms * bandwidth_scale,
        attn_decode_ms_per_kv_token_per_layer=ref.per_kv_token_ms * bandwidth_scale * kv_scale,
        attn_decode_fit=ref, decode_attention_measured=m.decode_attention_measured,
    )


__all__ = [
    "A100_LLAMA2_7B_DECODE_ATTN_MS", "ATTENTION_CSV", "DecodeAttentionFit", "GpuStepModel",
    "GPUS", "HARDWARE", "HardwareManifest", "MANIFESTS", "MEASURED_HARDWARE", "OperatorProfile",
    "VIDUR_HARDWARE", "hardware_help", "manifest", "read_manifests",
    "default_data_dir", "fit_decode_attention", "isotonic_increasing", "load_hardware",
    "profile_relpath", "read_decode_attention", "read_operator_profile",
]
