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
from tuned.workloads import RequestSpec

pytestmark = pytest.mark.usefixtures("quiet_logs")


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
                                                     latency_bins=()))
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
        res = mb.run(seed, quick=quick, bins=(2,), latency_bins=())
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
    from tuned import cli

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


def test_saber_checks_count_mixes():
    def mix(sg, bg, scv, bcv):
        return {"saber_goodput_avg": sg, "best_static_goodput_avg": bg, "saber_cv": scv,
                "best_static_cv": bcv}

    res = {"mixes": {"W1": mix(0.5, 0.4, 0.3, 0.5), "W2": mix(0.9, 0.9, 0.2, 0.1),
                     "W3": mix(0.3, 0.6, 0.1, 0.2)}}
    got = saber.checks(res)
    assert [(c["ours"], c["ok"]) for c in got] == [("2 of 3 (W1, W2)", True),
                                                  ("2 of 3 (W1, W3)", True)]


def test_saber_checks_each_reading_of_the_algorithm_separately():
    def mix(best, best_cv, literal, current):
        return {"best_static_goodput_avg": best, "best_static_cv": best_cv,
                "readings": {"saber": {"goodput_avg": literal[0], "cv": literal[1]},
                             "saber-current": {"goodput_avg": current[0], "cv": current[1]}}}

    res = {"mixes": {"W1": mix(0.5, 0.3, (0.4, 0.2), (0.6, 0.4)),
                     "W2": mix(0.9, 0.2, (0.3, 0.1), (0.9, 0.1)),
                     "W3": mix(0.6, 0.2, (0.2, 0.3), (0.7, 0.1))}}
    got = saber.checks(res)
    assert [(c["figure"].split(":")[0], c["ours"], c["ok"]) for c in got] == [
        ("paper's, as written (recorded speeds)", "0 of 3 (none)", False),
        ("paper's, as written (recorded speeds)", "2 of 3 (W1, W2)", True),
        ("paper's, running requests' current speed", "3 of 3 (W1, W2, W3)", True),
        ("paper's, running requests' current speed", "2 of 3 (W2, W3)", True)]


@pytest.fixture(scope="module")
def saber_quick():
    from tuned import log

    old = structlog.get_config()
    log.configure("warning")
    try:
        return saber.run(0, quick=True, testbed=False)   # the testbed: test_saber_testbed
    finally:
        structlog.configure(**old)


def test_saber_quick_runs_every_mix_and_rate_with_a_fitted_profile(saber_quick):
    res = saber_quick
    prof = res["profile"]
    assert prof["best"] == "usl" and prof["fits"]["usl"]["r2"] > 0.85
    assert prof["v_tok_s"][1] == pytest.approx(94, abs=5)   # A100 7B: one request alone
    for mix in ("W1", "W2", "W3"):
        rows = res["mixes"][mix]["per_rate"]
        assert [r["rps"] for r in rows] == [5.0, 10.0, 20.0]
        for r in rows:
            for c in r["contenders"].values():
                assert 0.0 <= c["goodput"] <= 1.0 and c["unfinished"] == 0
            best = r["contenders"][r["best_static"]]["goodput"]
            assert best == max(r["contenders"][f"static-{k}"]["goodput"]
                               for k in saber.STATIC_CAPS)


@pytest.mark.xfail(strict=True, reason="SABER's Algorithm 1 loses to the best static cap on "
                   "every mix in this simulator, read as written (recorded speeds) or with "
                   "running requests' current speed: its second condition holds the load "
                   "down on this speed curve; without it the policy matches the best static "
                   "(docs/papers.md, saber)")
def test_saber_quick_meets_its_tolerances(saber_quick):
    assert all(c["ok"] for c in saber_quick["checks"])


def test_saber_quick_loses_goodput_because_it_holds_concurrency_down(saber_quick):
    """What the xfail above is about, pinned: at 10 and 20 RPS SABER runs fewer
    requests at once than the best static cap and demotes a large share."""
    for mix in ("W1", "W2", "W3"):
        for r in saber_quick["mixes"][mix]["per_rate"]:
            if r["rps"] < 10:
                continue
            sa, best = r["contenders"]["saber"], r["contenders"][r["best_static"]]
            assert sa["goodput"] < best["goodput"]
            assert sa["mean_running"] < best["mean_running"]
            assert sa["demoted_share"] > 0.25


def test_saber_quick_measures_the_cause_of_the_shortfall(saber_quick):
    res = saber_quick
    # the SLAs re-derived on this testbed the paper's way are Table I's regime
    assert set(res["calibrated_slas_s"]) == {"generation", "qna", "summary", "translation"}
    for task, sla in res["calibrated_slas_s"].items():
        assert 0.5 * res["table1_slas_s"][task] <= sla <= 1.5 * res["table1_slas_s"][task]
    for mix in ("W1", "W2", "W3"):
        s = res["mixes"][mix]
        # without the running-request condition the same policy gains back most of the
        # goodput the published one loses to the best static cap
        assert s["diagnostic_goodput_avg"] > s["saber_goodput_avg"]
        assert (s["best_static_goodput_avg"] - s["diagnostic_goodput_avg"]
                < 0.25 * (s["best_static_goodput_avg"] - s["saber_goodput_avg"]))
        # reading the condition with running requests' current speed recovers part of
        # it, not all: the condition itself, not the recorded value, holds the load
        cur = s["readings"]["saber-current"]["goodput_avg"]
        assert s["saber_goodput_avg"] < cur < s["diagnostic_goodput_avg"]
        for r in s["per_rate"]:
            assert r["best_static"].startswith("static-")
    text = saber.format_table(res)
    assert "note: measured cause: without Algorithm 1's second condition" in text


def test_saber_protect_running_off_checks_only_the_candidates_own_speed():
    from tuned.policies.queues import AdmitContext, ReqInfo
    from tuned.policies.saber import SaberPolicy

    ctx = AdmitContext(now_s=10.0, kv_capacity_tokens=10_000, kv_free_tokens=10_000, cap=64,
                       speed_tok_s=lambda n: 100.0 / n)
    run = ReqInfo("a", 9.0, 10, 100, 100, deadline_s=11.0)     # recorded 100 / 2 = 50 tok/s
    cand = ReqInfo("b", 10.0, 10, 40, 40, deadline_s=11.0)     # needs 40 tok/s; v(2) = 50
    strict, lax = SaberPolicy(), SaberPolicy(protect_running=False)
    for p in (strict, lax):
        p.on_admitted(run, 9.0)
    assert strict.admit(cand, [run], [], ctx).admit is True          # 50 >= 50
    late = ReqInfo("c", 9.5, 10, 60, 60, deadline_s=10.5)            # recorded 60 tok/s
    for p in (strict, lax):
        p.on_admitted(late, 9.5)
    v = strict.admit(cand, [run, late], [], ctx)
    assert v == (False, "saber: v(3) = 33.3 tok/s < required 40.0 tok/s")
    cand2 = ReqInfo("d", 10.0, 10, 20, 20, deadline_s=11.0)          # needs 20 tok/s
    assert strict.admit(cand2, [run, late], [], ctx) == (
        False, "saber: v(3) = 33.3 tok/s would break running c (needs 60.0 tok/s)")
    assert lax.admit(cand2, [run, late], [], ctx).admit is True
    with pytest.raises(ValueError, match="unknown option"):
        SaberPolicy.from_options({"protect": False})
