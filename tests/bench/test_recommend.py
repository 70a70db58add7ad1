"""``tuned recommend``: the flags it prints first are the best static pair of its
JSON table and of ``tuned bench --engine sim`` on the same workload, SLO, seeds and
sweep; bad input is one line naming the flag, exit 2."""

from __future__ import annotations

import json
import re

import pytest

from fakes import run_main

#: a small phase shift (chat, then long prompts) that loads an A100 near the SLO's
#: edge: the pairs differ, and vLLM's default misses the TPOT SLO in the long phase
WORKLOAD = ("phases:poisson:rate=40,prompt=U(32,128),output=U(32,96),n=120;"
            "poisson:rate=20,prompt=U(300,700),output=U(16,48),n=60")
SWEEP = ["--hardware", "a100-llama2-7b", "--workload", WORKLOAD, "--sla", "ttft=2,tpot=0.05",
         "--seed", "0", "--caps", "8,16,32", "--budgets", "512,2048", "--jobs", "1"]
FLAGS = re.compile(r"--max-num-seqs (\d+) --max-num-batched-tokens (\d+)")


@pytest.fixture(scope="module")
def recommended(tmp_path_factory):
    path = tmp_path_factory.mktemp("rec") / "rec.json"
    code, out, err = run_main(["recommend", *SWEEP, "--seeds", "2", "--json", str(path)])
    assert code == 0, err
    return out, json.loads(path.read_text())


def test_the_first_line_is_the_json_best_pair_as_vllm_flags(recommended):
    out, rec = recommended
    first = out.splitlines()[0]
    m = FLAGS.fullmatch(first)
    assert m, first
    seqs, tokens = int(m.group(1)), int(m.group(2))
    best = rec["best"]
    assert (seqs, tokens) == (best["max_num_seqs"], best["max_num_batched_tokens"]) == (32, 512)
    assert rec["flags"] == first
    # vLLM's own parser takes the line as its two engine arguments
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(first.split())
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (32, 512)


def test_the_best_pair_heads_the_table_by_mean_goodput(recommended):
    _, rec = recommended
    pairs = rec["pairs"]
    assert [p["name"] for p in pairs] == ["static-32@512", "static-32", "vllm-default",
                                          "static-16@512", "static-16", "static-8@512",
                                          "static-8"]
    goodput = [p["goodput_rps"]["mean"] for p in pairs]
    assert goodput == sorted(goodput, reverse=True)
    assert pairs[0] == rec["best"]
    assert rec["vllm_default"]["max_num_seqs"] == 256
    assert rec["vllm_default"]["max_num_batched_tokens"] == 2048
    # every figure is a mean inside its range over the two seeds
    for p in pairs + [rec["tuned"]]:
        g = p["goodput_rps"]
        assert g["min"] <= g["mean"] <= g["max"]
    # caps 8 and 16 keep under half the best pair's goodput on seed 0: they run there only
    assert [p["seeds_run"] for p in pairs] == [2, 2, 2, 1, 1, 1, 1]
    assert rec["seeds"] == [0, 1]
    assert (rec["sweep"]["runs"], rec["sweep"]["first_seed_only"]) == (12, 4)
    assert rec["tuned"]["seeds_run"] == 2
    assert rec["tuned"]["goodput_vs_best"] == pytest.approx(
        rec["tuned"]["goodput_rps"]["mean"] / rec["best"]["goodput_rps"]["mean"])


def test_the_pair_is_bench_s_best_static_pair_with_the_same_goodput(recommended, tmp_path):
    _, rec = recommended
    code, _, err = run_main(["bench", "--engine", "sim", *SWEEP, "--repeats", "2", "--quick",
                             "--capacity", "off", "--out", str(tmp_path)])
    assert code == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    best = report["best_static"]["by_goodput"]
    assert best == rec["best"]["name"] == "static-32@512"
    runs = {r["name"]: r for r in report["runs"]}
    assert runs[best]["goodput_rps"] == pytest.approx(rec["best"]["goodput_rps"]["mean"],
                                                      rel=1e-12)
    assert runs["tuned"]["goodput_rps"] == pytest.approx(rec["tuned"]["goodput_rps"]["mean"],
                                                         rel=1e-12)


def _hardware_names() -> str:
    from tuned.sim.gpu import HARDWARE

    return ", ".join(HARDWARE)


@pytest.mark.parametrize("argv, line", [
    (["--sla", "ttft=2,tpot=50"], "--sla: SLO tpot=50: must be below 1 s (probably "
     "milliseconds: the SLA is in seconds, 50 ms is 0.05)"),
    (["--slo", "ttft=2,tpot"], "--sla: SLO 'tpot': expected KEY=SECONDS with KEY one of "
     "ttft, tpot, e2el"),
    (["--hardware", "b200-llama2-7b"], None),
    (["--workload", "nonsense"], "workload 'nonsense': unknown kind 'nonsense' (allowed: "
     "trace, poisson, gamma, saber, lmsys, phases, phase-shift)"),
    (["--seeds", "0"], "--seeds: must be in [1, 100], got 0"),
    (["--caps", "4,x"], "--caps: expected comma-separated whole numbers, got '4,x'"),
    (["--json", "/nonexistent/dir/r.json"], "--json /nonexistent/dir/r.json: must be a file "
     "in an existing, writable folder"),
])
def test_bad_input_is_one_line_naming_the_flag_and_exit_2(argv, line):
    base = ["--hardware", "a100-llama2-7b", "--workload", WORKLOAD]
    for flag in argv[::2]:      # the bad value replaces the good one
        if flag in base:
            i = base.index(flag)
            del base[i:i + 2]
    code, out, err = run_main(["recommend", *base, *argv])
    if line is None:
        line = f"unknown hardware 'b200-llama2-7b'; known: {_hardware_names()}"
    assert (code, out, err) == (2, "", f"tuned recommend: {line}\n")
