"""First come, first served: vLLM's default waiting queue, as a tuned queue policy.

Requests are admitted in arrival order and the policy never refuses one; the batch
cap (``max_num_active_reqs``) and vLLM's own KV-cache check are the only limits.
It is the baseline every other policy is compared against.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuned.policies.queues import AdmitContext, QueuePolicy, ReqInfo, Verdict


class FCFSPolicy(QueuePolicy):
    """Arrival order, always admit."""

    name = "fcfs"

    def order_key(self, info: ReqInfo) -> float:
        return info.arrival_s

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        # stable: requests with equal arrival times keep their insertion order
        return sorted(waiting, key=self.order_key)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        return Verdict(True, "fcfs: always admit")
