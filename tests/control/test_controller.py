"""The controller loop on a fake engine view: readiness, watchdog, reload, fallback."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tuned import config
from tuned.control.controller import Controller, Fallback
from tuned.control.metrics import Metrics
from tuned.control.sdnotify import SdNotifier

from fakes import FakeEngine


def write(tmp_path: Path, text: str, name="tuned.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


BASE = "max_num_seqs = 32\ninterval_s = 0.1\nstale_after_s = 1.0\n"


# ------------------------------------------------------------- sd_notify
class NotifySocket:
    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)
        self.path = str(path)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            self.messages.append((time.monotonic(), data.decode()))

    def close(self):
        self._stop.set()
        self.thread.join()
        self.sock.close()

    def count(self, prefix, since=0.0, until=float("inf")):
        return sum(1 for t, m in self.messages if m.startswith(prefix) and since <= t <= until)


def test_ready_only_after_first_decision_and_watchdog_rate(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    eng = FakeEngine()
    eng.fail_counts = 3   # the first three ticks cannot observe: no decision yet
    ctrl = Controller(config.validate({"interval_s": 0.1, "stale_after_s": 1.0}), eng,
                      Metrics(), notifier=SdNotifier(sock.path, watchdog_usec=400_000))
    ready_at_decision = []
    orig_ready = ctrl.watchdog.notifier.ready

    def ready(status=""):
        ready_at_decision.append(ctrl.current is not None)
        return orig_ready(status)

    ctrl.watchdog.notifier.ready = ready
    t0 = time.monotonic()
    ctrl.start()
    try:
        time.sleep(0.25)
        assert sock.count("READY=1") == 0          # ticks so far all failed
        assert ctrl.current is None
        time.sleep(1.75)
    finally:
        ctrl.stop()
    elapsed = time.monotonic() - t0
    sock.close()
    assert sock.count("READY=1") == 1
    assert ready_at_decision == [True]
    # WATCHDOG_USEC = 0.4 s -> a ping at most every 0.2 s (half of it), and pings go
    # on while ticks succeed (how many ticks a loaded host runs is its business)
    n = sock.count("WATCHDOG=1", since=t0)
    assert 3 <= n <= elapsed / 0.2 + 1, (n, elapsed)


def test_watchdog_pings_stop_while_loop_is_stalled(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    eng = FakeEngine()
    ctrl = Controller(config.validate({"interval_s": 0.1, "stale_after_s": 1.0}), eng,
                      Metrics(), notifier=SdNotifier(sock.path, watchdog_usec=200_000))
    gate = threading.Event()
    gate.set()
    orig_decide = ctrl.decide

    def decide(obs):
        gate.wait()           # the stall: the tick blocks here
        return orig_decide(obs)

    ctrl.decide = decide
    ctrl.start()
    try:
        time.sleep(0.6)
        gate.clear()
        time.sleep(0.25)       # let the tick in flight reach the gate
        stall_from = time.monotonic()
        time.sleep(1.0)
        stall_to = time.monotonic()
        assert not ctrl.healthy() or ctrl.cfg.stale_after_s >= 1.0
        gate.set()
        time.sleep(0.6)
        resumed = time.monotonic()
    finally:
        gate.set()
        ctrl.stop()
    sock.close()
    assert sock.count("WATCHDOG=1", until=stall_from) >= 3
    assert sock.count("WATCHDOG=1", since=stall_from, until=stall_to) == 0
    assert sock.count("WATCHDOG=1", since=stall_to, until=resumed + 0.1) >= 2


def test_notifier_disabled_sends_nothing():
    ctrl = Controller(config.default(), FakeEngine(), Metrics(), notifier=SdNotifier(None))
    assert ctrl.run_once() is not None
    assert ctrl.watchdog.ready_sent is False


def test_every_decision_says_whether_the_cap_binds(tmp_path):
    eng = FakeEngine(running=4, waiting=0)
    ctrl = Controller(config.load(write(tmp_path, BASE)), eng, Metrics())
    d = ctrl.run_once()
    assert d.cap == 32 and d.inputs["cap_binds"] is False
    assert d.inputs["cap_note"].startswith("the cap does not bind: 4 running under cap 32, "
                                           "nothing waiting")
    assert ctrl.decisions_json()["current"]["inputs"]["cap_binds"] is False


# ------------------------------------------------------------- reload
def test_valid_reload_changes_sla_and_decisions(tmp_path):
    path = write(tmp_path, BASE)
    eng = FakeEngine(running=4, waiting=4)
    ctrl = Controller(config.load(path), eng, Metrics())
    for _ in range(5):
        eng.add_step(0.040, 8)
    assert ctrl.run_once().reason == "memory_no_data"
    write(tmp_path, BASE + "tbt_sla_s = 0.020\neps_d_s = 0.002\n")
    res = ctrl.reload()
    assert res["outcome"] == "ok" and res["changed"] == ["tbt_sla_s"]
    for _ in range(5):   # steps within the TBT window however long the reload took
        eng.add_step(0.040, 8)
    d = ctrl.run_once()
    # TBT 40 ms > 22 ms: high = max(8, 1 + 2) = 8, low = 1 -> b_SLA = 4 (= running)
    assert (d.b_sla, d.cap, d.reason) == (4, 4, "sla_over")
    assert ctrl.metrics.reloads.labels("ok")._value.get() == 1


def test_invalid_reload_is_refused_and_old_config_kept(tmp_path):
    path = write(tmp_path, BASE + "tbt_sla_s = 0.05\n")
    ctrl = Controller(config.load(path), FakeEngine(), Metrics())
    write(tmp_path, BASE + "tbt_sla_s = -1\nb_min = 40\n")
    res = ctrl.reload()
    assert res["outcome"] == "refused"
    assert res["problems"] == ["tbt_sla_s: must be in [0, 1), got -1"]
    write(tmp_path, BASE + "b_min = 40\n")
    res = ctrl.reload()
    assert res["problems"] == ["b_min: must be <= b_max (32), got 40"]
    assert ctrl.cfg.tbt_sla_s == 0.05 and ctrl.cfg.b_min == 1
    # the GPU-memory guard around the damper around the token budget around Pang et
    # al.'s policy
    sla = ctrl.policy.inner.inner.inner.sla
    assert sla is not None and sla.sla_s == 0.05
    assert ctrl.metrics.reloads.labels("refused")._value.get() == 2
    assert ctrl.decisions_json()["last_reload"]["outcome"] == "refused"


def test_reload_reports_restart_fields_and_switches_policy(tmp_path):
    path = write(tmp_path, BASE)
    eng = FakeEngine()
    ctrl = Controller(config.load(path), eng, Metrics())
    write(tmp_path, BASE.replace("32", "64") + 'queue_policy = "mcsf"\nmetrics_port = 9999\n')
    res = ctrl.reload()
    assert res["outcome"] == "ok"
    assert res["restart_needed"] == ["max_num_seqs", "metrics_port"]
    assert ctrl.cfg.max_num_seqs == 32 and ctrl.cfg.metrics_port == 9464   # kept
    assert ctrl.cfg.queue_policy == "mcsf" and eng.policies == ["mcsf"]


def test_reload_with_missing_file_keeps_running(tmp_path):
    path = write(tmp_path, BASE)
    ctrl = Controller(config.load(path), FakeEngine(), Metrics())
    path.unlink()
    res = ctrl.reload()
    assert res["outcome"] == "refused"
    assert res["problems"][0].startswith("cannot read config file")


# ------------------------------------------------------------- observe
def test_demand_is_counted_in_whole_blocks():
    """memory_demand = "lifetime" (Pang et al. as published): each request's whole demand."""
    eng = FakeEngine()
    eng.block_size = 16
    eng.kv_capacity_tokens = 64 * 16
    ctrl = Controller(config.validate({"memory_demand": "lifetime"}), eng, Metrics())
    for p, o in ((10, 6), (10, 7), (40, 24)):   # 16 -> 1 block, 17 -> 2, 64 -> 4
        eng.add_finished(p, o)
    ob = ctrl.observe()
    assert ob.kv_capacity_blocks == 64
    assert ob.demand_mean == pytest.approx(7 / 3)
    assert ob.demand_std == pytest.approx(((4 / 3) ** 2 + (1 / 3) ** 2 + (5 / 3) ** 2) ** 0.5 / 3 ** 0.5)


