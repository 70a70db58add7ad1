"""Serving metrics on hand-built request timelines, SLO parsing, capacity search."""

import json
import math
from pathlib import Path

import pytest

from tuned.bench.metrics import (REQUEST_COLUMNS, CapacityResult, RequestResult, Slo, SloSpec,
                                 capacity_search, mean_summary, summarize,
                                 write_requests_csv)


def timeline():
    """Four requests worked out by hand (prompt 10/20/30/40 tokens):

    r1 arrives 0, tokens at 0.5 1.0 1.5 2.0 2.5: TTFT 0.5, E2EL 2.5, TPOT 0.5, ITL 0.5 ×4
    r2 arrives 1, one token at 1.2:                TTFT 0.2, E2EL 0.2, no TPOT, no ITL
    r3 arrives 2, tokens at 4 5 6:                 TTFT 2.0, E2EL 4.0, TPOT 1.0, ITL 1 ×2
    r4 arrives 3, fails at 3.5
    """
    return [
        RequestResult("r1", 0.0, 10, 5, 0.5, 2.5, [0.5, 1.0, 1.5, 2.0, 2.5], preemptions=1,
                      recomputed_tokens=12),
        RequestResult("r2", 1.0, 20, 1, 1.2, 1.2, [1.2]),
        RequestResult("r3", 2.0, 30, 3, 4.0, 6.0, [4.0, 5.0, 6.0], preemptions=2,
                      recomputed_tokens=30),
        RequestResult("r4", 3.0, 40, 0, None, 3.5, failed=True, error="HTTP 500"),
    ]


def test_request_properties():
    r1, r2, r3, r4 = timeline()
    assert (r1.ttft_s, r1.e2e_s, r1.tpot_s, r1.itls_s) == (0.5, 2.5, 0.5, [0.5] * 4)
    assert (r2.ttft_s, r2.e2e_s, r2.tpot_s, r2.itls_s) == (pytest.approx(0.2),
                                                           pytest.approx(0.2), None, [])
    assert (r3.ttft_s, r3.e2e_s, r3.tpot_s, r3.itls_s) == (2.0, 4.0, 1.0, [1.0, 1.0])
    assert (r4.ttft_s, r4.tpot_s, r4.completed, r3.completed) == (None, None, False, True)
    assert RequestResult("x", 0, 1, 3, 1.0, 2.0).itls_s == []


def test_summarize_by_hand():
    s = summarize(timeline(), Slo(ttft_s=1.0, tpot_s=0.6))
    exact = {"submitted": 4, "completed": 3, "failed": 1, "unfinished": 0, "good": 2,
             "duration_s": 6.0, "total_input_tokens": 60, "total_output_tokens": 9,
             "preemptions": 3, "recomputed_tokens": 42, "slo": "ttft=1,tpot=0.6"}
    assert {k: s[k] for k in exact} == exact
    approx = {
        "goodput_rps": 2 / 6, "attainment": 0.5, "request_throughput_rps": 0.5,
        "output_tok_s": 1.5, "total_tok_s": 11.5,
        # ttft sorted [0.2, 0.5, 2.0]: p90 at index 1.8 = 0.5 + 0.8 × 1.5
        "ttft_mean_s": 0.9, "ttft_p50_s": 0.5, "ttft_p90_s": 1.7, "ttft_p99_s": 1.97,
        # tpot over output > 1 only: [0.5, 1.0]
        "tpot_mean_s": 0.75, "tpot_p50_s": 0.75, "tpot_p90_s": 0.95, "tpot_p99_s": 0.995,
        "tpot_std_s": 0.25,
        # itl [0.5 ×4, 1, 1]: p50 at index 2.5, p90 at 4.5
        "itl_mean_s": 4 / 6, "itl_p50_s": 0.5, "itl_p90_s": 1.0, "itl_p99_s": 1.0,
        # e2el sorted [0.2, 2.5, 4.0]
        "e2el_mean_s": 6.7 / 3, "e2el_p50_s": 2.5, "e2el_p90_s": 3.7, "e2el_p99_s": 3.97,
    }
    assert {k: s[k] for k in approx} == pytest.approx(approx)
    json.dumps(s)


