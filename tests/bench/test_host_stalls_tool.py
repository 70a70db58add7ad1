"""tools/host_stalls.py's summaries (no engine: hand-made arrival times and naps)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fakes import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("host_stalls")


def test_a_stream_that_arrives_in_one_burst_shows_its_gap(tool):
    times = [0.05, 0.06, 7.00, 7.01, 7.02]
    assert tool.stream_summary(times) == {"chunks": 5, "first_s": 0.05, "last_s": 7.02,
                                          "largest_gaps_s": [6.94, 0.01, 0.01]}
    assert tool.stream_summary([]) == {"chunks": 0, "first_s": None, "last_s": None,
                                       "largest_gaps_s": []}


def test_overruns_keep_the_late_naps_with_their_jiffies(tool):
    rows = [[6.56, 8.85, 1, 1770], [7.0, 0.2, 0, 40], [15.65, 1.4, 0, 280]]
    assert tool.overruns(rows, 0.3) == [
        {"at_s": 6.56, "late_s": 8.85, "steal_jiffies": 1, "cpu_jiffies": 1770},
        {"at_s": 15.65, "late_s": 1.4, "steal_jiffies": 0, "cpu_jiffies": 280}]


def test_the_watcher_script_prints_an_overrun_row_per_late_nap(tool):
    # a limit below any nap's overrun: every nap is reported, as [at, late, steal, cpu]
    out = subprocess.run([sys.executable, "-c", tool.WATCHER, "0.3", "-1"],
                         capture_output=True, text=True, timeout=60).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) >= 3
    assert all(len(r) == 4 and r[1] >= -0.05 and r[2] >= 0 and r[3] >= 0 for r in rows)
