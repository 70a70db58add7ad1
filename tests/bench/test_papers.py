"""`tuned bench --paper NAME`: the dispatcher, its files and exit codes, and
the saber scenario against its tolerances (multibin, mcsf, pang and bucketserve:
their own test_paper_*.py)."""

import io
import json
from pathlib import Path

import pytest
import structlog

from tuned.bench import papers
from tuned.bench.metrics import RequestResult
from tuned.bench.papers import mcsf_checks, run_paper
from tuned.bench.papers import multibin as mb
from tuned.bench.papers import pang, saber
from tuned.base.workloads import RequestSpec

# every test here starts no engine: tools/test.sh runs the slow ones on every core
pytestmark = [pytest.mark.usefixtures("quiet_logs"), pytest.mark.simulation]


# ------------------------------------------------------------------ dispatcher

def test_unknown_scenario_is_a_usage_error_naming_the_known_ones(tmp_path):
    err = io.StringIO()
    rc = run_paper("orca", tmp_path / "out", quick=True, seed=0, stdout=io.StringIO(),
                   stderr=err)
    assert rc == 2
    assert err.getvalue().strip() == ("tuned bench: unknown paper scenario 'orca' "
                                      "(known: multibin, mcsf, pang, saber, bucketserve)")
    assert not (tmp_path / "out").exists()


def test_every_scenario_module_has_run_and_format_table():
    import importlib

    for name, (module, paper) in papers.SCENARIOS.items():
        mod = importlib.import_module(module)
        assert callable(mod.run) and callable(mod.format_table), name
        assert paper.startswith(("000_", "001_", "002_", "003_", "004_"))


def test_run_paper_writes_json_and_markdown_and_returns_0(tmp_path):
    out = io.StringIO()
    rc = run_paper("multibin", tmp_path, quick=True, seed=3, stdout=out,
                   runner=lambda seed, quick: mb.run(seed, quick=quick, bins=(1, 2),
                                                     latency_bins=(), section6_bins=()))
    assert rc == 0
    data = json.loads((tmp_path / "paper-multibin.json").read_text())
    assert data["passed"] is True and data["seed"] == 3 and data["quick"] is True
    assert [r["k"] for r in data["rows"]] == [1, 2]
    assert all(c["ok"] for c in data["checks"]) and len(data["checks"]) == 4
    md = (tmp_path / "paper-multibin.md").read_text()
    assert md.startswith("# tuned bench --paper multibin\n")
    assert "| figure | ours | paper |\n|---|---|---|\n| k=1 throughput, steady" in md
    assert md.rstrip().endswith("All figures within tolerance.")
    text = out.getvalue()
    assert "figure | ours | paper" in text and "c_max = B / ((l_max + l_min)/2) | 12.190" in text
    assert text.rstrip().endswith("All figures within tolerance.")


def test_run_paper_returns_1_and_names_the_figure_out_of_tolerance(tmp_path):
    def strict(seed, quick):
        res = mb.run(seed, quick=quick, bins=(2,), latency_bins=(), section6_bins=())
        res["tolerance"] = 1e-9      # no simulation is that exact
        res["checks"] = mb.checks(res)
        return res

    out = io.StringIO()
    rc = run_paper("multibin", tmp_path, quick=True, seed=0, stdout=out, runner=strict)
    assert rc == 1
    data = json.loads((tmp_path / "paper-multibin.json").read_text())
    assert data["passed"] is False
    assert [c["ok"] for c in data["checks"]] == [False, True]
    last = out.getvalue().rstrip().splitlines()[-1]
    assert last.startswith("Out of tolerance: k=2 steady throughput / Theorem 4.2 = 0.99")
    assert last.endswith("(target 1 ± 1e-09).")
    assert "FAILED" in (tmp_path / "paper-multibin.md").read_text()


