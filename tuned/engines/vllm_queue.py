"""A vLLM waiting queue ordered and gated by a tuned queue policy.

:class:`PolicyQueue` is a ``vllm.v1.core.sched.request_queue.RequestQueue`` that
replaces the scheduler's ``self.waiting``. Everything it does is the engine-neutral
:class:`tuned.core.queue.QueueCore` (its docstring says how vLLM's admission loop
uses the queue); this module only maps vLLM's objects onto it: where a request's
hints live (``sampling_params.extra_args``), which finished statuses are true
samples of the output length, which requests of vLLM's own queue were preempted,
and the scheduler's KV numbers for the :class:`AdmitContext`. Under vLLM's
``--scheduling-policy priority`` (``scheduler_config.policy``) the queue orders by a
request's ``priority`` first (``QueueCore``'s ``priority_first``), and its fallback is
vLLM's ``PriorityRequestQueue``, not the FCFS one.

It is also the guard around everything vLLM calls on its waiting queue: see
:class:`PolicyQueue`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from vllm.v1.core.sched.request_queue import (FCFSRequestQueue, PriorityRequestQueue,
                                               RequestQueue)
from vllm.v1.request import Request, RequestStatus

from tuned.core.queue import QueueCore, queue_oldest_arrival_s, queue_prompt_tokens
from tuned.core.predictor import OutputLengthPredictor
from tuned.core.queue_policy import AdmitContext
from tuned.policies.registry import make_policy

# finished requests whose output length is a true sample of the model's behaviour
_LEARN_FROM = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
               RequestStatus.FINISHED_REPETITION)


def _guarded(serve: Callable[..., Any], *, recover: Callable[..., Any] | None = None,
             passes: Callable[[Any, BaseException], bool] | None = None,
             check: Callable[..., None] | None = None,
             listed: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The guard of one :class:`PolicyQueue` entry point vLLM calls (the decorated
    method is tuned's path, run while the queue is not in fallback).

    ``serve(fallback, *args)``: how vLLM's own queue answers the call, in fallback.
    An exception from tuned's path puts the queue in fallback, is reported as
    ``where`` = the method's name (:meth:`PolicyQueue._fault`) and the call is answered
    by ``recover(fallback, *args)`` (default ``serve``: a recover undoes what the
    salvaged queue already holds of the call). vLLM's own contract errors reach vLLM
    unchanged: ``check(queue, *args)`` raises them before tuned's path runs,
    ``passes(queue, exc)`` lets an exception of tuned's path through. ``listed``:
    the one argument, an iterable of requests, is made a list first, so that the
    recover sees every request tuned's path was given."""
    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        where = method.__name__

        @functools.wraps(method)
        def entry(self: PolicyQueue, *args: Any) -> Any:
            if self.fallback is None:
                if check is not None:
                    check(self, *args)
                if listed:
                    args = (list(args[0]),)
                try:
                    return method(self, *args)
                except Exception as e:
                    if passes is not None and passes(self, e):
                        raise
                    self._fault(where, e)
                    return (recover or serve)(self.fallback, *args)
            return serve(self.fallback, *args)
        entry.guarded = where        # type: ignore[attr-defined]
        return entry
    return decorate


def _empty(q: PolicyQueue, e: BaseException) -> bool:
    """vLLM's contract: pop or peek from an empty queue raises IndexError."""
    return isinstance(e, IndexError) and not q._waiting


def _not_waiting(q: PolicyQueue, request: Request) -> None:
    """vLLM's contract: removing a request that is not waiting raises ValueError."""
    if request.request_id not in q._waiting:
        raise ValueError(f"request {request.request_id} is not in the waiting queue")


def _add_once(fb: RequestQueue, request: Request) -> None:
    """A request being added when the fault hit is kept (once)."""
    if all(r is not request for r in fb):
        fb.add_request(request)


def _to_front_once(fb: RequestQueue, request: Request) -> None:
    """A request the salvage already holds moves to the front, not in twice."""
    if any(r is request for r in fb):
        fb.remove_request(request)
    fb.prepend_request(request)


def _all_to_front_once(fb: RequestQueue, requests: list[Request]) -> None:
    back = {id(r) for r in requests}
    fb.remove_requests([r for r in fb if id(r) in back])
    fb.prepend_requests(requests)


def _remove_if_there(fb: RequestQueue, request: Request) -> None:
    if request in fb:
        fb.remove_request(request)


