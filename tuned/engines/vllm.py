"""tuned inside vLLM (0.32 and 0.33): a thin scheduler subclass.

vLLM loads it in the EngineCore process (``--scheduler-cls
tuned.engines.vllm.TunedScheduler``, or ``LLM(scheduler_cls=...)``) and calls it
from its busy loop. Its config comes from ``tuned serve`` (embedded in
``--additional-config``) or, on your own vLLM command line, from the engine's own
settings plus tuned's keys in ``--additional-config '{"tuned": {...}}'``, ``TUNED_*``
variables or a file (:func:`tuned.config.engine_setup`); a bad config, or one that
contradicts the engine's arguments, stops the engine at start (and, through
:mod:`tuned.engines.vllm_plugin`, vLLM's server before it loads the model).
It overrides as little as it can:

* ``schedule()``: first applies the controller's latest decision to the two live
  knobs, ``max_num_active_reqs`` (the admission gate; never ``max_num_running_reqs``,
  the model runner's slot count) and ``max_num_scheduled_tokens`` (the token budget),
  or the fallback cap when the controller failed or went stale; then vLLM schedules.
* ``update_from_output()``: after vLLM, records one :class:`StepSample` in a ring.
* ``_free_request()``: records the finished request's lengths for the memory bound,
  and its first token's time (noted by ``update_from_output``) for its TPOT.

The controller (an apscheduler thread) and the HTTP endpoint start here, in
``__init__``, so there is one of each per data-parallel rank. Everything tuned does
on the step path (these three hooks and every method of tuned's waiting queue,
:class:`tuned.engines.vllm_queue.PolicyQueue`) is wrapped so that an exception in
tuned is contained by :class:`tuned.core.steppath.StepPathGuard` (counted, logged
once per episode, fallback cap and vLLM's FCFS order until tuned recovers), never
raised into the engine; tuned's log sink never raises either (:mod:`tuned.base.log`).
``last_step_done_s`` (the end of the newest engine step) lets the controller tell a
stalled engine from an idle one (``engine_stall_s``).

``TunedScheduler`` picks the synchronous base (vLLM's ``Scheduler``, forced on CPU) or
``AsyncScheduler`` (the GPU default) from the engine's config, so one class name
serves both.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections import deque
from typing import Any

import structlog

from tuned import config as config_mod
from tuned.base import log as log_mod
from tuned.config import Config
from tuned.core import refusal
from tuned.core.knobs import Fallback  # noqa: F401  (re-exported for callers and tests)
from tuned.control.runtime import production_runtime
from tuned.core.steppath import StepPathGuard
from tuned.core.queue import queue_oldest_arrival_s, queue_prompt_tokens
from tuned.core.ring import FINISHED_RING, FinishedRequest, Ring, StepSample
from tuned.engines import vllm_plugin
from tuned.engines.vllm_version import UnsupportedVllmError, check_vllm_version  # noqa: F401

STEP_RING = 8192

#: vLLM's ``additional_config`` entry carrying tuned's config (kept under this name)
tuned_additional_config = config_mod.engine_handoff

log = structlog.get_logger("tuned.engine")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return r.status == 200
    except Exception:
        return False


def engine_settings(vllm_config) -> dict[str, Any]:
    """What this engine runs with, under tuned's config keys
    (:func:`tuned.config.engine_setup` takes them as the config's engine settings, or
    holds a config that repeats them to them)."""
    return vllm_plugin.engine_settings(vllm_config)


def _engine_setup(vllm_config) -> config_mod.EngineSetup:
    """The config from ``tuned serve``'s hand-off, or, dropped into your own vLLM
    command line, from ``--additional-config '{"tuned": {...}}'``, ``TUNED_<KEY>``
    variables and the TOML file named by ``config_path`` or ``TUNED_CONFIG``, with the
    engine's own settings (:func:`tuned.config.engine_setup`). tuned's vLLM plugin
    (:mod:`tuned.engines.vllm_plugin`) has made the same check in the process that
    parsed the arguments, before the model loaded; this one stands when the plugin is
    not loaded (``VLLM_PLUGINS``). A problem stops the engine at start: one line per
    problem on stderr, then :class:`tuned.config.ConfigError`."""
    try:
        setup = config_mod.engine_setup(vllm_config.additional_config, os.environ,
                                        engine_settings(vllm_config))
    except config_mod.ConfigError as e:
        for line in config_mod.refusal_lines(e):
            print(line, file=sys.stderr, flush=True)
        raise
    for line in setup.overridden:
        log.info("config_overridden", detail=line)
    return setup


def dp_rank(parallel_config: Any) -> int:
    """This engine's data-parallel rank: vLLM's ``data_parallel_index``.

    Not ``data_parallel_rank``: for a dense (non-MoE) model vLLM 0.32 runs each rank
    as an independent engine and resets ``data_parallel_rank`` to 0 in every one of
    them (``ParallelConfig.reconfigure_for_independent_dp_rank``), keeping the real
    rank in ``data_parallel_index`` (set in ``EngineCoreProc.run_engine_core``), the
    index vLLM's own metrics label ``engine`` with."""
    index = getattr(parallel_config, "data_parallel_index", None)
    if index is None:
        index = getattr(parallel_config, "data_parallel_rank", 0)
    return int(index or 0)