def test_mcsf_checks_use_the_papers_own_range_of_ratios():
    def model(avg, bench, proven, paper, n=5):
        return {"algorithms": {"MC-SF": {"avg": avg}, "MC-Benchmark": {"vs_mcsf": bench}},
                "paper": paper, "ip": {"proven_optimal": proven, "instances": n}}

    from tuned.bench.papers.mcsf import PAPER_FIGURES
    res = {"models": {"all_at_once": model(1.070, 1.3, 5, PAPER_FIGURES["all_at_once"]),
                      "online": model(1.23, 0.99, 4, PAPER_FIGURES["online"])}}
    checks = mcsf_checks(res)
    assert [(c["figure"], c["ok"]) for c in checks] == [
        ("all_at_once MC-SF latency/OPT avg", True),
        ("all_at_once MC-Benchmark latency / MC-SF's", True),
        ("all_at_once IP proven optimal", True),
        ("online MC-SF latency/OPT avg", False),
        ("online MC-Benchmark latency / MC-SF's", False),
        ("online IP proven optimal", False)]
    assert checks[3]["target"] == "in [1, 1.227] (paper's range, avg 1.047)"
    assert checks[5]["ours"] == "4/5"


def test_mcsf_dispatch_serialises_its_dataclasses(tmp_path):
    from tuned.bench.papers import mcsf

    out = io.StringIO()
    rc = run_paper("mcsf", tmp_path, quick=True, seed=0, stdout=out,
                   runner=lambda seed, quick: mcsf.run(seed, instances=1, table1_seeds=0))
    data = json.loads((tmp_path / "paper-mcsf.json").read_text())
    assert data["sizes"]["memory_tokens"] == [11, 17]       # the Sizes dataclass, as a dict
    assert {c["figure"] for c in data["checks"]} == {
        "all_at_once MC-SF latency/OPT avg", "all_at_once IP proven optimal",
        "all_at_once MC-Benchmark latency / MC-SF's", "online MC-Benchmark latency / MC-SF's",
        "online MC-SF latency/OPT avg", "online IP proven optimal"}
    assert rc == (0 if data["passed"] else 1)
    assert "tolerance all_at_once IP proven optimal | 1/1 | 1/1 | ok" in out.getvalue()


def test_cli_dispatches_paper_to_run_paper(tmp_path, monkeypatch):
    from tuned.commands import cli

    seen = {}

    def fake(name, out_dir, *, quick, seed, data_dir):
        seen.update(name=name, out_dir=out_dir, quick=quick, seed=seed, data_dir=data_dir)
        return 1

    monkeypatch.setattr(papers, "run_paper", fake)
    rc = cli.main(["bench", "--paper", "saber", "--out", str(tmp_path), "--quick",
                   "--seed", "7"])
    assert rc == 1
    assert seen == {"name": "saber", "out_dir": tmp_path, "quick": True, "seed": 7,
                    "data_dir": None}
    cli.main(["bench", "--paper", "pang", "--out", str(tmp_path), "--data-dir", "tables"])
    assert seen["data_dir"] == Path("tables")


def test_data_dir_reaches_the_scenario_and_is_refused_where_unused(tmp_path, monkeypatch):
    seen, err = {}, io.StringIO()

    def runner(seed, *, quick, data_dir):
        seen["data_dir"] = data_dir
        return {"checks": []}

    monkeypatch.setattr(pang, "format_table", lambda result: "table")
    rc = papers.run_paper("pang", tmp_path, quick=True, seed=0, runner=runner,
                          data_dir=Path("tables"), stdout=io.StringIO())
    assert (rc, seen) == (papers.EXIT_OK, {"data_dir": Path("tables")})
    rc = papers.run_paper("multibin", tmp_path, quick=True, seed=0, runner=runner,
                          data_dir=Path("tables"), stderr=err)
    assert rc == papers.EXIT_USAGE
    assert err.getvalue() == ("tuned bench: --data-dir: paper multibin reads no operator "
                              "tables (it applies to pang, saber, bucketserve, mcsf)\n")


def test_markdown_turns_pipe_runs_into_tables():
    md = papers.markdown("x", "title line\nfigure | ours | paper\na | 1 | 2\nnote\n"
                              "tolerance a | 1 | >= 0 | ok", [])
    assert md.splitlines() == [
        "# tuned bench --paper x", "", "title line", "",
        "| figure | ours | paper |", "|---|---|---|", "| a | 1 | 2 |", "",
        "note", "",
        "| figure | ours | target | verdict |", "|---|---|---|---|",
        "| tolerance a | 1 | >= 0 | ok |", "",
        "All figures within tolerance."]


