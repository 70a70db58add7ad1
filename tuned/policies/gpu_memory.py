"""GPU memory in the decision: a guard around any batch policy.

Device memory that another tenant, a second process or fragmentation takes is an
input the batch policies do not see (they read the KV cache vLLM allocated at
start). :class:`GpuMemoryGuard` wraps a policy (anything with
``decide(observation) -> Decision``) and reads ``Observation.gpu_free_fraction``:
NVML's free memory over total, the lowest over the visible GPUs.

The rule, per controller tick:

* **Pressure** (free < ``floor``): the guard's limit falls multiplicatively, to
  ``floor(DECREASE x min(limit, running))`` (the limit starts at the inner policy's
  cap; an idle engine halves the limit itself), never below ``b_min``. The cap
  applied is ``min(inner cap, limit)``; reason ``gpu_memory_pressure``. Each tick
  under pressure halves again, so the cap reaches ``b_min`` within
  ``log2(cap / b_min)`` ticks while the pressure lasts.
* **Hysteresis**: the limit holds (reason ``gpu_memory_hold``) until free memory has
  been at or above ``recover_at = min(2 x floor, (1 + floor) / 2)`` for
  ``RECOVER_TICKS`` ticks in a row; a tick between the floor and ``recover_at``
  holds the limit and restarts that count, a tick below the floor lowers it again.
* **Recovery**: after that, the limit doubles each tick (reason ``gpu_memory_hold``
  while it is still below the inner cap) and the guard lets go once it reaches the
  inner policy's cap; from then on the inner decision passes through unchanged.

Without NVML (``gpu_free_fraction`` None) or with ``floor`` 0 and no limit in
force, the guard returns the inner policy's decision object itself: decisions are
identical to the inner policy's. A NVML that stops answering mid-pressure holds the
limit (no figure is no evidence that the pressure cleared).

The guard keeps no engine, thread or I/O; its state is the limit and the count of
clear ticks. A reload rebuilds the policy and with it the guard (state starts
afresh).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tuned.core.types import Decision, Observation

#: the factor the limit is multiplied by on each tick under pressure
DECREASE = 0.5
#: ticks in a row at or above ``recover_at`` before the limit starts rising
RECOVER_TICKS = 3

REASON_PRESSURE = "gpu_memory_pressure"
REASON_HOLD = "gpu_memory_hold"


def recover_fraction(floor: float) -> float:
    """The free fraction at or above which pressure counts as cleared:
    twice the floor, or halfway to 1 for floors above 1/3."""
    return min(2.0 * floor, (1.0 + floor) / 2.0)


class GpuMemoryGuard:
    """Wraps ``inner`` (a batch policy); see the module docstring. Attributes the
    controller or tests read on the policy (``wants_active``, ``sla``...) are the
    inner policy's."""

    def __init__(self, inner: Any, *, floor: float, b_min: int, ceiling: int) -> None:
        if not 0.0 <= floor < 1.0:
            raise ValueError(f"gpu_memory_floor: must be in [0, 1), got {floor!r}")
        self.inner = inner
        self.floor = float(floor)
        self.recover_at = recover_fraction(self.floor)
        self.b_min = max(1, int(b_min))
        self.ceiling = int(ceiling)
        self.limit: int | None = None    # the guard's cap while pressure is in force
        self.clear_ticks = 0
        self.last_inner: Decision | None = None   # the inner policy's last decision

    def __getattr__(self, name: str) -> Any:
        # only reached for names the guard does not have: the inner policy's
        return getattr(self.__dict__["inner"], name)

    def decide(self, obs: Observation) -> Decision:
        dec = self.last_inner = self.inner.decide(obs)
        if not isinstance(dec, Decision) or type(dec.cap) is not int:
            return dec      # not a decision: the controller's check makes it a fault
        free = obs.gpu_free_fraction
        if self.limit is None:
            if free is None or not free < self.floor:
                return dec
            self.limit = dec.cap
        if free is not None and free < self.floor:
            self.clear_ticks = 0
            base = min(self.limit, obs.num_running) if obs.num_running > 0 else self.limit
            self.limit = max(self.b_min, math.floor(DECREASE * base))
            reason = REASON_PRESSURE
        else:
            if free is not None and free >= self.recover_at:
                self.clear_ticks += 1
            else:
                self.clear_ticks = 0
            if self.clear_ticks >= RECOVER_TICKS:
                self.limit = min(2 * self.limit, self.ceiling)
            if self.limit >= dec.cap:
                self.limit = None
                self.clear_ticks = 0
                return dec
            reason = REASON_HOLD
        return self._limited(dec, obs, reason)

    def _limited(self, dec: Decision, obs: Observation, reason: str) -> Decision:
        cap = min(dec.cap, self.limit)
        inputs = {**dec.inputs, "gpu_free_fraction": obs.gpu_free_fraction,
                  "gpu_memory_floor": self.floor, "gpu_memory_recover_at": self.recover_at,
                  "gpu_memory_limit": self.limit, "gpu_memory_clear_ticks": self.clear_ticks,
                  "policy_cap": dec.cap, "policy_reason": dec.reason}
        return dataclasses.replace(
            dec, cap=cap, target=min(dec.target, cap),
            batch=min(max(cap, obs.num_running), self.ceiling),
            reason=reason, inputs=inputs)


__all__ = ["DECREASE", "RECOVER_TICKS", "GpuMemoryGuard", "recover_fraction"]