def test_occupancy_demand_counts_the_blocks_held_at_each_decode_step():
    """The default, memory_demand = "occupancy": one sample per decode step, the whole
    blocks held while writing that token."""
    eng = FakeEngine()
    eng.block_size = 16
    eng.kv_capacity_tokens = 64 * 16
    ctrl = Controller(config.default(), eng, Metrics())
    for p, o in ((10, 6), (10, 7), (40, 24)):
        eng.add_finished(p, o)
    ob = ctrl.observe()
    # tokens held 11..16: 6 x 1 block; 11..17: 6 x 1, 1 x 2; 41..64: 8 x 3, 16 x 4
    samples = [1] * 6 + [1] * 6 + [2] + [3] * 8 + [4] * 16
    mean = sum(samples) / len(samples)
    assert ob.demand_mean == pytest.approx(102 / 37) == pytest.approx(mean)
    assert ob.demand_std == pytest.approx(
        (sum((x - mean) ** 2 for x in samples) / len(samples)) ** 0.5)
    assert ob.demand_samples == 3


def test_demand_follows_a_change_of_mix_within_the_window():
    """The demand window is the last demand_window finished requests (16 by default):
    after a phase of long prompts, 16 short requests are the whole estimate."""
    eng = FakeEngine()
    eng.block_size = 16
    eng.kv_capacity_tokens = 64 * 16
    ctrl = Controller(config.default(), eng, Metrics())
    assert ctrl.cfg.demand_window == 16
    for _ in range(40):
        eng.add_finished(600, 30)             # 38-40 blocks held while decoding
    assert ctrl.observe().demand_mean > 37
    for _ in range(15):
        eng.add_finished(15, 1)               # 16 tokens held: one block
    assert ctrl.observe().demand_mean > 2     # one long request still in the window
    eng.add_finished(15, 1)
    ob = ctrl.observe()
    assert (ob.demand_mean, ob.demand_std, ob.demand_samples) == (1.0, 0.0, 16)


