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
     "--events is for the simulator (--engine sim): a real engine's events are its own"),
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
