"""The bench's fair baseline: static (cap, token budget) pairs, the best pair in
hindsight, the ablations that attribute tuned's gain, and the report's words."""

from __future__ import annotations

import pytest

from tuned.bench import report as report_mod
from tuned.bench import runner
from tuned.bench.metrics import RequestResult, Slo, summarize
from tuned.bench.runner import Contender
from tuned.config import validate

SLO = Slo(ttft_s=2.0, tpot_s=0.05)


def _base(**kw):
    raw = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "max_model_len": 1024,
           "tbt_sla_s": 0.05, "eps_d_s": 0.002, "ttft_sla_s": 2.0, "fallback_cap": 4}
    raw.update(kw)
    return validate(raw)


# --- the field --------------------------------------------------------------------------------

def test_pairs_and_ablations_are_named_and_configured():
    field = runner.contenders(_base(), default_seqs=8, default_tokens=2048, caps=[2, 8],
                              budgets=[256, 2048], quick=True)
    by = {c.name: c for c in field}
    # the peers are the runs the policies declare (tuned.policies.catalog): trtllm and
    # sglang, in that order, and any policy added since
    peers = [r.name for r in runner.policy_runs("peer")]
    assert [p for p in peers if p in ("trtllm", "sglang")] == ["trtllm", "sglang"]
    assert [c.name for c in field] == [
        "vllm-default", "static-2@256", "static-2", "static-8@256", *peers,
        "tuned", "tuned-cap-only", "tuned-budget-only", "tuned-queue-only",
        "tuned-guard-only"]
    for name, cap, budget in (("vllm-default", 8, 2048), ("static-2@256", 2, 256),
                              ("static-2", 2, 2048), ("static-8@256", 8, 256)):
        c = by[name]
        assert (c.kind, c.cap, c.budget) == ("static", cap, budget)
        assert (c.config.max_num_seqs, c.config.max_num_batched_tokens) == (cap, budget)
        assert (c.config.batch_policy, c.config.queue_policy, c.config.ttft_sla_s,
                c.config.admission_guard) == ("static", "fcfs", 0.0, "off")

    def knobs(name):
        cfg = by[name].config
        return (cfg.batch_policy, cfg.token_budget_policy, cfg.queue_policy,
                cfg.queue_spec()[1], cfg.ttft_sla_s, cfg.guards_admission,
                cfg.max_num_seqs, cfg.max_num_batched_tokens)

    assert knobs("tuned") == ("tuned", "auto", "fcfs", {"late_after_s": 2.0}, 2.0, True, 8, 2048)
    assert knobs("tuned-cap-only") == ("tuned", "max", "fcfs", {}, 0.0, False, 8, 2048)
    assert knobs("tuned-budget-only") == ("static", "sla", "fcfs", {}, 0.0, False,
                                          8, 2048)
    assert knobs("tuned-queue-only") == ("static", "max", "fcfs", {"late_after_s": 2.0}, 2.0,
                                         False, 8, 2048)
    assert knobs("tuned-guard-only") == ("static", "max", "fcfs", {"late_after_s": 0.0}, 2.0,
                                         True, 8, 2048)
    for name in runner.ABLATIONS:
        assert (by[name].kind, by[name].cap, by[name].budget) == ("ablation", 8, 2048)


def test_a_budget_below_a_cap_is_raised_to_what_vllm_accepts_and_run_once():
    # cap 256 needs 256 + min_chunk_tokens = 288 tokens: the 128 and 256 budgets are both
    # 288, run once under that name
    field = runner.contenders(_base(max_num_seqs=256), default_seqs=256,
                              default_tokens=2048, caps=[256], budgets=[128, 256, 2048],
                              peers=False)
    assert [(c.name, c.budget) for c in field if c.kind == "static"] == [
        ("vllm-default", 2048), ("static-256@288", 288)]


def test_default_budget_grid_per_engine_kind_always_holds_the_default():
    assert runner.sweep_budgets("gpu", 2048) == [512, 1024, 2048, 4096, 8192]
    assert runner.sweep_budgets("gpu", 8192, quick=True) == [512, 2048, 8192]
    assert runner.sweep_budgets("gpu", 3000, quick=True) == [512, 2048, 3000, 8192]
    assert runner.sweep_budgets("cpu", 2048) == [128, 256, 512, 2048]
    assert runner.sweep_budgets("cpu", 2048, quick=True) == [256, 2048]


def test_bad_budgets_name_the_option_and_range():
    with pytest.raises(ValueError) as e:
        runner.contenders(_base(), default_seqs=8, default_tokens=2048, budgets=[0, 512])
    assert str(e.value) == "--budgets: 0 is outside [16, 1048576]"