def test_the_demand_reads_the_prompts_the_engine_holds_at_a_change_of_mix():
    """Where the engine says which prompts it holds (running and waiting), the demand
    pairs them with the finished requests' outputs: a phase of long prompts is read
    the tick it arrives, not after 16 of them finish; with none held, the finished
    requests' own pairs."""
    eng = FakeEngine(running=2, waiting=2)
    eng.block_size = 16
    held: list[int] = []
    eng.present_prompts = lambda: list(held)
    ctrl = Controller(config.default(), eng, Metrics())
    for _ in range(16):
        eng.add_finished(15, 1)               # chat: 16 tokens held, one block
    assert (ctrl.observe().demand_mean, ctrl.observe().demand_samples) == (1.0, 16)
    held[:] = [600, 600, 600, 600]            # long prompts arrive: 601 tokens, 38 blocks
    ob = ctrl.observe()
    assert (ob.demand_mean, ob.demand_std, ob.demand_samples) == (38.0, 0.0, 16)
    held[:] = [15, 600]                       # half and half: 8 pairs each
    ob = ctrl.observe()
    assert (ob.demand_mean, ob.demand_std) == (19.5, 18.5)


def test_the_oldest_wait_is_observed_where_the_engine_reads_it_and_requests_wait():
    """The longest wait for admission reaches the policy (the SLA bound steps aside
    past the TTFT SLO); not read with nothing waiting, None where the engine cannot."""
    eng = FakeEngine(running=2, waiting=3)
    ctrl = Controller(config.default(), eng, Metrics())
    assert ctrl.observe().oldest_wait_s is None
    eng.oldest_wait_s = lambda: 4.25
    assert ctrl.observe().oldest_wait_s == 4.25
    eng.waiting = 0
    assert ctrl.observe().oldest_wait_s is None


def test_every_departure_between_two_ticks_is_counted_past_the_demand_window():
    """More requests finish between two ticks than the demand window holds (a burst
    refused at the wait bound): each is counted once in tuned_requests_finished_total,
    while the demand estimate reads the window's last 16."""
    eng = FakeEngine()
    ctrl = Controller(config.default(), eng, Metrics())
    for _ in range(40):
        eng.add_finished(10, 20)
    ctrl.run_once()
    assert (ctrl.seen.new_finished, ctrl.last_observation.demand_samples) == (40, 16)
    assert ctrl.metrics.finished._value.get() == 40
    for _ in range(3):
        eng.add_finished(10, 20)
    ctrl.run_once()
    assert ctrl.seen.new_finished == 3 and ctrl.metrics.finished._value.get() == 43


