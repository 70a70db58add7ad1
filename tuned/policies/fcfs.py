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
A queue that reports each request joining and leaving keeps the tiers with
:class:`TieredOrder` (:meth:`FCFSPolicy.live_order`): a request moves once, when it
turns late, so a recompute costs the on-time tier and the requests that turned late,
not a sort of every waiting request (under an overload nearly all of them are late).

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

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict


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

    def live_order(self) -> TieredOrder | None:
        """The incremental keeper of :meth:`order` for a queue that reports membership
        (:class:`tuned.core.queue.QueueCore`); None without ``late_after_s``, where the
        order is a keyed sort (:meth:`order_key`)."""
        return TieredOrder(self) if self.late_after_s else None

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


class TieredOrder:
    """:meth:`FCFSPolicy.order` kept up to date as requests join and leave.

    The caller reports every request that joins the ordered set (:meth:`add`, in the
    order it joins: the tie-break among equal arrival times, as the stable sort over
    the caller's insertion-ordered set has it) and every one that leaves
    (:meth:`discard`); :meth:`order` then returns what ``policy.order`` would return
    for that set, with the same side effects (demotion counts, next lateness time).

    The list returned is kept, not rebuilt: a caller that caches it sees each
    :meth:`discard` applied to it (as if it had deleted the request itself) and must
    ask :meth:`order` again after an :meth:`add`. It holds the kept on-time requests
    by (arrival, join) and after them the late part by (arrival, doomed first, join).

    A request's tier depends only on ``now`` and the step model: it turns late at a
    fixed time (``arrival + late_after_s``, less its prefill with a model), so each
    on-time request sits in a heap keyed on that time and moves to the late part once,
    by bisection; the late part, nearly every waiting request under an overload, is
    never sorted or copied again. A new step model, or a clock that goes back,
    rebuilds (the step model is refitted every few seconds at most). Moore and
    Hodgson's rule runs over the on-time requests only, as before; the ones it dooms
    sit in the late part until the next :meth:`order`.
    """

    def __init__(self, policy: FCFSPolicy) -> None:
        self.policy = policy
        self._members: dict[str, tuple[ReqInfo, int]] = {}   # id -> (info, join seq)
        self._next_seq = 0
        self._late_ids: set[str] = set()         # late by time at the last order()
        self._doomed_ids: set[str] = set()       # on time, moved aside by Moore-Hodgson
        self._out: list[ReqInfo] = []            # kept on-time, then the late part
        self._n_kept = 0
        self._heap: list[tuple[float, int, str]] = []   # on time: (turns late, seq, id)
        self._model: object = None
        self._now_s = -math.inf

    def __len__(self) -> int:
        return len(self._members)

    # sort keys of the two parts of _out
    def _kept_key(self, r: ReqInfo) -> tuple[float, int]:
        return r.arrival_s, self._members[r.request_id][1]

    def _late_key(self, r: ReqInfo) -> tuple[float, int, int]:
        rid = r.request_id
        return r.arrival_s, rid not in self._doomed_ids, self._members[rid][1]

    def _turns_late_key(self, r: ReqInfo) -> float:
        # without a model: compared as arrival < now - late_after_s, as order() does
        return r.arrival_s if self._model is None else self.policy._turns_late_s(r)

    def _kept_insert(self, info: ReqInfo) -> None:
        bisect.insort_right(self._out, info, 0, self._n_kept, key=self._kept_key)
        self._n_kept += 1

    def _kept_remove(self, info: ReqInfo, seq: int) -> None:
        del self._out[bisect.bisect_left(self._out, (info.arrival_s, seq), 0, self._n_kept,
                                         key=self._kept_key)]
        self._n_kept -= 1

    def _late_insert(self, info: ReqInfo) -> None:
        bisect.insort_right(self._out, info, self._n_kept, key=self._late_key)

    def _late_remove(self, info: ReqInfo, seq: int, doomed: bool) -> None:
        del self._out[bisect.bisect_left(self._out, (info.arrival_s, not doomed, seq),
                                         self._n_kept, key=self._late_key)]

    def add(self, info: ReqInfo) -> None:
        """``info`` joins the set (after every member already there)."""
        rid = info.request_id
        self.discard(rid)
        seq = self._next_seq
        self._next_seq += 1
        self._members[rid] = (info, seq)
        self._kept_insert(info)
        heapq.heappush(self._heap, (self._turns_late_key(info), seq, rid))

    def discard(self, request_id: str) -> None:
        """``request_id`` leaves the set (absent: nothing); its heap entry goes stale."""
        member = self._members.get(request_id)
        if member is None:
            return
        info, seq = member
        if request_id in self._late_ids:
            self._late_remove(info, seq, False)
            self._late_ids.discard(request_id)
        elif request_id in self._doomed_ids:
            self._late_remove(info, seq, True)
            self._doomed_ids.discard(request_id)
        else:
            self._kept_remove(info, seq)
        del self._members[request_id]

    def order(self, now_s: float, ctx: AdmitContext | None = None) -> list[ReqInfo]:
        """``policy.order(members in the order they joined, now_s, ctx)``."""
        pol = self.policy
        model = pol._model = ctx.step_model if ctx is not None else None
        if model is not self._model or now_s < self._now_s:
            self._rebuild(model)
        self._now_s = now_s
        members = self._members
        for rid in self._doomed_ids:     # back on time: Moore-Hodgson runs afresh
            info, seq = members[rid]
            self._late_remove(info, seq, True)
        doomed_before, self._doomed_ids = self._doomed_ids, set()
        for rid in doomed_before:
            self._kept_insert(members[rid][0])
        for r in self._advance(now_s):
            if r.request_id not in pol._late:
                pol._late.add(r.request_id)
                pol.stats.demoted += 1
        out, n_kept = self._out, self._n_kept
        if model is None:
            pol._next_late_s = out[0].arrival_s + pol.late_after_s if n_kept else math.inf
            return out
        pol._next_late_s = self._heap[0][0] if self._heap else math.inf
        if not n_kept:
            return out
        _, doomed = pol._fewest_late(out[:n_kept], now_s, ctx)
        for r in doomed:
            rid = r.request_id
            self._kept_remove(r, members[rid][1])
            self._doomed_ids.add(rid)
            self._late_insert(r)
            if rid not in pol._late:
                pol._late.add(rid)
                pol.stats.demoted += 1
        return out

    def _rebuild(self, model: object) -> None:
        self._model = model
        self._late_ids.clear()
        self._doomed_ids.clear()
        self._out = sorted((info for info, _ in self._members.values()), key=self._kept_key)
        self._n_kept = len(self._out)
        self._heap = [(self._turns_late_key(r), self._members[r.request_id][1], r.request_id)
                      for r in self._out]
        heapq.heapify(self._heap)

    def _advance(self, now_s: float) -> list[ReqInfo]:
        """Move the on-time members late at ``now_s`` to the late part and return them;
        the heap's top is then the earliest time an on-time member turns late."""
        heap, members = self._heap, self._members
        cut = now_s - self.policy.late_after_s
        plain = self._model is None
        moved: list[ReqInfo] = []
        while heap:
            key, seq, rid = heap[0]
            member = members.get(rid)
            if member is not None and member[1] == seq and rid not in self._late_ids:
                if not (key < cut if plain else now_s >= key):
                    break
                info = member[0]
                self._kept_remove(info, seq)
                self._late_ids.add(rid)
                self._late_insert(info)
                moved.append(info)
            heapq.heappop(heap)                   # moved, or stale (left / re-added)
        return moved


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "fcfs", "kind": "queue", "build": "FCFSPolicy", "order": 10,
    "summary": "arrival order; with ttft_sla_s, late requests after those that can "
               "still make it",
    "options": {
        "late_after_s": {"type": "float", "default": 0.0, "lo": 0.0,
                         "doc": "a request waiting longer is late and served after the "
                                "on-time ones (0 = off; default ttft_sla_s)"},
    },
}