@pytest.mark.parametrize("slo, good", [
    (Slo(), 3),                                  # every completed request
    (Slo(tpot_s=0.5), 2),                        # r1 exactly at the SLO counts; r2 has no TPOT
    (Slo(tpot_s=0.49), 1),                       # only the one-token r2 passes
    (Slo(ttft_s=0.2), 1),                        # r2
    (Slo(e2el_s=2.5), 2),                        # r1, r2
    (Slo(ttft_s=3, tpot_s=1, e2el_s=4), 3),
    (Slo(ttft_s=3, tpot_s=1, e2el_s=3.9), 2),
])
def test_goodput_and_attainment(slo, good):
    s = summarize(timeline(), slo)
    assert s["good"] == good
    assert s["goodput_rps"] == pytest.approx(good / 6)
    assert s["attainment"] == good / 4          # the failed request counts against


def test_failed_and_unfinished_requests_are_not_good():
    rs = [RequestResult("a", 0.0, 5, 2, 0.1, 0.2),
          RequestResult("b", 0.0, 5, 2, 0.1, 0.2, failed=True),
          RequestResult("c", 1.0, 5, 1, 1.5, None)]          # cut off: unfinished
    s = summarize(rs, Slo(ttft_s=10))
    assert (s["completed"], s["failed"], s["unfinished"], s["good"]) == (1, 1, 1, 1)
    assert s["duration_s"] == pytest.approx(0.2) and s["attainment"] == pytest.approx(1 / 3)
    assert not Slo().is_good(rs[1]) and not Slo().is_good(rs[2]) and Slo().is_good(rs[0])
    # a completed request without a first-token time cannot show that it met a TTFT SLO
    assert not Slo(ttft_s=1).is_good(RequestResult("d", 0.0, 5, 2, None, 0.5))


def test_duration_override_and_empty_runs():
    s = summarize(timeline(), Slo(ttft_s=1.0), duration_s=10.0)
    assert (s["duration_s"], s["request_throughput_rps"], s["goodput_rps"]) == (10.0, 0.3, 0.2)
    e = summarize([], Slo())
    assert (e["submitted"], e["duration_s"], e["goodput_rps"], e["attainment"],
            e["ttft_p99_s"]) == (0, 0.0, None, None, None)
    with pytest.raises(ValueError, match="duration_s must be a number > 0, got 0"):
        summarize(timeline(), Slo(), duration_s=0)


def test_requests_csv_says_which_slo_each_request_missed(tmp_path):
    """The per-request file of a live bench run: r1 meets TTFT 1 s but not TPOT 0.4 s,
    r2 (one token) has no TPOT, r3 misses TTFT, r4 failed."""
    import csv

    path = tmp_path / "run.requests.csv"
    write_requests_csv(path, timeline(), Slo(ttft_s=1.0, tpot_s=0.4))
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == REQUEST_COLUMNS
        rows = {r["request_id"]: r for r in reader}
    pick = ("arrival_s", "ttft_s", "tpot_s", "met_ttft", "met_tpot", "good", "preemptions")
    assert [tuple(rows[k][c] for c in pick) for k in ("r1", "r2", "r3")] == [
        ("0.000000", "0.500000", "0.500000", "1", "0", "0", "1"),
        ("1.000000", "0.200000", "", "1", "", "1", "0"),
        ("2.000000", "2.000000", "1.000000", "0", "0", "0", "2")]
    assert (rows["r4"]["ttft_s"], rows["r4"]["met_ttft"], rows["r4"]["good"],
            rows["r4"]["error"]) == ("", "", "0", "HTTP 500")
    # r1 = 0.5 s TPOT counted by summarize against a 0.4 s SLO too: the two agree
    assert summarize(timeline(), Slo(ttft_s=1.0, tpot_s=0.4))["good"] == \
        sum(int(r["good"]) for r in rows.values())


# --- Slo.parse ------------------------------------------------------------------------------

