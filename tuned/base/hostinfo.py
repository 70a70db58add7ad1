"""What this host's CPU can do, read from ``/proc/cpuinfo`` (a parameter, so tests
pass a fixture): which dtype the demo model should run in on vLLM's CPU backend.

vLLM's CPU backend runs bfloat16 matmuls through oneDNN only where the CPU has
native bfloat16 instructions (AVX-512 BF16 or AMX); elsewhere it logs ``Failed to
create oneDNN linear, fallback to torch linear`` and bfloat16 becomes several
times slower than float32, the more so the larger the batch.
"""

from __future__ import annotations

from pathlib import Path

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _first_field(cpuinfo: str | Path, name: str) -> str | None:
    """The value of the first ``name : value`` line (None when absent or unreadable)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """The ``flags`` of the first CPU listed (empty when the file is unreadable)."""
    return frozenset((_first_field(cpuinfo, "flags") or "").split())


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The ``model name`` of the first CPU listed ("unknown" when the file has none)."""
    return _first_field(cpuinfo, "model name") or "unknown"


def preferred_cpu_dtype(flags: frozenset[str] | None = None) -> str:
    """``bfloat16`` where the CPU has native bfloat16 matmuls, else ``float32``."""
    flags = cpu_flags() if flags is None else flags
    return "bfloat16" if any(f in flags for f in BF16_FLAGS) else "float32"


def demo_dtype_args(model: str, vllm_args: list[str] | tuple[str, ...],
                    flags: frozenset[str] | None = None) -> list[str]:
    """``["--dtype", D]`` for a demo model (``demo:*``) on a CPU host unless the
    caller already chose a dtype; [] otherwise."""
    if not model.startswith("demo:"):
        return []
    if any(a == "--dtype" or a.startswith("--dtype=") for a in vllm_args):
        return []
    return ["--dtype", preferred_cpu_dtype(flags)]