class _TunedMixin:
    """The parts shared by the sync and async variants: a mapping of vLLM's objects
    onto the control core's contract (:mod:`tuned.core.contract`)."""

    # -------------------------------------------------------------- set-up
    def _tuned_setup(self) -> None:
        import vllm

        check_vllm_version(vllm.__version__)
        setup = _engine_setup(self.vllm_config)
        cfg, serving_url = setup.cfg, setup.serving_url
        log_mod.configure(cfg.log_level)
        self.steps = Ring(STEP_RING)
        self.finished = Ring(FINISHED_RING)
        self.ceiling = self.max_num_running_reqs
        self.max_num_batched_tokens = self.scheduler_config.max_num_batched_tokens
        pool = self.kv_cache_manager.block_pool
        self._block_pool = pool
        # one block of the pool is vLLM's null block and never holds tokens
        self._kv_usable_blocks = max(pool.num_gpu_blocks - 1, 1)
        self.kv_capacity_tokens = self._kv_usable_blocks * self.block_size
        self.dp_rank = dp_rank(self.parallel_config)
        from tuned.engines.vllm_queue import kv_bytes_per_token

        self.kv_bytes_per_token = kv_bytes_per_token(
            getattr(self, "kv_cache_config", None), pool.num_gpu_blocks * self.block_size)
        self._sched_times: deque[float] = deque()
        self._last_update_t = 0.0
        self._tuned_errors = 0
        self._refused_out: list = []      # refused at the wait bound, output not yet sent
        self._first_token_s: dict[str, float] = {}   # running request -> first token
        # one clock for the whole control core: vLLM's arrival stamps are wall time
        # and are moved onto it as they come (tuned.engines.vllm_queue.wall_offset_s)
        self._clock = time.monotonic
        from tuned.engines.vllm_queue import wall_offset_s

        self._wall_offset_s = wall_offset_s
        self.last_step_done_s = self._clock()
        serving = (lambda: _http_ok(serving_url)) if serving_url else (lambda: True)
        self.tuned = production_runtime(
            cfg, self, environ=os.environ, serving=serving, steps_json=self.steps_json,
            reload_token_sha256=setup.reload_token_sha256)
        self.controller = self.tuned.controller
        self.metrics = self.tuned.metrics
        self.endpoint = self.tuned.endpoint
        self._step_guard = StepPathGuard(self.tuned.slot, self.metrics, clock=self._clock)
        # fcfs keeps vLLM's own queue (nothing added on the step path); any other
        # policy, or a later switch, installs tuned's PolicyQueue at the top of
        # schedule(), on this thread.
        self.queue_policy = "fcfs"
        self._pending_queue: tuple[str, Config] | None = None
        if not cfg.native_queue:
            self.set_queue_policy(cfg.queue_policy, cfg)
            self._apply_queue_policy()
        self._write_knobs(self.tuned.slot.applied)
        log.info("tuned_started", ceiling=self.ceiling, kv_capacity_tokens=self.kv_capacity_tokens,
                 block_size=self.block_size, scheduler=type(self).__mro__[2].__name__,
                 metrics=(f"http://{cfg.metrics_host}:{self.endpoint.port}/metrics"
                          if self.endpoint else None),
                 config=cfg.source_path or ("vLLM's settings, no file" if cfg.sources is not None
                                            else "embedded default"), sla_s=cfg.tbt_sla_s)
        self.controller.start()

    # -------------------------------------------------------------- the view
    def counts(self) -> tuple[int, int]:
        return self.get_request_counts()

    def active_requests(self) -> list[tuple[int, int]]:
        return [(r.num_prompt_tokens, r.max_tokens or 0) for r in list(self.running)]

    def prefilling(self) -> int:
        """Running requests whose prompt is not all computed yet (a chunked prefill
        under way): admitted, so not waiting, but still without a first token (a
        preempted request recomputing its prompt has one, and is not counted)."""
        return sum(1 for r in list(self.running)
                   if r.num_computed_tokens < r.num_prompt_tokens and not r.num_output_tokens)

    def applied(self) -> dict:
        return self.tuned.slot.state()

    def set_queue_policy(self, name: str, cfg: Config) -> None:
        """Ask for a queue policy; the scheduler thread installs it next step."""
        from tuned.policies.registry import make_policy

        make_policy(name, cfg.queue_spec()[1])  # raise here, on the caller's thread
        self._pending_queue = (name, cfg)

    def _apply_queue_policy(self) -> None:
        from tuned.engines import vllm_queue

        name, cfg = self._pending_queue
        self._pending_queue = None
        before = len(self.waiting)
        # export the outgoing policy's last counts; the new one counts from zero
        self.tuned.queue_channel.switched(self.queue_snapshot())
        vllm_queue.install(self, name, cfg, on_warning=self._hint_warning,
                           on_fault=self._tuned_guard)
        log.info("queue_policy", old=self.queue_policy, new=name, waiting_kept=len(self.waiting),
                 waiting_before=before, running=len(self.running))
        self.queue_policy = name

    def _hint_warning(self, request_id: str, message: str) -> None:
        # messages read "<field>: must be ..., got ...; ignored"
        field = message.split(":", 1)[0]
        self.metrics.hint_warnings.labels(field).inc()
        log.warning("request_hint_ignored", field=field, request_id=request_id, problem=message)

    def _kv_used_blocks(self) -> int:
        # vLLM's null block never leaves the pool's free queue: it is neither free nor
        # in use by a request (vLLM's own BlockPool.get_usage() leaves it out too)
        return max(self._kv_usable_blocks - self._block_pool.get_num_free_blocks(), 0)

    def kv_usage_now(self) -> float:
        """Fraction of the usable KV blocks held right now (0.0 once every request has
        left). Read live: an abort frees its blocks outside any step, so the newest
        step sample can be stale once the engine idles."""
        return self._kv_used_blocks() / self._kv_usable_blocks

    def queue_snapshot(self) -> dict | None:
        snap = getattr(self.waiting, "snapshot", None)
        return snap() if snap is not None else None

    def present_prompts(self) -> list[int]:
        """The prompt tokens of each running request and of each waiting one (tuned's
        queue, or vLLM's own where it keeps it), read from the controller's thread."""
        try:
            waiting = queue_prompt_tokens(self.waiting)
        except (RuntimeError, IndexError):   # changed under the copy: next tick
            waiting = []
        return [r.num_prompt_tokens for r in list(self.running)] + waiting

    def oldest_wait_s(self) -> float | None:
        """How long the longest-waiting request has waited for admission (tuned's
        queue, or vLLM's own), read from the controller's thread; None when none
        waits."""
        try:
            first = queue_oldest_arrival_s(self.waiting, self._wall_offset_s)
        except (RuntimeError, IndexError):   # changed under the copy: next tick
            return None
        return None if first is None else max(self._clock() - first, 0.0)

    def steps_json(self, since: int) -> dict:
        return {"next": self.steps.next_seq, "block_size": self.block_size,
                "num_gpu_blocks": self._block_pool.num_gpu_blocks,
                "samples": [s._asdict() for s in self.steps.since(since)]}

    # -------------------------------------------------------------- hot path
    def _write_knobs(self, knobs) -> None:
        self.max_num_active_reqs = knobs.cap
        self.max_num_scheduled_tokens = knobs.token_budget

    def _tuned_apply(self) -> None:
        knobs = self.tuned.slot.take()
        if knobs is not None:
            self._write_knobs(knobs)

    def _queue_installed(self) -> bool:
        return hasattr(self.waiting, "begin_step")

    def _tuned_record(self, so, mro) -> None:
        now = self._clock()
        start = self._sched_times.popleft() if self._sched_times else now
        step_s = now - max(start, self._last_update_t)
        self._last_update_t = now
        nst = so.num_scheduled_tokens
        if not nst:
            return
        n_dec = 0
        drafts = 0
        spec = so.scheduled_spec_decode_tokens
        if spec:
            # speculative decoding: a decoding request verifies its draft tokens in the
            # same step; it is still one decode, and its drafts are no prompt tokens
            for rid, v in nst.items():
                k = len(spec.get(rid, ()))
                if v - k == 1:
                    n_dec += 1
                    drafts += k
        else:
            for v in nst.values():
                if v == 1:
                    n_dec += 1
        total = so.total_num_scheduled_tokens
        gen = 0
        for t in mro.sampled_token_ids or ():
            gen += len(t)
        used = self._kv_used_blocks()
        resident = 0
        first = self._first_token_s
        for r in self.running:
            resident += r.num_computed_tokens
            # the first token's time, for the request's TPOT when it finishes
            # (the attainment setpoint learns from it); dropped in _free_request
            if r.request_id not in first and r.num_output_tokens:
                first[r.request_id] = now
        running, waiting = self.get_request_counts()
        if hasattr(self.waiting, "step_done"):
            self.waiting.step_done(n_dec, len(so.preempted_req_ids or ()))
        self.steps.append(StepSample(
            self.steps.next_seq, now, step_s, n_dec, len(nst) - n_dec, total - n_dec - drafts,
            total,
            gen, used / self._kv_usable_blocks, used, resident, running, waiting,
            len(so.preempted_req_ids or ())))

    def _tuned_guard(self, where: str, e: BaseException) -> None:
        """Every exception tuned's step-path code raises ends here (the hooks below, and
        the queue's methods through ``on_fault``): counted and logged by the guard,
        the fallback cap held, the queue on vLLM's FCFS order. Never raises."""
        try:
            self._tuned_errors += 1
            self._step_guard.fault(where, e)
            enter = getattr(self.waiting, "enter_fallback", None)
            if enter is not None:
                enter()
        except Exception:
            pass
        # the held fallback cap now, not at the next step (the fault may be in the
        # very code that applies the knobs)
        slot = self.tuned.slot
        try:
            knobs = slot.take()
            if knobs is not None:
                self._write_knobs(knobs)
        except Exception:
            try:
                self._write_knobs(slot.clamp(slot.fallback_cap, slot.max_num_batched_tokens))
            except Exception:
                pass

    def _tuned_recover(self) -> None:
        """An episode of step-path faults ended: tuned's queue order again."""
        if self._step_guard.poll():
            restore = getattr(self.waiting, "restore", None)
            if restore is not None:
                restore()

    # -------------------------------------------------------------- overrides
    def schedule(self, *args, **kwargs):
        try:
            self._tuned_recover()
            self._tuned_apply()
            if self._pending_queue is not None:
                self._apply_queue_policy()
            if self.queue_policy != "fcfs" or self._queue_installed():
                from tuned.engines.vllm_queue import begin_step

                qi = self.tuned.queue_channel.inputs
                begin_step(self, qi.speed_fn, qi.guard, qi.gpu_free_tokens)
                refusal.answer(self.waiting.refusals, self)
        except Exception as e:
            self._tuned_guard("apply", e)
        out = super().schedule(*args, **kwargs)
        self._sched_times.append(self._clock())
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        result = super().update_from_output(scheduler_output, model_runner_output)
        # the engine's liveness, kept even while recording the step fails
        self.last_step_done_s = self._clock()
        try:
            self._tuned_record(scheduler_output, model_runner_output)
        except Exception as e:
            self._tuned_guard("record", e)
        if self._refused_out:
            try:
                self._emit_refused(result)
            except Exception as e:
                self._tuned_guard("refuse", e)
        return result

    def answer_refusals(self, refused) -> None:
        """vLLM's answer to the requests the queue refused
        (:class:`tuned.core.refusal.RefusalAnswer`): each is finished as vLLM finishes
        an aborted one; their clients hear back with the next outputs (finish reason
        ``abort``, no tokens: :func:`tuned.core.refusal.client_refusal` reads it)."""
        if not refused:
            return
        from vllm.v1.request import RequestStatus

        done = self.finish_requests([r.request_id for r, _ in refused],
                                    RequestStatus.FINISHED_ABORTED)
        self._refused_out.extend(done)
        now = self._clock()
        reason = ",".join(dict.fromkeys(e.reason for _, e in refused))
        predicted = [e.predicted_s for _, e in refused if e.predicted_s is not None]
        log.info("requests_refused", reason=reason, n=len(done),
                 longest_wait_s=round(max(now - (r.arrival_time - self._wall_offset_s())
                                          for r in done), 3) if done else None,
                 predicted_first_token_s=min(predicted) if predicted else None,
                 seen=next((e.seen for _, e in refused if e.seen), None))

    def _emit_refused(self, result: dict) -> None:
        """One final output per refused request to its client (vLLM's own shape for
        a request it ends without tokens, as for a failed KV load)."""
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs

        for req in self._refused_out:
            eco = result.get(req.client_index)
            if eco is None:
                eco = result[req.client_index] = EngineCoreOutputs()
            eco.outputs.append(EngineCoreOutput(
                request_id=req.request_id, new_token_ids=[],
                finish_reason=req.get_finished_reason(), events=req.take_events(),
                trace_headers=req.trace_headers))
        self._refused_out.clear()

    def _free_request(self, request, *args, **kwargs):
        try:
            self.finished.append(FinishedRequest(
                self.finished.next_seq, self._clock(), request.request_id,
                request.num_prompt_tokens, request.num_output_tokens,
                request.max_tokens or 0, request.arrival_time - self._wall_offset_s(),
                request.num_preemptions, self._first_token_s.pop(request.request_id, None)))
            q = self.waiting
            if hasattr(q, "on_request_finished"):
                q.on_request_finished(request)
        except Exception as e:
            self._tuned_guard("finish", e)
        return super()._free_request(request, *args, **kwargs)

    def shutdown(self) -> None:
        try:
            self.tuned.stop()
        except Exception as e:
            self._tuned_guard("shutdown", e)
        super().shutdown()


def _make_classes():
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    class TunedSyncScheduler(_TunedMixin, Scheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._tuned_setup()

    class TunedAsyncScheduler(_TunedMixin, AsyncScheduler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._tuned_setup()

    return TunedSyncScheduler, TunedAsyncScheduler


TunedSyncScheduler, TunedAsyncScheduler = _make_classes()


class TunedScheduler:
    """Entry point for ``--scheduler-cls``: builds the variant matching the engine.

    vLLM resolves async scheduling before it builds the scheduler; this picks
    ``AsyncScheduler`` as the base when it is on and the plain ``Scheduler`` when it
    is off (always on CPU).
    """

    def __new__(cls, *args, **kwargs):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if vllm_config.scheduler_config.async_scheduling:
            return TunedAsyncScheduler(*args, **kwargs)
        return TunedSyncScheduler(*args, **kwargs)

