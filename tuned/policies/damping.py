"""Damping of the cap: a wrapper around any batch policy that lets a lower cap through
at once and a higher one only once it has been wanted for a while.

Why: the SLA search answers each window of steps. Near the SLA's edge a window over it
lowers the cap, the next one under it raises the cap again (a quarter at a time once
the interval has collapsed), and the memory bound moves by a sequence or two with every
finished request, so the applied cap saw-tooths tick after tick while neither load nor
capacity changed. Each move changes which requests vLLM admits; a cap that goes up
for half a second admits prompts whose prefill then lands on the next window.

The rule, per controller tick, on the cap the inner policy decides:

* **lower or equal**: applied at once (an SLA violation, memory pressure or a cap that
  the load no longer fills are never held back); a pending raise is forgotten;
* **higher**: held (reason ``cap_raise_hold``) until a raise has been wanted on every
  tick for ``cap_raise_hold_s``, i.e. ``ceil(cap_raise_hold_s / interval_s) + 1``
  ticks in a row, and then applied to the lowest cap wanted over those ticks: what
  every one of them agreed on.

This is Kubernetes VPA's composition (STYLE.md): the inner policy stays a pure
estimator whose recommendation (``target``, ``lower``, ``upper``) passes through
unchanged; the wrapper only decides how far the applied cap follows it. With
``cap_raise_hold_s = 0`` the wrapper returns the inner policy's decision object
itself: decisions are the undamped policy's.

A held decision keeps the inner decision's target and bounds and carries its
``policy_cap`` and ``policy_reason`` in ``inputs``, with ``cap_raise_wanted_ticks``
(the raise's run so far) and ``cap_raise_hold_ticks`` (the run it needs). State is
the applied cap and the run; a reload rebuilds the policy and with it the wrapper.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tuned.core.types import Decision, Observation

REASON_RAISE_HOLD = "cap_raise_hold"


def hold_ticks(hold_s: float, interval_s: float) -> int:
    """Ticks in a row a raise must be wanted on to span ``hold_s`` at one tick per
    ``interval_s``; 0 for no hold (every raise applies on the tick it is wanted)."""
    if hold_s <= 0:
        return 0
    # a float quotient such as 1.5 / 0.5 may land a hair above the integer
    return math.ceil(round(hold_s / interval_s, 9)) + 1


class CapDamper:
    """Wraps ``inner`` (a batch policy); see the module docstring. Attributes the
    controller or tests read on the policy (``wants_active``, ``sla``...) are the
    inner policy's."""

    def __init__(self, inner: Any, *, hold_ticks: int, ceiling: int) -> None:
        if hold_ticks < 0:
            raise ValueError(f"hold_ticks: must be >= 0, got {hold_ticks!r}")
        self.inner = inner
        self.hold_ticks = int(hold_ticks)
        self.ceiling = int(ceiling)
        self.cap: int | None = None       # the cap applied by the last decision
        self.wanted = 0                   # ticks in a row a raise has been wanted
        self.wanted_min: int | None = None  # the lowest cap wanted over those ticks

    def __getattr__(self, name: str) -> Any:
        # only reached for names the wrapper does not have: the inner policy's
        return getattr(self.__dict__["inner"], name)

    def decide(self, obs: Observation) -> Decision:
        dec = self.inner.decide(obs)
        if self.hold_ticks == 0 or not isinstance(dec, Decision) or type(dec.cap) is not int:
            return dec      # off, or not a decision: the controller's check makes it a fault
        if self.cap is None or dec.cap <= self.cap:
            self.cap, self.wanted, self.wanted_min = dec.cap, 0, None
            return dec
        self.wanted += 1
        self.wanted_min = dec.cap if self.wanted_min is None else min(self.wanted_min, dec.cap)
        if self.wanted >= self.hold_ticks:
            self.cap, self.wanted, self.wanted_min = self.wanted_min, 0, None
            if self.cap == dec.cap:
                return dec
        return self._held(dec, obs)

    def _held(self, dec: Decision, obs: Observation) -> Decision:
        cap = self.cap
        inputs = {**dec.inputs, "policy_cap": dec.cap, "policy_reason": dec.reason,
                  "cap_raise_wanted_ticks": self.wanted,
                  "cap_raise_hold_ticks": self.hold_ticks}
        return dataclasses.replace(dec, cap=cap,
                                   batch=min(max(cap, obs.num_running), self.ceiling),
                                   reason=REASON_RAISE_HOLD, inputs=inputs)


__all__ = ["REASON_RAISE_HOLD", "CapDamper", "hold_ticks"]