def test_slo_parse():
    assert Slo.parse("ttft=2,tpot=0.05") == Slo(ttft_s=2.0, tpot_s=0.05)
    assert Slo.parse(" e2el = 10 , ttft=0.5") == Slo(ttft_s=0.5, e2el_s=10.0)
    assert str(Slo.parse("tpot=0.05,ttft=2,e2el=10")) == "ttft=2,tpot=0.05,e2el=10"
    assert str(Slo()) == "none"


@pytest.mark.parametrize("text, message", [
    ("", "SLO '': expected KEY=SECONDS[,KEY=SECONDS...] with KEY one of ttft, tpot, e2el"),
    ("ttft", "SLO 'ttft': expected KEY=SECONDS with KEY one of ttft, tpot, e2el"),
    ("ttft:2000", "SLO 'ttft:2000': expected KEY=SECONDS with KEY one of ttft, tpot, e2el "
                  "(seconds with '=', not vLLM's KEY:MS)"),
    ("itl=0.1", "SLO key 'itl' is not one of ttft, tpot, e2el"),
    ("ttft=1,ttft=2", "SLO key 'ttft' given twice"),
    ("tpot=fast", "SLO tpot='fast': expected a number of seconds > 0"),
    ("tpot=0", "SLO tpot='0': expected a number of seconds > 0"),
    ("e2el=inf", "SLO e2el='inf': expected a number of seconds > 0"),
    ("ttft=1,", "SLO '': expected KEY=SECONDS with KEY one of ttft, tpot, e2el"),
])
def test_slo_parse_errors(text, message):
    with pytest.raises(ValueError) as e:
        Slo.parse(text)
    assert str(e.value) == message


# --- SLOs relative to the host ---------------------------------------------------------------

def test_slo_spec_takes_multiples_of_the_batch1_step():
    spec = SloSpec.parse("ttft=40x,tpot=2.5x,e2el=30")
    assert spec.relative and spec.multiples == {"ttft": 40.0, "tpot": 2.5}
    assert spec.seconds == {"e2el": 30.0} and str(spec) == "ttft=40x,tpot=2.5x,e2el=30"
    assert spec.resolve(0.04) == Slo(ttft_s=1.6, tpot_s=0.1, e2el_s=30.0)
    assert not SloSpec.parse("ttft=2,tpot=0.05").relative
    assert SloSpec.parse("ttft=2,tpot=0.05").resolve(None) == Slo(ttft_s=2.0, tpot_s=0.05)


@pytest.mark.parametrize("text, message", [
    ("tpot=-1x", "SLO tpot='-1x': expected tpot=MULTIPLEx, a number > 1 times the batch-1 "
                 "decode step (e.g. tpot=2.5x)"),
    ("tpot=abcx", "SLO tpot='abcx': expected tpot=MULTIPLEx, a number > 1 times the batch-1 "
                  "decode step (e.g. tpot=2.5x)"),
    ("tpot=1x", "SLO tpot='1x': expected tpot=MULTIPLEx, a number > 1 times the batch-1 "
                "decode step (e.g. tpot=2.5x)"),
    ("ttft=0x", "SLO ttft='0x': expected ttft=MULTIPLEx, a number > 0 times the batch-1 "
                "decode step (e.g. ttft=40x)"),
    ("tpot=2x,tpot=0.1", "SLO key 'tpot' given twice"),
])
def test_slo_spec_errors(text, message):
    with pytest.raises(ValueError) as e:
        SloSpec.parse(text)
    assert str(e.value) == message


def test_a_relative_slo_needs_a_step_and_stays_below_a_second():
    with pytest.raises(ValueError, match="needs a measured step > 0, got None"):
        SloSpec.parse("tpot=2.5x").resolve(None)
    with pytest.raises(ValueError) as e:
        SloSpec.parse("tpot=2.5x").resolve(0.5)
    assert str(e.value) == ("SLO tpot=2.5x: 1.25 s with a batch-1 step of 0.5 s; must be "
                            "below 1 s")
    with pytest.raises(ValueError) as e:          # Slo.parse takes seconds only
        Slo.parse("tpot=2.5x")
    assert str(e.value) == ("SLO tpot=2.5x: a multiple of the batch-1 step needs a measured "
                            "step (tuned bench); give seconds here")


