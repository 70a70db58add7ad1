"""What a profile records about where it was measured: the model's shape, the
host's CPU and GPUs, the versions."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from tuned.curves.fit import kv_bytes_per_token


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "float8": 1, "fp8": 1, "int8": 1}


def model_config_summary(model_dir: str | Path) -> dict[str, Any] | None:
    """Shape of a Hugging Face model folder from its config.json (None if not a folder)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    text_cfg = cfg.get("text_config") or cfg
    heads = text_cfg.get("num_attention_heads")
    hidden = text_cfg.get("hidden_size")
    head_dim = text_cfg.get("head_dim") or (hidden // heads if hidden and heads else None)
    kv_heads = text_cfg.get("num_key_value_heads") or heads
    layers = text_cfg.get("num_hidden_layers")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or text_cfg.get("torch_dtype") or "")
    out = {"architecture": (cfg.get("architectures") or [None])[0], "num_layers": layers,
           "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv_heads,
           "head_dim": head_dim, "vocab_size": text_cfg.get("vocab_size"), "dtype": dtype or None,
           "kv_bytes_per_token": None}
    if layers and kv_heads and head_dim and dtype in _DTYPE_BYTES:
        out["kv_bytes_per_token"] = kv_bytes_per_token(layers, kv_heads, head_dim,
                                                       _DTYPE_BYTES[dtype])
    return out


def hardware_info(cpuinfo_path: str = "/proc/cpuinfo", pynvml: Any = None) -> dict[str, Any]:
    """CPU model and core count, and GPU name/count from NVML (None when there is none)."""
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path(cpuinfo_path).read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    if not cpu:
        import platform

        cpu = platform.processor() or platform.machine() or None
    gpu, gpu_count = None, 0
    try:
        nv = pynvml
        if nv is None:
            import pynvml as nv  # nvidia-ml-py
        nv.nvmlInit()
        gpu_count = int(nv.nvmlDeviceGetCount())
        if gpu_count:
            name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0))
            gpu = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver / no library / no device: a CPU host
        gpu, gpu_count = None, 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": cpu, "cpu_cores": cores, "gpu": gpu, "gpu_count": gpu_count}


def package_version(dist_names: tuple[str, ...]) -> str | None:
    for name in dist_names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def tuned_version() -> str | None:
    with contextlib.suppress(Exception):
        import tuned

        v = getattr(tuned, "__version__", None)
        if v:
            return str(v)
    return package_version(("tuned-llm",))
