"""First come, first served: vLLM's default waiting queue, as a tuned queue policy.

Requests are admitted in arrival order and the policy never refuses one; the batch
cap (``max_num_active_reqs``) and vLLM's own KV-cache check are the only limits.
It is the baseline every other policy is compared against.

``late_after_s`` (set from the config's ``ttft_sla_s``) adds SABER's demotion (seed
002) with the TTFT target as the deadline: a request that has waited longer than
``late_after_s`` can no longer meet its TTFT, so the requests that still can are
served first, each tier in arrival order. Under an overload FCFS makes every request
late; this keeps the ones that can still be on time on time, and serves the late
ones whenever nothing on time waits (nothing is refused or dropped). Each tier is in
arrival order; the order is recomputed when the next request turns late (without a
step model the late ones are the head of the arrival order, so it is one split).

With the admission guard's step model in the context (``ctx.step_model``, an SLA
set), lateness is predicted rather than observed: a request is late once the time
it has waited plus its own prefill, T(0, p) from the step model, exceeds
``late_after_s`` -- it cannot meet its TTFT even if admitted now, alone. On a GPU
the prefill is milliseconds and nothing changes; on a CPU, where a long prompt's
prefill is a good part of a 3 s TTFT, the doomed requests stop taking the turn of
ones that can still make it. SABER's paper demotes on an observed deadline miss;
this is the same rule one prefill earlier.

With the step's token budget also known (``ctx.token_budget``), the on-time requests
are checked together, not one by one: Moore and Hodgson's rule for the fewest late
jobs on one machine (Moore 1968; deadlines in arrival order, as here, make it
optimal), with each request's prefill as its job at the engine's pace under a
backlog, T(b, c, kv) / c per prompt token (kv: the tokens resident in the cache,
which every step reads), after the prompt tokens the running requests still owe.
Where the queue cannot all make their TTFT, the largest prefills are moved to the
late tier, so that the most requests meet it. The pace keeps the KV term because
under load the resident cache is a large share of every step: a pace of
T(b, c) / c over-estimates how fast prompts clear and keeps too many on time.
"""

from __future__ import annotations

import bisect
import heapq
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
        self._model = None               # the guard's step model, from the last order()

    def order_key(self, info: ReqInfo) -> float | None:
        return None if self.late_after_s else info.arrival_s

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        # stable: requests with equal arrival times keep their insertion order
        by_arrival = sorted(waiting, key=lambda r: r.arrival_s)
        if not self.late_after_s:
            return by_arrival
        self._model = ctx.step_model if ctx is not None else None
        if self._model is None:
            cut = now_s - self.late_after_s
            k = bisect.bisect_left([r.arrival_s for r in by_arrival], cut)
            late, on_time = by_arrival[:k], by_arrival[k:]
            self._next_late_s = (on_time[0].arrival_s + self.late_after_s if on_time
                                 else math.inf)
        else:
            late, on_time = [], []
            nxt = math.inf
            for r in by_arrival:
                turns_late = self._turns_late_s(r)
                if now_s >= turns_late:
                    late.append(r)
                else:
                    on_time.append(r)
                    nxt = min(nxt, turns_late)
            self._next_late_s = nxt
            if on_time:     # a step model came with ctx, so ctx is set here
                on_time, doomed = self._fewest_late(on_time, now_s, ctx)
                if doomed:
                    late = sorted(doomed + late, key=lambda r: r.arrival_s)
        for r in late:
            if r.request_id not in self._late:
                self._late.add(r.request_id)
                self.stats.demoted += 1
        return on_time + late

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        return bool(self.late_after_s) and ctx.now_s >= self._next_late_s

    def _fewest_late(self, queue: list[ReqInfo], now_s: float,
                     ctx: AdmitContext) -> tuple[list[ReqInfo], list[ReqInfo]]:
        """(kept, doomed): Moore and Hodgson's rule for the fewest late jobs on one
        machine, over the on-time requests in arrival order (= deadline order, every
        deadline being arrival + ``late_after_s``). Each request's job is its prefill:
        its prompt tokens at the engine's current prefill pace, T(b, c, kv) / c per
        token for the running requests b, a full chunk c (the token budget less b) and
        the resident KV tokens kv, which is how a backlog drains; the queue starts
        after the prompt tokens the running requests still owe. Walking the queue,
        whenever the prefills so far would finish past a request's deadline the
        largest of them is taken out (doomed): each removal keeps the most requests on
        time. Not modelled: later arrivals, and the KV growing as the queue is served.
        Unknown token budget: nothing is doomed."""
        b = max(int(ctx.num_running), 0)
        budget = int(ctx.token_budget)
        if budget <= b:
            return queue, []
        c = budget - b
        per_token = self._model.predict_step_s(b, c, ctx.kv_resident_tokens) / c
        t = now_s + per_token * max(int(ctx.prefill_backlog_tokens), 0)
        heap: list[tuple[float, int]] = []
        doomed: set[int] = set()
        for i, r in enumerate(queue):
            cost = per_token * max(r.prompt_tokens, 0)
            t += cost
            heapq.heappush(heap, (-cost, i))
            if t > r.arrival_s + self.late_after_s:
                neg, j = heapq.heappop(heap)
                t += neg
                doomed.add(j)
        if not doomed:
            return queue, []
        return ([r for i, r in enumerate(queue) if i not in doomed],
                [r for i, r in enumerate(queue) if i in doomed])

    def _turns_late_s(self, r: ReqInfo) -> float:
        """When ``r`` can no longer meet its TTFT: arrival + late_after_s, less its
        predicted prefill when the step model is known."""
        lead = self._model.predict_step_s(0, max(r.prompt_tokens, 0)) if self._model else 0.0
        return r.arrival_s + self.late_after_s - lead

    def observe_arrival(self, info: ReqInfo) -> None:
        if self.late_after_s:
            self._next_late_s = min(self._next_late_s, self._turns_late_s(info))

    def forget(self, request_id: str) -> None:
        self._late.discard(request_id)

    def on_admitted(self, info: ReqInfo, now_s: float) -> None:
        super().on_admitted(info, now_s)
        self._late.discard(info.request_id)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        return Verdict(True, "fcfs: always admit")
