"""The control loop: observe -> decide -> act, once per ``interval_s``.

``Controller.run_once()`` reads the step and finished-request rings the scheduler
fills, NVML memory where a GPU exists, and the queue lengths (observe); runs the
batch-size policy of seed 000 (decide); and puts the decision in a pending slot the
scheduler applies at the top of its next ``schedule()`` (act). Each phase is timed
into ``tuned_controller_tick_seconds{phase}``.

A tick that raises is counted and hands the scheduler the configured fallback cap;
the scheduler also falls back on its own when the last good tick is older than
``stale_after_s``. Nothing here can stop the engine: the loop runs in apscheduler's
thread and only ever swaps a reference the scheduler reads.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable

import structlog

from tuned import config as config_mod
from tuned.config import Config, ConfigError
from tuned.metrics import Metrics
from tuned.core.contract import EngineView
from tuned.core.knobs import Fallback, KnobSlot, valid_cap
from tuned.core.window import demand_moments, step_window
from tuned.curves.online import fit_recent_steps
from tuned.core.types import Decision, Observation
from tuned.policies.registry import build_batch_policy, feasibility_patience  # noqa: F401
from tuned.telemetry.nvml import NvmlSampler
from tuned.core.ring import Ring

__all__ = ["Controller", "EngineView", "Fallback"]

log = structlog.get_logger("tuned.controller")

#: the online step-time fit: refreshed this often, over this many recent steps
STEP_FIT_EVERY_S = 4.0
STEP_FIT_SAMPLES = 1024
#: a failure that repeats tick after tick is logged again this often (with the count)
FAIL_LOG_EVERY_S = 60.0


def load_profile(path: str):
    from tuned.curves.profile import load_profile as _load

    return _load(path)


class Controller:
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
        self.notifier = notifier
        self.serving = serving
        self.clock = clock
        self.wall = wall
        self.profile_loader = profile_loader
        self.reload_source = reload_source or self._read_config_file
        self.on_decision = on_decision
        self._lock = threading.RLock()
        # the slot the engine takes its knobs from, on this controller's clock
        self.slot = KnobSlot(engine.ceiling, engine.max_num_batched_tokens,
                             stale_after_s=cfg.stale_after_s, fallback_cap=cfg.fallback_cap,
                             clock=clock, metrics=metrics)
        self.current: Decision | None = None
        self.recent: list[dict] = []
        self.seq = 0
        self.ready_sent = False
        self._last_watchdog = -math.inf
        self._busy_since: float | None = None
        self._stall_logged = False
        self._step_seq = 0
        self._fin_seq = 0
        self._queue_last: dict = {}
        self._gpu: list | None = None
        self._obs: Observation | None = None
        self._fit_t = -math.inf
        self._failing: tuple | None = None  # ((cause, error), logged at, repeats since)
        self._step_fit = None
        # tbt_sla_auto: the SLA this host earned at start (None until derived)
        self.derived_sla: dict | None = None
        self.last_reload: dict = {"t": None, "outcome": "none", "problems": [],
                                  "restart_needed": []}
        self._scheduler = None
        self.cfg = cfg
        self._build(cfg)
        metrics.ceiling.set(engine.ceiling)
        metrics.kv_capacity.set(engine.kv_capacity_tokens)

    # the slot's two fields, kept as attributes of the controller for callers and tests
    @property
    def pending(self) -> Decision | Fallback | None:
        return self.slot.pending

    @pending.setter
    def pending(self, item: Decision | Fallback | None) -> None:
        self.slot.offer(item)

    @property
    def last_ok(self) -> float:
        """Controller-clock time of the last good tick."""
        return self.slot.last_ok

    @last_ok.setter
    def last_ok(self, t: float) -> None:
        self.slot.mark_ok(t)

    # ------------------------------------------------------------------ config
    @property
    def sla_s(self) -> float:
        """The TBT SLA in force: the config's, or the one derived on this host."""
        if self.cfg.tbt_sla_s:
            return self.cfg.tbt_sla_s
        return self.derived_sla["sla_s"] if self.derived_sla else 0.0

    def admission_guard(self) -> tuple[Any, float, float]:
        """(step model, TPOT SLA, TTFT SLA) for the queue's admission guard
        (:meth:`tuned.core.queue.QueueCore._tpot_room` and ``_ttft_room``), or
        (None, 0.0, 0.0) while it is off: ``admission_guard = "off"``, no SLA yet, or
        no step fit yet. The TTFT SLA is 0 (that half off) without ``ttft_sla_s``.
        Read by the engine's scheduling thread once per step."""
        fit = self._step_fit
        if fit is None or not self.cfg.guards_admission:
            return None, 0.0, 0.0
        return fit, self.sla_s, self.cfg.ttft_sla_s

    def sla_source(self) -> str:
        if self.cfg.tbt_sla_s:
            return "config"
        if self.cfg.tbt_sla_auto:
            return "derived" if self.derived_sla else "pending"
        return "none"

    def _effective(self, cfg: Config) -> Config:
        """``cfg`` with the derived SLA filled in (tbt_sla_auto on, tbt_sla_s = 0)."""
        if cfg.tbt_sla_s or not cfg.tbt_sla_auto or not self.derived_sla:
            return cfg
        sla = self.derived_sla["sla_s"]
        return _replace(cfg, {"tbt_sla_s": sla, "eps_d_s": min(cfg.eps_d_s, sla / 10)})

    def _maybe_derive_sla(self, obs: Observation) -> None:
        """tbt_sla_auto: once the online step fit exists, fix the SLA at
        tbt_sla_auto x the predicted decode step at batch 1 (no prefill, the running
        requests' mean context) and rebuild the policies with it."""
        fit = self._step_fit
        if self.derived_sla or not self.cfg.tbt_sla_auto or self.cfg.tbt_sla_s or fit is None:
            return
        kv_seq = obs.kv_tokens_resident / obs.num_running if obs.num_running else 0.0
        t1 = fit.predict_step_s(1, 0.0, kv_seq)
        if not (math.isfinite(t1) and t1 > 0):
            return
        sla = round(self.cfg.tbt_sla_auto * t1, 4)
        self.derived_sla = {"sla_s": sla, "step_s_batch1": t1, "factor": self.cfg.tbt_sla_auto,
                            "fit": fit.to_dict()}
        self._build(self.cfg, reuse_profile=True)
        log.info("sla_derived", sla_s=sla, step_s_batch1=round(t1, 5),
                 factor=self.cfg.tbt_sla_auto, fit_samples=fit.n_samples,
                 note="tbt_sla_auto: the TBT SLA follows this host's measured speed")

    def _build(self, cfg: Config, reuse_profile: bool = False) -> None:
        """(Re)build the policy objects from a validated config. All or nothing: the
        profile and the policy are built before anything is replaced, so a failure
        leaves the running objects untouched (a rollback that re-read the old profile
        from disk failed in turn when the file had been corrupted since)."""
        eff = self._effective(cfg)
        if reuse_profile:  # same file, already loaded: do not read it again
            profile = self.profile
        else:
            profile = self.profile_loader(eff.profile) if eff.profile else None
        policy, first_reason = self._make_policy(eff, profile)
        self.cfg = cfg
        cfg = eff
        self.policy, self._first_reason = policy, first_reason
        self.profile = profile
        # one bound method for the queue's admission checks (SABER): a new object
        # every step would make it recompute its order every step
        self.speed_fn = profile.speed_tok_s if profile is not None else None
        self.slot.configure(stale_after_s=cfg.stale_after_s, fallback_cap=cfg.fallback_cap)
        self.metrics.tbt_sla.set(cfg.tbt_sla_s)

    def _make_policy(self, cfg: Config, profile) -> tuple[Any, str | None]:
        """The batch policy named by ``cfg.batch_policy`` (tuned.policies.registry)."""
        eng = self.engine
        return build_batch_policy(cfg, ceiling=eng.ceiling,
                                  max_num_batched_tokens=eng.max_num_batched_tokens,
                                  block_size=eng.block_size, profile=profile)

    def _read_config_file(self) -> Config:
        if not self.cfg.source_path:
            return config_mod.default()
        return config_mod.load(self.cfg.source_path)

    def reload(self) -> dict:
        """Re-read and validate the config; apply it live or keep the old one.

        Reloads are serialised from the file read on (two POSTs at once: the second
        reads the file after the first is applied, so the last file wins)."""
        with self._lock:
            return self._reload()

    def _reload(self) -> dict:
        now = self.wall()
        try:
            new = self.reload_source()
        except ConfigError as e:
            return self._refuse(now, e.problems)
        except Exception as e:  # an unreadable file that load() did not turn into problems
            return self._refuse(now, [f"{type(e).__name__}: {e}"])
        restart = config_mod.restart_changes(self.cfg, new)
        if restart:
            # Keep the running engine's values for fields that size the engine.
            new = _replace(new, {n: getattr(self.cfg, n) for n in restart})
        changed = [n for n in config_mod.FIELDS if getattr(self.cfg, n) != getattr(new, n)]
        with self._lock:
            old = self.cfg
            kept = (self.cfg, self.policy, self._first_reason, self.profile, self.speed_fn)
            try:
                self._build(new)  # all or nothing
                if (new.queue_spec(), new.class_deadlines_s, new.queue_seed) != (
                        old.queue_spec(), old.class_deadlines_s, old.queue_seed) or (
                        old.native_queue and not new.native_queue):
                    self.engine.set_queue_policy(new.queue_policy, new)
            except Exception as e:  # a profile that fails to load, a policy that fails
                # put the running objects back as they were (no re-read from disk)
                (self.cfg, self.policy, self._first_reason, self.profile,
                 self.speed_fn) = kept
                eff = self._effective(old)
                self.slot.configure(stale_after_s=eff.stale_after_s,
                                    fallback_cap=eff.fallback_cap)
                self.metrics.tbt_sla.set(eff.tbt_sla_s)
                return self._refuse(now, [f"{type(e).__name__}: {e}"])
        if self._scheduler is not None and new.interval_s != old.interval_s:
            self._scheduler.reschedule_job("tuned-controller", trigger="interval",
                                           seconds=new.interval_s)
        self.last_reload = {"t": now, "outcome": "ok", "problems": [],
                            "restart_needed": restart, "changed": changed}
        self.metrics.reloads.labels("ok").inc()
        log.info("reload_applied", changed=changed, restart_needed=restart,
                 source=new.source_path or "embedded default")
        return dict(self.last_reload)

    def _refuse(self, now: float, problems: list[str]) -> dict:
        self.last_reload = {"t": now, "outcome": "refused", "problems": problems,
                            "restart_needed": [], "changed": []}
        self.metrics.reloads.labels("refused").inc()
        log.warning("reload_refused", problems=problems, kept=self.cfg.source_path or
                    "embedded default")
        return dict(self.last_reload)

    # ------------------------------------------------------------------ loop
    def run_once(self) -> Decision | None:
        """One tick. Never raises: a failure becomes a counted fallback.

        Besides an exception, two outcomes are faults: a decision whose cap is not
        an integer in [1, ceiling] (``invalid_decision``), and a decide phase that
        took longer than ``interval_s`` (``slow_decision``: by the time it lands it
        answers a question one tick old). Either hands the engine the fallback cap.
        """
        m = self.metrics
        try:
            with self._lock:
                t0 = self.clock()
                obs = self.observe()
                self._maybe_derive_sla(obs)
                t1 = self.clock()
                dec = self.decide(obs)
                t2 = self.clock()
                fault = self._fault(dec, t2 - t1)
                if fault is None:
                    self.act(dec)
                t3 = self.clock()
            m.tick.labels("observe").observe(t1 - t0)
            m.tick.labels("decide").observe(t2 - t1)
            m.tick.labels("act").observe(t3 - t2)
            m.tick.labels("total").observe(t3 - t0)
            if fault is not None:
                self._fail(fault[0], fault[1])
                return None
            self.slot.mark_ok(t3)
            self._failing = None
        except Exception as e:
            dec = None
            self._fail("controller_error", f"{type(e).__name__}: {e}", exc_info=True)
        self._notify()
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
        eng, m, cfg = self.engine, self.metrics, self.cfg
        now = self.clock()
        new_steps = eng.steps.since(self._step_seq)
        if new_steps:
            self._step_seq = new_steps[-1].seq + 1
        gen = pre = 0
        for s in new_steps:
            if s.num_decode:
                m.tbt.observe(s.step_s)
            gen += s.generated_tokens
            pre += s.preempted
        m.steps.inc(len(new_steps))
        m.generated.inc(gen)
        m.preemptions.inc(pre)
        win = step_window(eng.steps.newest_first(), now, cfg.tbt_window_s,
                          cap=self.slot.applied.cap)
        if (now - self._fit_t >= STEP_FIT_EVERY_S and (cfg.sla_enabled or cfg.tbt_sla_auto)
                and (cfg.batch_policy in ("tuned", "sla") or cfg.guards_admission)):
            # the online step model: refreshed every few seconds from this engine's
            # own recent steps (tuned.curves.online)
            self._fit_t = now
            fit = fit_recent_steps(eng.steps.last(STEP_FIT_SAMPLES))
            if fit is not None:
                self._step_fit = fit
        fin = eng.finished.last(cfg.demand_window)
        new_fin = [f for f in fin if f.seq >= self._fin_seq]
        if fin:
            self._fin_seq = fin[-1].seq + 1
        m.finished.inc(len(new_fin))
        # A request's KV demand in blocks: what the paged allocator gives it.
        demand = demand_moments([f.prompt_tokens + f.output_tokens for f in fin],
                                eng.block_size)
        running, waiting = eng.counts()
        self._export_queue(eng.queue_snapshot())
        if self.nvml is not None:
            gpu = self.nvml.sample()
            if gpu is None and self._gpu:
                # NVML stopped answering: withdraw the series, not freeze the last value
                m.gpu_used.clear()
                m.gpu_total.clear()
            self._gpu = gpu
            for g in self._gpu or ():
                m.gpu_used.labels(str(g.index)).set(g.used_bytes)
                m.gpu_total.labels(str(g.index)).set(g.total_bytes)
        m.running.set(running)
        m.waiting.set(waiting)
        # live where the engine can read it (vLLM: an abort frees blocks outside any
        # step, so the newest step's figure goes stale once the engine idles)
        live_kv = getattr(eng, "kv_usage_now", None)
        kv_usage = live_kv() if live_kv is not None else win.kv_usage
        m.kv_usage.set(kv_usage)
        active = (tuple(eng.active_requests())
                  if getattr(self.policy, "wants_active", False) else ())
        self._obs = Observation(
            num_running=running, num_waiting=waiting, active=active,
            kv_capacity_blocks=eng.kv_capacity_tokens // eng.block_size,
            demand_mean=demand.mean, demand_std=demand.std, demand_samples=demand.n,
            tbt_mean_s=win.tbt_mean_s, decode_batch_mean=win.decode_batch_mean,
            kv_usage=kv_usage, tbt_p90_s=win.tbt_p90_s,
            decode_only_tbt_s=win.decode_only_tbt_s, mixed_tbt_s=win.mixed_tbt_s,
            binding=win.binding,
            kv_tokens_resident=win.kv_tokens_resident, step_model=self._step_fit)
        return self._obs

    def _export_queue(self, snap: dict | None) -> None:
        """Queue-policy counters as Prometheus counters (a policy switch restarts the
        policy's own counts; the exported totals keep growing)."""
        m = self.metrics
        if not snap:
            m.queue_policy.info({"policy": "fcfs", "queue": "vllm"})  # vLLM's own queue
            return
        pol = snap["policy"]
        last = self._queue_last if self._queue_last.get("policy") == pol else {}
        for key, counter in (("admitted", m.q_admitted), ("deferred", m.q_deferred),
                             ("demoted", m.q_demoted)):
            delta = snap[key] - last.get(key, 0)
            if delta > 0:
                counter.labels(pol).inc(delta)
        m.q_bins.set(snap["bins_in_use"])
        m.q_buckets.set(snap["buckets_in_use"])
        m.pred_mae.set(snap["prediction_mae_tokens"])
        m.pred_bias.set(snap["prediction_mean_error_tokens"])
        m.pred_count.set(snap["prediction_count"])
        m.queue_policy.info({"policy": pol, "queue": "tuned"})
        self._queue_last = dict(snap)

    def queue_switched(self, final: dict | None) -> None:
        """Called by the scheduler thread just before it installs another queue
        policy: export the outgoing policy's counts up to now, then start over."""
        with self._lock:
            if final:
                self._export_queue(final)
            self._queue_last = {}

    def decide(self, obs: Observation) -> Decision:
        dec = self.policy.decide(obs)
        if self._first_reason and self.current is None and dec.reason == "initial":
            dec = _replace(dec, {"reason": self._first_reason})
        return dec

    def act(self, dec: Decision) -> None:
        m = self.metrics
        old = self.current
        self.seq += 1
        self.current = dec
        self.slot.offer(dec)
        m.target.set(dec.target)
        m.batch.set(dec.batch)
        m.lower.set(dec.lower)
        m.upper.set(dec.upper)
        if dec.b_mem is not None:
            m.b_mem.set(dec.b_mem)
        if dec.b_sla is not None:
            m.b_sla.set(dec.b_sla)
        m.decisions.labels(dec.reason).inc()
        feasible = dec.inputs.get("sla_feasible")
        if feasible is not None:
            m.sla_feasible.set(1 if feasible else 0)
            was = old.inputs.get("sla_feasible") if old is not None else True
            if feasible != was:
                (log.warning if not feasible else log.info)(
                    "sla_infeasible" if not feasible else "sla_feasible_again",
                    sla_s=self.sla_s, why=dec.inputs.get("sla_infeasible_why"),
                    action="SLA bound set aside: memory bound and full token budget"
                    if not feasible else "SLA search resumes")
        entry = {"t": self.wall(), "seq": self.seq, **dec.to_dict()}
        self.recent.append(entry)
        del self.recent[:-200]
        if self.on_decision is not None:
            self.on_decision(entry)
        if old is None or (old.cap, old.token_budget) != (dec.cap, dec.token_budget):
            m.decision_changes.inc()
            log.info("decision", old_cap=old.cap if old else None, new_cap=dec.cap,
                     old_token_budget=old.token_budget if old else None,
                     new_token_budget=dec.token_budget, target=dec.target, batch=dec.batch,
                     lower=dec.lower, upper=dec.upper, reason=dec.reason,
                     b_mem=dec.b_mem, b_sla=dec.b_sla, inputs=dec.inputs)

    def _notify(self) -> None:
        n = self.notifier
        if n is None or not getattr(n, "enabled", False):
            return
        now = self.clock()
        interval = n.watchdog_interval_s
        # pings ride on ticks: allow half a tick of slack so a tick that lands a hair
        # early does not skip its ping (gaps would reach WATCHDOG_USEC otherwise)
        if (interval is not None and now - self._last_watchdog
                >= interval - min(self.cfg.interval_s, interval) / 2
                and not self.engine_stalled()):
            n.watchdog()
            self._last_watchdog = now
        if not self.ready_sent and self.current is not None:
            try:
                serving = self.serving()
            except Exception:
                serving = False
            if serving:
                n.ready(f"cap={self.current.cap} reason={self.current.reason}")
                self.ready_sent = True

    # ------------------------------------------------------------------ state
    def healthy(self) -> bool:
        """/healthz: the controller ticks (its last good tick is at most
        ``stale_after_s`` old) and the engine is not stalled (:meth:`engine_stalled`)."""
        return (self.clock() - self.slot.last_ok <= self.cfg.stale_after_s
                and not self.engine_stalled())

    def engine_stalled(self) -> bool:
        """True while the engine has requests (running or waiting) and no engine step
        has completed for ``cfg.effective_engine_stall_s``, counted from the later of
        the newest step's end (``engine.last_step_done_s``) and the first check that
        found work after an idle spell: an idle engine steps never and is not stalled.
        Engines that do not report ``last_step_done_s`` (the simulator) never are.
        Logs ``engine_stalled`` once per stall and ``engine_step_resumed`` after it."""
        last = getattr(self.engine, "last_step_done_s", None)
        if last is None:
            return False
        running, waiting = self.engine.counts()
        now = self.clock()
        if running + waiting == 0:
            self._busy_since = None
            stalled = False
        else:
            if self._busy_since is None:
                self._busy_since = now
            age = now - max(last, self._busy_since)
            stalled = age > self.cfg.effective_engine_stall_s
        if stalled != self._stall_logged:
            self._stall_logged = stalled
            if stalled:
                log.error("engine_stalled", running=running, waiting=waiting,
                          since_last_step_s=round(now - last, 3),
                          engine_stall_s=self.cfg.effective_engine_stall_s,
                          action="/healthz 503, no watchdog ping")
            else:
                log.info("engine_step_resumed")
        return stalled

    def decisions_json(self, limit: int = 50) -> dict:
        obs = self._obs
        limit = max(0, min(limit, 200))
        running, waiting = self.engine.counts()
        gpu = None if self._gpu is None else [g._asdict() for g in self._gpu]
        return {
            "current": self.recent[-1] if self.recent else None,
            "recent": self.recent[-limit:] if limit else [],
            "applied": self.slot.state(),
            "config": {"queue_policy": self.cfg.queue_policy, "profile": self.cfg.profile,
                       "tbt_sla_s": self.sla_s, "sla_source": self.sla_source(),
                       "derived_sla": self.derived_sla,
                       "sla_statistic": self.cfg.sla_statistic,
                       "batch_policy": self.cfg.batch_policy,
                       "source_path": self.cfg.source_path,
                       "interval_s": self.cfg.interval_s},
            "last_reload": dict(self.last_reload),
            "telemetry": {"tbt_mean_s": obs.tbt_mean_s if obs else None,
                          "decode_batch_mean": obs.decode_batch_mean if obs else None,
                          "kv_usage": obs.kv_usage if obs else 0.0,
                          "kv_capacity_tokens": self.engine.kv_capacity_tokens,
                          "gpu": gpu, "running": running, "waiting": waiting},
            "engine": {"ceiling": self.engine.ceiling,
                       "max_num_batched_tokens": self.engine.max_num_batched_tokens,
                       "dp_rank": self.engine.dp_rank},
        }

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


def _replace(obj, changes: dict):
    import dataclasses

    return dataclasses.replace(obj, **changes)
