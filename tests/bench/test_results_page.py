"""tools/results.py: docs/results.md written from hand-built ``tuned bench`` report folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import load_tool
from tuned.bench import report as report_mod


@pytest.fixture(scope="module")
def results():
    return load_tool("results")


def _folder(tmp_path: Path, *, provenance: bool = True) -> Path:
    folder = tmp_path / "rep"
    (folder / "logs").mkdir(parents=True)
    runs = [
        {"name": "vllm-default", "kind": "static", "cap": 256, "submitted": 4, "completed": 4,
         "failed": 0, "goodput_rps": 0.5, "attainment": 0.5, "output_tok_s": 120.0,
         "ttft_p99_s": 2.5, "tpot_p99_s": 0.08},
        {"name": "tuned", "kind": "tuned", "submitted": 4, "completed": 3, "failed": 0,
         "goodput_rps": 0.75, "attainment": 0.75, "output_tok_s": 118.0,
         "ttft_p99_s": 0.9, "tpot_p99_s": 0.045},
    ]
    rep = {"engine": "sim", "hardware": "a100-llama2-7b", "workload": "phase-shift:n=4",
           "slo": "ttft=2,tpot=0.05", "seed": 0, "runs": runs,
           "best_static": {"by_goodput": "vllm-default"},
           "best_cap": {"by_goodput": "vllm-default"},
           "findings": ["The batch cap never moved (it stayed at 256)."],
           "capacity": {"vllm-default": 2.0, "tuned": 3.0},
           "ratios": {"goodput_vs_best_static": 1.5, "goodput_vs_vllm-default": 1.5,
                      "goodput_vs_best_cap": 1.5,
                      "capacity_vs_best_static": 1.5}}
    if provenance:
        rep.update({"command": "tuned bench --engine sim --out rep", "date": "2026-01-02T03:04:05Z",
                    "host": {"cpu_model": "Test CPU", "cpu_cores": 2}})
    (folder / "report.json").write_text(json.dumps(rep))
    (folder / "logs" / "tuned.requests.csv").write_text(
        "request_id,arrival_s,ttft_s,good,refused\n"
        "r0,0.0,0.250000,1,0\nr1,0.5,1.500000,1,0\nr2,1.0,,0,0\nr3,1.5,0.100000,1,0\n"
        "r4,2.0,,0,1\n")
    return folder


def test_results_page_rows(results, tmp_path):
    out = tmp_path / "results.md"
    assert results.main([str(_folder(tmp_path)), "--out", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert ("| sim | a100-llama2-7b | `phase-shift:n=4` | 1.50x (vllm-default) | 1.50x "
            "(vllm-default) | 1.50x "
            "| 900.0 ms / 2.50 s | 1.50x | `tuned bench --engine sim --out rep` |") in lines
    assert "- command: `tuned bench --engine sim --out rep`" in lines
    assert "- host: Test CPU, 2 cores" in lines
    assert "- date: 2026-01-02T03:04:05Z" in lines
    # the default's log is absent: its longest wait is unknown, not zero
    assert ("| vllm-default | static | 0.5 | 0.5 | 120 | 2.50 s | 80.0 ms | - | 4/4 | 2 |"
            in lines)
    assert ("| tuned | tuned | 0.75 | 0.75 | 118 | 900.0 ms | 45.0 ms "
            "| 1.50 s (+1 refused) (+1 never served) | 3/4 | 3 |") in lines
    assert "- The batch cap never moved (it stayed at 256)." in lines


def test_results_page_without_provenance(results, tmp_path):
    """A report written before bench recorded host, date and command says so."""
    out = tmp_path / "results.md"
    assert results.main([str(_folder(tmp_path, provenance=False)), "--out", str(out)]) == 0
    text = out.read_text()
    assert "- host: not recorded" in text
    assert "- date: not recorded" in text


def test_results_page_bad_folder(results, tmp_path, capsys):
    assert results.main([str(tmp_path / "missing"), "--out", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"results: {tmp_path / 'missing' / 'report.json'}: not a readable "
                          "tuned bench report")
    assert not (tmp_path / "r.md").exists()


def test_provenance_records_command_host_and_date(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: avx2\n")
    p = report_mod.provenance(["bench", "--workload", "phase-shift:rate=2,n=30"],
                              cpuinfo=cpuinfo, cpu_count=lambda: 16, now_s=lambda: 0.0)
    assert p["command"] == "tuned bench --workload phase-shift:rate=2,n=30"
    assert p["date"] == "1970-01-01T00:00:00Z"
    assert p["host"] == {"cpu_model": "Test CPU 9000", "cpu_cores": 16}
    from tuned.base.hostinfo import cpu_flags, cpu_model

    assert cpu_flags(cpuinfo) == frozenset({"avx2"})      # one reader for both fields
    assert (cpu_model(tmp_path / "absent"), cpu_flags(tmp_path / "absent")) == ("unknown",
                                                                                frozenset())


def test_bench_command_argv_repeats_the_run():
    import argparse

    from tuned.bench.command import command_argv

    args = argparse.Namespace(command="bench", engine="sim", hardware="a100-llama2-7b",
                              profile=None, workload="phase-shift:rate=12,n=300",
                              slo="ttft=2,tpot=0.05", out="runs/x", quick=True, seed=0,
                              config=None, jobs=1, func=print)
    assert command_argv(args) == [
        "bench", "--engine", "sim", "--hardware", "a100-llama2-7b", "--workload",
        "phase-shift:rate=12,n=300", "--slo", "ttft=2,tpot=0.05", "--out", "runs/x",
        "--quick", "--seed", "0"]


def test_sim_bench_report_carries_its_command_and_renders(results, tmp_path):
    """A real (small) simulator bench records the command that repeats it, and the page
    quotes that command and the longest wait from the bench's own request logs."""
    from tuned.commands import cli

    out = tmp_path / "bench"
    argv = ["bench", "--engine", "sim", "--hardware", "a100-llama2-7b",
            "--workload", "poisson:rate=4,prompt=64,output=16,n=12", "--slo", "ttft=2,tpot=0.05",
            "--contenders", "tuned", "--capacity", "off", "--jobs", "1", "--out", str(out)]
    assert cli.main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["command"] == (
        "tuned bench --engine sim --hardware a100-llama2-7b --workload "
        "poisson:rate=4,prompt=64,output=16,n=12 --slo ttft=2,tpot=0.05 --out "
        f"{out} --seed 0 --contenders tuned --capacity off")
    assert report["host"]["cpu_cores"] >= 1
    page = tmp_path / "results.md"
    assert results.main([str(out), "--out", str(page)]) == 0
    loaded = results.load(out)
    assert loaded["runs"][0]["never_served"] == 0
    assert loaded["runs"][0]["longest_wait_s"] > 0
    assert f"- command: `{report['command']}`" in page.read_text().splitlines()


def test_a_rewrite_keeps_the_measurements_run_by_hand(results, tmp_path):
    """Below the marker, docs/results.md holds benchmarks run by hand; regenerating the
    page from bench reports keeps them as they were."""
    results_tool = results
    out = tmp_path / "results.md"
    folder = _folder(tmp_path)
    assert results_tool.main([str(folder), "--out", str(out)]) == 0
    page = out.read_text()
    assert results_tool.KEPT_MARKER in page
    out.write_text(page + "\n## Controller course\n\nfigures here\n")
    assert results_tool.main([str(folder), "--out", str(out)]) == 0
    again = out.read_text()
    assert again.count(results_tool.KEPT_MARKER) == 1
    assert again.endswith("## Controller course\n\nfigures here\n")
