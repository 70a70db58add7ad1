"""GPU memory from NVML, or a clear 'no GPU' and engine-only telemetry.

The pynvml module (from the nvidia-ml-py package) is the hardware boundary: it is
passed in, so tests hand a fake module with the same function names and error class.
"""

from __future__ import annotations

from typing import Any

import structlog

from tuned.core.types import GpuMemory

log = structlog.get_logger("tuned.nvml")


def free_fraction(gpus: list[GpuMemory] | None) -> float | None:
    """Device free memory over total, the lowest over ``gpus`` (what the GPU-memory
    guard reads); None without a sample or without a device that reports a total."""
    fractions = [(g.total_bytes - g.used_bytes) / g.total_bytes
                 for g in gpus or () if g.total_bytes > 0]
    return max(0.0, min(fractions)) if fractions else None


def free_bytes(gpus: list[GpuMemory] | None) -> int | None:
    """Device free memory in bytes on the GPU with the least of it; None without a
    sample."""
    return max(0, min(g.total_bytes - g.used_bytes for g in gpus)) if gpus else None


def _default_pynvml():
    import pynvml  # provided by nvidia-ml-py

    return pynvml


class NvmlSampler:
    """Reads used/total device memory for the GPUs visible to this process.

    ``start()`` initialises NVML once. Where it fails (no driver, no device, no
    library) the sampler disables itself, logs one line saying telemetry is
    engine-only (``nvml_unavailable``), and ``sample()`` returns None from then on.

    A query that raises mid-run (a driver hiccup, a device that fell off the bus:
    ``NVML_ERROR_GPU_IS_LOST``) makes ``sample()`` return None and logs one
    ``nvml_lost`` line; later calls keep asking (one cheap NVML call per controller
    tick) and log one ``nvml_recovered`` line if the device answers again, so a
    transient error does not cost the GPU series for the life of the service.
    ``available`` says whether the last sample succeeded.
    """

    def __init__(self, pynvml: Any = None, device_indices: list[int] | None = None):
        self._pynvml = pynvml
        self._device_indices = device_indices
        self._handles: list[tuple[int, str, Any]] = []
        self.available = False
        self.reason = "not started"

    def start(self) -> bool:
        try:
            nv = self._pynvml if self._pynvml is not None else _default_pynvml()
            self._pynvml = nv
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
            indices = self._device_indices if self._device_indices is not None else range(count)
            for i in indices:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = nv.nvmlDeviceGetName(h)
                if isinstance(name, bytes):
                    name = name.decode()
                self._handles.append((i, str(name), h))
            if not self._handles:
                raise RuntimeError("NVML reports no GPU device")
        except Exception as e:  # any NVML failure means: no GPU telemetry
            self._handles = []
            self.available = False
            self.reason = f"{type(e).__name__}: {e}"
            log.info("nvml_unavailable", telemetry="engine-only", reason=self.reason)
            return False
        self.available = True
        self.reason = "ok"
        log.info("nvml_ready", gpus=[n for _, n, _ in self._handles])
        return True

    def sample(self) -> list[GpuMemory] | None:
        if not self._handles:  # NVML never came up: engine-only for good
            return None
        out = []
        try:
            for i, name, h in self._handles:
                m = self._pynvml.nvmlDeviceGetMemoryInfo(h)
                out.append(GpuMemory(i, name, int(m.used), int(m.total)))
        except Exception as e:
            # A device that stops answering mid-run: keep serving, report once per
            # episode, ask again next tick.
            if self.available:
                self.available = False
                self.reason = f"{type(e).__name__}: {e}"
                log.warning("nvml_lost", telemetry="engine-only", reason=self.reason,
                            note="GPU memory series withdrawn; NVML is asked again every tick")
            return None
        if not self.available:
            self.available = True
            log.info("nvml_recovered", gpus=[n for _, n, _ in self._handles],
                     after=self.reason)
            self.reason = "ok"
        return out

    def stop(self) -> None:
        if self._handles:
            self._handles = []
            self.available = False
            try:
                self._pynvml.nvmlShutdown()
            except Exception:
                pass