def test_observation_window_and_demand_moments():
    eng = FakeEngine(running=3, waiting=2)
    ctrl = Controller(config.validate({"tbt_window_s": 1.0}), eng, Metrics())
    now = time.monotonic()
    eng.add_step(0.500, 30, t=now - 5.0)      # outside the 1 s window
    eng.add_step(0.010, 2, t=now)
    eng.add_step(0.030, 4, t=now)
    eng.add_step(0.020, 0, t=now)             # a prefill-only step: not a TBT sample
    for p, o in ((10, 20), (30, 40)):
        eng.add_finished(p, o)
    ctrl.run_once()                           # observe, then the export of what it read
    ob = ctrl.last_observation
    assert ob.tbt_mean_s == pytest.approx(0.020)
    assert ob.decode_batch_mean == pytest.approx(3.0)
    # block_size 1, occupancy: tokens held 11..30 (20 steps), then 31..70 (40 steps)
    held = list(range(11, 31)) + list(range(31, 71))
    assert ob.demand_mean == pytest.approx(40.5) == pytest.approx(sum(held) / 60)
    assert ob.demand_std == pytest.approx(
        (sum((x - 40.5) ** 2 for x in held) / 60) ** 0.5)
    assert (ob.num_running, ob.num_waiting, ob.demand_samples) == (3, 2, 2)
    # histogram got the three decode steps (all new since the last tick)
    assert ctrl.metrics.tbt._sum.get() == pytest.approx(0.540)


def test_first_step_fit_comes_as_soon_as_there_are_steps_then_every_few_seconds():
    """Without a fit the token budget is the full budget and the queue cannot predict a
    first token, so the first fit is tried at every tick until it succeeds, from 16
    busy steps, not at the next 4 s refresh."""
    from tuned.control.controller import FIRST_STEP_FIT_SAMPLES, STEP_FIT_EVERY_S
    from tuned.core.ring import StepSample

    clock = [100.0]
    eng = FakeEngine(running=8, waiting=4)
    ctrl = Controller(config.validate({"tbt_sla_s": 0.05}), eng, Metrics(),
                      clock=lambda: clock[0])
    assert ctrl.observe().step_model is None            # no steps yet

    def add(n):
        s = eng.steps
        for i in range(n):
            b, c = 1 + i % 8, 64 * (i % 5)
            s.append(StepSample(s.next_seq, clock[0], 0.010 + 0.001 * b + 0.0001 * c, b,
                                1 if c else 0, c, b + c, b, 0.1, 1, 100 * b, 8, 4, 0))

    add(FIRST_STEP_FIT_SAMPLES - 1)
    clock[0] += 0.5
    assert ctrl.observe().step_model is None            # one step short of the first fit
    add(1)
    clock[0] += 0.5                                     # one tick, not 4 s later
    first = ctrl.observe().step_model
    assert first is not None
    assert first.gamma == pytest.approx(0.0001, rel=1e-6)
    add(60)
    clock[0] += 0.5
    assert ctrl.observe().step_model is first           # refreshed every few s only
    clock[0] += STEP_FIT_EVERY_S
    assert ctrl.observe().step_model is not first


def test_observation_says_how_far_the_prefilling_steps_run_from_the_fit():
    """The fit spans the ring; the window's prefilling decode steps that ran 6 ms
    slower than it predicts show as a residual of +6 ms (decode-only and prefill-only
    steps do not count), and none without a fit."""
    from tuned.core.ring import StepSample

    clock = [100.0]
    eng = FakeEngine(running=8, waiting=4)
    ctrl = Controller(config.validate({"tbt_sla_s": 0.05, "tbt_window_s": 1.0}), eng,
                      Metrics(), clock=lambda: clock[0])

    def add(n, slower=0.0, t=None):
        s = eng.steps
        for i in range(n):
            b, c = 1 + i % 8, 64 * (i % 5)
            s.append(StepSample(s.next_seq, clock[0] if t is None else t,
                                0.010 + 0.001 * b + 0.0001 * c + slower, b,
                                1 if c else 0, c, b + c, b, 0.1, 1, 100 * b, 8, 4, 0))

    assert ctrl.observe().prefill_residual_s is None    # no fit yet
    add(60, t=clock[0] - 5.0)                            # the fit's steps, before the window
    clock[0] += 0.5
    ob = ctrl.observe()
    assert ob.step_model is not None and ob.prefill_residual_s is None
    add(10, slower=0.006)
    eng.steps.append(StepSample(eng.steps.next_seq, clock[0], 0.5, 0, 1, 64, 64, 0, 0.1,
                                1, 0, 8, 4, 0))          # prefill only: not counted
    assert ctrl.observe().prefill_residual_s == pytest.approx(0.006)