def test_without_a_ttft_slo_the_queue_ablation_is_not_run():
    field = runner.contenders(_base(ttft_sla_s=0.0), default_seqs=8, default_tokens=2048,
                              caps=[8], budgets=[2048], quick=True)
    assert [c.name for c in field if c.kind == "ablation"] == [
        "tuned-cap-only", "tuned-budget-only", "tuned-guard-only"]


def test_budget_only_holds_the_cap_at_the_ceiling_and_moves_the_budget():
    """On the simulator, tuned-budget-only's cap is the ceiling except where it yields
    to a token budget below it (reason ``budget_room``: vLLM's budget must hold the
    cap's decodes), while its token budget goes below the full one (the SLA bites on
    7B decodes)."""
    from tuned.sim.hardware import resolve_hardware
    from tuned.base.workloads import parse_workload

    hw = resolve_hardware("a100-llama2-7b")
    base = validate({"max_num_seqs": 64, "max_num_batched_tokens": 2048,
                     "max_model_len": 8192, "tbt_sla_s": 0.03, "eps_d_s": 0.001,
                     "num_gpu_blocks": hw.num_gpu_blocks, "log_level": "warning"})
    field = runner.contenders(base, default_seqs=64, default_tokens=2048, caps=[64],
                              budgets=[2048], only=["tuned-budget-only"])
    wl = parse_workload("poisson:rate=20,prompt=U(256,1024),output=U(16,64),n=80", 0)
    out = runner.SimBench(hw).run(field[0], wl.requests)
    assert max(cap for _, cap in out.cap_timeline) == 64
    assert {d["reason"] for d in out.decisions if d["cap"] < 64} <= {"budget_room"}
    assert all(d["token_budget"] > d["cap"] for d in out.decisions)
    budgets = {d["token_budget"] for d in out.decisions if "token_budget" in d}
    assert budgets and min(budgets) < 2048


# --- the best pair in hindsight ----------------------------------------------------------------

def _run(name, kind, goodput_n, ttft, *, cap=None, budget=None, tpot=0.02, n=10,
         extra_done=0, late_ttft=5.0):
    """``n`` requests arriving 0..n-1 s; the first ``goodput_n`` good (TTFT ``ttft``),
    ``extra_done`` more completed late (TTFT ``late_ttft``), the rest refused; every
    run lasts 20 s."""
    results = []
    for i in range(n):
        a = float(i)
        if i < goodput_n + extra_done:
            t1 = a + (ttft if i < goodput_n else late_ttft)
            results.append(RequestResult(f"{name}-{i}", a, 10, 3, t1, t1 + 2 * tpot,
                                         [t1, t1 + tpot, t1 + 2 * tpot]))
        else:
            results.append(RequestResult(f"{name}-{i}", a, 10, 3, None, None,
                                         refused_s=a + 0.1))
    row = report_mod.run_row(Contender(name, kind, None, cap, budget),
                             summarize(results, SLO, duration_s=20.0))
    return row


def test_the_best_pair_is_the_highest_goodput_ties_to_the_lower_ttft_p99():
    runs = [_run("vllm-default", "static", 4, 0.5, cap=8, budget=2048),
            _run("static-4", "static", 6, 0.5, cap=4, budget=2048),
            _run("static-4@256", "static", 7, 1.5, cap=4, budget=256),
            _run("static-8@256", "static", 7, 0.9, cap=8, budget=256),
            _run("static-2@256", "static", 5, 0.1, cap=2, budget=256),
            _run("tuned", "tuned", 8, 1.0)]
    best = report_mod.best_static(runs, None)
    # 7 good at 20 s: 0.35 req/s twice; static-8@256 has the lower TTFT p99
    assert best["by_goodput"] == "static-8@256"
    cap_best = report_mod.best_static(runs, None, budget=2048)
    assert cap_best["by_goodput"] == "static-4"
    rat = report_mod.ratios(runs, best, None, best_cap=cap_best)
    assert rat["goodput_vs_best_static"] == pytest.approx(8 / 7)
    assert rat["goodput_vs_best_cap"] == pytest.approx(8 / 6)
    assert rat["goodput_vs_vllm-default"] == pytest.approx(8 / 4)


