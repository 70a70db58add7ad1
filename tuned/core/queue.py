"""The engine-neutral waiting queue: ordering, admission gate, pinning, deferral and
output-length learning, on request ids and :class:`~tuned.core.queue_policy.ReqInfo`.

:class:`QueueCore` implements the method set of vLLM 0.32's ``RequestQueue``
(``add_request``, ``pop_request``, ``peek_request``, ``prepend_request(s)``,
``remove_request(s)``, ``__bool__``, ``__len__``, ``__iter__``) over any request
object with the attributes of :class:`QueuedRequest`, so the vLLM adapter
(:mod:`tuned.engines.vllm_queue`) and the simulator (:mod:`tuned.sim.engine`)
drive the very same code. How an engine's admission loop must use it (vLLM's
``Scheduler.schedule``, "Next, schedule the WAITING requests", is the model):

* ``if not queue: break`` -- :meth:`__bool__` is the admission gate: True only
  when the policy's next request may be admitted now. :meth:`__len__` still
  counts every waiting request.
* ``peek_request()`` then ``pop_request()`` -- both return the policy's chosen
  request (the one the gate admitted). An engine may pop a request it decides to
  skip and hand the skipped ones back with ``prepend_requests()`` at the end of
  the loop; they return to their place in the policy order and do not count as
  admitted.
* ``prepend_request()`` -- a preempted request. It goes to the very front
  whatever the policy, most recently preempted first, and bypasses the gate: it
  was admitted before.
* ``remove_requests()`` -- aborted / stopped waiting requests.

Per step the engine calls :meth:`QueueCore.begin_step` at the top of its
scheduling pass with an :class:`AdmitContext` and its live list of running
requests: the engine appends each admitted request to that list, so requests
admitted earlier in the step count as running for later admissions. Per-step
cost: the order is re-sorted only when the waiting set changed or the policy's
``refresh`` asks for it, and a policy with a :class:`LiveOrder` (fcfs with a TTFT
target) is told of each request joining and leaving instead, so that its recompute
does not sort every waiting request; one ``ReqInfo`` per request id is cached; the
running requests' progress is read once per step, lazily, when the gate first
needs it.

The admission guard (:mod:`tuned.core.admission`) wraps whatever the policy
chooses: the chosen request waits while its prefill would push a running request
over its TPOT or a prefilling cohort over its TTFT.

Priority scheduling (``priority_first``, vLLM's ``--scheduling-policy priority``):
a request's ``priority`` comes first, the smaller value first as vLLM's
``PriorityRequestQueue`` orders; the policy orders and gates only the requests of
the most urgent level waiting, and a lower level waits until that level is empty
(the policy never admits a less urgent request past a more urgent one). Within a
level: preempted requests first (most recently preempted first), then, while an
overload past twice the engine's capacity makes the queue serve newest first, the
oldest of those waiting since before then and after them the newest of that level
(:func:`tuned.core.refusal.first_token_leads`), then an aged request of that level
(the wait bound), then the policy's order, whose ties keep arrival order. Without
priority scheduling the same order holds over one level. vLLM's own queue orders a level by arrival alone, preempted requests
included; its preemption of running requests for a more urgent one
(``Scheduler.schedule`` when KV blocks run out) is vLLM's and unchanged.

All methods are for the engine's scheduling thread; ``stats`` and
:meth:`QueueCore.snapshot` may be read from another thread.

One module on purpose: it is vLLM's ``RequestQueue`` method set over one shared state
(the waiting set, pins, the cached order, pops not yet committed). Its collaborators
are their own modules: the admission guard (:mod:`tuned.core.admission`), output-length
learning (:class:`tuned.core.length_learning.LengthLearning`, ``queue.lengths``) and
refusal (:class:`tuned.core.refusal.QueueRefusals`, ``queue.refusals``: the wait bound,
the refused requests the engine answers through :func:`tuned.core.refusal.answer`).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from tuned.core.admission import AdmissionGuard, prompt_tokens_left
from tuned.core.length_learning import LengthLearning
from tuned.core.predictor import OutputLengthPredictor
from tuned.core.queue_policy import AdmitContext, PolicyStats, QueuePolicy, ReqInfo, Verdict
from tuned.core.refusal import QueueRefusals
from tuned.core.wait_bound import WaitBound

_PRUNE_EVERY_STEPS = 4096
_UNLIMITED = 1 << 62


class QueuedRequest(Protocol):
    """What the queue reads of an engine's request (vLLM's ``Request`` has these)."""

    request_id: str
    arrival_time: float        # on the engine clock after subtracting arrival_offset_s
    num_prompt_tokens: int
    max_tokens: int | None
    num_output_tokens: int     # tokens generated so far
    priority: int


R = TypeVar("R", bound=QueuedRequest)


class LiveOrder(Protocol):
    """A policy's order kept up to date incrementally (a policy offers one through
    ``live_order()``): the queue reports each request joining the ordered set, in
    order, and leaving it; ``order(now_s, ctx)`` equals ``policy.order`` of the set,
    in the order its members joined. The list it returns stays its own: a request
    leaving is taken out of it by ``discard``, so the queue does not delete it."""

    def add(self, info: ReqInfo) -> None: ...

    def discard(self, request_id: str) -> None: ...

    def order(self, now_s: float, ctx: AdmitContext | None = None) -> list[ReqInfo]: ...


def _priority(r: Any) -> int:
    return r.priority


def live_order_of(policy: QueuePolicy) -> LiveOrder | None:
    make = getattr(policy, "live_order", None)
    return make() if make is not None else None


def queue_prompt_tokens(waiting: Any) -> list[int]:
    """The prompt tokens of each request in an engine's waiting queue: tuned's
    (:meth:`QueueCore.waiting_prompt_tokens`), or a plain queue of requests (vLLM's
    own, the simulator's FCFS list) read through a copy. For the controller's thread."""
    read = getattr(waiting, "waiting_prompt_tokens", None)
    return read() if read is not None else [r.num_prompt_tokens for r in list(waiting)]


def queue_oldest_arrival_s(waiting: Any, offset_s: float | Callable[[], float] = 0.0) -> float | None:
    """The earliest arrival among an engine's waiting requests, or None: tuned's queue
    reads its own (:meth:`QueueCore.oldest_arrival_s`); a plain queue of requests is
    read through a copy, each ``arrival_time`` less ``offset_s`` (vLLM stamps wall
    time). For the controller's thread."""
    read = getattr(waiting, "oldest_arrival_s", None)
    if read is not None:
        return read()
    off = offset_s() if callable(offset_s) else offset_s
    return min((r.arrival_time - off for r in list(waiting)), default=None)


class _Popped(NamedTuple):
    info: ReqInfo
    now_s: float
    pin_key: int | None     # set when a pinned (preempted) request was popped


class QueueCore(Generic[R]):
    """The waiting queue of one engine, ordered and gated by ``policy``.

    ``R`` is the engine's request type (see :class:`QueuedRequest`).
    ``predictor`` supplies output-length predictions and learns from
    :meth:`request_finished`; ``class_deadlines_s`` is the SLA table for the
    ``tuned_class`` hint; ``on_warning(request_id, text)`` receives each ignored
    hint (the three go to ``lengths``, a :class:`LengthLearning`);
    ``wait_bound`` starts ``refusals`` (a :class:`QueueRefusals`) with a bound (else
    :meth:`set_wait_bound`); ``clock`` is the engine's clock,
    used only before the first :meth:`begin_step` (after it, ``ctx.now_s``);
    ``arrival_offset_s`` is subtracted from a request's ``arrival_time`` to bring
    it onto that clock (vLLM stamps arrivals with wall time, its scheduler runs on
    the monotonic clock): a number, or a callable read as each request is taken in
    (so that a wall-clock step between two arrivals shifts neither).
    ``priority_first``: a request's ``priority`` (smaller first) before the policy's
    order, as the module docstring says.
    """

    def __init__(self, policy: QueuePolicy, predictor: OutputLengthPredictor | None = None, *,
                 class_deadlines_s: Mapping[str, float] | None = None,
                 on_warning: Callable[[str, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 arrival_offset_s: float | Callable[[], float] = 0.0,
                 wait_bound: WaitBound | None = None,
                 priority_first: bool = False) -> None:
        self.policy = policy
        #: order by ``priority`` first (vLLM's --scheduling-policy priority)
        self.priority_first = bool(priority_first)
        #: the wait bound around whatever the policy orders, and the refusals
        self.refusals: QueueRefusals[R] = QueueRefusals(wait_bound)
        self.arrival_offset_s = (arrival_offset_s if callable(arrival_offset_s)
                                 else float(arrival_offset_s))
        #: hints, output-length predictions and their learning
        self.lengths = LengthLearning(predictor, class_deadlines_s, on_warning)
        self._clock = clock
        self.last_verdict: Verdict | None = None
        self._waiting: dict[str, R] = {}       # every waiting request, by id
        self._unpinned: dict[str, ReqInfo] = {}      # waiting requests the policy orders
        self._infos: dict[str, ReqInfo] = {}         # waiting and running, until finished
        self._pinned: dict[str, int] = {}            # preempted: id -> key (smaller = front)
        self._pin_counter = 0
        self._order: list[ReqInfo] | None = None     # cached policy order of _unpinned
        self._live = self._live_order()              # mirrors _unpinned, when offered
        self._ctx: AdmitContext | None = None
        self._running: list[R] = []
        self._n_running_at_gate: int | None = None
        self._running_infos: list[ReqInfo] | None = None
        self._head: R | None = None
        self._head_valid = False
        self._popped: dict[str, _Popped] = {}
        self._deferred_ids: set[str] = set()
        self._step = 0
        self.guard = AdmissionGuard()                # around whatever the policy chooses

    # ------------------------------------------------------------ per step
    def begin_step(self, ctx: AdmitContext, running_requests: list[R]) -> None:
        """Top of ``schedule()``: fix the context for this step.

        ``running_requests`` must be the scheduler's live ``self.running`` list (not
        a copy): admissions appended to it during the step are seen by the gate.
        """
        self._commit_pops()
        # what the running list says, the same for every engine, and the predictor's
        # measured under-prediction (MC-SF's reserve alpha) when there is one
        excess = self.lengths.under_excess
        ctx = dataclasses.replace(
            ctx, num_running=len(running_requests),
            prefill_backlog_tokens=sum(prompt_tokens_left(r) for r in running_requests),
            under_prediction=excess if excess > 0 else ctx.under_prediction)
        self._ctx = ctx
        self._running = running_requests
        self.guard.begin_step(ctx, running_requests)
        self._n_running_at_gate = None
        self._running_infos = None
        self._deferred_ids.clear()
        self._head_valid = False
        self._step += 1
        infos = self._infos
        left = [max((i.predicted_output if (i := infos.get(r.request_id)) is not None
                     else 1) - r.num_output_tokens, 1) for r in running_requests] \
            if self.refusals.bound is not None and ctx.step_model is not None else ()
        for rid in self.refusals.due(ctx, self._unpinned, left):
            req = self._waiting.get(rid)
            if req is not None:
                info = self._unpinned.get(rid)
                self._remove_ids({rid})
                self.refusals.refused(req, rid, ctx.now_s,
                                      info.arrival_s if info is not None else None)
        if self.policy.refresh(self._unpinned.values(), ctx):
            self._invalidate_order()
        if self._step % _PRUNE_EVERY_STEPS == 0:
            self._prune()

    def set_wait_bound(self, spec: tuple | None) -> None:
        """Bound every wait: ``(bound_s, refuse[, age_after_s])`` (see
        :mod:`tuned.core.wait_bound`), or None for no bound. The waiting requests are
        bounded from their arrival; the same spec again keeps the bound as it is. The
        refused requests go to the engine through :func:`tuned.core.refusal.answer`."""
        self.refusals.set_bound(spec, self._unpinned.values())
        self._head_valid = False

    def step_done(self, num_decode: int, preempted: int) -> None:
        """After each engine step: policies that follow the engine step by step
        (``on_step``, e.g. SGLang's new_token_ratio decay and its reset on
        retraction) hear of it; a no-op for the others."""
        on_step = getattr(self.policy, "on_step", None)
        if on_step is None:
            return
        if num_decode == 0 and preempted == 0 and not self._running:
            on_step(idle=True)
        elif preempted:
            on_step(1, preempted, [self._view(r, True) for r in self._running])
        elif num_decode:
            on_step(1)

    def switch_policy(self, new_policy: QueuePolicy) -> QueuePolicy:
        """Order and gate by ``new_policy`` from now on, keeping every waiting request
        (pinned ones stay in front). Returns the old policy. Predictions are redone
        when the new policy plans with a different (over-)estimate. The new policy's
        counters start from zero. Call from the scheduler's thread (a live reload on
        the controller thread should hand the policy over through the pending slot
        applied at the top of ``schedule()``)."""
        self._commit_pops()
        old, self.policy = self.policy, new_policy
        self._live = None
        if new_policy.overestimate != old.overestimate:
            for rid, info in list(self._infos.items()):
                self._set_info(rid, self.lengths.repredict(info, new_policy.overestimate))
        for info in sorted(self._unpinned.values(), key=lambda r: r.arrival_s):
            new_policy.observe_arrival(info)
        self._rebuild_live()
        if self._ctx is not None:
            new_policy.refresh(self._unpinned.values(), self._ctx)
        self._invalidate_order()
        return old

    def request_finished(self, request: R, learn: bool) -> None:
        """A request left the engine (finished or aborted): learn its output length
        when ``learn`` (it ended normally, so its length is a true sample) and drop
        its state. Call once per request, from the scheduler's thread."""
        self._commit_pops()
        rid = request.request_id
        if rid in self._waiting:
            self._remove_ids({rid})
        info = self._infos.pop(rid, None)
        self.guard.forget(rid)
        if learn:
            self.lengths.learn(request.num_prompt_tokens, request.num_output_tokens, info)
        if info is not None:
            self.policy.on_finished(info)
        else:
            self.policy.forget(rid)

    @property
    def stats(self) -> PolicyStats:
        """The active policy's counters and gauges (a new policy starts from zero)."""
        return self.policy.stats

    def snapshot(self) -> dict[str, Any]:
        """Numbers for metrics: policy stats, queue sizes, hint warnings, prediction errors."""
        d = self.policy.stats.as_dict()
        d.update(policy=self.policy.name, waiting=len(self._waiting), pinned=len(self._pinned),
                 hint_warnings=self.lengths.hint_warnings, guard_holds=self.guard.holds,
                 guard_held=dict(self.guard.held),
                 **self.refusals.counts(), **self.lengths.prediction_stats())
        return d

    def waiting_prompt_tokens(self) -> list[int]:
        """The prompt tokens of each waiting request, in no set order. Safe to call
        from another thread (the controller's): it copies the ids, then reads each
        request's cached view."""
        infos = self._infos
        return [i.prompt_tokens for rid in list(self._waiting)
                if (i := infos.get(rid)) is not None]

    def oldest_arrival_s(self) -> float | None:
        """The earliest arrival (engine clock) among the waiting requests, or None.
        Safe to call from another thread, as :meth:`waiting_prompt_tokens`."""
        infos = self._infos
        return min((i.arrival_s for rid in list(self._waiting)
                    if (i := infos.get(rid)) is not None), default=None)

    def info(self, request_id: str) -> ReqInfo | None:
        """The cached view of a waiting or running request."""
        return self._infos.get(request_id)

    # ------------------------------------------------------------ RequestQueue
    def add_request(self, request: R) -> None:
        rid = request.request_id
        if rid in self._waiting:          # re-added (e.g. a resumed streaming session)
            self._remove_ids({rid})
        info = self._make_info(request)
        self._set_info(rid, info)
        self._waiting[rid] = request
        self._unpin(rid, info)
        self._pinned.pop(rid, None)
        self.policy.observe_arrival(info)
        self._insert_ordered(info)

    def pop_request(self) -> R:
        req = self._head_or_first()
        if req is None:
            raise IndexError("pop from an empty queue")
        rid = req.request_id
        now = self._context().now_s
        pin_key = self._pinned.pop(rid, None)
        if pin_key is None and self._order is not None and self._live is None:
            for i, r in enumerate(self._order):
                if r.request_id == rid:
                    del self._order[i]
                    break
        info = self._drop_unpinned(rid) or self._infos.get(rid) or self._make_info(req)
        del self._waiting[rid]
        self._set_info(rid, dataclasses.replace(info, started_s=now))
        self._popped[rid] = _Popped(info, now, pin_key)
        self._head_valid = False
        if pin_key is None:
            self.refusals.admitted(now)
        return req

    def peek_request(self) -> R:
        req = self._head_or_first()
        if req is None:
            raise IndexError("peek from an empty queue")
        return req

    def prepend_request(self, request: R) -> None:
        """A preempted request: to the very front, whatever the policy."""
        self._pin_counter -= 1
        self._pin(request, self._pin_counter)

    def prepend_requests(self, requests: Iterable[R]) -> None:
        """Requests vLLM popped and skipped this step go back where they were
        (pinned ones to the front, others to their place in the policy order);
        requests this queue never saw are pinned to the front like
        :meth:`prepend_request`, each in turn."""
        for req in requests:
            rid = req.request_id
            rec = self._popped.pop(rid, None)
            if rec is None:
                self.prepend_request(req)
                continue
            if rec.pin_key is not None:
                self._pin(req, rec.pin_key)
                continue
            info = dataclasses.replace(self._infos.get(rid, rec.info), started_s=None)
            self._set_info(rid, info)
            self._waiting[rid] = req
            self._unpin(rid, info)
            self._insert_ordered(info)
        self._head_valid = False

    def remove_request(self, request: R) -> None:
        if request.request_id not in self._waiting:
            raise ValueError(f"request {request.request_id} is not in the waiting queue")
        self._remove_ids({request.request_id})

    def remove_requests(self, requests: Iterable[R]) -> None:
        self._remove_ids({r.request_id for r in requests})

    def __bool__(self) -> bool:
        """The admission gate: True only if the next request may be admitted now."""
        return self._select_head() is not None

    def __len__(self) -> int:
        return len(self._waiting)

    def __iter__(self) -> Iterator[R]:
        """Every waiting request: pinned first, then the policy order (under
        priority_first, level by level: the level's pinned ones, then its order)."""
        pinned = [self._waiting[rid] for rid in sorted(self._pinned, key=self._pin_rank)]
        ordered = [req for info in list(self._ordered(self._context()))
                   if (req := self._waiting.get(info.request_id)) is not None]
        if self.priority_first:
            yield from heapq.merge(pinned, ordered, key=lambda r: r.priority)
        else:
            yield from pinned
            yield from ordered

    def __contains__(self, request: object) -> bool:
        return getattr(request, "request_id", None) in self._waiting

    # ------------------------------------------------------------ internals
    def _context(self) -> AdmitContext:
        if self._ctx is not None:
            return self._ctx
        return AdmitContext(now_s=self._clock(), kv_capacity_tokens=_UNLIMITED,
                            kv_free_tokens=_UNLIMITED, cap=_UNLIMITED)

    def extra_args(self, request: R) -> Mapping[str, Any] | None:
        """The request's client hints (``vllm_xargs``); engines override this."""
        return getattr(request, "extra_args", None)

    def _make_info(self, request: R) -> ReqInfo:
        rid = request.request_id
        max_tokens = max(int(request.max_tokens or 1), 1)
        hints, pred = self.lengths.predict(rid, self.extra_args(request),
                                           request.num_prompt_tokens, max_tokens,
                                           self.policy.overestimate)
        off = self.arrival_offset_s
        arrival_s = request.arrival_time - (off() if callable(off) else off)
        deadline = arrival_s + hints.deadline_s if hints.deadline_s is not None else None
        return ReqInfo(rid, arrival_s, request.num_prompt_tokens, max_tokens, pred,
                       request.num_output_tokens, None, hints.output_tokens, deadline,
                       request.priority, hints.sla_class)

    def _set_info(self, rid: str, info: ReqInfo) -> None:
        self._infos[rid] = info
        if rid in self._unpinned:
            self._unpinned[rid] = info
            if self._live is not None:          # new fields, same place: start afresh
                self._rebuild_live()

    def _pin(self, request: R, key: int) -> None:
        rid = request.request_id
        if rid not in self._infos:
            self._set_info(rid, self._make_info(request))
        if self._drop_unpinned(rid) is not None:
            self._invalidate_order()
        self._waiting[rid] = request
        self._pinned[rid] = key
        self._head_valid = False

    def _insert_ordered(self, info: ReqInfo) -> None:
        """Put an unpinned request into the cached order: by bisection when the
        policy's order is a keyed sort (after equal keys, as a stable re-sort would
        place it), else by recomputing the order when next needed."""
        if self._order is not None and self.policy.order_key(info) is not None:
            key = self.policy.order_key
            if self.priority_first:
                key = lambda r: (r.priority, self.policy.order_key(r))  # noqa: E731
            bisect.insort_right(self._order, info, key=key)
            self._head_valid = False
        else:
            self._invalidate_order()

    def _invalidate_order(self) -> None:
        self._order = None
        self._head_valid = False

    def _ordered(self, ctx: AdmitContext) -> list[ReqInfo]:
        if self._order is None:
            self._order = (self._live.order(ctx.now_s, ctx) if self._live is not None else
                           self.policy.order(list(self._unpinned.values()), ctx.now_s, ctx))
            if self.priority_first:     # stable: the policy's order within a level
                self._order.sort(key=_priority)
        return self._order

    def _pin_rank(self, rid: str) -> Any:
        """Sort key of a pinned request: its pin (most recently preempted first),
        under priority_first after its priority."""
        if self.priority_first:
            return self._waiting[rid].priority, self._pinned[rid]
        return self._pinned[rid]

    def _live_order(self) -> LiveOrder | None:
        # a live order is the policy's alone: under priority_first the order is
        # re-sorted by priority, so the plain policy order is used instead
        return None if self.priority_first else live_order_of(self.policy)

    def _rebuild_live(self) -> None:
        self._invalidate_order()        # the cached order is the old live order's list
        self._live = self._live_order()
        if self._live is not None:
            for info in self._unpinned.values():
                self._live.add(info)

    def _unpin(self, rid: str, info: ReqInfo) -> None:
        """``rid`` joins the requests the policy orders (after those already there)."""
        self._unpinned[rid] = info
        if self._live is not None:
            self._live.add(info)
        self.refusals.join(info)

    def _drop_unpinned(self, rid: str) -> ReqInfo | None:
        info = self._unpinned.pop(rid, None)
        if info is not None and self._live is not None:
            self._live.discard(rid)
        self.refusals.leave(rid)
        return info

    def _view(self, req: R, progress: bool) -> ReqInfo:
        rid = req.request_id
        info = self._infos.get(rid)
        if info is None:
            info = self._make_info(req)
            self._infos[rid] = info
        if progress and req.num_output_tokens != info.output_tokens:
            info = info.with_progress(req.num_output_tokens, info.started_s)
            self._infos[rid] = info
        return info

    def _running_views(self) -> tuple[list[ReqInfo], list[ReqInfo]]:
        run = self._running
        progress = self.policy.uses_running_progress
        if self._running_infos is None:
            self._running_infos = [self._view(r, progress)
                                   for r in run[: self._n_running_at_gate]]
        return self._running_infos, [self._view(r, progress)
                                     for r in run[self._n_running_at_gate:]]

    def _select_head(self) -> R | None:
        if self._head_valid:
            return self._head
        self._head_valid = True
        self._head = None
        if self._n_running_at_gate is None:
            # first gate of the step: vLLM's preemptions are done, admissions follow
            self._n_running_at_gate = len(self._running)
        if not self._waiting:
            return None
        ctx = self._context()
        ordered = self._ordered(ctx) if self._unpinned and (
            self.priority_first or not self._pinned) else []
        if self._pinned:
            rid = min(self._pinned, key=self._pin_rank)
            if not (self.priority_first and ordered
                    and ordered[0].priority < self._waiting[rid].priority):
                self._head = self._waiting[rid]
                self.last_verdict = Verdict(True, "preempted request resumes first")
                return self._head
        eligible = None
        if self.priority_first and ordered:
            # the policy chooses within the most urgent level only
            top = ordered[0].priority
            ordered = ordered[:bisect.bisect_right(ordered, top, key=_priority)]
            eligible = lambda rid: self._unpinned[rid].priority == top  # noqa: E731
        overloaded = self.refusals.newest_head(self._unpinned.values(), eligible)
        if overloaded is not None:
            rid, newest = overloaded
            return self._guarded_head(self._unpinned[rid], ctx, Verdict(
                True, "overloaded: newest first, the older ones are refused as they "
                      "turn late" if newest else "overloaded: the requests waiting "
                      "since before go first, oldest first"))
        aged = self.refusals.aged_head(ctx.now_s, eligible)
        if aged is not None:
            return self._guarded_head(self._unpinned[aged], ctx, Verdict(
                True, f"waited {self.refusals.bound.age_after_s:g} s or more: its turn by age"))
        running, admitted = self._running_views()
        sel = self.policy.select(ordered, running, admitted, ctx)
        for info in sel.refused:
            if info.request_id not in self._deferred_ids:
                self._deferred_ids.add(info.request_id)
                self.policy.on_deferred(info, sel.verdict)
        self.last_verdict = sel.verdict
        if sel.chosen is not None:
            return self._guarded_head(sel.chosen, ctx, sel.verdict)
        return self._head

    def _guarded_head(self, chosen: ReqInfo, ctx: AdmitContext, verdict: Verdict) -> R | None:
        """``chosen`` as the head, unless the admission guard holds it."""
        self.last_verdict = verdict
        held = self.guard.hold_reason(chosen, ctx, self._running, self._infos)
        if held:
            self.policy.stats.deferred += 1
            self.policy.stats.last_reason = held
            self.last_verdict = Verdict(False, held)
            return None
        self._head = self._waiting[chosen.request_id]
        return self._head

    def _head_or_first(self) -> R | None:
        """The gate's choice, else the first waiting request in policy order."""
        req = self._select_head()
        if req is not None:
            return req
        return next(iter(self), None)

    def _commit_pops(self) -> None:
        """Popped requests that vLLM did not hand back were admitted."""
        if not self._popped:
            return
        for rid, rec in self._popped.items():
            if rec.pin_key is None:
                self.policy.on_admitted(self._infos.get(rid, rec.info), rec.now_s)
        self._popped.clear()

    def _remove_ids(self, ids: set[str]) -> None:
        """Drop waiting (or popped, not yet committed) requests; others are ignored,
        as vLLM passes the same list to its own kv-holding queue."""
        unordered: set[str] = set()
        for rid in ids:
            if rid not in self._waiting and rid not in self._popped:
                continue
            self._waiting.pop(rid, None)
            self._pinned.pop(rid, None)
            if self._drop_unpinned(rid) is not None:
                unordered.add(rid)
            self._popped.pop(rid, None)
            self._infos.pop(rid, None)
            self.policy.forget(rid)
            self._head_valid = False
        if unordered and self._order is not None and self._live is None:
            self._order = [r for r in self._order if r.request_id not in unordered]

    def _prune(self) -> None:
        live = set(self._waiting) | {r.request_id for r in self._running}
        for rid in [rid for rid in self._infos if rid not in live]:
            del self._infos[rid]
        self.guard.prune(live)
