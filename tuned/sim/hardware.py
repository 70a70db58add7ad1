"""What the simulator runs on: a step-time model plus the engine's memory and
defaults. ``--hardware NAME`` picks a GPU-shaped model (:mod:`tuned.sim.gpu`),
``--profile FILE`` a model measured on this host by `tuned profile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuned.sim.nvml import GpuPressure, SimNvml
from tuned.sim.stepmodel import ProfileStepModel, StepClock

#: vLLM 0.32's own defaults for its OpenAI server (``EngineArgs.get_batch_defaults``,
#: ``UsageContext.OPENAI_API_SERVER``): H100-class (>= 70 GiB, not A100) 1024 / 8192,
#: other GPUs (A100) 256 / 2048, the CPU build 128 / 2048 (world size 1). (8192 for
#: an A100 is the offline ``LLM`` class's figure, not the server's.) A simulated GPU's
#: own pair is in its manifest (``tuned/data/hardware``); a profile measured on a GPU
#: host takes the A100 pair.
VLLM_DEFAULTS = {"h100": (1024, 8192), "a100": (256, 2048), "cpu": (128, 2048)}
#: the longest sequence the simulated GPU engines run, and the CPU build's (the demo
#: models' own context)
GPU_MAX_MODEL_LEN = 8192
CPU_MAX_MODEL_LEN = 1024
#: the KV cache `tuned bench --engine vllm` gives the CPU build (the embedded default's)
CPU_NUM_GPU_BLOCKS = 48


@dataclass(frozen=True)
class SimHardware:
    name: str
    step_model: StepClock
    block_size: int
    num_gpu_blocks: int                     # blocks the engine would allocate (null block included)
    vllm_default_max_num_seqs: int
    vllm_default_max_num_batched_tokens: int
    info: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = GPU_MAX_MODEL_LEN
    gpu_memory_bytes: int = 0               # one card's memory (0: not a GPU model)
    gpu_memory_utilization: float = 0.9     # the share vLLM reserves at start
    kv_bytes_per_token: float = 0.0         # KV bytes per token on one card (0: unknown)

    def engine_defaults(self) -> dict[str, int]:
        """The engine as vLLM starts it on this hardware: see :func:`engine_defaults`."""
        return {"max_num_seqs": self.vllm_default_max_num_seqs,
                "max_num_batched_tokens": self.vllm_default_max_num_batched_tokens,
                "max_model_len": self.max_model_len, "num_gpu_blocks": self.num_gpu_blocks,
                # the step time of a GPU model is a staircase in the tokens, a
                # profile's (this CPU host's) a line
                "token_budget_granule": 256 if self.gpu_memory_bytes else 0}

    def nvml(self, events: Sequence[GpuPressure]) -> SimNvml:
        """A simulated NVML for ``events`` on this GPU: vLLM's reserved share used
        outside them. ``ValueError`` for a hardware that is not a GPU model."""
        if not self.gpu_memory_bytes:
            raise ValueError(f"--events: gpu_pressure needs a GPU model (--hardware), "
                             f"{self.name} has no GPU memory figure")
        return SimNvml(events, total_bytes=self.gpu_memory_bytes,
                       baseline_used_fraction=self.gpu_memory_utilization, name=self.name)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "block_size": self.block_size,
                "num_gpu_blocks": self.num_gpu_blocks,
                "vllm_default_max_num_seqs": self.vllm_default_max_num_seqs,
                "vllm_default_max_num_batched_tokens": self.vllm_default_max_num_batched_tokens,
                "step_model": self.step_model.describe(), **self.info}


def gpu_hardware(name: str, data_dir: Path | None = None, block_size: int = 16,
                 gpu_memory_utilization: float = 0.9) -> SimHardware:
    """A named GPU-shaped model (``a100-llama2-7b`` ...); ``ValueError`` names the known ones."""
    from tuned.sim.gpu import load_hardware, manifest

    model = load_hardware(name, data_dir)
    m = manifest(name)
    seqs, toks = m.vllm_max_num_seqs, m.vllm_max_num_batched_tokens
    return SimHardware(name, model, block_size,
                       model.num_gpu_blocks(block_size, gpu_memory_utilization) + 1,
                       seqs, toks, {"gpu_memory_utilization": gpu_memory_utilization},
                       gpu_memory_bytes=model.gpu_memory_bytes,
                       gpu_memory_utilization=gpu_memory_utilization,
                       kv_bytes_per_token=model.kv_bytes_per_token / model.tensor_parallel)


def profile_hardware(path: str | Path) -> SimHardware:
    """The host a profile was measured on: its step-time fit, block size and cache."""
    from tuned.curves.profile import load_profile

    prof = load_profile(path)
    eng = prof.meta.get("engine") or {}
    block = int(eng.get("block_size") or 16)
    blocks = int(eng.get("num_gpu_blocks") or 0)
    gpu = (prof.meta.get("hardware") or {}).get("gpu")
    seqs, toks = VLLM_DEFAULTS["cpu" if not gpu else "a100"]
    return SimHardware(f"profile:{Path(path).name}", ProfileStepModel(prof), block,
                       blocks, seqs, toks, {"profile": str(path)},
                       max_model_len=CPU_MAX_MODEL_LEN)


#: the KV block of vLLM's CPU build (its attention backend's page)
CPU_BLOCK_SIZE = 128


def fitted_hardware(fit: dict, engine: dict[str, int], gap_s: float = 0.0) -> SimHardware:
    """The CPU host a real engine's step fit describes (``fit``: ``a``, ``beta``,
    ``gamma`` and ``eta``, seconds, as `tuned bench --engine vllm` measures it before
    its contenders), with the engine's settings ``engine`` (:func:`engine_defaults`
    of None, or the bench's) and ``gap_s`` between steps. ValueError for a fit without
    a positive step."""
    from tuned.curves.online import LinearStepModel

    from tuned.sim.stepmodel import LinearStepClock

    try:
        model = LinearStepModel(float(fit["a"]), float(fit["beta"]), float(fit["gamma"]),
                                float(fit.get("eta") or 0.0), source="measured")
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"step fit: needs numbers a, beta and gamma, got {fit!r}") from None
    if not model.predict_step_s(1) > 0:
        raise ValueError(f"step fit: a batch-1 step of {model.predict_step_s(1)!r} s")
    seqs, toks = VLLM_DEFAULTS["cpu"]
    return SimHardware("measured step fit", LinearStepClock(model, "measured step fit",
                                                            max(gap_s, 0.0)),
                       CPU_BLOCK_SIZE, int(engine.get("num_gpu_blocks") or CPU_NUM_GPU_BLOCKS),
                       int(engine.get("max_num_seqs") or seqs),
                       int(engine.get("max_num_batched_tokens") or toks),
                       {"fit": dict(fit)},
                       max_model_len=int(engine.get("max_model_len") or CPU_MAX_MODEL_LEN))


def engine_defaults(hardware: SimHardware | None) -> dict[str, int]:
    """The engine settings ``tuned simulate`` and ``tuned bench`` start from (a config
    file's keys override them): vLLM 0.32's ``max_num_seqs`` and
    ``max_num_batched_tokens`` for the hardware (:data:`VLLM_DEFAULTS`), its longest
    sequence and its KV blocks. ``None`` is the CPU build that ``tuned bench --engine
    vllm`` runs (the demo models, :data:`CPU_NUM_GPU_BLOCKS` blocks)."""
    if hardware is not None:
        return hardware.engine_defaults()
    seqs, toks = VLLM_DEFAULTS["cpu"]
    return {"max_num_seqs": seqs, "max_num_batched_tokens": toks,
            "max_model_len": CPU_MAX_MODEL_LEN, "num_gpu_blocks": CPU_NUM_GPU_BLOCKS,
            "token_budget_granule": 0}


def resolve_hardware(hardware: str | None = None, profile: str | None = None,
                     data_dir: Path | None = None) -> SimHardware:
    """``--hardware NAME`` (tables from ``data_dir``, by default the packaged ones) or
    ``--profile FILE``."""
    if bool(hardware) == bool(profile):
        raise ValueError("give exactly one of --hardware NAME or --profile FILE")
    if data_dir is not None and not hardware:
        raise ValueError("--data-dir: applies only with --hardware (GPU operator tables)")
    return gpu_hardware(hardware, data_dir) if hardware else profile_hardware(profile)