def test_repeats_settle_the_best_pair_on_the_mean():
    from tuned.bench.metrics import mean_summary

    a = [summarize([RequestResult("x", 0.0, 1, 1, t, t)], Slo(ttft_s=1.0), duration_s=1.0)
         for t in (0.5, 2.0, 0.5)]                   # good, late, good
    b = [summarize([RequestResult("y", 0.0, 1, 1, 0.5, 0.5)], Slo(ttft_s=1.0),
                   duration_s=d) for d in (1.2, 1.2, 1.2)]
    ma, mb = mean_summary(a), mean_summary(b)
    assert ma["goodput_rps"] == pytest.approx(2 / 3) and ma["repeats"] == 3
    assert ma["goodput_rps_runs"] == [1.0, 0.0, 1.0]
    assert ma["ttft_p99_s"] == pytest.approx(1.0)
    assert mb["goodput_rps"] == pytest.approx(1 / 1.2)
    runs = [report_mod.run_row(Contender("static-1", "static", None, 1, 16), ma),
            report_mod.run_row(Contender("static-2", "static", None, 2, 16), mb)]
    # static-1 had the best single run (1.0 req/s twice); static-2 the best mean
    assert report_mod.best_static(runs, None)["by_goodput"] == "static-2"
    assert mean_summary(a[:1]) == a[0]


# --- the report's words ------------------------------------------------------------------------

def _report(runs, **kw):
    rep = {"engine": "sim", "hardware": "hw", "workload": "w", "seed": 0,
           "slo": str(SLO), "runs": runs}
    rep.update(kw)
    rep["best_static"] = report_mod.best_static(runs, None)
    rep["best_cap"] = report_mod.best_static(runs, None, budget=2048)
    rep["ratios"] = report_mod.ratios(runs, rep["best_static"], None,
                                      best_cap=rep["best_cap"])
    return rep


def _field(tuned_ttft=1.0, cap_moves=0):
    runs = [_run("vllm-default", "static", 4, 0.5, cap=8, budget=2048),
            _run("static-4@256", "static", 6, 0.4, cap=4, budget=256),
            _run("tuned", "tuned", 8, tuned_ttft),
            _run("tuned-cap-only", "ablation", 4, 0.5, cap=8, budget=2048),
            _run("tuned-budget-only", "ablation", 5, 0.5, cap=8, budget=2048),
            _run("tuned-queue-only", "ablation", 7, 0.5, cap=8, budget=2048),
            _run("tuned-guard-only", "ablation", 4, 0.5, cap=8, budget=2048)]
    runs[2].update(cap_moves=cap_moves, cap_min=8 if not cap_moves else 3, cap_max=8)
    return runs


def test_attribution_names_the_closest_ablation_and_each_share():
    att = report_mod.attribution(_field())
    # baseline: the static pair the ablations hold fixed (cap 8, budget 2048)
    assert att["baseline"] == "vllm-default"
    assert att["gain_rps"] == pytest.approx(0.2)     # 8 vs 4 good in 20 s
    assert att["shares"] == pytest.approx({"tuned-cap-only": 0.0, "tuned-budget-only": 0.25,
                                           "tuned-queue-only": 0.75, "tuned-guard-only": 0.0})
    assert att["closest"] == "tuned-queue-only"
    words = report_mod.findings(_report(_field()))
    assert ("tuned's goodput gain over vllm-default (+0.2 req/s) is best matched by "
            "tuned-queue-only (the queue order), 75% of it; tuned-budget-only 25%, "
            "tuned-cap-only 0%, tuned-guard-only 0%.") in words
    runs = _field()
    runs[5] = _run("tuned-queue-only", "ablation", 5, 0.5, cap=8, budget=2048)
    assert ("tuned's goodput gain over vllm-default (+0.2 req/s) is best matched by "
            "tuned-budget-only (the token budget), 25% of it; tuned-queue-only 25%, "
            "tuned-cap-only 0%, tuned-guard-only 0% (alone they add up to 50%: the rest "
            "comes from the levers together).") in report_mod.findings(_report(runs))


def test_no_gain_says_so():
    runs = _field()
    runs[2] = _run("tuned", "tuned", 3, 1.0)
    words = report_mod.findings(_report(runs))
    assert ("tuned's goodput is not above vllm-default's (0.15 vs 0.2 req/s): "
            "there is no gain to attribute.") in words


def test_tail_regression_against_the_best_pair_is_said_in_words():
    # tuned's TTFT is 1.6 s on every good request against the best pair's 0.4 s
    words = report_mod.findings(_report(_field(tuned_ttft=1.6)))
    assert ("Tail regression against the best pair (static-4@256): tuned's TTFT p99 is "
            "4.00x the best pair's.") in words
    level = report_mod.findings(_report(_field(tuned_ttft=0.4)))
    assert ("No tail regression against the best pair (static-4@256): tuned's TTFT p99, "
            "TPOT p99 and throughput are within 5% of it or better.") in level


