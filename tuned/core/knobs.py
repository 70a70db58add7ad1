"""The act state machine: the pending slot between the controller and an engine.

The controller (its own thread, or the simulator's event loop) puts a
:class:`~tuned.policies.batch.Decision` or a :class:`Fallback` into the slot; the
engine takes it at the top of every step with :meth:`KnobSlot.take`, which
returns the two knob values to write (admission cap, token budget) only when
they changed. The slot also owns the fallback rules every engine must obey:

* a :class:`Fallback` (the tick raised, or the decision was invalid or too slow)
  applies ``fallback_cap`` with the full token budget;
* a decision older than ``stale_after_s`` on the controller's clock (the
  controller stalled) does the same, with cause ``stale``; a fresh decision
  clears either;
* the slot carries the knobs only, one way; what the engine's waiting queue reads
  each step, and the outgoing queue's counters going back up, pass through their own
  channel (:mod:`tuned.core.queue_channel`);
* :meth:`KnobSlot.hold` (tuned's code on the engine's step path raised, see
  :mod:`tuned.core.steppath`) applies the fallback cap until :meth:`KnobSlot.release`,
  whatever decisions arrive meanwhile; on release the newest one is taken.

Every value written is clamped: the cap to [1, ceiling], the budget to
[cap + 1, max_num_batched_tokens] (vLLM's ``max_num_scheduled_tokens`` must leave
room for every running decode plus one prefill token, or running requests
starve). Nothing here raises into the engine: :meth:`take` is a few comparisons
and the engine wraps it anyway.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import structlog

from tuned.core.types import Decision

log = structlog.get_logger("tuned.engine")


@dataclass(frozen=True)
class Fallback:
    """Handed to the engine instead of a Decision when a tick fails."""

    cause: str
    cap: int


class Knobs(NamedTuple):
    """The two live knobs: vLLM's ``max_num_active_reqs`` and ``max_num_scheduled_tokens``."""

    cap: int
    token_budget: int


def valid_cap(value: object, ceiling: int) -> bool:
    """True for an integer cap in [1, ceiling] (a bool, NaN or float is not one)."""
    return (isinstance(value, int) and not isinstance(value, bool)
            and 1 <= value <= ceiling)


class KnobSlot:
    """Pending slot + fallback/staleness rules + clamp; see the module docstring.

    ``clock`` is the controller's clock (monotonic in vLLM, virtual in the
    simulator); ``metrics`` (optional) gets the applied knobs and fallback counts.
    Writers: :meth:`offer` and :meth:`mark_ok` (controller side). Reader: :meth:`take`
    (engine side, once per step). Swapping one reference is atomic under the GIL.
    """

    def __init__(self, ceiling: int, max_num_batched_tokens: int, *, stale_after_s: float,
                 fallback_cap: int, clock: Callable[[], float], metrics=None) -> None:
        self.ceiling = int(ceiling)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        self.stale_after_s = float(stale_after_s)
        self.fallback_cap = int(fallback_cap)
        self.clock = clock
        self.metrics = metrics
        self.pending: Decision | Fallback | None = None
        self.last_ok = clock()
        self.fallback_cause: str | None = None
        self._taken: object = None
        self.held: str | None = None
        self.applied = self.clamp(self.fallback_cap, self.max_num_batched_tokens)
        self._export()

    # ------------------------------------------------------------ controller side
    def configure(self, *, stale_after_s: float, fallback_cap: int) -> None:
        """Take a reloaded config's fallback settings."""
        self.stale_after_s = float(stale_after_s)
        self.fallback_cap = int(fallback_cap)

    def offer(self, item: Decision | Fallback) -> None:
        if isinstance(item, Decision):
            # A decision is only offered by a good tick: mark it before the engine can
            # take it. Marked after (as the tick's end did alone), the step that applies
            # it could still find the previous mark stale_after_s old and fall back
            # again right after clearing the fallback.
            self.last_ok = max(self.last_ok, self.clock())
        self.pending = item

    def mark_ok(self, t: float) -> None:
        self.last_ok = t

    # ------------------------------------------------------------ engine side
    def hold(self, cause: str) -> None:
        """Apply the fallback cap (cause ``cause``) from the next :meth:`take` until
        :meth:`release`. Engine thread."""
        self.held = cause

    def release(self) -> None:
        """End a :meth:`hold`: the next :meth:`take` applies the newest pending
        decision (or fallback) again. Engine thread."""
        if self.held is None:
            return
        self.held = None
        self._taken = None
        if self.pending is None and self.fallback_cause is not None:
            self.fallback_cause = None
            if self.metrics is not None:
                self.metrics.in_fallback.set(0)

    def clamp(self, cap: float, budget: float) -> Knobs:
        cap = min(max(int(cap), 1), self.ceiling)
        return Knobs(cap, min(max(int(budget), cap + 1), self.max_num_batched_tokens))

    def take(self) -> Knobs | None:
        """Top of every engine step: the knobs to write now, or None if unchanged."""
        before = self.applied
        p = self.pending
        if self.held is not None:
            self._enter_fallback(self.held, self.fallback_cap)
        elif p is not self._taken:
            self._taken = p
            if isinstance(p, Decision):
                self.applied = self.clamp(p.cap, p.token_budget)
                if self.fallback_cause is not None:
                    log.info("fallback_cleared", cause=self.fallback_cause, cap=self.applied.cap)
                    self.fallback_cause = None
                    if self.metrics is not None:
                        self.metrics.in_fallback.set(0)
            elif isinstance(p, Fallback):
                self._enter_fallback(p.cause, p.cap)
        if (self.held is None and self.fallback_cause is None
                and self.clock() - self.last_ok > self.stale_after_s):
            self._enter_fallback("stale", self.fallback_cap)
        if self.applied == before:
            return None
        self._export()
        return self.applied

    def _enter_fallback(self, cause: str, cap: int) -> None:
        if self.fallback_cause == cause:
            return
        self.fallback_cause = cause
        self.applied = self.clamp(cap, self.max_num_batched_tokens)
        if self.metrics is not None:
            self.metrics.fallbacks.labels(cause).inc()
            self.metrics.in_fallback.set(1)
        age = self.clock() - self.last_ok
        log.warning("fallback", cause=cause, cap=self.applied.cap,
                    last_good_tick_age_s=round(age, 3) if math.isfinite(age) else None)

    def _export(self) -> None:
        if self.metrics is not None:
            self.metrics.applied_cap.set(self.applied.cap)
            self.metrics.token_budget.set(self.applied.token_budget)

    def state(self) -> dict:
        """What ``/decisions`` shows as ``applied``."""
        return {"cap": self.applied.cap, "token_budget": self.applied.token_budget,
                "fallback": self.fallback_cause is not None,
                "fallback_cause": self.fallback_cause}