def test_mean_summary_carries_the_spread_over_repeats():
    s = [{"goodput_rps": g, "ttft_p99_s": t} for g, t in ((1.0, 3.0), (2.0, 2.0), (3.0, 4.0))]
    m = mean_summary(s)
    assert m["goodput_rps"] == 2.0 and m["ttft_p99_s"] == 3.0
    assert (m["goodput_rps_min"], m["goodput_rps_max"]) == (1.0, 3.0)
    assert m["goodput_rps_std"] == pytest.approx(1.0)         # sample sd of 1, 2, 3
    assert m["goodput_rps_runs"] == [1.0, 2.0, 3.0] and m["ttft_p99_s_runs"] == [3.0, 2.0, 4.0]
    assert "goodput_rps_min" not in mean_summary(s[:1])       # one repeat: no spread


# --- capacity -------------------------------------------------------------------------------

def test_capacity_on_a_step():
    res = capacity_search(lambda r: 1.0 if r <= 3.7 else 0.0, 1.0, 2.0)
    assert res.probes == [(1.0, 1.0), (2.0, 1.0), (4.0, 0.0), (3.0, 1.0), (3.5, 1.0),
                          (3.75, 0.0), (3.625, 1.0)]
    assert (res.capacity_rps, res.upper_rps, res.converged) == (3.625, 3.75, True)
    assert 3.7 * 0.95 <= res.capacity_rps <= 3.7
    json.dumps(res.as_dict())


def test_capacity_on_a_smooth_curve():
    def attainment(r):
        return 1 / (1 + (r / 5) ** 4)

    true = 5 * (1 / 9) ** 0.25                  # attainment(true) = 0.9
    res = capacity_search(attainment, 0.5, 10.0, tol_rel=0.01)
    assert res.converged and true * 0.99 <= res.capacity_rps <= true
    assert all(a == attainment(r) for r, a in res.probes)
    assert res.probes[:2] == [(0.5, attainment(0.5)), (10.0, attainment(10.0))]
    assert len(res.probes) <= 2 + 12


def test_capacity_edges():
    res = capacity_search(lambda r: 0.5, 1.0, 2.0)
    assert (res.capacity_rps, res.probes, res.converged) == (0.0, [(1.0, 0.5)], True)
    assert res.reason == "attainment below 0.9 already at lo_rps=1"
    res = capacity_search(lambda r: 1.0, 1.0, 2.0, max_doublings=3)
    assert [r for r, _ in res.probes] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert (res.capacity_rps, res.upper_rps, res.converged) == (16.0, None, False)
    assert res.reason == "attainment still >= 0.9 at 16 req/s after 3 doublings of hi_rps"
    res = capacity_search(lambda r: 1.0 if r < 1.5 else math.nan, 1.0, 2.0, max_iter=2)
    assert [r for r, _ in res.probes] == [1.0, 2.0, 1.5, 1.25]
    assert (res.capacity_rps, res.upper_rps, res.converged) == (1.25, 1.5, False)
    assert res.reason == "max_iter=2 bisection steps spent"
    assert isinstance(res, CapacityResult)
    with pytest.raises(ValueError, match="need 0 < lo_rps < hi_rps, got 2.0, 1.0"):
        capacity_search(lambda r: 1.0, 2.0, 1.0)


