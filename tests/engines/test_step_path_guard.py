"""tuned never takes vLLM's engine down: a fault injected into each entry point vLLM
calls (every method of the waiting queue, the scheduler hooks, the log sink) of a real
vLLM scheduler, sync and async; the engine liveness behind /healthz and the watchdog;
the wall-to-monotonic offset read per request."""

from __future__ import annotations

import io
import time

import pytest
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.request import RequestStatus

from fakes import decision, make_scheduler, req, requests, step
from tuned import config
from tuned.base import log as log_mod
from tuned.control.controller import Controller
from tuned.core.knobs import KnobSlot
from tuned.core.queue import QueueCore
from tuned.core.steppath import StepPathGuard
from tuned.engines.vllm_queue import make_policy_queue, wall_offset_s
from tuned.control.metrics import Metrics
from tuned.policies.batch import Decision
from tuned.core.ring import Ring

QUEUE_METHODS = ("add_request", "pop_request", "peek_request", "prepend_request",
                 "prepend_requests", "remove_request", "remove_requests", "__bool__",
                 "__len__", "__iter__")
FALLBACK_CAP = 3


@pytest.fixture(params=[False, True], ids=["Scheduler", "AsyncScheduler"])
def sched(request, tiny_model):
    s = make_scheduler(str(tiny_model), request.param, queue_policy="mcsf")
    yield s
    s.shutdown()


def errors(s, where: str) -> float:
    return s.metrics.step_path_errors.labels(where)._value.get()


def workload(s) -> set[str]:
    """What vLLM does to its waiting queue, each entry point at least once: adds,
    iteration, a remove and re-add, the admission loop's gate / peek / pop and a
    skipped request handed back, steps, a preemption, an abort. Returns the ids of
    the requests that must complete in full."""
    q = s.waiting
    reqs = requests(5, max_tokens=6)
    for r in reqs:
        s.add_request(r)
    assert len(list(q)) == len(q) == 5
    q.remove_request(reqs[4])
    q.add_request(reqs[4])
    if q:
        head = q.peek_request()
        assert q.pop_request() is head
        q.prepend_requests([head])
    step(s)
    step(s)
    victim = s.running.pop()
    s._preempt_request(victim, time.monotonic())
    s.finish_requests("r3", RequestStatus.FINISHED_ABORTED)
    for _ in range(300):
        if not s.has_requests():
            break
        step(s)
    return {"r0", "r1", "r2", "r4"}


def completed(s) -> set[str]:
    return {f.request_id for f in s.finished.since(0) if f.output_tokens == 6}


@pytest.mark.parametrize("where", QUEUE_METHODS)
def test_a_raising_queue_method_falls_back_to_fcfs_and_every_request_completes(
        sched, monkeypatch, logs, where):
    sched.tuned.slot.offer(decision(2))      # r3 still waiting when it is aborted

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected in {where}")

    monkeypatch.setattr(QueueCore, where, boom)
    want = workload(sched)
    assert completed(sched) == want
    assert "r3" in {f.request_id for f in sched.finished.since(0)}   # aborted, left
    assert not sched.has_requests() and len(sched.waiting) == 0
    assert errors(sched, where) >= 1
    assert isinstance(sched.waiting.fallback, FCFSRequestQueue)
    # the fallback cap, held whatever decision is pending
    assert sched.applied() == {"cap": FALLBACK_CAP, "token_budget": 256, "fallback": True,
                               "fallback_cause": "step_path_error"}
    assert sched.metrics.fallbacks.labels("step_path_error")._value.get() == 1
    lines = [e for e in logs() if e["event"] == "step_path_error"]
    assert len(lines) == 1 and lines[0]["where"] == where      # once per episode
    assert lines[0]["error"] == f"RuntimeError: injected in {where}"


@pytest.mark.parametrize("hook", ["_tuned_apply", "_tuned_record"])
def test_a_raising_scheduler_hook_is_contained(sched, monkeypatch, logs, hook):
    sched.tuned.slot.offer(decision(6))
    monkeypatch.setattr(sched, hook, lambda *a: 1 / 0)
    want = workload(sched)
    assert completed(sched) == want
    where = {"_tuned_apply": "apply", "_tuned_record": "record"}[hook]
    # raised on every step, logged once: the episode never ended
    assert errors(sched, where) >= 5
    assert [e["where"] for e in logs() if e["event"] == "step_path_error"] == [where]
    assert sched.waiting.fallback is not None
    assert sched.applied()["fallback_cause"] == "step_path_error"


