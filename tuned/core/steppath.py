"""The step-path guard: what happens when tuned's own code, called by the engine from
its busy loop, raises.

vLLM calls tuned at a handful of entry points (the scheduler hooks ``schedule``,
``update_from_output``, ``_free_request``, and every method of the waiting queue it
holds as ``self.waiting``). Each catches any exception and hands it to
:meth:`StepPathGuard.fault`, which

* counts it in ``tuned_step_path_errors_total{where}`` (every one);
* logs one ``step_path_error`` line, with the traceback, per episode (an episode
  runs from the first fault to recovery; later faults in it are counted, not
  logged: a fault on every step would otherwise write a traceback per step);
* holds the knob slot on the fallback cap (cause ``step_path_error``,
  :meth:`tuned.core.knobs.KnobSlot.hold`), while the engine's queue serves in
  arrival order (:class:`tuned.engines.vllm_queue.PolicyQueue` falls back to vLLM's
  FCFS queue by itself);
* never raises, whatever the metrics or the log sink do.

Recovery rule: an episode ends at the top of the first step that finds no fault for
``recover_after_s`` (:meth:`StepPathGuard.poll` returns True then): the slot is
released and the engine puts its requests back under tuned's queue policy. If the
cause is still there (a request whose hints the policy cannot take is still
waiting), that raises again and a new episode starts: at most one log line per
``recover_after_s`` for a cause that lasts. A reload that installs a queue policy
also restores tuned's order at once (:func:`tuned.engines.vllm_queue.install`).

Engine thread only.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("tuned.engine")

#: a fault-free stretch this long ends an episode (then tuned's order is tried again)
RECOVER_AFTER_S = 30.0
CAUSE = "step_path_error"


class StepPathGuard:
    """Counts, logs once per episode and holds the fallback cap; see the module
    docstring. ``slot`` is the engine's :class:`~tuned.core.knobs.KnobSlot` (None:
    no cap to hold), ``metrics`` the :class:`~tuned.control.metrics.Metrics` (None: count
    here only), ``clock`` the engine's clock."""

    def __init__(self, slot: Any = None, metrics: Any = None, *,
                 clock: Callable[[], float] = time.monotonic,
                 recover_after_s: float = RECOVER_AFTER_S) -> None:
        self.slot = slot
        self.metrics = metrics
        self.clock = clock
        self.recover_after_s = float(recover_after_s)
        self.errors = 0                 # every fault since start
        self.episode_errors = 0         # faults in the current episode
        self.last_fault_s = -math.inf
        self.in_episode = False

    def fault(self, where: str, exc: BaseException) -> None:
        """Contain one exception raised at ``where``. Never raises."""
        try:
            self.errors += 1
            self.episode_errors += 1
            self.last_fault_s = self.clock()
            if self.metrics is not None:
                self.metrics.step_path_errors.labels(where).inc()
            if self.slot is not None:
                self.slot.hold(CAUSE)
            if not self.in_episode:
                self.in_episode = True
                log.error(CAUSE, where=where, error=f"{type(exc).__name__}: {exc}",
                          action="fallback cap and arrival order until tuned recovers",
                          recover_after_s=self.recover_after_s, errors_total=self.errors,
                          exc_info=exc)
        except Exception:  # noqa: S110 - the guard of last resort must not raise
            pass

    def poll(self) -> bool:
        """Top of each engine step: True once, when an episode has just ended (no
        fault for ``recover_after_s``): the caller restores tuned's queue order.
        Never raises."""
        try:
            if not self.in_episode or self.clock() - self.last_fault_s < self.recover_after_s:
                return False
            self.in_episode = False
            if self.slot is not None:
                self.slot.release()
            log.info("step_path_recovered", errors_in_episode=self.episode_errors,
                     quiet_s=self.recover_after_s)
            self.episode_errors = 0
            return True
        except Exception:
            return False
