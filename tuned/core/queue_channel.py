"""The queue channel: what passes between the controller and an engine's waiting queue,
beside the knob slot (:mod:`tuned.core.knobs`), which carries the two knobs alone.

Down (controller -> engine): the :class:`QueueInputs` the queue reads each step, which
the controller publishes once per tick and whenever the config in force changes; the
engine reads :attr:`QueueChannel.inputs` at the top of its step.

Up (engine -> controller): when the engine installs another queue policy it leaves
the outgoing queue's last counters with :meth:`QueueChannel.switched`; the controller
takes them with :meth:`QueueChannel.take_switch` at its next tick and exports them.
The step path never calls the controller: both ways are one reference swap (atomic
under the GIL).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple


class QueueInputs(NamedTuple):
    """What the engine's waiting queue reads each step, as the controller last
    published it: ``speed_fn(n)`` the profile's per-request decode speed (SABER), and
    the admission guard's step model with its TPOT and TTFT targets (``step_model`` is
    None and both targets 0 while the guard is off), and NVML's free device memory in
    KV tokens (None without NVML or without the engine's KV bytes per token)."""

    speed_fn: Callable[[int], float] | None = None
    step_model: object = None
    tpot_sla_s: float = 0.0
    ttft_sla_s: float = 0.0
    gpu_free_tokens: int | None = None

    @property
    def guard(self) -> tuple[object, float, float]:
        return self.step_model, self.tpot_sla_s, self.ttft_sla_s


#: the outgoing queue's counters, not yet exported (no switch since the last tick)
NO_SWITCH = object()


class QueueChannel:
    """Queue inputs down, the outgoing queue's counters up; see the module docstring."""

    def __init__(self) -> None:
        self.inputs = QueueInputs()
        self._switched: object = NO_SWITCH

    # ------------------------------------------------------------ controller side
    def publish(self, inputs: QueueInputs) -> None:
        """The queue's inputs from now on."""
        self.inputs = inputs

    def take_switch(self) -> object:
        """The counters an engine left with :meth:`switched` since the last call, or
        :data:`NO_SWITCH`."""
        final, self._switched = self._switched, NO_SWITCH
        return final

    # ------------------------------------------------------------ engine side
    def switched(self, final: dict | None) -> None:
        """The engine is about to install another queue policy; ``final`` is the
        outgoing queue's snapshot (None for the engine's own FCFS queue)."""
        self._switched = final