def test_tuned_order_and_the_decision_come_back_after_a_quiet_period(sched, monkeypatch):
    sched.tuned.slot.offer(decision(6))
    t = [100.0]
    sched._step_guard.clock = lambda: t[0]
    real = QueueCore.add_request

    def once(self, r):
        if r.request_id == "r1":
            raise RuntimeError("injected once")
        return real(self, r)

    monkeypatch.setattr(QueueCore, "add_request", once)
    for r in requests(4, max_tokens=6):
        sched.add_request(r)
    q = sched.waiting
    assert [r.request_id for r in q.fallback] == ["r0", "r1", "r2", "r3"]
    monkeypatch.setattr(QueueCore, "add_request", real)
    step(sched)
    assert q.fallback is not None and sched.max_num_active_reqs == FALLBACK_CAP
    t[0] += sched._step_guard.recover_after_s
    sched.tuned.slot.mark_ok(time.monotonic())
    step(sched)
    assert q.fallback is None                       # tuned's queue again
    assert sched.applied()["fallback"] is False and sched.max_num_active_reqs == 6
    while sched.has_requests():
        step(sched)
    assert completed(sched) == {"r0", "r1", "r2", "r3"}
    assert errors(sched, "add_request") == 1


def test_a_restore_that_raises_again_keeps_fcfs_and_loses_nothing(monkeypatch):
    faults = []
    q = make_policy_queue("mcsf", {}, None, on_fault=lambda w, e: faults.append(w))

    for i in range(3):
        q.add_request(req(f"w{i}", t=float(i)))
    q.enter_fallback()
    assert [r.request_id for r in q] == ["w0", "w1", "w2"] and len(q) == 3

    def boom(self, r):
        raise RuntimeError("still broken")

    monkeypatch.setattr(QueueCore, "add_request", boom)
    assert q.restore() is False and faults == ["restore"]
    assert [r.request_id for r in q.fallback] == ["w0", "w1", "w2"]
    monkeypatch.undo()
    assert q.restore() is True and q.fallback is None
    assert sorted(r.request_id for r in q) == ["w0", "w1", "w2"]


def test_the_controllers_reads_of_the_queue_follow_it_into_fallback():
    """The memory bound's prompts and the oldest wait are read from whichever queue
    holds the waiting requests: tuned's, or vLLM's FCFS queue in fallback."""
    q = make_policy_queue("mcsf", {}, None, arrival_offset_s=0.5)
    for rid, t, prompt in (("a", 3.0, 5), ("b", 1.0, 50), ("c", 2.0, 20)):
        q.add_request(req(rid, prompt=prompt, t=t))
    before = (sorted(q.waiting_prompt_tokens()), q.oldest_arrival_s())
    assert before == ([5, 20, 50], 0.5)
    q.enter_fallback()
    assert (sorted(q.waiting_prompt_tokens()), q.oldest_arrival_s()) == before
    q.pop_request()
    assert (sorted(q.waiting_prompt_tokens()), q.oldest_arrival_s()) == ([5, 20], 1.5)


def test_fallback_keeps_preempted_first_then_arrival_order():

    q = make_policy_queue("mcsf", {}, None)
    for rid, t, prompt in (("late", 3.0, 5), ("early", 1.0, 50), ("mid", 2.0, 20)):
        q.add_request(req(rid, prompt=prompt, t=t))
    p = req("pre", t=9.0)
    p.status = RequestStatus.PREEMPTED
    q.prepend_request(p)
    q.enter_fallback()
    assert [r.request_id for r in q] == ["pre", "early", "mid", "late"]


# ---------------------------------------------------------------- guard and slot
def test_guard_holds_the_slot_until_quiet_then_releases_to_the_newest_decision():
    t = [0.0]
    m = Metrics()
    slot = KnobSlot(8, 256, stale_after_s=1e9, fallback_cap=2, clock=lambda: t[0], metrics=m)
    slot.offer(Decision(6, 1, 6, 6, 6, 200, "memory"))
    assert slot.take().cap == 6
    g = StepPathGuard(slot, m, clock=lambda: t[0], recover_after_s=10.0)
    g.fault("add_request", ValueError("x"))
    assert slot.take().cap == 2
    slot.offer(Decision(5, 1, 5, 5, 5, 200, "memory"))
    assert slot.take() is None and slot.applied.cap == 2    # held
    t[0] = 9.0
    g.fault("__bool__", ValueError("y"))                     # the quiet period restarts
    t[0] = 18.0
    assert g.poll() is False
    t[0] = 19.0
    assert g.poll() is True and g.poll() is False
    assert slot.take().cap == 5 and slot.fallback_cause is None
    assert m.step_path_errors.labels("add_request")._value.get() == 1
    assert m.step_path_errors.labels("__bool__")._value.get() == 1
    assert m.fallbacks.labels("step_path_error")._value.get() == 1


