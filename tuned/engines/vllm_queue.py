"""vLLM 0.32 waiting queue ordered and gated by a tuned queue policy.

:class:`PolicyQueue` is a ``vllm.v1.core.sched.request_queue.RequestQueue`` that
replaces the scheduler's ``self.waiting``. Everything it does is the engine-neutral
:class:`tuned.core.queue.QueueCore` (its docstring says how vLLM's admission loop
uses the queue); this module only maps vLLM's objects onto it: where a request's
hints live (``sampling_params.extra_args``), which finished statuses are true
samples of the output length, which requests of vLLM's own queue were preempted,
and the scheduler's KV numbers for the :class:`AdmitContext`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.request import Request, RequestStatus

from tuned.core.queue import QueueCore
from tuned.core.predictor import OutputLengthPredictor
from tuned.policies.queues import AdmitContext, make_policy

# finished requests whose output length is a true sample of the model's behaviour
_LEARN_FROM = (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED,
               RequestStatus.FINISHED_REPETITION)


class PolicyQueue(QueueCore[Request], RequestQueue):
    """The waiting queue of one vLLM scheduler (see :class:`QueueCore`)."""

    def extra_args(self, request: Request) -> Mapping[str, Any] | None:
        sp = request.sampling_params
        return sp.extra_args if sp is not None else None

    def on_request_finished(self, request: Request) -> None:
        """Called from the scheduler's ``_free_request`` once per request."""
        self.request_finished(request, learn=request.status in _LEARN_FROM)


# ---------------------------------------------------------------- factories
def make_policy_queue(name: str, options: Mapping[str, Any] | None,
                      predictor: OutputLengthPredictor | None, rng_seed: int = 0, *,
                      class_deadlines_s: Mapping[str, float] | None = None,
                      on_warning: Callable[[str, str], None] | None = None,
                      clock: Callable[[], float] = time.monotonic,
                      arrival_offset_s: float = 0.0) -> PolicyQueue:
    """A :class:`PolicyQueue` for the registered policy ``name`` built from ``options``
    (``ValueError`` on an unknown name or option)."""
    return PolicyQueue(make_policy(name, options, rng_seed), predictor,
                       class_deadlines_s=class_deadlines_s, on_warning=on_warning, clock=clock,
                       arrival_offset_s=arrival_offset_s)


def wall_offset_s() -> float:
    """wall clock − monotonic clock: vLLM stamps ``arrival_time`` with the wall clock,
    tuned runs on the monotonic one; subtract this to convert."""
    return time.time() - time.monotonic()


def context_from_scheduler(scheduler: Any, speed_tok_s: Callable[[int], float] | None = None,
                           now_s: float | None = None,
                           guard: tuple[Any, float, float] = (None, 0.0, 0.0)) -> AdmitContext:
    """The :class:`AdmitContext` of a vLLM scheduler right now (one null block
    excluded), on the monotonic clock."""
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
                        ttft_sla_s=guard[2],
                        token_budget=int(getattr(scheduler, "max_num_scheduled_tokens", 0) or 0))


def begin_step(scheduler: Any, speed_tok_s: Callable[[int], float] | None = None,
               guard: tuple[Any, float, float] = (None, 0.0, 0.0)) -> None:
    """Call at the top of ``schedule()``: no-op unless ``scheduler.waiting`` is a
    :class:`PolicyQueue`. ``guard``: (step model, TPOT SLA, TTFT SLA) of the
    admission guard."""
    q = scheduler.waiting
    if isinstance(q, PolicyQueue):
        q.begin_step(context_from_scheduler(scheduler, speed_tok_s, guard=guard),
                     scheduler.running)


def install(scheduler: Any, name: str, cfg: Any = None, *,
            predictor: OutputLengthPredictor | None = None,
            on_warning: Callable[[str, str], None] | None = None) -> PolicyQueue:
    """Make ``scheduler.waiting`` a :class:`PolicyQueue` running policy ``name``.

    If it already is one, the policy is switched in place (live reload); otherwise
    the requests of vLLM's queue move over in their order, preempted ones pinned in
    front. Reads ``cfg.queue_spec()`` (the policy's options, ``late_after_s`` from
    ``ttft_sla_s`` for fcfs) or ``cfg.queue_options`` (mapping of options for the policy),
    ``cfg.class_deadlines_s`` (SLA table) and ``cfg.queue_seed`` when the config
    has them. Scheduler thread only, like :meth:`PolicyQueue.switch_policy`.
    """
    spec = getattr(cfg, "queue_spec", None)
    options = spec()[1] if spec is not None else (getattr(cfg, "queue_options", None) or {})
    classes = getattr(cfg, "class_deadlines_s", None) or {}
    seed = int(getattr(cfg, "queue_seed", 0) or 0)
    q = scheduler.waiting
    if isinstance(q, PolicyQueue):
        q.class_deadlines_s = dict(classes)
        q.switch_policy(make_policy(name, options, seed))
        return q
    new = make_policy_queue(name, options, predictor, seed, class_deadlines_s=classes,
                            on_warning=on_warning, arrival_offset_s=wall_offset_s())
    old = list(q)
    preempted = [r for r in old if r.status == RequestStatus.PREEMPTED]
    for r in old:
        if r.status != RequestStatus.PREEMPTED:
            new.add_request(r)
    for r in reversed(preempted):
        new.prepend_request(r)
    scheduler.waiting = new
    return new
