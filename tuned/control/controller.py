"""The control loop: observe -> decide -> act, once per ``interval_s``.

``Controller.run_once()`` reads the step and finished-request rings the scheduler
fills, NVML memory where a GPU exists, and the queue lengths (observe); exports what it
read (:class:`tuned.control.export.MetricsExport`) and publishes the queue's inputs
into the queue channel (:mod:`tuned.core.queue_channel`); runs the batch-size policy
of Pang et al. inside the GPU-memory guard (decide; :mod:`tuned.policies.gpu_memory`);
and puts the decision in the knob slot the scheduler applies at the top of its next
``schedule()`` (act). Each tick is timed into ``tuned_controller_tick_seconds``, each
phase into ``tuned_controller_tick_phase_seconds{phase}`` (the export and the
publishing count in the observe phase).

A tick that raises is counted and hands the scheduler the configured fallback cap;
the scheduler also falls back on its own when the last good tick is older than
``stale_after_s``. Nothing here can stop the engine: the loop runs in apscheduler's
thread and only ever swaps a reference the scheduler reads.

The loop composes its collaborators (:mod:`tuned.control`): reload, the Prometheus
export, engine liveness and sd_notify, the derived SLA and the ``/decisions`` view each
live in their own module; the batch policy comes from the one registry
(:func:`tuned.policies.registry.build_batch_policy`).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, NamedTuple

import structlog

from tuned.config import Config
from tuned.control.export import MetricsExport
from tuned.control.liveness import EngineLiveness, Watchdog
from tuned.control.reload import Reloader
from tuned.control.sla import SlaSource
from tuned.control.status import decisions_view
from tuned.control.metrics import Metrics
from tuned.core.admission import holds_between
from tuned.core.contract import EngineView
from tuned.core.knobs import Fallback, KnobSlot, valid_cap
from tuned.core.queue_channel import NO_SWITCH, QueueChannel, QueueInputs
from tuned.core.refusal import RefusalWatch
from tuned.core.window import (BindingHistory, demand_moments, occupancy_moments,
                               present_pairs, request_tpot_s, step_window)
from tuned.curves.online import MIN_SAMPLES, fit_recent_steps
from tuned.core.types import Decision, Observation
from tuned.policies.explain import BIND_SHARE, explained
from tuned.policies.registry import build_batch_policy, wants_step_fit
from tuned.telemetry.nvml import NvmlSampler, free_bytes, free_fraction

__all__ = ["Controller", "EngineView", "Fallback"]

log = structlog.get_logger("tuned.controller")

#: the online step-time fit: refreshed this often, over this many recent steps
STEP_FIT_EVERY_S = 4.0
STEP_FIT_SAMPLES = 1024
#: the busy steps the first fit needs (later fits need the online fit's own minimum,
#: 50): on a fresh engine hit by a burst, 50 steps take seconds, and until the first
#: fit the queue cannot predict a first token, so it refuses only at the wait bound
FIRST_STEP_FIT_SAMPLES = 16
#: a failure that repeats tick after tick is logged again this often (with the count)
FAIL_LOG_EVERY_S = 60.0


class Seen(NamedTuple):
    """What a tick's observe read beside its :class:`Observation`, for the export:
    the engine steps and the number of finished requests since the last tick, the
    outgoing queue's counters of a queue switch (or ``NO_SWITCH``), the queue's
    snapshot."""

    new_steps: list
    new_finished: int
    queue_switch: object
    queue: dict | None


def load_profile(path: str):
    from tuned.curves.profile import load_profile as _load

    return _load(path)


class Controller:
    """One engine's control loop; see the module docstring. Every outside resource is
    a parameter: the engine view, the metrics, NVML, the sd_notify socket, the clocks,
    the profile loader and the config source a reload reads."""

    def __init__(self, cfg: Config, engine: EngineView, metrics: Metrics,
                 nvml: NvmlSampler | None = None, notifier: Any = None,
                 serving: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 profile_loader: Callable[[str], Any] = load_profile,
                 reload_source: Callable[[], Config] | None = None,
                 on_decision: Callable[[dict], None] | None = None):
        self.engine = engine
        self.metrics = metrics
        self.nvml = nvml
        self.clock = clock
        self.wall = wall
        self.profile_loader = profile_loader
        self.on_decision = on_decision
        self._lock = threading.RLock()
        # the slot the engine takes its knobs from, on this controller's clock
        self.slot = KnobSlot(engine.ceiling, engine.max_num_batched_tokens,
                             stale_after_s=cfg.stale_after_s, fallback_cap=cfg.fallback_cap,
                             clock=clock, metrics=metrics)
        # what the engine's waiting queue reads, down, and its switches, up
        self.queue_channel = QueueChannel()
        self.export = MetricsExport(metrics)
        self.liveness = EngineLiveness(engine, clock)
        self.watchdog = Watchdog(notifier, clock, serving)
        self.sla = SlaSource()
        self.reloader = Reloader(self, metrics, self._lock, source=reload_source, wall=wall)
        self.current: Decision | None = None
        self.recent: list[dict] = []
        self.seq = 0
        self.gpu: list | None = None                  # NVML's devices at the last tick
        self.gpu_free_tokens: int | None = None       # their free memory in KV tokens
        self.last_observation: Observation | None = None
        self.seen: Seen | None = None                 # observe's readings for the export
        self._step_seq = 0
        self._fin_seq = 0
        self._binding = BindingHistory()    # tick by tick: did the cap bind?
        self._fit_t = -math.inf
        self.refusals = RefusalWatch()       # what the door decides by (/admission)
        self._failing: tuple | None = None  # ((cause, error), logged at, repeats since)
        self._step_fit = None
        self._scheduler = None
        self.cfg = cfg
        self._build(cfg)
        metrics.ceiling.set(engine.ceiling)
        metrics.kv_capacity.set(engine.kv_capacity_tokens)

    # ------------------------------------------------------------------ config
    def queue_inputs(self) -> QueueInputs:
        """What the engine's waiting queue reads each step, published into the queue
        channel each tick and whenever the config in force changes: the profile's
        speed curve, and the admission guard's step model, TPOT SLA and TTFT SLA
        (:class:`tuned.core.admission.AdmissionGuard`), or (None, 0.0, 0.0) while the
        guard is off: ``admission_guard = "off"``, no SLA yet, or no step fit yet. The
        TTFT SLA is 0 (that half off) without ``ttft_sla_s``. And NVML's free memory
        in KV tokens (BucketServe's N_max)."""
        fit = self._step_fit
        if fit is None or not self.cfg.guards_admission:
            return QueueInputs(self.speed_fn, gpu_free_tokens=self.gpu_free_tokens)
        return QueueInputs(self.speed_fn, fit, self.sla.sla_s(self.cfg),
                           self.cfg.ttft_sla_s, self.gpu_free_tokens)

    def _build(self, cfg: Config, reuse_profile: bool = False) -> None:
        """(Re)build the policy objects from a validated config. All or nothing: the
        profile and the policy are built before anything is replaced, so a failure
        leaves the running objects untouched (a rollback that re-read the old profile
        from disk failed in turn when the file had been corrupted since)."""
        eff = self.sla.effective(cfg)
        if reuse_profile:  # same file, already loaded: do not read it again
            profile = self.profile
        else:
            profile = self.profile_loader(eff.profile) if eff.profile else None
        eng = self.engine
        policy, first_reason = build_batch_policy(
            eff, ceiling=eng.ceiling, max_num_batched_tokens=eng.max_num_batched_tokens,
            block_size=eng.block_size, profile=profile)
        self.cfg = cfg
        self.policy, self._first_reason = policy, first_reason
        self.profile = profile
        # one bound method for the queue's admission checks (SABER): a new object
        # every step would make it recompute its order every step
        self.speed_fn = profile.speed_tok_s if profile is not None else None
        self._settle(eff)

    def _settle(self, eff: Config) -> None:
        """Hand on what the config in force (``eff``, with the SLA in force) sets: the
        slot's fallback settings, the SLA gauge, the queue's inputs."""
        self.slot.configure(stale_after_s=eff.stale_after_s, fallback_cap=eff.fallback_cap)
        self.metrics.tbt_sla.set(eff.tbt_sla_s)
        self.queue_channel.publish(self.queue_inputs())

    def apply_config(self, new: Config) -> None:
        """Apply a validated config live, all or nothing (the reloader's target): on an
        exception the running policy, profile and slot settings are as they were (put
        back, not re-read from disk) and the exception propagates."""
        with self._lock:
            old = self.cfg
            kept = (self.cfg, self.policy, self._first_reason, self.profile, self.speed_fn)
            try:
                self._build(new)
                if (new.queue_spec(), new.class_deadlines_s, new.queue_seed,
                        new.wait_bound_spec()) != (
                        old.queue_spec(), old.class_deadlines_s, old.queue_seed,
                        old.wait_bound_spec()) or (
                        old.native_queue and not new.native_queue):
                    self.engine.set_queue_policy(new.queue_policy, new)
            except Exception:
                (self.cfg, self.policy, self._first_reason, self.profile,
                 self.speed_fn) = kept
                self._settle(self.sla.effective(old))
                raise
        if self._scheduler is not None and new.interval_s != old.interval_s:
            self._scheduler.reschedule_job("tuned-controller", trigger="interval",
                                           seconds=new.interval_s)

    def reload(self) -> dict:
        """Re-read and validate the config; apply it live or keep the old one
        (:class:`tuned.control.reload.Reloader`)."""
        return self.reloader.reload()

    # ------------------------------------------------------------------ loop
    def run_once(self) -> Decision | None:
        """One tick. Never raises: a failure becomes a counted fallback.

        Besides an exception, two outcomes are faults: a decision whose cap is not
        an integer in [1, ceiling] (``invalid_decision``), and a decide phase that
        took longer than ``interval_s`` (``slow_decision``: by the time it lands it
        answers a question one tick old). Either hands the engine the fallback cap.
        """
        try:
            with self._lock:
                t0 = self.clock()
                obs = self.observe()
                self._export_seen(obs)
                if self.sla.derive(self.cfg, self._step_fit, obs.kv_tokens_resident,
                                   obs.num_running):
                    self._build(self.cfg, reuse_profile=True)
                self.queue_channel.publish(self.queue_inputs())
                t1 = self.clock()
                dec = self.decide(obs)
                t2 = self.clock()
                fault = self._fault(dec, t2 - t1)
                if fault is None:
                    self.act(dec)
                t3 = self.clock()
            self.export.tick(t0, t1, t2, t3)
            if fault is not None:
                self._fail(fault[0], fault[1])
                return None
            self.slot.mark_ok(t3)
            self._failing = None
        except Exception as e:
            dec = None
            self._fail("controller_error", f"{type(e).__name__}: {e}", exc_info=True)
        self.watchdog.tick(self.cfg.interval_s, self.engine_stalled, self.current)
        return dec

    def _fault(self, dec: object, decide_s: float) -> tuple[str, str] | None:
        if not isinstance(dec, Decision) or not valid_cap(dec.cap, self.engine.ceiling) \
                or not valid_cap(dec.token_budget, self.engine.max_num_batched_tokens):
            cap = getattr(dec, "cap", dec)
            return "invalid_decision", (f"cap must be an integer in [1, {self.engine.ceiling}], "
                                        f"got {cap!r}")
        if decide_s > self.cfg.interval_s:
            return "slow_decision", (f"decide took {decide_s:.3f}s, longer than interval_s "
                                     f"({self.cfg.interval_s:g}s)")
        return None

    def _fail(self, cause: str, error: str, exc_info: bool = False) -> None:
        """Count every failed tick; log the first of a run of identical failures, then
        once a minute with the count (a fault that lasts would otherwise log a
        traceback every tick)."""
        self.metrics.errors.inc()
        self.slot.offer(Fallback(cause, self.cfg.fallback_cap))
        now = self.clock()
        # an exception is one failure while its text stays; a slow or invalid decision
        # is one whatever the value (its text carries the number)
        key = (cause, error if cause == "controller_error" else "")
        f = self._failing
        if f is not None and f[0] == key and now - f[1] < FAIL_LOG_EVERY_S:
            self._failing = (key, f[1], f[2] + 1)
            return
        repeats = f[2] if f is not None and f[0] == key else 0
        self._failing = (key, now, 0)
        log.error("controller_error", cause=cause, error=error,
                  fallback_cap=self.cfg.fallback_cap, exc_info=exc_info,
                  **({"repeated_since_last_line": repeats} if repeats else {}))

    def observe(self) -> Observation:
        """Read the engine: its new steps and finished requests, the windowed step
        aggregates, the online step fit (every few seconds), NVML and the queue. What
        the export needs beside the Observation is kept in ``self.seen``; exporting
        and publishing are :meth:`run_once`'s."""
        eng, cfg = self.engine, self.cfg
        now = self.clock()
        new_steps = eng.steps.since(self._step_seq)
        if new_steps:
            self._step_seq = new_steps[-1].seq + 1
        self._refresh_step_fit(now)
        win = step_window(eng.steps.newest_first(), now, cfg.tbt_window_s,
                          cap=self.slot.applied.cap, model=self._step_fit)
        # every departure since the last tick (counted, TPOTs), however many: the
        # demand window below may be shorter than one tick's departures
        new_fin = eng.finished.since(self._fin_seq)
        if new_fin:
            self._fin_seq = new_fin[-1].seq + 1
        fin = eng.finished.last(cfg.demand_window)
        # A request's KV demand in blocks: what the paged allocator gives it, at a
        # random decode step of its life (occupancy) or all of it (lifetime).
        if cfg.memory_demand == "lifetime":
            demand = demand_moments([f.prompt_tokens + f.output_tokens for f in fin],
                                    eng.block_size)
        else:
            # the prompts of the requests the engine holds (known from their
            # arrival: a change of mix is read at once), the finished ones' outputs
            read = getattr(eng, "present_prompts", None)
            pairs = present_pairs(read() if read is not None else [],
                                  [f.output_tokens for f in fin])
            demand = occupancy_moments(
                pairs or [(f.prompt_tokens, f.output_tokens) for f in fin], eng.block_size)
            demand = demand._replace(n=len(fin))
        self._binding.note(now, win.binding >= BIND_SHARE)
        tpots = self._bound_tpots(new_fin)
        running, waiting = eng.counts()
        switch = self.queue_channel.take_switch()
        snap = eng.queue_snapshot()
        self.refusals.note(snap, now, running, waiting, self.slot.applied.cap)
        if self.nvml is not None:
            self.gpu = self.nvml.sample()
        gpu_free = free_fraction(self.gpu)
        self.gpu_free_tokens = _free_tokens(self.gpu, getattr(eng, "kv_bytes_per_token", None))
        # live where the engine can read it (vLLM: an abort frees blocks outside any
        # step, so the newest step's figure goes stale once the engine idles)
        live_kv = getattr(eng, "kv_usage_now", None)
        kv_usage = live_kv() if live_kv is not None else win.kv_usage
        active = (tuple(eng.active_requests())
                  if getattr(self.policy, "wants_active", False) else ())
        read_prefilling = getattr(eng, "prefilling", None)
        prefilling = read_prefilling() if read_prefilling is not None else 0
        read_wait = getattr(eng, "oldest_wait_s", None)
        oldest_wait = read_wait() if read_wait is not None and waiting else None
        held = holds_between(self.seen.queue if self.seen is not None else None, snap)
        self.seen = Seen(new_steps, len(new_fin), switch, snap)
        self.last_observation = Observation(
            num_running=running, num_waiting=waiting, active=active,
            kv_capacity_blocks=eng.kv_capacity_tokens // eng.block_size,
            demand_mean=demand.mean, demand_std=demand.std, demand_samples=demand.n,
            tbt_mean_s=win.tbt_mean_s, decode_batch_mean=win.decode_batch_mean,
            kv_usage=kv_usage, tbt_p90_s=win.tbt_p90_s,
            decode_only_tbt_s=win.decode_only_tbt_s, mixed_tbt_s=win.mixed_tbt_s,
            decode_only_p90_s=win.decode_only_p90_s,
            binding=win.binding,
            kv_tokens_resident=win.kv_tokens_resident, step_model=self._step_fit,
            gpu_free_fraction=gpu_free, finished_tpot_s=tpots,
            prefill_residual_s=win.prefill_residual_s, oldest_wait_s=oldest_wait,
            held=held, prefilling=prefilling)
        return self.last_observation

    def _bound_tpots(self, finished: list) -> tuple:
        """The TPOT (as the SLO judges it) of each finished request that decoded
        mostly at a binding cap: what the attainment margin learns from
        (:class:`tuned.policies.sla_bound.AttainmentMargin`). A request that lived under
        a cap that did not bind decoded in the offered load's batch, or in the batch
        of a cap the search has since left; its TPOT says nothing of the setpoint."""
        out = []
        for f in finished:
            tpot = request_tpot_s(f)
            if tpot is None:
                continue
            share = self._binding.share(f.first_token_s, f.t)
            if share is not None and share >= BIND_SHARE:
                out.append(tpot)
        return tuple(out)

    def _export_seen(self, obs: Observation) -> None:
        """The tick's readings as metrics (what :meth:`observe` read)."""
        seen, export = self.seen, self.export
        export.steps(seen.new_steps)
        export.finished(seen.new_finished)
        if seen.queue_switch is not NO_SWITCH:   # the engine installed another queue policy
            export.queue_switched(seen.queue_switch)
        export.queue(seen.queue)
        if self.nvml is not None:
            export.gpu(self.gpu)
        export.engine(obs.kv_usage)

    def _refresh_step_fit(self, now: float) -> None:
        """The online step model: refreshed every few seconds from this engine's own
        recent steps (tuned.curves.online), where an SLA or the guard reads it (a
        plugin policy that reads it says so with ``wants_step_fit``). Until the first
        fit succeeds it is tried every tick, from :data:`FIRST_STEP_FIT_SAMPLES` busy
        steps: without one the token budget is the full budget, and a long prompt's
        whole prefill in one step stalls the decodes beside it."""
        cfg = self.cfg
        due = self._step_fit is None or now - self._fit_t >= STEP_FIT_EVERY_S
        if (due and (cfg.sla_enabled or cfg.tbt_sla_auto)
                and (wants_step_fit(cfg.batch_policy) or cfg.guards_admission
                     or getattr(self.policy, "wants_step_fit", False))):
            self._fit_t = now
            fit = fit_recent_steps(self.engine.steps.last(STEP_FIT_SAMPLES),
                                   min_samples=FIRST_STEP_FIT_SAMPLES
                                   if self._step_fit is None else MIN_SAMPLES)
            if fit is not None:
                self._step_fit = fit

    def decide(self, obs: Observation) -> Decision:
        """The policy's decision, explained (:func:`tuned.policies.explain.explained`);
        anything else is a fault: run_once hands the engine the fallback cap."""
        first = self._first_reason if self.current is None else None
        return explained(self.policy.decide(obs), obs, first)

    def act(self, dec: Decision) -> None:
        """Hand the decision to the engine's slot, export it, keep it in the history."""
        old = self.current
        self.seq += 1
        self.current = dec
        self.slot.offer(dec)
        self.export.decision(dec, old, self.sla.sla_s(self.cfg))
        entry = {"t": self.wall(), "seq": self.seq, **dec.to_dict()}
        self.recent.append(entry)
        del self.recent[:-200]
        if self.on_decision is not None:
            self.on_decision(entry)
        self.export.decision_recorded(dec, old)

    # ------------------------------------------------------------------ state
    def healthy(self) -> bool:
        """/healthz: the controller ticks (its last good tick is at most
        ``stale_after_s`` old) and the engine is not stalled (:meth:`engine_stalled`)."""
        return (self.clock() - self.slot.last_ok <= self.cfg.stale_after_s
                and not self.engine_stalled())

    def engine_stalled(self) -> bool:
        """The engine has requests and no step completed for ``engine_stall_s``
        (:class:`tuned.control.liveness.EngineLiveness`)."""
        return self.liveness.stalled(self.cfg.effective_engine_stall_s)

    def decisions_json(self, limit: int = 50) -> dict:
        return decisions_view(self, limit)

    def admission_json(self) -> dict:
        """What ``GET /admission`` answers (:mod:`tuned.engines.gateway` reads it):
        :meth:`tuned.core.refusal.RefusalWatch.state` under the config's wait bound."""
        return self.refusals.state(self.cfg.wait_bound_spec(), self.clock())

    def start(self):
        """Run ``run_once`` every ``interval_s`` on apscheduler's thread, first tick now."""
        from apscheduler.schedulers.background import BackgroundScheduler

        sched = BackgroundScheduler(daemon=True)
        sched.add_job(self.run_once, "interval", seconds=self.cfg.interval_s,
                      id="tuned-controller", max_instances=1, coalesce=True,
                      misfire_grace_time=None, next_run_time=_now_dt())
        sched.start()
        self._scheduler = sched
        return sched

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None


def _now_dt():
    import datetime

    return datetime.datetime.now(datetime.timezone.utc)


def _free_tokens(gpu: list | None, kv_bytes_per_token: float | None) -> int | None:
    """NVML's free memory (the lowest GPU) in KV tokens; None without a sample or
    without the engine's bytes per token."""
    free = free_bytes(gpu)
    return int(free // kv_bytes_per_token) if free is not None and kv_bytes_per_token else None
