"""What the simulator runs on: a step-time model plus the engine's memory and
defaults. ``--hardware NAME`` picks a GPU-shaped model (:mod:`tuned.sim.gpu`),
``--profile FILE`` a model measured on this host by `tuned profile`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuned.sim.stepmodel import ProfileStepModel, StepClock

#: vLLM 0.32's own defaults for its OpenAI server (``EngineArgs.get_batch_defaults``):
#: H100-class (>= 70 GiB, not A100) 1024 / 8192, other GPUs (A100) 256 / 2048,
#: the CPU build 128 / 2048 (world size 1).
VLLM_DEFAULTS = {"h100": (1024, 8192), "a100": (256, 2048), "cpu": (128, 2048)}


@dataclass(frozen=True)
class SimHardware:
    name: str
    step_model: StepClock
    block_size: int
    num_gpu_blocks: int                     # blocks the engine would allocate (null block included)
    vllm_default_max_num_seqs: int
    vllm_default_max_num_batched_tokens: int
    info: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "block_size": self.block_size,
                "num_gpu_blocks": self.num_gpu_blocks,
                "vllm_default_max_num_seqs": self.vllm_default_max_num_seqs,
                "vllm_default_max_num_batched_tokens": self.vllm_default_max_num_batched_tokens,
                "step_model": self.step_model.describe(), **self.info}


def gpu_hardware(name: str, data_dir: Path | None = None, block_size: int = 16,
                 gpu_memory_utilization: float = 0.9) -> SimHardware:
    """A named GPU-shaped model (``a100-llama2-7b`` ...); ``ValueError`` names the known ones."""
    from tuned.sim.gpu import load_hardware

    model = load_hardware(name, data_dir)
    seqs, toks = VLLM_DEFAULTS["h100" if name.startswith("h100") else "a100"]
    return SimHardware(name, model, block_size,
                       model.num_gpu_blocks(block_size, gpu_memory_utilization) + 1,
                       seqs, toks, {"gpu_memory_utilization": gpu_memory_utilization})


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
                       blocks, seqs, toks, {"profile": str(path)})


def resolve_hardware(hardware: str | None = None, profile: str | None = None,
                     data_dir: Path | None = None) -> SimHardware:
    """``--hardware NAME`` (tables from ``data_dir``, by default the packaged ones) or
    ``--profile FILE``."""
    if bool(hardware) == bool(profile):
        raise ValueError("give exactly one of --hardware NAME or --profile FILE")
    if data_dir is not None and not hardware:
        raise ValueError("--data-dir: applies only with --hardware (GPU operator tables)")
    return gpu_hardware(hardware, data_dir) if hardware else profile_hardware(profile)