class PolicyQueue(QueueCore[Request], RequestQueue):
    """The waiting queue of one vLLM scheduler (see :class:`QueueCore`), guarded.

    vLLM calls ``add_request``, ``pop_request``, ``peek_request``,
    ``prepend_request(s)``, ``remove_request(s)``, ``__bool__``, ``__len__`` and
    ``__iter__`` straight from its step path and its ``add_request``, where an
    exception would take the engine down. Each of them here (one decorator,
    :func:`_guarded`) catches any exception
    from tuned's code (policy, predictor, hints, logging), reports it to
    ``on_fault(where, exc)`` (the scheduler's :class:`~tuned.core.steppath.StepPathGuard`;
    ``where`` is the method's name) and switches the queue to :attr:`fallback`, a
    vLLM ``FCFSRequestQueue`` (``PriorityRequestQueue`` under priority scheduling,
    the queue vLLM itself would run), without losing a request: the waiting ones move over,
    preempted (pinned) ones first, then the rest in arrival order, and a request
    being added when the fault hit is kept. vLLM's own contract errors (``IndexError``
    from an empty queue, ``ValueError`` for a request not in it) pass through as
    vLLM's queue raises them. In fallback every method is the FCFS queue's and no
    policy code runs; :meth:`restore` (called when the guard's episode ends, and by a
    reload through :func:`install`) puts the requests back under the policy.
    """

    def __init__(self, *args: Any, on_fault: Callable[[str, BaseException], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_fault = on_fault
        #: vLLM's own queue while tuned's order is suspended by a fault, else None
        self.fallback: FCFSRequestQueue | PriorityRequestQueue | None = None

    def extra_args(self, request: Request) -> Mapping[str, Any] | None:
        sp = request.sampling_params
        return sp.extra_args if sp is not None else None

    def on_request_finished(self, request: Request) -> None:
        """Called from the scheduler's ``_free_request`` once per request."""
        self.request_finished(request, learn=request.status in _LEARN_FROM)

    # ---------------------------------------- reads from the controller's thread
    def waiting_prompt_tokens(self) -> list[int]:
        fb = self.fallback
        return super().waiting_prompt_tokens() if fb is None else queue_prompt_tokens(fb)

    def oldest_arrival_s(self) -> float | None:
        fb = self.fallback
        return (super().oldest_arrival_s() if fb is None
                else queue_oldest_arrival_s(fb, self.arrival_offset_s))

    # ------------------------------------------------------------ fallback
    def enter_fallback(self) -> None:
        """Serve vLLM's FCFS order from now on (idempotent; never raises). The waiting
        requests move over, preempted ones first, then by arrival."""
        fb = self.fallback
        if fb is None:
            fb = PriorityRequestQueue() if self.priority_first else FCFSRequestQueue()
            try:
                reqs = self._salvage()
            except Exception:
                reqs = list(self._waiting.values())
            for r in reqs:
                fb.add_request(r)
            self._clear_waiting()
            self.fallback = fb

    def restore(self) -> bool:
        """Put the fallback's requests back under the policy (preempted ones pinned
        in front, the others ordered by it) and leave fallback. If that raises, the
        fault is reported (``where="restore"``) and the queue stays as it was in
        fallback; returns whether tuned's order is back."""
        fb = self.fallback
        if fb is None:
            return True
        reqs = list(fb)
        self.fallback = None
        try:
            preempted = [r for r in reqs if r.status == RequestStatus.PREEMPTED]
            for r in reqs:
                if r.status != RequestStatus.PREEMPTED:
                    QueueCore.add_request(self, r)
            for r in reversed(preempted):
                QueueCore.prepend_request(self, r)
            return True
        except Exception as e:
            self._clear_waiting()
            self.fallback = fb
            self._report("restore", e)
            return False

    def _salvage(self) -> list[Request]:
        waiting = self._waiting
        pinned = [waiting[rid] for rid in sorted(self._pinned, key=self._pinned.__getitem__)
                  if rid in waiting]
        pinned_ids = {r.request_id for r in pinned}
        rest = [r for rid, r in waiting.items() if rid not in pinned_ids]
        rest.sort(key=lambda r: r.arrival_time)
        return pinned + rest

    def _clear_waiting(self) -> None:
        """Empty tuned's side of the queue (the policy forgets the waiting requests;
        running ones keep their cached views)."""
        for rid in list(self._waiting):
            self._infos.pop(rid, None)
            try:
                self.policy.forget(rid)
            except Exception:
                pass
        self._waiting = {}
        self._unpinned = {}
        self._pinned = {}
        self._popped.clear()
        self._deferred_ids.clear()
        self._order = None
        self._head = None
        self._head_valid = False

    def _report(self, where: str, e: BaseException) -> None:
        if self._on_fault is not None:
            try:
                self._on_fault(where, e)
            except Exception:
                pass

    def _fault(self, where: str, e: BaseException) -> None:
        self.enter_fallback()
        self._report(where, e)

    # ------------------------------------------------------------ guarded entry points
    def begin_step(self, ctx: AdmitContext, running_requests: list[Request]) -> None:
        if self.fallback is None:
            super().begin_step(ctx, running_requests)

    def step_done(self, num_decode: int, preempted: int) -> None:
        if self.fallback is None:
            super().step_done(num_decode, preempted)

    @_guarded(lambda fb, r: fb.add_request(r), recover=_add_once)
    def add_request(self, request: Request) -> None:
        super().add_request(request)

    @_guarded(lambda fb: fb.pop_request(), passes=_empty)
    def pop_request(self) -> Request:
        return super().pop_request()

    @_guarded(lambda fb: fb.peek_request(), passes=_empty)
    def peek_request(self) -> Request:
        return super().peek_request()

    @_guarded(lambda fb, r: fb.prepend_request(r), recover=_to_front_once)
    def prepend_request(self, request: Request) -> None:
        super().prepend_request(request)

    @_guarded(lambda fb, rs: fb.prepend_requests(rs), recover=_all_to_front_once, listed=True)
    def prepend_requests(self, requests: Iterable[Request]) -> None:
        super().prepend_requests(requests)

    @_guarded(_remove_if_there, check=_not_waiting)
    def remove_request(self, request: Request) -> None:
        super().remove_request(request)

    @_guarded(lambda fb, rs: fb.remove_requests(rs), listed=True)
    def remove_requests(self, requests: Iterable[Request]) -> None:
        super().remove_requests(requests)

    @_guarded(bool)
    def __bool__(self) -> bool:
        return super().__bool__()

    @_guarded(len)
    def __len__(self) -> int:
        return super().__len__()

    @_guarded(lambda fb: iter(list(fb)))
    def __iter__(self) -> Iterator[Request]:
        return iter(list(super().__iter__()))

    def __contains__(self, request: object) -> bool:
        fb = self.fallback
        if fb is None:
            return super().__contains__(request)
        return request in fb

    def snapshot(self) -> dict[str, Any]:
        d = super().snapshot()
        fb = self.fallback
        d["fallback"] = fb is not None
        if fb is not None:
            d["waiting"] = len(fb)
        return d


# ---------------------------------------------------------------- factories
def make_policy_queue(name: str, options: Mapping[str, Any] | None,
                      predictor: OutputLengthPredictor | None, rng_seed: int = 0, *,
                      class_deadlines_s: Mapping[str, float] | None = None,
                      on_warning: Callable[[str, str], None] | None = None,
                      on_fault: Callable[[str, BaseException], None] | None = None,
                      clock: Callable[[], float] = time.monotonic,
                      arrival_offset_s: float | Callable[[], float] = 0.0,
                      priority_first: bool = False) -> PolicyQueue:
    """A :class:`PolicyQueue` for the registered policy ``name`` built from ``options``
    (``ValueError`` on an unknown name or option); ``priority_first`` orders by a
    request's priority first (vLLM's priority scheduling)."""
    return PolicyQueue(make_policy(name, options, rng_seed), predictor,
                       class_deadlines_s=class_deadlines_s, on_warning=on_warning, clock=clock,
                       arrival_offset_s=arrival_offset_s, on_fault=on_fault,
                       priority_first=priority_first)


def priority_scheduling(scheduler: Any) -> bool:
    """Whether the engine runs vLLM's ``--scheduling-policy priority`` (its
    ``scheduler_config.policy``)."""
    sc = getattr(getattr(scheduler, "vllm_config", None), "scheduler_config", None)
    if sc is None:
        sc = getattr(scheduler, "scheduler_config", None)
    policy = getattr(sc, "policy", "fcfs")
    return str(getattr(policy, "value", policy)).lower() == "priority"


def wall_offset_s(wall: Callable[[], float] = time.time,
                  mono: Callable[[], float] = time.monotonic) -> float:
    """wall clock − monotonic clock: vLLM stamps ``arrival_time`` with the wall clock,
    tuned runs on the monotonic one; subtract this to convert. Read it when a request
    arrives, not once: a wall clock stepped since (NTP, an operator) would otherwise
    shift every later arrival by the step."""
    return wall() - mono()


def kv_bytes_per_token(kv_cache_config: Any, pool_tokens: int) -> float | None:
    """The KV cache's bytes per token on one GPU (one worker's allocation: vLLM's
    ``KVCacheConfig`` describes a worker's tensors): the device-resident tensors'
    bytes over the pool's tokens. None where it cannot be read (no config, no
    tensors) -- NVML's free memory is then not read in KV tokens."""
    try:
        total = sum(int(t.size) for t in kv_cache_config.kv_cache_tensors
                    if not getattr(t, "host_resident", False))
    except (AttributeError, TypeError, ValueError):
        return None
    return total / pool_tokens if total > 0 and pool_tokens > 0 else None


def context_from_scheduler(scheduler: Any, speed_tok_s: Callable[[int], float] | None = None,
                           now_s: float | None = None,
                           guard: tuple[Any, float, float] = (None, 0.0, 0.0),
                           gpu_free_tokens: int | None = None) -> AdmitContext:
    """The :class:`AdmitContext` of a vLLM scheduler right now (one null block
    excluded), on the monotonic clock; ``gpu_free_tokens`` is NVML's free memory in KV
    tokens as the controller last published it."""
    pool = scheduler.kv_cache_manager.block_pool
    block = scheduler.block_size
    cap_tokens = getattr(scheduler, "kv_capacity_tokens", None)
    if cap_tokens is None:
        cap_tokens = (pool.num_gpu_blocks - 1) * block
    return AdmitContext(now_s=time.monotonic() if now_s is None else now_s,
                        kv_capacity_tokens=int(cap_tokens),
                        kv_free_tokens=int(pool.get_num_free_blocks() * block),
                        cap=int(scheduler.max_num_active_reqs), speed_tok_s=speed_tok_s,
                        block_size=int(block), step_model=guard[0], tpot_sla_s=guard[1],
                        ttft_sla_s=guard[2], gpu_free_tokens=gpu_free_tokens,
                        token_budget=int(getattr(scheduler, "max_num_scheduled_tokens", 0) or 0))


def begin_step(scheduler: Any, speed_tok_s: Callable[[int], float] | None = None,
               guard: tuple[Any, float, float] = (None, 0.0, 0.0),
               gpu_free_tokens: int | None = None) -> None:
    """Call at the top of ``schedule()``: no-op unless ``scheduler.waiting`` is a
    :class:`PolicyQueue`. ``guard``: (step model, TPOT SLA, TTFT SLA) of the
    admission guard; ``gpu_free_tokens``: NVML's free memory in KV tokens."""
    q = scheduler.waiting
    if isinstance(q, PolicyQueue):
        q.begin_step(context_from_scheduler(scheduler, speed_tok_s, guard=guard,
                                            gpu_free_tokens=gpu_free_tokens),
                     scheduler.running)


def install(scheduler: Any, name: str, cfg: Any = None, *,
            predictor: OutputLengthPredictor | None = None,
            on_warning: Callable[[str, str], None] | None = None,
            on_fault: Callable[[str, BaseException], None] | None = None) -> PolicyQueue:
    """Make ``scheduler.waiting`` a :class:`PolicyQueue` running policy ``name``.

    If it already is one, the policy is switched in place (live reload); otherwise
    the requests of vLLM's queue move over in their order, preempted ones pinned in
    front; under vLLM's priority scheduling (:func:`priority_scheduling`) the new
    queue orders by priority first. Reads ``cfg.queue_spec()`` (the policy's options, ``late_after_s`` from
    ``ttft_sla_s`` for fcfs) or ``cfg.queue_options`` (mapping of options for the policy),
    ``cfg.class_deadlines_s`` (SLA table) and ``cfg.queue_seed`` when the config
    has them. Scheduler thread only, like :meth:`PolicyQueue.switch_policy`. A queue
    in fallback (:meth:`PolicyQueue.restore`) goes back to tuned's order here.
    """
    spec = getattr(cfg, "queue_spec", None)
    options = spec()[1] if spec is not None else (getattr(cfg, "queue_options", None) or {})
    classes = getattr(cfg, "class_deadlines_s", None) or {}
    seed = int(getattr(cfg, "queue_seed", 0) or 0)
    q = scheduler.waiting
    bound = cfg.wait_bound_spec() if hasattr(cfg, "wait_bound_spec") else None
    if isinstance(q, PolicyQueue):
        q.lengths.class_deadlines_s = dict(classes)
        q.switch_policy(make_policy(name, options, seed))
        q.set_wait_bound(bound)
        q.restore()
        return q
    new = make_policy_queue(name, options, predictor, seed, class_deadlines_s=classes,
                            on_warning=on_warning, on_fault=on_fault,
                            arrival_offset_s=wall_offset_s,
                            priority_first=priority_scheduling(scheduler))
    old = list(q)
    preempted = [r for r in old if r.status == RequestStatus.PREEMPTED]
    for r in old:
        if r.status != RequestStatus.PREEMPTED:
            new.add_request(r)
    for r in reversed(preempted):
        new.prepend_request(r)
    new.set_wait_bound(bound)
    scheduler.waiting = new
    return new
