"""Liveness of the engine, not of the controller: ``/healthz`` and the systemd
watchdog fail while the engine has requests and no step completes; sd_notify's
READY and watchdog pings."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("tuned.controller")


class EngineLiveness:
    """Whether the engine is stalled: it has requests (running or waiting) and no
    engine step has completed for ``stall_s``, counted from the later of the newest
    step's end (``engine.last_step_done_s``) and the first check that found work after
    an idle spell: an idle engine steps never and is not stalled. Engines that do not
    report ``last_step_done_s`` (the simulator) never are. Logs ``engine_stalled``
    once per stall and ``engine_step_resumed`` after it."""

    def __init__(self, engine: Any, clock: Callable[[], float]) -> None:
        self.engine = engine
        self.clock = clock
        self._busy_since: float | None = None
        self._stall_logged = False

    def stalled(self, stall_s: float) -> bool:
        last = getattr(self.engine, "last_step_done_s", None)
        if last is None:
            return False
        running, waiting = self.engine.counts()
        now = self.clock()
        if running + waiting == 0:
            self._busy_since = None
            stalled = False
        else:
            if self._busy_since is None:
                self._busy_since = now
            age = now - max(last, self._busy_since)
            stalled = age > stall_s
        if stalled != self._stall_logged:
            self._stall_logged = stalled
            if stalled:
                log.error("engine_stalled", running=running, waiting=waiting,
                          since_last_step_s=round(now - last, 3), engine_stall_s=stall_s,
                          action="/healthz 503, no watchdog ping")
            else:
                log.info("engine_step_resumed")
        return stalled


class Watchdog:
    """sd_notify from the controller's thread: READY once the first decision exists
    and the server answers (``serving``), and a watchdog ping every
    ``WATCHDOG_USEC / 2`` while the engine is not stalled."""

    def __init__(self, notifier: Any, clock: Callable[[], float],
                 serving: Callable[[], bool]) -> None:
        self.notifier = notifier
        self.clock = clock
        self.serving = serving
        self.ready_sent = False
        self._last_ping = -math.inf

    def tick(self, interval_s: float, stalled: Callable[[], bool], current: Any) -> None:
        n = self.notifier
        if n is None or not getattr(n, "enabled", False):
            return
        now = self.clock()
        interval = n.watchdog_interval_s
        # pings ride on ticks: allow half a tick of slack so a tick that lands a hair
        # early does not skip its ping (gaps would reach WATCHDOG_USEC otherwise)
        if (interval is not None and now - self._last_ping
                >= interval - min(interval_s, interval) / 2 and not stalled()):
            n.watchdog()
            self._last_ping = now
        if not self.ready_sent and current is not None:
            try:
                serving = self.serving()
            except Exception:
                serving = False
            if serving:
                n.ready(f"cap={current.cap} reason={current.reason}")
                self.ready_sent = True
