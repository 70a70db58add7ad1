"""tools/sim_vs_real.py's table from two bench folders (no engine: hand-built folders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import load_tool

HEAD = "request_id,arrival_s,ttft_s,tpot_s\n"


@pytest.fixture(scope="module")
def tool():
    return load_tool("sim_vs_real")


def _folder(root: Path, repeats: list[list[tuple[float, float | None]]], goodput: list[float]) -> Path:
    """A bench folder with one contender, ``tuned``: each repeat's (ttft, tpot) rows."""
    (root / "logs").mkdir(parents=True)
    for k, rows in enumerate(repeats):
        name = "tuned.requests.csv" if k == 0 else f"tuned.r{k}.requests.csv"
        (root / "logs" / name).write_text(HEAD + "".join(
            f"r{i},0,{t},{'' if p is None else p}\n" for i, (t, p) in enumerate(rows)))
    run = {"name": "tuned", "goodput_rps": sum(goodput) / len(goodput)}
    if len(goodput) > 1:
        run["goodput_rps_runs"] = goodput
    (root / "report.json").write_text(json.dumps({"runs": [run]}))
    return root


def test_each_repeat_is_read_and_the_sim_is_flagged_outside_the_real_spread(tool, tmp_path):
    real = _folder(tmp_path / "real", [[(1.0, 0.02), (3.0, 0.04)], [(2.0, 0.03), (4.0, None)]],
                   [1.0, 2.0])
    sim = _folder(tmp_path / "sim", [[(0.5, 0.03), (0.5, 0.03)]], [1.5])
    got = tool.repeats(real)["tuned"]
    assert got["ttft_p50"] == [2.0, 3.0]            # np.percentile of each repeat
    assert got["tpot_p50"] == [pytest.approx(0.03), 0.03]   # a one-token request has no TPOT
    assert got["goodput"] == [1.0, 2.0]
    rows = {line.split(" | ")[1]: line for line in
            tool.table(tool.repeats(real), tool.repeats(sim)).splitlines()[2:]}
    assert rows["TTFT p50"] == "| tuned | TTFT p50 | 2.50 s (2.00 s-3.00 s) | 500 ms | 0.20 | yes |"
    assert rows["TPOT p50"] == "| tuned | TPOT p50 | 30 ms (30 ms-30 ms) | 30 ms | 1.00 | no |"
    assert rows["goodput req/s"] == "| tuned | goodput req/s | 1.50 (1.00-2.00) | 1.50 | 1.00 | no |"
