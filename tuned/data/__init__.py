"""The data tuned ships with: Vidur's GPU operator tables, tuned's own GPU measurements,
the simulated hardware's manifests (``hardware/``) and the Azure conversation trace (sources, licence and how they were reduced or
measured: ``README.md`` beside this file).

Everything is found through :mod:`importlib.resources`, so an installed wheel reads
its own copy and no code reads a path outside the package. ``tools/build_package_data.py``
writes this folder from the full upstream files.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

VIDUR_DIR = "vidur"
MEASURED_DIR = "measured"
HARDWARE_DIR = "hardware"
GPUS_FILE = "gpus.toml"
TRACES_DIR = "traces"
TRACE_SUFFIX = ".csv"


def data_root() -> Path:
    """This package's folder on the file system (a zipped install is refused: the
    simulator opens the tables as files)."""
    root = resources.files(__name__)
    if not isinstance(root, Path):
        raise RuntimeError(f"tuned's package data must be installed as files, not inside "
                           f"an archive ({root})")
    return root


def vidur_dir() -> Path:
    """The packaged operator tables: ``<gpu>/<model>/mlp.csv`` (the default data dir of
    :func:`tuned.sim.gpu.load_hardware`)."""
    return data_root() / VIDUR_DIR


def measured_dir() -> Path:
    """Operator tables tuned measured itself on a GPU (``tools/measure_gpu_ops.py``):
    ``<gpu>/<model>/mlp.csv`` and ``attention.csv`` (the default data dir of
    :func:`tuned.sim.gpu.load_hardware` for those GPUs)."""
    return data_root() / MEASURED_DIR


def hardware_dir() -> Path:
    """The simulated hardware's manifests: ``<name>.toml`` each, and ``gpus.toml``
    (read by :mod:`tuned.sim.gpu`)."""
    return data_root() / HARDWARE_DIR


def trace_names() -> tuple[str, ...]:
    """Names of the packaged traces (``trace:NAME`` in a workload spec)."""
    return tuple(sorted(p.name.removesuffix(TRACE_SUFFIX)
                        for p in (data_root() / TRACES_DIR).glob(f"*{TRACE_SUFFIX}")))


def trace_path(name: str) -> Path:
    """The packaged trace ``name`` (e.g. ``azure_conv_2023``); ValueError names the
    known ones."""
    known = trace_names()
    if name not in known:
        raise ValueError(f"no packaged trace {name!r}; packaged: {', '.join(known)}")
    return data_root() / TRACES_DIR / f"{name}{TRACE_SUFFIX}"


def data_files() -> tuple[str, ...]:
    """Every data file of the package, as POSIX paths relative to :func:`data_root`
    (the Python sources and caches excluded): what a wheel must carry."""
    root = data_root()
    return tuple(sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                        if p.is_file() and p.suffix not in (".py", ".pyc")
                        and "__pycache__" not in p.parts))


__all__ = ["GPUS_FILE", "HARDWARE_DIR", "MEASURED_DIR", "TRACES_DIR", "VIDUR_DIR", "data_files",
           "data_root", "hardware_dir", "measured_dir", "trace_names", "trace_path", "vidur_dir"]
