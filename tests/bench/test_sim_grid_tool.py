"""tools/sim_grid.py: one real row through the simulator, and the table it prints."""

from __future__ import annotations

import pytest

from fakes import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("sim_grid")


def test_a_row_runs_the_bench_and_the_table_gives_its_ratio_and_phases(tool, tmp_path):
    row = (tool.CPU, "phase-shift:rate=1.5,n=12", "ttft=3,tpot=0.05", "static-8@256", 256)
    rep = tool.run_row(0, row, tmp_path)
    runs = {r["name"]: r for r in rep["runs"]}
    assert set(runs) == {"tuned", "vllm-default", "static-8@256"}
    lines = tool.table([(row, rep)])
    t, p, d = (runs[k]["goodput_rps"] for k in ("tuned", "static-8@256", "vllm-default"))
    assert lines[2].startswith("| demo-small-cpu.json | `phase-shift:rate=1.5,n=12` | "
                               "ttft=3,tpot=0.05 | static-8@256 | ")
    assert f"**{t / p:.2f}x** | {t / d:.2f}x |" in lines[2]
    # the phased row's phases, one line per contender, good of n (refused)
    assert lines[-5] == "| run | chat1 | summarise | chat2 |"
    tuned_phases = runs["tuned"]["phases"]
    assert lines[-3] == "| tuned | " + " | ".join(
        f"{ph['good']:.0f} of {ph['n']:.0f} ({ph['refused']:.0f})" for ph in tuned_phases) + " |"
    assert [ph["n"] for ph in tuned_phases] == [12, 12, 12]
