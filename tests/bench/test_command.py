"""``tuned bench``'s argument checks and engine choice: each refusal is one line on
stderr, exit 2, before anything runs, in the order the command checks them."""

from __future__ import annotations

import pytest

from fakes import run_main

W = ["--workload", "phase-shift:rate=1,n=4"]


@pytest.mark.parametrize("argv, want", [
    (["--jobs", "-1"], "--jobs: must be >= 0 (0 = the CPU count), got -1"),
    (["--repeats", "0"], "--repeats: must be in [1, 100], got 0"),
    ([], "--workload is required (or --paper NAME)"),
    (W + ["--sla", "ttft=2,tpot=x"], None),
    (W + ["--model", "demo:tiny"],
     "--model is for --engine vllm; the simulator takes --hardware or --profile"),
    (W + ["--engine", "vllm"], "--engine vllm needs --model (e.g. demo:small)"),
    (W + ["--engine", "vllm", "--model", "demo:tiny", "--data-dir", "d"],
     "--data-dir is for the simulator's --hardware (--engine sim)"),
    (W + ["--engine", "vllm", "--model", "demo:tiny", "--events", "x"],
     "--events: 'x' must be throttle=T0-T1@F on the real engine (the server runs 1/F of "
     "the time from T0 to T1 seconds of the workload; seconds T0 < T1, F in [1, 10])"),
    (W + ["--engine", "vllm", "--model", "demo:tiny", "--events", "throttle=5-2@2"],
     "--events: 'throttle=5-2@2' needs T0 < T1, got T0=5, T1=2"),
    (W + ["--engine", "vllm", "--model", "demo:tiny", "--events", "throttle=0-2@20"],
     "--events: 'throttle=0-2@20' needs F in [1, 10], got F=20"),
    (W + ["--engine", "vllm", "--model", "demo:tiny", "--events",
          "throttle=0-20@2,throttle=10-30@2"],
     "--events: 'throttle=10-30@2' overlaps throttle=0-20@2"),
    (W + ["--hardware", "a100-llama2-7b", "--caps", "4,x"],
     "--caps: expected comma-separated whole numbers, got '4,x'"),
])
def test_each_refusal_is_one_line_and_exit_2(tmp_path, argv, want):
    code, out, err = run_main(["bench", "--out", str(tmp_path / "o"), *argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tuned bench: ")
    if want is not None:
        assert err == f"tuned bench: {want}\n"
    else:
        assert err.startswith("tuned bench: --sla: ")
    assert not (tmp_path / "o" / "report.json").exists()


@pytest.mark.parametrize("slo, want", [
    ("ttft=2,tpot=-1x", "--sla: SLO tpot='-1x': expected tpot=MULTIPLEx, a number > 1 times "
                        "the batch-1 decode step (e.g. tpot=2.5x)"),
    ("ttft=2,tpot=abcx", "--sla: SLO tpot='abcx': expected tpot=MULTIPLEx, a number > 1 "
                         "times the batch-1 decode step (e.g. tpot=2.5x)"),
])
def test_a_bad_relative_slo_is_one_line_before_any_engine(tmp_path, slo, want):
    for engine in (["--hardware", "a100-llama2-7b"], ["--engine", "vllm", "--model", "demo:tiny"]):
        code, out, err = run_main(["bench", "--out", str(tmp_path / "o"), *W, *engine,
                                   "--slo", slo])
        assert (code, out, err) == (2, "", f"tuned bench: {want}\n")


SIZED = "phases:poisson:rate=10x,prompt=U(26,486),output=U(13,243),s=20;" \
        "poisson:rate=0.25x,prompt=U(26,486),output=U(13,243),n=20"


@pytest.mark.parametrize("workload, engine, slo, want", [
    (SIZED, ["--hardware", "a100-llama2-7b"], "ttft=3,tpot=2.5x",
     "--workload: a rate in x (K times this host's capacity) is sized from the engine's "
     "measured step: it needs --engine vllm and a relative --slo such as tpot=2.5x (got "
     "--engine sim --slo ttft=3,tpot=2.5x)"),
    (SIZED, ["--engine", "vllm", "--model", "demo:tiny"], "ttft=3,tpot=0.05",
     "--workload: a rate in x (K times this host's capacity) is sized from the engine's "
     "measured step: it needs --engine vllm and a relative --slo such as tpot=2.5x (got "
     "--engine vllm --slo ttft=3,tpot=0.05)"),
    ("poisson:rate=2x,prompt=8,output=8", ["--engine", "vllm", "--model", "demo:tiny"],
     "ttft=3,tpot=2.5x", "--workload: workload 'poisson:rate=2x,prompt=8,output=8': "
     "missing n= or s= (requests, or seconds at the rate)"),
])
def test_a_workload_sized_to_the_host_is_checked_before_any_engine(tmp_path, workload,
                                                                   engine, slo, want):
    code, out, err = run_main(["bench", "--out", str(tmp_path / "o"), "--workload", workload,
                               *engine, "--slo", slo])
    assert (code, out, err) == (2, "", f"tuned bench: {want}\n")


def test_the_repeats_default_to_three_on_the_real_engine_and_one_on_the_simulator():
    from argparse import Namespace

    from tuned.bench.command import LIVE_REPEATS, _check_args

    assert LIVE_REPEATS == 3
    for engine, want in (("vllm", 3), ("sim", 1)):
        args = Namespace(jobs=0, repeats=None, engine=engine, paper=None, out="/tmp")
        _check_args(args)
        assert args.repeats == want
    args = Namespace(jobs=0, repeats=5, engine="vllm", paper=None, out="/tmp")
    _check_args(args)
    assert args.repeats == 5


def test_a_relative_slo_on_the_simulator_is_its_step_models_batch1_step(tmp_path):
    import json

    from tuned.bench.runner import sim_batch1_step_s
    from tuned.sim.hardware import resolve_hardware

    code, _, err = run_main(["bench", "--hardware", "a100-llama2-7b", *W, "--quick",
                             "--capacity", "off", "--jobs", "1", "--contenders",
                             "vllm-default,tuned", "--slo", "ttft=2,tpot=2.5x",
                             "--out", str(tmp_path)])
    assert code == 0, err
    step = sim_batch1_step_s(resolve_hardware("a100-llama2-7b"))
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["slo_parsed"]["tpot_s"] == pytest.approx(2.5 * step, abs=1e-6)
    assert rep["slo_relative"] == {"spec": "ttft=2,tpot=2.5x", "step_s_batch1": step,
                                   "source": "the simulated hardware's step model at batch 1"}
    assert rep["repeats"] == 1
    assert [(v["vs_run"], v["state"]) for v in rep["noise"]] == [("vllm-default", "one_repeat")]
    assert rep["noise"][0]["words"].endswith(": one repeat: no spread measured")


def test_the_real_engine_bench_interleaves_three_repeats_and_judges_the_noise(tmp_path,
                                                                             monkeypatch):
    """The engine replaced by a fake that only records the order it was asked for: the
    repeats go A1 B1 A2 B2 A3 B3, a relative SLO is resolved on the measured step, and
    the report carries each contender's spread and the verdicts."""
    import json

    from tuned.base import demo_model
    from tuned.bench import live
    from tuned.bench.metrics import RequestResult

    order, calls = [], []

    def fake_measure(base, **kw):
        calls.append(kw["factor"])
        return {"sla_s": 0.1, "step_s_batch1": 0.04, "factor": kw["factor"]}

    def fake_run(c, wl, **kw):
        order.append(c.name)
        slow = 1.0 + 0.1 * len(order)                 # every run a little slower
        res = [RequestResult(f"r{i}", s.arrival_s, s.prompt_tokens, s.output_tokens,
                             s.arrival_s + 0.05 * slow,
                             s.arrival_s + 0.05 * slow + 0.02 * (s.output_tokens - 1),
                             token_times_s=[s.arrival_s + 0.05 * slow + 0.02 * k
                                            for k in range(s.output_tokens)])
               for i, s in enumerate(wl.requests)]
        return live.LiveRun(results=res, cap_timeline=[(0.0, 4)], decisions=[],
                            duration_s=1.0, server_log=tmp_path / "log",
                            send_lags_s=[0.001 * len(order)] * len(res),
                            steps=[{"seq": 1, "t": 0.5}] if c.name == "tuned" else [],
                            pace_s=(0.010 * len(order), 0.010 * len(order) + 0.005)
                            if kw["pace"] else (None, None))

    monkeypatch.setattr(live, "measure_batch1_step", fake_measure)
    monkeypatch.setattr(live, "run_live", fake_run)
    monkeypatch.setattr(demo_model, "resolve_model", lambda *a, **k: tmp_path / "model")
    code, out, err = run_main(["bench", "--engine", "vllm", "--model", "demo:tiny", *W,
                               "--quick", "--contenders", "vllm-default,tuned", "--slo",
                               "ttft=2,tpot=2.5x", "--out", str(tmp_path / "o")])
    assert code == 0, err
    assert calls == [2.5]
    assert order == ["vllm-default", "tuned"] * 3
    logs = tmp_path / "o" / "logs"
    # each repeat's send lags (run 4 is tuned's second) and tuned serve's step records
    assert json.loads((logs / "tuned.r1.send_lags.json").read_text())[0] == pytest.approx(0.004)
    assert json.loads((logs / "tuned.r2.steps.json").read_text()) == [{"seq": 1, "t": 0.5}]
    assert not (logs / "vllm-default.steps.json").exists()
    rep = json.loads((tmp_path / "o" / "report.json").read_text())
    assert rep["repeats"] == 3 and " --repeats 3 " in rep["command"]
    assert rep["slo_parsed"]["tpot_s"] == pytest.approx(0.1)
    assert rep["slo_relative"]["step_s_batch1"] == 0.04
    for run in rep["runs"]:
        assert len(run["goodput_rps_runs"]) == 3
        assert run["goodput_rps_min"] <= run["goodput_rps"] <= run["goodput_rps_max"]
    assert [v["vs_run"] for v in rep["noise"]] == ["vllm-default"]
    assert rep["noise"][0]["state"] in ("above", "inside", "below")
    assert "## Above the noise?" in out and rep["noise"][0]["words"] in out
    # the pace probe around each run: vllm-default ran 1st, 3rd, 5th, tuned 2nd, 4th, 6th
    pace = rep["host_pace"]
    assert [run["pace_s_runs"] for run in rep["runs"]] == [
        [[pytest.approx(x), pytest.approx(x + 0.005)] for x in xs]
        for xs in ((0.01, 0.03, 0.05), (0.02, 0.04, 0.06))]
    assert (pace["min_s"], pace["max_s"]) == (pytest.approx(0.01), pytest.approx(0.065))
    assert pace["relative"] == pytest.approx(0.0425 / 0.0325)
    assert ("- the host's pace (a lone request's step just before and just after each run): "
            "10.0-65.0 ms, 6.50x (vllm-default 10.0-55.0, tuned 20.0-65.0 ms); during "
            "tuned's runs the host's step was 1.31x its mean during the others' (slower for "
            "tuned).") in out
    # each repeat's longest silence (no stream's token with a request in flight)
    quiet = {run["name"]: run["silence_s_runs"] for run in rep["runs"]}
    assert all(len(v) == 3 and all(x[0] > 0 for x in v) for v in quiet.values()), quiet
    assert ("- the longest time no stream got a token while requests were in flight (seconds "
            "of it point at a host stall, which every request in flight then pays): "
            "vllm-default " + ", ".join(f"{x[0]:.2f} s from {x[1]:.1f} s"
                                        for x in quiet["vllm-default"])) in out


def test_a_contender_that_does_not_start_is_its_message_and_log_tail_not_a_traceback(
        tmp_path, monkeypatch):
    """A contender's engine that exits while starting (here: a config the engine's
    own tuned refuses) ends the bench with exit 1 and the start error's lines."""
    from tuned.bench import command
    from tuned.bench.live import LiveStartError

    def fail(*a, **k):
        raise LiveStartError("contender 'tuned' (tuned) did not start: engine exited with "
                             "code 1 while starting; last lines of LOG:\n"
                             "tuned.config.ConfigError: F: sla_statistic: must be one of "
                             "mean, p90, attainment, got 'x'")

    monkeypatch.setattr(command, "_sweep", fail)
    code, out, err = run_main(["bench", "--out", str(tmp_path / "o"), *W,
                               "--hardware", "a100-llama2-7b", "--slo", "ttft=2,tpot=0.05"])
    assert code == 1
    assert err.splitlines()[-2:] == [
        "tuned bench: error: contender 'tuned' (tuned) did not start: engine exited with "
        "code 1 while starting; last lines of LOG:",
        "  tuned.config.ConfigError: F: sla_statistic: must be one of mean, p90, attainment, "
        "got 'x'"]
    assert "Traceback" not in err


def test_a_share_for_the_default_outside_0_1_is_refused_before_any_engine(tmp_path):
    code, out, err = run_main(["bench", "--out", str(tmp_path / "o"), "--workload", SIZED,
                               "--engine", "vllm", "--model", "demo:tiny", "--slo",
                               "ttft=3,tpot=2.5x", "--default-attainment", "1.5"])
    assert (code, out, err) == (2, "", "tuned bench: --default-attainment: must be a share "
                                "in (0, 1), e.g. 0.5, got 1.5\n")


def _sized_target(workload: str):
    """The bench's target and arguments after the relative SLO and the rate=Kx sizing,
    on the step fit of profiles/demo-small-cpu.json (this repository's CPU host)."""
    from argparse import Namespace
    from pathlib import Path

    from tuned.bench.command import _Target, _size_workload, base_config
    from tuned.bench.metrics import SloSpec
    from tuned.curves.profile import load_profile
    from tuned.sim.hardware import engine_defaults

    prof = load_profile(Path(__file__).resolve().parents[2] / "profiles" / "demo-small-cpu.json")
    fit = prof.step_model().to_dict()
    step = fit["a"] + fit["beta"] + 0.002           # a batch-1 step with 2 ms between steps
    slo = SloSpec.parse("ttft=3,tpot=2.5x").resolve(step)
    args = Namespace(workload=workload, seed=0, config=None, default_attainment=None)
    engine = engine_defaults(None)
    target = _Target(None, None, engine, base_config(args, slo, engine, model="demo:small"),
                     "vllm-cpu:demo:small", step={"fit": fit, "step_s_batch1": step})
    _size_workload(args, target, slo)
    return args, target, slo


def test_the_default_attainment_sizes_the_rates_on_the_simulator_of_the_measured_step():
    """--default-attainment A: every rate=Kx part scaled by one factor, found where the
    simulator of the measured step (its 2 ms between steps included) puts vLLM's
    default at A within 2 points; a lower share needs a heavier load."""
    from tuned.bench.command import ATTAINMENT_TOLERANCE, _size_for_attainment

    wl = ("phases:poisson:rate=0.9x,prompt=LN(200,120),output=LN(150,100),s=20;"
          "poisson:rate=1.5x,prompt=U(400,800),output=U(16,64),s=8")
    factors = {}
    for share in (0.3, 0.7):
        args, target, slo = _sized_target(wl)
        args.default_attainment = share
        _size_for_attainment(args, target, slo)
        got = target.sized["attainment"]
        assert got["target"] == share and got["gap_s"] == pytest.approx(0.002)
        assert abs(got["predicted"] - share) <= ATTAINMENT_TOLERANCE
        assert target.sized["sized"] == args.workload and "x," not in args.workload
        factors[share] = got["factor"]
    assert factors[0.3] > factors[0.7]
