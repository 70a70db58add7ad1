"""The real engine's server throttled for part of a run (``tuned bench --engine
vllm --events throttle=T0-T1@F``): from ``T0`` to ``T1`` seconds of the workload the
server's processes (its API server, engine core and workers) run ``1/F`` of every
:data:`PERIOD_S` and are stopped (SIGSTOP, then SIGCONT) for the rest, as a CPU
quota throttles a container (a cgroup's ``cpu.max``, a Kubernetes CPU limit) or a
host whose speed drops does to its steps. It is the real engine's counterpart of the
simulator's ``slowdown=T0-T1@F`` (:mod:`tuned.sim.events`), so that every contender
meets the same slowdown at the same point of its arrivals.

A process spinning beside the engine does not do this: the host's scheduler gives a
waking engine thread the core before a spinner that has run longer, so the engine is
slowed only once it is saturated. The throttler is a process of its own, so the
client's event loop neither delays it nor is delayed by it; it continues every
process when it ends, at ``T1``, on SIGTERM, or when the run ends first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from tuned.base.inputs import window_event

FORM = "throttle=T0-T1@F"
FACTOR_RANGE = (1.0, 10.0)
PERIOD_S = 0.02
_THROTTLE = window_event("throttle")

# argv: pids (comma-separated), run seconds, stopped seconds, duration; continues
# every pid when it ends or is terminated
_THROTTLER = """\
import os, signal, sys, time
pids = [int(p) for p in sys.argv[1].split(",")]
run_s, stop_s, end = float(sys.argv[2]), float(sys.argv[3]), time.monotonic() + float(sys.argv[4])
def send(sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
def cont(*_):
    send(signal.SIGCONT)
    sys.exit(0)
signal.signal(signal.SIGTERM, cont)
try:
    while time.monotonic() < end:
        time.sleep(run_s)
        send(signal.SIGSTOP)
        time.sleep(stop_s)
        send(signal.SIGCONT)
finally:
    cont()
"""


@dataclass(frozen=True)
class Throttle:
    """The server runs ``1 / factor`` of the time during ``[start_s, end_s)``."""

    start_s: float
    end_s: float
    factor: float


def parse_throttles(text: str) -> tuple[Throttle, ...]:
    """``--events`` for the real engine: comma-separated ``throttle=T0-T1@F``, not
    overlapping; ``ValueError`` with a one-line message naming the item, its form
    and ranges."""
    out: list[Throttle] = []
    lo, hi = FACTOR_RANGE
    for item in (s.strip() for s in (text or "").split(",")):
        if not item:
            continue
        m = _THROTTLE.fullmatch(item)
        if m is None:
            raise ValueError(f"--events: {item[:60]!r} must be {FORM} on the real engine "
                             f"(the server runs 1/F of the time from T0 to T1 seconds of "
                             f"the workload; seconds T0 < T1, F in [{lo:g}, {hi:g}])")
        t0, t1, f = (float(g) for g in m.groups())
        if not t0 < t1:
            raise ValueError(f"--events: {item[:60]!r} needs T0 < T1, got T0={t0:g}, "
                             f"T1={t1:g}")
        if not lo <= f <= hi:
            raise ValueError(f"--events: {item[:60]!r} needs F in [{lo:g}, {hi:g}], got "
                             f"F={f:g}")
        for o in out:
            if t0 < o.end_s and o.start_s < t1:
                raise ValueError(f"--events: {item[:60]!r} overlaps throttle="
                                 f"{o.start_s:g}-{o.end_s:g}@{o.factor:g}")
        out.append(Throttle(t0, t1, f))
    return tuple(out)


def server_pids(pid: int) -> list[int]:
    """The server's process and every process under it."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [pid] + [c.pid for c in root.children(recursive=True)]
    except psutil.Error:
        return []


def _cont(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGCONT)
        except OSError:
            pass


async def _one(ev: Throttle, pid: int, t0: float, clock: Callable[[], float]) -> None:
    await asyncio.sleep(max(0.0, t0 + ev.start_s - clock()))
    left = t0 + ev.end_s - clock()
    pids = server_pids(pid)
    if left <= 0 or not pids:
        return
    run_s = PERIOD_S / ev.factor
    proc = subprocess.Popen([sys.executable, "-c", _THROTTLER, ",".join(map(str, pids)),
                             f"{run_s:.6f}", f"{PERIOD_S - run_s:.6f}", f"{left:.3f}"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None:
            await asyncio.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.terminate()         # it continues every process as it goes
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _cont(pids)


async def run_throttles(events: tuple[Throttle, ...], pid: int, t0: float,
                        clock: Callable[[], float]) -> None:
    """Throttle the server ``pid`` (and every process under it) at each event's times
    relative to ``t0`` on ``clock``; cancelling this task continues the server."""
    for ev in sorted(events, key=lambda e: e.start_s):
        await _one(ev, pid, t0, clock)


__all__ = ["FORM", "PERIOD_S", "Throttle", "parse_throttles", "run_throttles",
           "server_pids"]
