"""Step-time drift in the simulator (--events slowdown= / drift=): a run whose hardware
slows down, as a host of this project's kind or a throttled GPU does."""

from __future__ import annotations

import json
import math

import pytest
import structlog

from tuned import config
from tuned.commands.cli import main
from tuned.sim.engine import simulate
from tuned.sim.events import Drift, SimEvents, Slowdown, StepDrift, parse_events
from tuned.sim.hardware import gpu_hardware
from tuned.sim.nvml import GpuPressure
from tuned.base.workloads import parse_workload

SPEC = "poisson:rate=8,prompt=U(16,512),output=U(16,256),n=300"


@pytest.fixture(autouse=True)
def _quiet_logs():
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    yield
    structlog.reset_defaults()


def test_parse_events_reads_every_kind():
    ev = parse_events("gpu_pressure=10-20@0.995, slowdown=5-15@1.5, drift=60@2")
    assert ev.pressure == (GpuPressure(10.0, 20.0, 0.995),)
    assert ev.drift == StepDrift((Slowdown(5.0, 15.0, 1.5), Drift(60.0, 2.0)))
    assert parse_events("") == SimEvents() and not parse_events("")
    assert ev.describe() == [
        {"kind": "gpu_pressure", "start_s": 10.0, "end_s": 20.0, "used_fraction": 0.995},
        {"kind": "slowdown", "start_s": 5.0, "end_s": 15.0, "factor": 1.5},
        {"kind": "drift", "period_s": 60.0, "peak": 2.0}]


def test_the_factor_is_the_product_of_the_parts_in_force():
    d = parse_events("slowdown=5-15@1.5,drift=60@2").drift
    assert d.factor(0.0) == 1.0                                  # drift at its own speed
    assert d.factor(30.0) == pytest.approx(2.0)                  # drift's peak, no slowdown
    assert d.factor(10.0) == pytest.approx(1.5 * (1 + (1 - math.cos(math.pi / 3)) / 2))
    assert d.factor(15.0) == pytest.approx(1.5)                  # [T0, T1): slowdown over
    assert d.factor(60.0) == pytest.approx(1.0)


@pytest.mark.parametrize("text, message", [
    ("slowdown=10-5@2", "--events: 'slowdown=10-5@2' needs T0 < T1, got T0=10, T1=5"),
    ("slowdown=1-5@20", "--events: 'slowdown=1-5@20' needs F in [0.1, 10], got F=20"),
    ("drift=0@2", "--events: 'drift=0@2' needs P in (0, 1e+06] seconds, got P=0"),
    ("drift=60", "--events: 'drift=60' must be gpu_pressure=T0-T1@U, slowdown=T0-T1@F or "
                 "drift=P@F (seconds T0 < T1, period P > 0, used fraction U in [0, 1], "
                 "step-time factor F in [0.1, 10])"),
    ("oom=1-2@0.5", "--events: 'oom=1-2@0.5' must be gpu_pressure=T0-T1@U, slowdown="),
    ("gpu_pressure=1-2@1.5", "--events: 'gpu_pressure=1-2@1.5' needs T0 < T1 and U in [0, 1], "
                             "got T0=1, T1=2, U=1.5"),
])
def test_a_bad_event_names_the_form_and_range(text, message):
    with pytest.raises(ValueError) as e:
        parse_events(text)
    assert str(e.value).startswith(message)


def _run(drift=None, policy="static"):
    hw = gpu_hardware("a100-llama2-7b")
    cfg = config.validate({**hw.engine_defaults(), "batch_policy": policy, "interval_s": 0.5,
                           "tbt_sla_s": 0.05})
    wl = parse_workload(SPEC, 0, max_model_len=cfg.max_model_len)
    return simulate(cfg, hw, wl.requests, drift=drift)


def test_a_slowdown_scales_the_steps_inside_it_and_no_other():
    base = _run()
    slow = _run(parse_events("slowdown=10-20@2").drift)
    before = [s for s in base.steps if s.t < 10]
    assert [s.step_s for s in slow.steps[:len(before)]] == [s.step_s for s in before]
    # the same engine state scheduled at t in [10, 20) takes twice as long: the first
    # step starting inside the window is the first that differs, by 2x its own time
    first = next(i for i, (a, b) in enumerate(zip(base.steps, slow.steps)) if a != b)
    a, b = base.steps[first], slow.steps[first]
    assert b.t - b.step_s >= 10 - 1e-9 and b.step_s == pytest.approx(2 * a.step_s)
    assert slow.events == [{"kind": "slowdown", "start_s": 10.0, "end_s": 20.0,
                            "factor": 2.0}]
    after = [s for s in slow.steps if s.t - s.step_s >= 20]
    assert after and max(s.step_s for s in after) < 2 * max(s.step_s for s in base.steps)


def test_the_controller_shrinks_the_token_budget_while_the_host_is_slow():
    """tuned holds the TBT: with nothing waiting the cap does not bind, and during a 2x
    slowdown the prefill chunks the TPOT sizes beside the decodes are smaller than
    before. (A tick with requests waiting may spend the window's room below the SLO
    on a larger chunk, bound ``ttft``; those are left out.)"""
    res = _run(parse_events("slowdown=15-35@2").drift, policy="tuned")

    def sized_by_tpot(t0, t1):
        return [d["token_budget"] for d in res.decisions if t0 <= d["t"] < t1
                and d["inputs"].get("budget_bound") == "tpot"]

    before, during = sized_by_tpot(10, 15), sized_by_tpot(25, 35)
    assert before and during and max(during) < min(before)


def test_simulate_cli_drift(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["simulate", "--hardware", "a100-llama2-7b", "--workload", SPEC,
               "--events", "drift=30@2", "--out", str(out)])
    assert rc == 0
    assert "events:\n  drift: steps x1 to x2 and back every 30 s\n" in capsys.readouterr().out
    doc = json.loads((out / "result.json").read_text())
    assert doc["events"] == [{"kind": "drift", "period_s": 30.0, "peak": 2.0}]
    rc = main(["simulate", "--hardware", "a100-llama2-7b", "--workload", SPEC,
               "--events", "drift=30@20", "--out", str(out)])
    assert rc == 2
    assert capsys.readouterr().err.startswith(
        "tuned simulate: --events: 'drift=30@20' needs F in [0.1, 10], got F=20")


def test_bench_refuses_the_simulators_events_on_the_real_engine(tmp_path, capsys):
    rc = main(["bench", "--engine", "vllm", "--model", "demo:tiny", "--workload", SPEC,
               "--events", "drift=30@2", "--out", str(tmp_path)])
    assert rc == 2
    assert ("--events: 'drift=30@2' must be throttle=T0-T1@F on the real engine"
            in capsys.readouterr().err)