def test_the_longest_wait_and_waits_past_ten_times_the_ttft_target_are_said():
    runs = _field()
    # tuned: 8 good at TTFT 1 s, and 2 more completed with TTFT 25 s, none refused
    runs[2] = dict(_run("tuned", "tuned", 8, 1.0, extra_done=2, late_ttft=25.0),
                   cap_moves=0, cap_max=8)
    rep = _report(runs, slo_parsed={"ttft_s": 2.0})
    assert ("tuned's longest wait for a first token was 25.00 s (the best pair's 400.0 ms); "
            "2 completed requests waited more than 10x the TTFT target (20.00 s); "
            "0 were refused.") in report_mod.findings(rep)
    vllm = report_mod.findings(_report(_field()))
    assert ("tuned's longest wait for a first token was 1.00 s (the best pair's 400.0 ms); "
            "0 completed requests waited more than 10x the TTFT target; 2 were refused."
            ) in vllm


def test_a_cap_that_never_moved_is_said_with_where_the_gain_came_from():
    words = report_mod.findings(_report(_field(cap_moves=0)))
    assert ("The batch cap never moved (it stayed at 8); the gain came from the queue "
            "order (tuned-queue-only alone: 75%) and the token budget (tuned-budget-only "
            "alone: 25%).") in words
    moved = report_mod.findings(_report(_field(cap_moves=5)))
    assert "The batch cap moved 5 times, between 3 and 8." in moved
    md = report_mod.markdown(_report(_field(cap_moves=0)))
    assert "## What produced the gain" in md
    assert "The batch cap never moved (it stayed at 8)" in md


def test_a_ratio_over_a_zero_is_said_in_words():
    rep = _report(_field(cap_moves=0))
    rep["ratios"] = {"goodput_vs_vllm-default": float("inf"), "goodput_vs_best_static": 1.5,
                     "goodput_vs_best_cap": None}
    md = report_mod.markdown(rep)
    assert "| goodput vs vllm-default | above a zero (the other had none) |" in md
    assert "| goodput vs best_static | 1.5x |" in md
    assert "| goodput vs best_cap | - |" in md


# --- the command -------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, value, message", [
    ("--budgets", "512,big", "tuned bench: --budgets: expected comma-separated whole numbers, "
                             "got '512,big'"),
    ("--budgets", "8", "tuned bench: --budgets: 8 is outside [16, 1048576]"),
    ("--repeats", "0", "tuned bench: --repeats: must be in [1, 100], got 0"),
])
def test_bad_sweep_options_are_refused_in_one_line(tmp_path, capsys, flag, value, message):
    from tuned.commands import cli

    rc = cli.main(["bench", "--engine", "sim", "--hardware", "a100-llama2-7b", "--workload",
                   "poisson:rate=4,prompt=64,output=16,n=12", flag, value,
                   "--out", str(tmp_path)])
    assert rc == 2
    assert capsys.readouterr().err.strip() == message


def test_sim_bench_sweeps_pairs_over_repeats(tmp_path):
    """Two repeats (seeds 0 and 1) of a small pair sweep: each contender's figures are
    the mean of its two runs, each repeat keeps its request log, and the default
    budget is in the sweep beside the one asked for."""
    import csv
    import json

    from tuned.commands import cli

    rc = cli.main(["bench", "--engine", "sim", "--hardware", "a100-llama2-7b",
                   "--workload", "poisson:rate=6,prompt=U(16,512),output=U(16,128),n=40",
                   "--slo", "ttft=2,tpot=0.05", "--caps", "8", "--budgets", "256",
                   "--contenders", "vllm-default,static-8,static-8@256,tuned,tuned-cap-only",
                   "--repeats", "2", "--capacity", "off", "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 0
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["repeats"] == 2 and rep["default_budget"] == 2048
    assert rep["command"].endswith("--repeats 2 --capacity off")
    runs = {r["name"]: r for r in rep["runs"]}
    assert [(n, runs[n].get("cap"), runs[n].get("budget")) for n in runs] == [
        ("vllm-default", 256, 2048), ("static-8@256", 8, 256), ("static-8", 8, 2048),
        ("tuned", None, None), ("tuned-cap-only", 256, 2048)]
    for name, run in runs.items():
        goods = []
        for k, stem in enumerate((name, f"{name}.r1")):
            with open(tmp_path / "logs" / f"{stem}.requests.csv", newline="") as f:
                goods.append(sum(int(r["good"]) for r in csv.DictReader(f)))
        assert run["repeats"] == 2 and len(run["goodput_rps_runs"]) == 2
        assert run["attainment"] == pytest.approx(sum(goods) / 80)
    assert rep["best_static"]["by_goodput"] in ("vllm-default", "static-8", "static-8@256")
    assert rep["best_cap"]["by_goodput"] in ("vllm-default", "static-8")
    assert "goodput_vs_best_cap" in rep["ratios"] and rep["findings"]
    md = (tmp_path / "report.md").read_text()
    assert "- every figure is the mean of 2 repeats" in md