def test_sim_bench_writes_each_contenders_requests_csv_agreeing_with_its_report(tmp_path):
    """`tuned bench --engine sim` writes the same per-request file as a live run, one
    per contender, and each file's good requests are the report's attainment."""
    import csv

    from tuned.commands import cli

    rc = cli.main(["bench", "--engine", "sim", "--hardware", "a100-llama2-7b",
                   "--workload", "poisson:rate=8,prompt=U(16,512),output=U(16,256),n=60",
                   "--slo", "ttft=2,tpot=0.05",
                   "--contenders", "tuned,static-8", "--caps", "8", "--capacity", "off",
                   "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "report.json").read_text())
    runs = {r["name"]: r for r in report["runs"]}
    assert sorted(runs) == ["static-8", "tuned"]
    for name, run in runs.items():
        with open(tmp_path / "logs" / f"{name}.requests.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == 60
        good = sum(int(r["good"]) for r in rows)
        assert good / 60 == pytest.approx(run["attainment"], abs=1e-9)


def test_host_drift_tool_at_the_profiles_speed_is_the_bench(tmp_path):
    """tools/host_drift.py with no slowdown and no jitter runs each contender exactly
    as `tuned bench --engine sim` does (same config, same workload, same counts); a
    slower host serves fewer of the default's requests within the SLOs; bad input is
    refused naming the flag. Run as a user runs it, in its own process (it configures
    logging, which must not leak into the other tests)."""
    import csv
    import subprocess
    import sys

    from tuned.commands import cli

    root = Path(__file__).resolve().parents[2]
    tool = [sys.executable, str(root / "tools" / "host_drift.py")]
    profile = str(root / "profiles" / "demo-small-cpu.json")
    wl = "phase-shift:rate=1.2,n=20,scale=0.5"   # the default misses a few
    cfg = tmp_path / "b48.toml"
    cfg.write_text("num_gpu_blocks = 48\nmax_model_len = 1024\n")
    rc = cli.main(["bench", "--engine", "sim", "--profile", profile, "--config", str(cfg),
                   "--workload", wl, "--slo", "ttft=3,tpot=0.05", "--quick",
                   "--contenders", "tuned,vllm-default", "--capacity", "off", "--jobs", "1",
                   "--out", str(tmp_path / "b")])
    assert rc == 0
    bench = {}
    for name in ("tuned", "vllm-default"):
        with open(tmp_path / "b" / "logs" / f"{name}.requests.csv", newline="") as f:
            bench[name] = sum(int(r["good"]) for r in csv.DictReader(f))
    assert bench["vllm-default"] < 60       # a case with misses, not all-good on both
    out = subprocess.run(tool + ["--profile", profile, "--workload", wl, "--seeds", "0",
                                 "--slow", "1,3", "--sigma", "0",
                                 "--contenders", "tuned,vllm-default"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == (f"seed=0 slow=1 vllm-default={bench['vllm-default']} "
                        f"tuned={bench['tuned']}")
    slow = dict(kv.split("=") for kv in lines[1].split()[2:])
    assert int(slow["vllm-default"]) < bench["vllm-default"]
    bad = subprocess.run(tool + ["--profile", profile, "--slow", "fast"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert bad.stderr.strip() == "--slow: a comma-separated list of numbers, got 'fast'"


# --- refusals and time to first response -----------------------------------------------------

def refusal_timeline():
    """r1 served (TTFT 0.5), r2 served late (TTFT 25 s), r3 refused 0.25 s after it
    arrived, r4 failed, r5 unfinished. First responses: 0.5, 25, 0.25."""
    return [RequestResult("r1", 0.0, 10, 2, 0.5, 1.0, [0.5, 1.0]),
            RequestResult("r2", 1.0, 10, 2, 26.0, 26.5, [26.0, 26.5]),
            RequestResult("r3", 2.0, 10, 2, None, None, refused_s=2.25),
            RequestResult("r4", 3.0, 10, 0, None, 3.5, failed=True, error="HTTP 500"),
            RequestResult("r5", 4.0, 10, 2, None, None)]


def test_refused_requests_are_counted_and_never_good():
    rs = refusal_timeline()
    assert (rs[2].refused, rs[2].completed, rs[2].first_response_s) == (True, False, 0.25)
    assert not Slo().is_good(rs[2])
    # a refused request is refused even if a server sent a token first
    odd = RequestResult("x", 0.0, 1, 1, 0.1, 0.2, refused_s=0.3)
    assert not odd.completed and not Slo().is_good(odd)
    s = summarize(rs, Slo(ttft_s=2.0))
    assert {k: s[k] for k in ("submitted", "completed", "failed", "refused", "unfinished",
                              "good")} == {"submitted": 5, "completed": 2, "failed": 1,
                                           "refused": 1, "unfinished": 1, "good": 1}
    assert s["attainment"] == pytest.approx(1 / 5)


def test_first_response_and_the_longest_wait_by_hand():
    s = summarize(refusal_timeline(), Slo(ttft_s=2.0, tpot_s=1.0))
    # first responses [0.25, 0.5, 25]: p50 0.5, p90 at index 1.8 = 0.5 + 0.8 * 24.5
    assert {k: s[k] for k in ("first_response_mean_s", "first_response_p50_s",
                              "first_response_p90_s", "first_response_p99_s",
                              "max_wait_s")} == pytest.approx(
        {"first_response_mean_s": 25.75 / 3, "first_response_p50_s": 0.5,
         "first_response_p90_s": 20.1, "first_response_p99_s": 24.51, "max_wait_s": 25.0})
    # r2 waited 25 s > 10 x 2 s
    assert s["waits_over_10x_ttft"] == 1
    assert summarize(refusal_timeline(), Slo(ttft_s=3.0))["waits_over_10x_ttft"] == 0
    assert summarize(refusal_timeline(), Slo(tpot_s=1.0))["waits_over_10x_ttft"] is None
    # the run lasts until the last answer, a refusal included
    late_refusal = refusal_timeline()[:3] + [RequestResult("r6", 5.0, 1, 1, None, None,
                                                           refused_s=40.0)]
    assert summarize(late_refusal, Slo())["duration_s"] == 40.0


def test_requests_csv_marks_refusals():
    import csv
    import io

    from tuned.bench.metrics import request_rows

    rows = {r["request_id"]: r for r in request_rows(refusal_timeline(), Slo(ttft_s=2.0))}
    assert (rows["r3"]["refused"], rows["r3"]["first_response_s"], rows["r3"]["good"]) == \
        ("1", "0.250000", 0)
    assert (rows["r1"]["refused"], rows["r1"]["first_response_s"]) == ("0", "0.500000")
    assert rows["r5"]["first_response_s"] == ""
    buf = io.StringIO()
    csv.DictWriter(buf, fieldnames=REQUEST_COLUMNS).writerows(rows.values())


def test_sim_results_carry_the_simulators_refusals():
    """A simulated request the queue refused (``refused_s`` on the simulator's request)
    is a refusal in the bench's results; a simulator without the attribute refuses
    nothing."""
    from types import SimpleNamespace

    from tuned.bench.runner import results_from_sim

    def req(rid, **kw):
        d = dict(request_id=rid, arrival_time=1.0, num_prompt_tokens=8, num_output_tokens=2,
                 first_token_s=None, finish_s=None, token_times=None, preemptions=0,
                 recomputed_tokens=0)
        d.update(kw)
        return SimpleNamespace(**d)

    res = SimpleNamespace(failed=[], requests=[
        req("a", refused_s=1.5),
        req("b", first_token_s=1.2, finish_s=1.4, token_times=[1.2, 1.4])])
    a, b = results_from_sim(res)
    assert (a.refused, a.refused_s, a.first_response_s, a.completed) == (True, 1.5, 0.5, False)
    assert (b.refused, b.completed) == (False, True)
    s = summarize([a, b], Slo(ttft_s=1.0))
    assert (s["refused"], s["good"], s["unfinished"]) == (1, 1, 0)


def test_the_longest_silence_counts_only_while_a_request_is_in_flight():
    """No stream's token for a while counts as silence only while some request is
    in flight (arrived, its last token still to come): an idle engine between two
    requests is not a stall, and a lone prefill is the request's TTFT."""
    from tuned.bench.metrics import longest_silence

    def req(i, arrival, times):
        return RequestResult(f"r{i}", arrival, 10, len(times), times[0], times[-1],
                             token_times_s=times)

    # idle from 0.3 to 5.0 (nothing in flight), then r1's TTFT of 0.4 s
    assert longest_silence([req(0, 0.0, [0.1, 0.2, 0.3]),
                            req(1, 5.0, [5.4, 5.5])]) == (pytest.approx(0.4), 5.0)
    # r1 waits from 0.25 while r0 decodes until 0.3: silent from r0's last token
    assert longest_silence([req(0, 0.0, [0.1, 0.2, 0.3]),
                            req(1, 0.25, [2.0, 2.1])]) == (pytest.approx(1.7), 0.3)
    # a failed request has no token times: it neither counts nor breaks the reading
    failed = RequestResult("f", 0.0, 10, 0, None, None, failed=True)
    assert longest_silence([failed]) is None
    assert longest_silence([failed, req(0, 1.0, [1.5, 1.6])]) == (pytest.approx(0.5), 1.0)


def test_a_phased_run_is_counted_phase_by_phase_and_averaged_over_repeats():
    """Per phase, in arrival order: good (both SLOs), served, refused, the p99 time
    to a first response and to a refusal; repeats average phase by phase."""
    from tuned.bench.metrics import mean_summary, phase_counts, summarize

    slo = Slo(ttft_s=1.0, tpot_s=0.5)
    rs = [RequestResult("a", 0.0, 5, 3, 0.5, 1.0),                 # good
          RequestResult("b", 0.5, 5, 3, 2.0, 2.5),                 # late: served, not good
          RequestResult("c", 10.0, 5, 3, None, None, refused_s=10.75),
          RequestResult("d", 11.0, 5, 3, 11.25, 11.75),            # good
          RequestResult("e", 12.0, 5, 0, None, 12.5, failed=True)]
    phase_of = {"a": "burst", "b": "burst", "c": "light", "d": "light", "e": "light"}
    rows = phase_counts(rs, slo, phase_of)
    assert [(r["name"], r["n"], r["good"], r["served"], r["refused"]) for r in rows] == [
        ("burst", 2, 1, 2, 0), ("light", 3, 1, 1, 1)]
    assert rows[0]["refusal_p99_s"] is None
    assert rows[1]["refusal_p99_s"] == pytest.approx(0.75)
    assert rows[0]["first_response_p99_s"] == pytest.approx(1.49)    # of 0.5 and 1.5
    one = summarize(rs, slo, phase_of=phase_of)
    assert one["phases"] == rows
    assert "phases" not in summarize(rs, slo)                          # no phases asked
    assert "phases" not in summarize(rs, slo, phase_of={"a": None})   # none named
    other = summarize(rs[:2] + [RequestResult("c", 10.0, 5, 3, 10.5, 11.0)] + rs[3:], slo,
                      phase_of=phase_of)
    mean = mean_summary([one, other])["phases"]
    assert [(r["name"], r["good"], r["refused"]) for r in mean] == [
        ("burst", 1.0, 0.0), ("light", 1.5, 0.5)]
    assert mean[1]["refusal_p99_s"] is None            # one repeat refused none


def test_the_report_gives_each_phase_and_its_best_static_setting():
    from tuned.bench.report import phase_best_static, phase_table

    def run(name, kind, goods):
        return {"name": name, "kind": kind, "phases": [
            {"name": ph, "n": 10, "good": g, "served": 10 - r, "refused": r,
             "first_response_p99_s": 1.5, "refusal_p99_s": 0.5 if r else None}
            for ph, (g, r) in zip(("chat1", "long", "chat2"), goods)]}

    runs = [run("vllm-default", "static", [(7, 0), (1, 0), (6, 0)]),
            run("static-8@256", "static", [(9, 0), (0, 0), (2, 0)]),
            run("tuned", "tuned", [(9, 0), (3, 4), (10, 0)])]
    assert phase_best_static(runs) == [
        {"name": "chat1", "run": "static-8@256", "good": 9},
        {"name": "long", "run": "vllm-default", "good": 1},
        {"name": "chat2", "run": "vllm-default", "good": 6}]
    lines = phase_table(runs)
    assert lines[5] == "| run | chat1 | long | chat2 |"
    assert lines[9] == ("| tuned | 9 / 10 / 0 of 10; 1.50 s, - | 3 / 6 / 4 of 10; 1.50 s, "
                        "500.0 ms | 10 / 10 / 0 of 10; 1.50 s, - |")
    assert lines[-1] == ("| best static of the phase | static-8@256: 9 good | "
                         "vllm-default: 1 good | vllm-default: 6 good |")
    assert phase_table([{"name": "x", "kind": "static"}]) == []
