"""GPU memory for the simulator: NVML's ``sample()`` on the virtual clock, with
memory-pressure events.

``tuned simulate --events gpu_pressure=T0-T1@U`` says another tenant holds device
memory so that the GPU is ``U`` used (a fraction of its memory) during
``[T0, T1)`` seconds of virtual time. Outside the events the GPU is as used as
vLLM leaves it: ``gpu_memory_utilization`` of it (vLLM reserves that share at
start). :class:`SimNvml` answers ``sample()`` as
:class:`tuned.telemetry.nvml.NvmlSampler` does, so the controller path is the one
a real GPU runs (the GPU-memory guard reads it, ``tuned_gpu_memory_*`` exports it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tuned.core.types import GpuMemory
from tuned.base.inputs import window_event

EVENT_KINDS = ("gpu_pressure",)
_PRESSURE = window_event("gpu_pressure")


@dataclass(frozen=True)
class GpuPressure:
    """The GPU is ``used_fraction`` used during ``[start_s, end_s)`` of virtual time."""

    start_s: float
    end_s: float
    used_fraction: float

    def describe(self) -> dict:
        return {"kind": "gpu_pressure", "start_s": self.start_s, "end_s": self.end_s,
                "used_fraction": self.used_fraction}


def parse_events(text: str) -> tuple[GpuPressure, ...]:
    """``gpu_pressure=T0-T1@U[,gpu_pressure=...]``; ``ValueError`` with a one-line
    message naming the item and the allowed form and ranges."""
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = _PRESSURE.fullmatch(item)
        if m is None:
            raise ValueError(f"--events: {item[:60]!r} must be gpu_pressure=T0-T1@U "
                             "(seconds T0 < T1, used fraction U in [0, 1])")
        t0, t1, used = (float(g) for g in m.groups())
        if not t0 < t1 or not 0.0 <= used <= 1.0:
            raise ValueError(f"--events: {item[:60]!r} needs T0 < T1 and U in [0, 1], "
                             f"got T0={t0:g}, T1={t1:g}, U={used:g}")
        out.append(GpuPressure(t0, t1, used))
    return tuple(out)


class SimNvml:
    """One simulated GPU of ``total_bytes``; see the module docstring. ``clock`` is the
    engine's virtual clock (set by :class:`tuned.sim.engine.SimEngine`)."""

    def __init__(self, events: Sequence[GpuPressure], *, total_bytes: int,
                 baseline_used_fraction: float, name: str = "simulated GPU",
                 clock: Callable[[], float] = lambda: 0.0) -> None:
        if total_bytes <= 0 or not 0.0 <= baseline_used_fraction <= 1.0:
            raise ValueError("SimNvml: need total_bytes > 0 and a baseline used fraction "
                             f"in [0, 1], got {total_bytes}, {baseline_used_fraction}")
        self.events = tuple(events)
        self.total_bytes = int(total_bytes)
        self.baseline = float(baseline_used_fraction)
        self.name = name
        self.clock = clock
        self.available = True
        self.reason = "ok"

    def start(self) -> bool:
        return True

    def used_fraction(self, t: float) -> float:
        """The GPU's used share at virtual time ``t``: the highest event in force, else
        the baseline."""
        return max([e.used_fraction for e in self.events if e.start_s <= t < e.end_s],
                   default=self.baseline)

    def sample(self) -> list[GpuMemory]:
        used = round(self.used_fraction(self.clock()) * self.total_bytes)
        return [GpuMemory(0, self.name, used, self.total_bytes)]

    def stop(self) -> None:
        pass


__all__ = ["EVENT_KINDS", "GpuPressure", "SimNvml", "parse_events"]
