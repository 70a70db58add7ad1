"""The simulated hardware tuned knows, as data: one manifest a hardware in
``tuned/data/hardware/<name>.toml`` (its GPU, the model's shape and serving tensor-parallel
degree, where its operator tables lie, whether its decode attention was measured with
them, source, licence and vLLM's defaults on that GPU) and the GPUs they run on in
``gpus.toml``. Adding a hardware is adding a manifest and its tables: no code names
one. Cheap to import (the command-line help lists the names); the step-time models
themselves are :mod:`tuned.sim.gpu`'s.
"""

from __future__ import annotations

import functools
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from tuned.data import GPUS_FILE, hardware_dir


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator: peak dense bf16 rate, HBM bandwidth, card memory, all-reduce."""

    name: str
    peak_bf16_flops: float
    hbm_bytes_per_s: float
    memory_bytes: int
    allreduce_bytes_per_s: float
    multiprocessors: int = 0


@dataclass(frozen=True)
class HardwareManifest:
    """One simulated hardware as ``tuned/data/hardware/<name>.toml`` declares it: the GPU
    (a key of ``gpus.toml``), the model's shape and serving TP degree, where its
    operator tables lie, whether its decode attention was measured with them, its
    source and licence, and vLLM's defaults on that GPU. Adding a hardware is adding a
    manifest (and its tables): no code names one."""

    name: str
    summary: str
    gpu: GpuSpec
    model: str
    tables: PurePosixPath          # <data folder>/<gpu>/<model folder>, under tuned/data
    decode_attention_measured: bool
    source: str
    licence: str
    num_layers: int
    num_params: float
    tensor_parallel: int
    vllm_max_num_seqs: int
    vllm_max_num_batched_tokens: int

    @property
    def data_folder(self) -> str:
        """The packaged folder holding the tables (``vidur`` or ``measured``)."""
        return self.tables.parts[0]

    @property
    def profile_relpath(self) -> PurePosixPath:
        """``<gpu>/<model folder>/mlp.csv``: where the table lies inside a data dir."""
        return PurePosixPath(*self.tables.parts[1:], "mlp.csv")


DECODE_ATTENTION_SOURCES = ("reference", "measured")


def _field(where: str, table: dict, key: str, kind: type | tuple[type, ...]) -> Any:
    if key not in table:
        raise ValueError(f"{where}: '{key}' is missing")
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ValueError(f"{where}: '{key}' must be {names}, got {value!r}")
    if isinstance(value, (int, float)) and value < 0:
        raise ValueError(f"{where}: '{key}' must be >= 0, got {value!r}")
    return value


def read_gpus(path: Path) -> dict[str, GpuSpec]:
    """The accelerators of ``gpus.toml``; ``ValueError`` names the file and field."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    num = (int, float)
    return {name: GpuSpec(name, float(_field(f"{path.name} [{name}]", t, "peak_bf16_flops", num)),
                          float(_field(f"{path.name} [{name}]", t, "hbm_bytes_per_s", num)),
                          int(_field(f"{path.name} [{name}]", t, "memory_bytes", int)),
                          float(_field(f"{path.name} [{name}]", t, "allreduce_bytes_per_s", num)),
                          int(t.get("multiprocessors", 0)))
            for name, t in data.items()}


def read_manifest(path: Path, gpus: dict[str, GpuSpec]) -> HardwareManifest:
    """One ``<name>.toml`` manifest; ``ValueError`` names the file and the field."""
    where = path.name
    with open(path, "rb") as f:
        t = tomllib.load(f)
    gpu = _field(where, t, "gpu", str)
    if gpu not in gpus:
        raise ValueError(f"{where}: 'gpu' must be one of {', '.join(sorted(gpus))} "
                         f"(gpus.toml), got {gpu!r}")
    tables = PurePosixPath(_field(where, t, "tables", str))
    if len(tables.parts) != 3 or tables.is_absolute() or ".." in tables.parts:
        raise ValueError(f"{where}: 'tables' must be <data folder>/<gpu>/<model folder>, "
                         f"got {str(tables)!r}")
    attention = _field(where, t, "decode_attention", str)
    if attention not in DECODE_ATTENTION_SOURCES:
        raise ValueError(f"{where}: 'decode_attention' must be one of "
                         f"{', '.join(DECODE_ATTENTION_SOURCES)}, got {attention!r}")
    shape, vllm = _field(where, t, "shape", dict), _field(where, t, "vllm", dict)
    num = (int, float)
    return HardwareManifest(
        name=path.stem, summary=_field(where, t, "summary", str), gpu=gpus[gpu],
        model=_field(where, t, "model", str), tables=tables,
        decode_attention_measured=attention == "measured",
        source=_field(where, t, "source", str), licence=_field(where, t, "licence", str),
        num_layers=_field(f"{where} [shape]", shape, "num_layers", int),
        num_params=float(_field(f"{where} [shape]", shape, "num_params", num)),
        tensor_parallel=_field(f"{where} [shape]", shape, "tensor_parallel", int),
        vllm_max_num_seqs=_field(f"{where} [vllm]", vllm, "max_num_seqs", int),
        vllm_max_num_batched_tokens=_field(f"{where} [vllm]", vllm, "max_num_batched_tokens", int))


def read_manifests(folder: Path) -> dict[str, HardwareManifest]:
    """Every ``*.toml`` manifest of ``folder`` by name (``gpus.toml`` gives their GPUs)."""
    gpus = read_gpus(folder / GPUS_FILE)
    return {p.stem: read_manifest(p, gpus)
            for p in sorted(folder.glob("*.toml")) if p.name != GPUS_FILE}


@functools.cache
def gpus() -> dict[str, GpuSpec]:
    """The packaged GPUs (``tuned/data/hardware/gpus.toml``)."""
    return read_gpus(hardware_dir() / GPUS_FILE)


@functools.cache
def manifests() -> dict[str, HardwareManifest]:
    """The packaged hardware by name, in name order (``tuned/data/hardware``)."""
    return read_manifests(hardware_dir())


def hardware_help() -> str:
    """The hardware names with their summaries, for ``--hardware``'s help."""
    return "; ".join(f"{n}: {m.summary}" for n, m in manifests().items())


__all__ = ["GpuSpec", "HardwareManifest", "gpus", "hardware_help", "manifests", "read_gpus",
           "read_manifest", "read_manifests"]