def test_guard_never_raises_even_when_its_metrics_do():
    class Broken:
        @property
        def step_path_errors(self):
            raise RuntimeError("metrics broken")

    g = StepPathGuard(None, Broken())
    g.fault("pop_request", ValueError("x"))
    assert g.errors == 1


# ---------------------------------------------------------------- logging
class FullDisk(io.TextIOBase):
    def write(self, s):
        raise OSError(28, "No space left on device")


class ClosedPipe(io.TextIOBase):
    def write(self, s):
        return len(s)

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("stream", [FullDisk(), ClosedPipe()], ids=["ENOSPC", "EPIPE"])
def test_logging_never_raises_and_counts_the_drops(stream):
    import structlog

    log_mod.configure("info", stream=stream)
    try:
        before = log_mod.dropped_lines()
        structlog.get_logger("t").error("x", exc_info=ValueError("y"))
        structlog.get_logger("t").info("y")
        assert log_mod.dropped_lines() == before + 2
        text = Metrics().exposition().decode()
        assert f'tuned_log_lines_dropped_total{{engine="0"}} {float(before + 2)}' in text
    finally:
        structlog.reset_defaults()


def test_step_path_with_stderr_on_a_full_disk(sched, monkeypatch):
    import structlog

    log_mod.configure("info", stream=FullDisk())
    try:
        before = log_mod.dropped_lines()
        monkeypatch.setattr(QueueCore, "__bool__", lambda self: 1 / 0)
        sched.tuned.slot.offer(decision(6))
        want = workload(sched)
        assert completed(sched) == want
        assert errors(sched, "__bool__") == 1
        assert sched.controller.run_once() is not None     # the tick logs, never raises
        assert log_mod.dropped_lines() > before
    finally:
        structlog.reset_defaults()


def test_a_failing_tick_with_stderr_on_a_full_disk_still_returns_and_pings(monkeypatch):
    log_mod.configure("info", stream=FullDisk())
    try:
        cfg = config.validate({"interval_s": 0.5, "stale_after_s": 2.0,
                               "batch_policy": "static"})
        n = Notifier()
        c = Controller(cfg, StallEngine(), Metrics(), notifier=n, clock=lambda: 0.0)
        monkeypatch.setattr(c, "observe", lambda: 1 / 0)
        before = log_mod.dropped_lines()
        assert c.run_once() is None                 # controller_error, logged to nowhere
        assert n.pings == 1
        assert c.metrics.errors._value.get() == 1
        assert log_mod.dropped_lines() > before
    finally:
        import structlog

        structlog.reset_defaults()


# ---------------------------------------------------------------- liveness
class StallEngine:
    """An engine view whose steps the test moves by hand."""

    steps = Ring(16)
    finished = Ring(16)
    ceiling = 8
    max_num_batched_tokens = 256
    kv_capacity_tokens = 1024
    block_size = 16
    dp_rank = 0

    def __init__(self):
        self.work = (0, 0)
        self.last_step_done_s = 0.0

    def counts(self):
        return self.work

    def queue_snapshot(self):
        return None


class Notifier:
    enabled = True
    watchdog_interval_s = 1.0

    def __init__(self):
        self.pings = 0

    def watchdog(self):
        self.pings += 1

    def ready(self, status):
        pass


def test_a_stalled_engine_step_fails_healthz_and_stops_the_watchdog(logs):
    t = [0.0]
    cfg = config.validate({"interval_s": 0.5, "stale_after_s": 2.0, "engine_stall_s": 5.0,
                           "batch_policy": "static"})
    eng = StallEngine()
    n = Notifier()
    c = Controller(cfg, eng, Metrics(), notifier=n, clock=lambda: t[0])

    def tick_to(until_s: float, stepping: bool) -> None:
        while t[0] < until_s:
            t[0] = round(t[0] + 0.5, 3)
            if stepping:
                eng.last_step_done_s = t[0]
            c.run_once()

    eng.work = (0, 0)
    tick_to(30.0, stepping=False)        # idle: no steps, healthy, pinged
    assert c.healthy() and not c.engine_stalled()
    pings = n.pings
    assert pings >= 29
    eng.work = (2, 3)
    tick_to(40.0, stepping=True)          # busy and stepping
    assert c.healthy()
    stall_t = t[0]
    tick_to(stall_t + 5.0, stepping=False)     # the step hangs: exactly engine_stall_s
    assert c.healthy()
    pings = n.pings
    tick_to(stall_t + 15.0, stepping=False)
    assert not c.healthy() and c.engine_stalled()
    assert n.pings == pings                    # no ping while stalled
    # the controller itself still ticks fine: this is the engine's stall
    assert t[0] - c.slot.last_ok <= cfg.stale_after_s
    tick_to(stall_t + 16.0, stepping=True)     # the step returns
    assert c.healthy() and n.pings == pings + 1
    events = [e["event"] for e in logs() if e["event"].startswith("engine_")]
    assert events == ["engine_stalled", "engine_step_resumed"]