# ------------------------------------------------------------------ saber

def _result(rid, arrival, finish, failed=False):
    return RequestResult(rid, arrival, 10, 5, arrival + 0.1 if finish else None, finish,
                         failed=failed)


def test_goodput_by_deadline_counts_each_request_against_its_own_deadline():
    specs = [RequestSpec("a", 0.0, 10, 5, 5, "qna", 1.0),
             RequestSpec("b", 1.0, 10, 5, 5, "translation", 12.0),
             RequestSpec("c", 2.0, 10, 5, 5, "qna", 1.0),
             RequestSpec("d", 3.0, 10, 5, 5, None, None),
             RequestSpec("e", 4.0, 10, 5, 5, "qna", 1.0)]
    results = [_result("a", 0.0, 1.0),        # exactly on its deadline: good
               _result("b", 1.0, 12.5),       # 11.5 s of 12: good
               _result("c", 2.0, 3.5),        # 1.5 s of 1: late
               _result("d", 3.0, 100.0),      # no deadline, completed: good
               _result("e", 4.0, None)]       # unfinished
    assert saber.goodput_by_deadline(results, specs) == pytest.approx(3 / 5)
    assert saber.completion_ratios(results, specs) == pytest.approx([1.0, 11.5 / 12, 1.5])
    assert saber.goodput_by_deadline([], specs) is None


def test_cv_is_population_sigma_over_mean():
    assert saber.cv([1.0, 3.0]) == pytest.approx(0.5)
    assert saber.cv([2.0]) is None


def _mix(best, **goodput):
    return {"best_static_goodput_avg": best,
            "readings": {k.replace("_", "-"): {"goodput_avg": g, "cv": None}
                         for k, g in goodput.items()}}


def test_saber_checks_the_shipped_reading_against_the_papers_direction():
    res = {"mixes": {"W1": _mix(0.50, saber=0.51, saber_recorded=0.2),
                     "W2": _mix(0.90, saber=0.834, saber_recorded=0.95),
                     "W3": _mix(0.60, saber=0.60, saber_recorded=0.9)}}
    got = saber.checks(res)
    assert [(c["figure"].split(": ")[1], c["ours"], c["target"].split(" (")[0], c["ok"])
            for c in got] == [
        ("W1 goodput gain over best static, mean over RPS (points)", "+1.0", "> 0", True),
        ("W2 goodput gain over best static, mean over RPS (points)", "-6.6", ">= -6.7", True),
        ("W3 goodput gain over best static, mean over RPS (points)", "+0.0", "> 0", False)]
    assert all(c["figure"].startswith("paper's, as executed") for c in got)
    res["mixes"]["W2"] = _mix(0.90, saber=0.832)
    assert [c["ok"] for c in saber.checks(res)] == [True, False, False]


def test_saber_per_task_average_run_is_not_capped_at_the_exact_length():
    from tuned.base.workloads import SABER_TASKS

    specs = [RequestSpec("a", 0.0, 100, 20, 20, "generation", 8.0),
             RequestSpec("b", 0.1, 4000, 200, 200, "qna", 1.0)]
    got, hints = saber.task_average(specs)
    assert [(r.max_tokens, r.output_tokens) for r in got] == [(3996, 20), (200, 200)]
    assert hints == {"a": {"tuned_output_tokens": round(SABER_TASKS["generation"].output_mean)},
                     "b": {"tuned_output_tokens": round(SABER_TASKS["qna"].output_mean)}}


def test_saber_hints_reach_the_policy_uncapped(tmp_path, monkeypatch):
    """The per-task average run's hint is what SABER plans with, above the exact length."""
    from tuned.curves.profile import save_profile
    from tuned.policies.saber import SaberPolicy
    from tuned.sim.hardware import gpu_hardware

    hw = gpu_hardware(saber.HARDWARE)
    seen = {}
    real = SaberPolicy.admit

    def spy(self, cand, running, admitted, ctx):
        seen[cand.request_id] = (cand.max_tokens, self.remaining_tokens(cand))
        return real(self, cand, running, admitted, ctx)

    monkeypatch.setattr(SaberPolicy, "admit", spy)
    prof = saber.speed_profile(hw, 0, levels=(1, 2, 4))
    save_profile(prof, str(tmp_path / "p.json"))
    specs = [RequestSpec("a", 0.0, 50, 20, 20, "generation", 8.0)]
    avg, hints = saber.task_average(specs)
    cfg = saber._saber_config(hw, str(tmp_path / "p.json"), use_predicted=True)
    out = saber._one(cfg, hw, avg, hints)
    assert out["goodput"] == 1.0
    assert seen == {"a": (saber.MAX_MODEL_LEN - 50, hints["a"]["tuned_output_tokens"])}


