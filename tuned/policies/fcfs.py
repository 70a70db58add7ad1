"""First come, first served: vLLM's default waiting queue, as a tuned queue policy.

Requests are admitted in arrival order and the policy never refuses one; the batch
cap (``max_num_active_reqs``) and vLLM's own KV-cache check are the only limits.
It is the baseline every other policy is compared against.

``late_after_s`` (set from the config's ``ttft_sla_s``) adds SABER's demotion (seed
002) with the TTFT target as the deadline: a request that has waited longer than
``late_after_s`` can no longer meet its TTFT, so the requests that still can are
served first, each tier in arrival order. Under an overload FCFS makes every request
late; this keeps the ones that can still be on time on time, and serves the late
ones whenever nothing on time waits (nothing is refused or dropped). Both tiers are
runs of the arrival order (the late ones are its head), so the order is one split
of the arrival-sorted list, recomputed when the next request turns late.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Sequence

from tuned.policies.queues import AdmitContext, QueuePolicy, ReqInfo, Verdict


class FCFSPolicy(QueuePolicy):
    """Arrival order, always admit; with ``late_after_s`` > 0, on-time requests first."""

    name = "fcfs"

    def __init__(self, *, late_after_s: float = 0.0, rng=None) -> None:
        super().__init__(rng=rng)
        if isinstance(late_after_s, bool) or not isinstance(late_after_s, (int, float)) \
                or not math.isfinite(late_after_s) or late_after_s < 0:
            raise ValueError(f"fcfs: late_after_s must be a number of seconds >= 0, got "
                             f"{late_after_s!r}")
        self.late_after_s = float(late_after_s)
        self._next_late_s = math.inf
        self._late: set[str] = set()     # waiting requests already counted as demoted

    def order_key(self, info: ReqInfo) -> float | None:
        return None if self.late_after_s else info.arrival_s

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        # stable: requests with equal arrival times keep their insertion order
        by_arrival = sorted(waiting, key=lambda r: r.arrival_s)
        if not self.late_after_s:
            return by_arrival
        cut = now_s - self.late_after_s
        k = bisect.bisect_left([r.arrival_s for r in by_arrival], cut)
        late, on_time = by_arrival[:k], by_arrival[k:]
        self._next_late_s = on_time[0].arrival_s + self.late_after_s if on_time else math.inf
        for r in late:
            if r.request_id not in self._late:
                self._late.add(r.request_id)
                self.stats.demoted += 1
        return on_time + late

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        return bool(self.late_after_s) and ctx.now_s >= self._next_late_s

    def observe_arrival(self, info: ReqInfo) -> None:
        if self.late_after_s:
            self._next_late_s = min(self._next_late_s, info.arrival_s + self.late_after_s)

    def forget(self, request_id: str) -> None:
        self._late.discard(request_id)

    def on_admitted(self, info: ReqInfo, now_s: float) -> None:
        super().on_admitted(info, now_s)
        self._late.discard(info.request_id)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        return Verdict(True, "fcfs: always admit")