def test_work_after_an_idle_spell_is_not_a_stall():
    t = [0.0]
    cfg = config.validate({"interval_s": 0.5, "stale_after_s": 2.0, "engine_stall_s": 5.0,
                           "batch_policy": "static"})
    eng = StallEngine()
    c = Controller(cfg, eng, Metrics(), clock=lambda: t[0])
    t[0] = 100.0                       # the last step was 100 s ago: idle since
    eng.work = (0, 1)                  # a request arrives
    assert not c.engine_stalled()
    t[0] = 104.0
    assert not c.engine_stalled()
    t[0] = 105.5
    assert c.engine_stalled()


def test_engine_stall_s_is_validated_against_interval_s():
    with pytest.raises(config.ConfigError) as e:
        config.validate({"interval_s": 5.0, "engine_stall_s": 8.0, "stale_after_s": 10.0})
    assert "engine_stall_s: must be 0 (auto) or >= 2 * interval_s (10), got 8" in e.value.problems
    assert config.validate({"interval_s": 30.0, "stale_after_s": 60.0}).effective_engine_stall_s \
        == 60.0
    assert config.validate({}).effective_engine_stall_s == 20.0


def healthz(s) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{s.endpoint.port}/healthz",
                                    timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_real_scheduler_whose_step_never_returns_fails_healthz(tiny_model):
    from vllm.v1.outputs import ModelRunnerOutput

    s = make_scheduler(str(tiny_model), False, engine_stall_s=1.0)
    try:
        s.add_request(requests(1)[0])
        step(s)
        s.tuned.slot.mark_ok(time.monotonic())
        assert healthz(s) == 200
        so = s.schedule()               # the model runs ... and never returns
        t0 = time.monotonic()
        while time.monotonic() - t0 <= 1.0 + 0.2:
            time.sleep(0.05)
        s.tuned.slot.mark_ok(time.monotonic())        # the controller still ticks
        assert s.controller.engine_stalled() and healthz(s) == 503
        ids = list(so.num_scheduled_tokens)
        s.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids]))   # the step returns
        assert healthz(s) == 200
    finally:
        s.shutdown()


def test_liveness_survives_a_failing_step_record(sched, monkeypatch):
    monkeypatch.setattr(sched, "_tuned_record", lambda so, mro: 1 / 0)
    t0 = sched.last_step_done_s
    sched.add_request(requests(1)[0])
    step(sched)
    assert sched.last_step_done_s > t0


# ---------------------------------------------------------------- clock
def test_a_backward_wall_clock_step_does_not_make_later_requests_late():

    mono = [1000.0]
    wall = [5000.0]
    offset = lambda: wall_offset_s(lambda: wall[0], lambda: mono[0])  # noqa: E731
    q = make_policy_queue("fcfs", {"late_after_s": 3.0}, None, clock=lambda: mono[0],
                          arrival_offset_s=offset)
    q.add_request(req("a", t=wall[0]))
    mono[0] += 1.0
    wall[0] += 1.0 - 600.0              # the wall clock steps back 10 minutes
    q.add_request(req("b", t=wall[0]))
    assert q.info("a").arrival_s == 1000.0 and q.info("b").arrival_s == 1001.0
    # neither is late: a 1 s old and b just in; the order stays by arrival
    assert [r.request_id for r in q] == ["a", "b"]
    frozen = make_policy_queue("fcfs", {"late_after_s": 3.0}, None, clock=lambda: mono[0],
                               arrival_offset_s=4000.0)
    frozen.add_request(req("b", t=wall[0]))
    assert frozen.info("b").arrival_s == 401.0       # what the frozen offset did


def test_a_reload_that_installs_a_queue_policy_restores_tuned_order(sched, monkeypatch):
    real = QueueCore.add_request

    def once(self, r):
        if r.request_id == "r0":
            raise RuntimeError("injected once")
        return real(self, r)

    monkeypatch.setattr(QueueCore, "add_request", once)
    for r in requests(3, max_tokens=6):
        sched.add_request(r)
    q = sched.waiting
    assert q.fallback is not None
    monkeypatch.setattr(QueueCore, "add_request", real)
    cfg = config.validate({"max_num_seqs": 8, "max_num_batched_tokens": 256,
                           "max_model_len": 256, "queue_policy": "saber"})
    sched.set_queue_policy("saber", cfg)
    step(sched)
    assert sched.waiting is q and q.fallback is None and q.policy.name == "saber"
    while sched.has_requests():
        step(sched)
    assert completed(sched) == {"r0", "r1", "r2"}
