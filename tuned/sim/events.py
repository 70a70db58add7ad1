"""What happens to the simulated hardware during a run (``--events``, ``tuned
simulate`` and ``tuned bench --engine sim``), comma-separated:

* ``gpu_pressure=T0-T1@U``: another tenant holds GPU memory so that the GPU is ``U``
  used during ``[T0, T1)`` (:mod:`tuned.sim.nvml`, read through a simulated NVML);
* ``slowdown=T0-T1@F``: every step takes ``F`` times as long during ``[T0, T1)`` (a
  co-tenant, thermal throttling, a host that slows);
* ``drift=P@F``: the step time swings smoothly between its own and ``F`` times it,
  with period ``P`` seconds: ``1 + (F - 1) * (1 - cos(2 pi t / P)) / 2``, its own at
  ``t = 0``, ``F`` times at ``t = P / 2`` (a host of this project's kind drifted by 2x
  within minutes).

Step-time factors in force multiply; the engine's own time between steps scales with
them. A hardware model stays pure (same shape, same time); the drift is the run's,
applied by :class:`tuned.sim.engine.SimEngine` at the step's start.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tuned.base.inputs import EVENT_NUMBER, window_event
from tuned.sim.nvml import GpuPressure
from tuned.sim.nvml import parse_events as parse_pressure

EVENT_KINDS = ("gpu_pressure", "slowdown", "drift")
FACTOR_RANGE = (0.1, 10.0)
MAX_PERIOD_S = 1e6
_SLOWDOWN = window_event("slowdown")
_DRIFT = re.compile(rf"drift={EVENT_NUMBER}@{EVENT_NUMBER}")
FORMS = "gpu_pressure=T0-T1@U, slowdown=T0-T1@F or drift=P@F"
HELP = ("events in simulated time, comma-separated: gpu_pressure=T0-T1@U makes the GPU U "
        "used (a fraction of its memory, another tenant's; --hardware only, read through a "
        "simulated NVML) from T0 to T1 seconds; slowdown=T0-T1@F makes every step F times "
        "as long from T0 to T1; drift=P@F swings the step time between its own and F times "
        "it with period P seconds")


@dataclass(frozen=True)
class Slowdown:
    """Steps take ``factor`` times as long during ``[start_s, end_s)``."""

    start_s: float
    end_s: float
    factor: float

    def factor_at(self, t: float) -> float:
        return self.factor if self.start_s <= t < self.end_s else 1.0

    def describe(self) -> dict:
        return {"kind": "slowdown", "start_s": self.start_s, "end_s": self.end_s,
                "factor": self.factor}


@dataclass(frozen=True)
class Drift:
    """Steps take 1 to ``peak`` times as long, a cosine of period ``period_s``."""

    period_s: float
    peak: float

    def factor_at(self, t: float) -> float:
        return 1.0 + (self.peak - 1.0) * (1.0 - math.cos(2.0 * math.pi * t / self.period_s)) / 2

    def describe(self) -> dict:
        return {"kind": "drift", "period_s": self.period_s, "peak": self.peak}


@dataclass(frozen=True)
class StepDrift:
    """The step-time factor of a run at virtual time ``t``: the product of its parts."""

    parts: tuple[Slowdown | Drift, ...]

    def factor(self, t: float) -> float:
        f = 1.0
        for p in self.parts:
            f *= p.factor_at(t)
        return f

    def describe(self) -> list[dict]:
        return [p.describe() for p in self.parts]


@dataclass(frozen=True)
class SimEvents:
    """A run's events: memory pressure (for a simulated NVML) and step-time drift."""

    pressure: tuple[GpuPressure, ...] = ()
    drift: StepDrift | None = None

    def __bool__(self) -> bool:
        return bool(self.pressure) or self.drift is not None

    def describe(self) -> list[dict]:
        return [e.describe() for e in self.pressure] + (self.drift.describe() if self.drift
                                                        else [])

    def lines(self, hardware: str) -> list[str]:
        """One readable line per event, for the command's preamble."""
        out = [f"gpu_pressure {e.start_s:g}-{e.end_s:g} s: {e.used_fraction:g} of "
               f"{hardware}'s memory used" for e in self.pressure]
        for p in self.drift.parts if self.drift else ():
            out.append(f"slowdown {p.start_s:g}-{p.end_s:g} s: steps x{p.factor:g}"
                       if isinstance(p, Slowdown) else
                       f"drift: steps x1 to x{p.peak:g} and back every {p.period_s:g} s")
        return out


def _factor(item: str, f: float) -> None:
    lo, hi = FACTOR_RANGE
    if not lo <= f <= hi:
        raise ValueError(f"--events: {item[:60]!r} needs F in [{lo:g}, {hi:g}], got F={f:g}")


def parse_events(text: str) -> SimEvents:
    """``--events``: comma-separated items of :data:`EVENT_KINDS` (module docstring);
    ``ValueError`` with a one-line message naming the item, its form and ranges."""
    pressure: list[GpuPressure] = []
    parts: list[Slowdown | Drift] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        kind = item.partition("=")[0]
        if kind == "gpu_pressure":
            pressure += parse_pressure(item)
        elif kind == "slowdown" and (m := _SLOWDOWN.fullmatch(item)):
            t0, t1, f = (float(g) for g in m.groups())
            if not t0 < t1:
                raise ValueError(f"--events: {item[:60]!r} needs T0 < T1, got T0={t0:g}, "
                                 f"T1={t1:g}")
            _factor(item, f)
            parts.append(Slowdown(t0, t1, f))
        elif kind == "drift" and (m := _DRIFT.fullmatch(item)):
            period, f = (float(g) for g in m.groups())
            if not 0 < period <= MAX_PERIOD_S:
                raise ValueError(f"--events: {item[:60]!r} needs P in (0, {MAX_PERIOD_S:g}] "
                                 f"seconds, got P={period:g}")
            _factor(item, f)
            parts.append(Drift(period, f))
        else:
            raise ValueError(f"--events: {item[:60]!r} must be {FORMS} (seconds T0 < T1, "
                             f"period P > 0, used fraction U in [0, 1], step-time factor F "
                             f"in [{FACTOR_RANGE[0]:g}, {FACTOR_RANGE[1]:g}])")
    return SimEvents(tuple(pressure), StepDrift(tuple(parts)) if parts else None)


__all__ = ["Drift", "EVENT_KINDS", "HELP", "SimEvents", "Slowdown", "StepDrift", "parse_events"]