def test_saber_pooled_cv_is_over_every_request():
    rows = [{"ratio_mean": 1.0, "ratio_n": 2, "ratio_sumsq": 1.0 + 1.0},      # 1, 1
            {"ratio_mean": 3.0, "ratio_n": 2, "ratio_sumsq": 4.0 + 16.0}]     # 2, 4
    # requests 1, 1, 2, 4: mean 2, population sigma sqrt(1.5)
    assert saber.pooled_cv(rows) == pytest.approx(1.5 ** 0.5 / 2)
    assert saber.cv([1.0, 3.0]) == pytest.approx(0.5)     # per-RPS means: the figure


@pytest.fixture(scope="module")
def saber_quick():
    from tuned.base import log

    old = structlog.get_config()
    log.configure("warning")
    try:
        # the testbed: test_saber_testbed; the authors' set-up: test_paper_saber
        return saber.run(0, quick=True, testbed=False, authors=False)
    finally:
        structlog.configure(**old)


@pytest.mark.slow  # the quick plan: about a minute of simulation (22 contenders)
def test_saber_quick_runs_every_mix_and_rate_with_a_fitted_profile(saber_quick):
    res = saber_quick
    prof = res["profile"]
    assert prof["best"] == "usl" and prof["fits"]["usl"]["r2"] > 0.85
    assert prof["v_tok_s"][1] == pytest.approx(94, abs=5)   # A100 7B: one request alone
    for mix in ("W1", "W2", "W3"):
        rows = res["mixes"][mix]["per_rate"]
        assert [r["rps"] for r in rows] == [5.0, 10.0, 20.0]
        for r in rows:
            assert len(r["contenders"]) == 10 + 4 + 5 + 3
            for c in r["contenders"].values():
                assert 0.0 <= c["goodput"] <= 1.0 and c["unfinished"] == 0
            best = r["contenders"][r["best_static"]]["goodput"]
            assert best == max(r["contenders"][f"static-{k}"]["goodput"]
                               for k in saber.STATIC_CAPS)


@pytest.mark.slow
def test_saber_quick_meets_its_tolerances(saber_quick):
    """The shipped reading (as executed, window 16) gains on W1 and W3 and stays within
    the paper's W2 spread; the full run agrees in direction (docs/papers.md, saber)."""
    assert [c["ok"] for c in saber_quick["checks"]] == [True, True, True]
    mixes = saber_quick["mixes"]
    assert saber.gain_points(mixes["W1"]) > 5 and saber.gain_points(mixes["W3"]) > 0


@pytest.mark.slow
def test_saber_quick_readings_side_by_side(saber_quick):
    """Pinned: the recorded reading ratchets concurrency down and loses on every mix;
    the current reading loses less; as executed equals no second clause here (the
    profile never predicts below 1 tok/s)."""
    for mix, s in saber_quick["mixes"].items():
        g = {name: saber.gain_points(s, name) for name in saber.READINGS}
        assert g["saber-recorded"] < g["saber-current"] <= g["saber"], mix
        assert g["saber-recorded"] < -10, mix
        assert s["readings"]["saber"] == s["readings"]["saber-off"], mix
        for r in s["per_rate"]:
            if r["rps"] >= 10:
                c = r["contenders"]
                assert c["saber-recorded"]["mean_running"] < c["saber"]["mean_running"]
    text = saber.format_table(saber_quick)
    assert ("W1 / W2 / W3 goodput gain over best static per RPS, mean over RPS (points), "
            "line 10 as executed (any() is a boolean), the shipped default (checked) | ") in text
    assert "gain (points) by admission window" in text
    assert "CV investigation" in text