def test_controller_error_hands_fallback():
    eng = FakeEngine()
    eng.fail_counts = 1
    ctrl = Controller(config.validate({"fallback_cap": 5}), eng, Metrics())
    assert ctrl.run_once() is None
    assert ctrl.slot.pending == Fallback("controller_error", 5)
    assert ctrl.metrics.errors._value.get() == 1
    assert ctrl.run_once() is not None     # next tick recovers


class FakeStepModel:
    def largest_chunk_within(self, b, tbt_s, lo, hi, kv_tokens=0.0):
        return 100

    def predict_step_s(self, b, c=0.0, kv_tokens=0.0):
        return 0.001


class FakeProfile:
    def largest_batch_within(self, tbt_s, b_max):
        return 12 if tbt_s == 0.03 else 1

    def step_model(self):
        return FakeStepModel()

    def speed_tok_s(self, n):
        return 50.0 / n


def test_profile_gives_first_cap_before_any_telemetry(tmp_path):
    prof = write(tmp_path, "{}", "p.json")
    cfg = config.validate({"profile": str(prof), "tbt_sla_s": 0.03})
    ctrl = Controller(cfg, FakeEngine(), Metrics(), profile_loader=lambda p: FakeProfile())
    d = ctrl.run_once()
    # the budget is sized for the decodes that run (none yet: b = 1), plus the chunk
    assert (d.cap, d.reason, d.token_budget) == (12, "profile_initial", 101)


def test_shipped_profile_gives_the_first_cap_before_telemetry():
    """With the profile measured on this kind of machine and an SLA, the first
    decision (no step sample, no finished request yet) is the profile's prediction."""
    from tuned.curves.profile import load_profile

    path = Path(__file__).resolve().parents[2] / "profiles" / "demo-small-cpu.json"
    prof = load_profile(path)
    cfg = config.validate({"profile": str(path), "tbt_sla_s": 0.025, "max_num_seqs": 32})
    eng = FakeEngine(ceiling=32)
    ctrl = Controller(cfg, eng, Metrics())
    d = ctrl.run_once()
    want = prof.largest_batch_within(0.025, 32)
    assert 1 < want < 32
    assert (d.cap, d.reason) == (want, "profile_initial")
    # the token budget: one decode (nothing runs yet) plus the step model's largest
    # chunk within the SLA less its tolerance eps_D (2 ms); on this CPU profile not
    # even the smallest chunk (32 tokens) fits, so chunking cannot hold the SLA and
    # the budget is the full one
    assert prof.step_model().predict_step_s(1, 32, 32) > 0.025 - 0.002
    assert d.token_budget == 2048


def test_observe_reads_only_and_the_tick_exports_and_publishes():
    """observe() reads the engine; the metrics export of what it read and the queue's
    inputs going down the channel are run_once's."""
    eng = FakeEngine(running=3, waiting=2)
    ctrl = Controller(config.default(), eng, Metrics())
    now = time.monotonic()
    for b in (2, 4):
        eng.add_step(0.010, b, t=now)
    eng.add_finished(10, 20)
    inputs = ctrl.queue_channel.inputs
    ob = ctrl.observe()
    assert (ob.num_running, ob.num_waiting, ob.decode_batch_mean) == (3, 2, 3.0)
    assert ctrl.metrics.steps._value.get() == 0 and ctrl.metrics.finished._value.get() == 0
    assert ctrl.queue_channel.inputs is inputs
    assert (len(ctrl.seen.new_steps), ctrl.seen.new_finished) == (2, 1)
    ctrl2 = Controller(config.default(), eng, Metrics())
    assert ctrl2.run_once() is not None
    assert ctrl2.metrics.steps._value.get() == 2 and ctrl2.metrics.finished._value.get() == 1
    assert ctrl2.queue_channel.inputs == ctrl2.queue_inputs()


def test_a_tick_says_what_held_admissions_since_the_last_and_counts_the_guards():
    """The queue's snapshot counts the guard's holds by check; each tick's observation
    has those since the last tick (the decision's note names them) and
    tuned_queue_held_total{reason} counts them."""
    eng = FakeEngine(running=2, waiting=3)
    snap = {"policy": "fcfs", "admitted": 0, "deferred": 4, "demoted": 0,
            "bins_in_use": 0, "buckets_in_use": 0, "prediction_count": 0,
            "prediction_mae_tokens": 0.0, "prediction_mean_error_tokens": 0.0,
            "guard_held": {"tpot_guard": 3, "ttft_guard": 0}}
    eng.queue_snapshot = lambda: dict(snap)
    m = Metrics()
    ctrl = Controller(config.default(), eng, m)
    d = ctrl.run_once()
    assert ctrl.last_observation.held == (("tpot_guard", 3), ("queue_policy", 1))
    assert "held by the admission guard's TPOT check (3 holds) and the queue policy (1 " \
        "hold) since the last decision" in d.inputs["cap_note"]
    snap.update(deferred=9, guard_held={"tpot_guard": 3, "ttft_guard": 5})
    ctrl.run_once()
    assert ctrl.last_observation.held == (("ttft_guard", 5),)
    assert [m.q_held.labels(r)._value.get() for r in ("tpot_guard", "ttft_guard")] == [3, 5]
    ctrl.run_once()                               # nothing new
    assert ctrl.last_observation.held == ()
    assert m.q_held.labels("tpot_guard")._value.get() == 3


# ------------------------------------------------------------- the attainment margin
def test_the_margin_learns_only_from_requests_that_decoded_at_a_binding_cap():
    """``sla_statistic = "attainment"``: a request over its TPOT that decoded while the
    cap did not bind (the offered load set its batch) leaves the margin alone; one
    that decoded at a binding cap lowers it, and /metrics shows the setpoint."""
    from tuned.core.ring import FinishedRequest
    from tuned.policies.sla_bound import ATTAINMENT_STEP

    now = [0.0]
    eng = FakeEngine(ceiling=32)
    m = Metrics()
    ctrl = Controller(config.validate({"tbt_sla_s": 0.05, "sla_statistic": "attainment",
                                       "interval_s": 0.5}), eng, m, clock=lambda: now[0])

    def tick(t, running, waiting):
        now[0] = t
        eng.running, eng.waiting = running, waiting
        eng.add_step(0.040, max(running, 1), t=t - 0.01)
        return ctrl.run_once()

    def finish(first, end):      # 11 tokens: TPOT (end - first) / 10, 60 ms here
        f = eng.finished
        f.append(FinishedRequest(f.next_seq, end, f"r{f.next_seq}", 10, 11, 11, first - 0.1,
                                 0, first_token_s=first))

    for t in (0.5, 1.0, 1.5):
        tick(t, 4, 0)                     # 4 running, nothing waits: the cap is loose
    finish(0.6, 1.2)
    d = tick(2.0, 4, 0)
    assert ctrl.last_observation.finished_tpot_s == ()
    assert (d.inputs["sla_margin"], d.inputs["tpot_samples"]) == (1.0, 0)
    for t in (2.5, 3.0, 3.5):
        tick(t, 32, 10)                   # a full cap with requests waiting: it binds
    finish(2.6, 3.2)
    d = tick(4.0, 32, 10)
    assert ctrl.last_observation.finished_tpot_s == pytest.approx((0.06,))
    assert d.inputs["sla_statistic"] == "attainment"
    assert d.inputs["sla_margin"] == pytest.approx(1 - 0.9 * ATTAINMENT_STEP)
    assert d.inputs["tpot_samples"] == 1
    assert m.registry.get_sample_value("tuned_sla_setpoint_seconds") == \
        pytest.approx(0.05 * (1 - 0.9 * ATTAINMENT_STEP))
    assert m.registry.get_sample_value("tuned_sla_margin_ratio") == \
        pytest.approx(1 - 0.9 * ATTAINMENT_STEP)


def test_without_attainment_the_setpoint_is_the_sla_and_the_margin_one():
    m = Metrics()
    eng = FakeEngine(ceiling=32, running=4)
    ctrl = Controller(config.validate({"tbt_sla_s": 0.05}), eng, m, clock=lambda: 1.0)
    eng.add_step(0.040, 4, t=0.9)
    d = ctrl.run_once()
    # the default auto: the budget sizes chunks (granule 256, a GPU), so p90
    assert (d.inputs["sla_statistic"], d.inputs["sla_setpoint_s"]) == ("p90", 0.05)
    assert m.registry.get_sample_value("tuned_sla_setpoint_seconds") == 0.05
    assert m.registry.get_sample_value("tuned_sla_margin_ratio") == 1.0
