"""End to end: `tuned profile --quick` against the real engine on the tiny demo model
writes a loadable profile and its PNG in bounded time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tuned.curves.profile import load_profile

pytestmark = pytest.mark.slow

BUDGET_S = 420


@pytest.mark.timeout(BUDGET_S + 60)
def test_quick_profile_on_tiny_model(tmp_path, tiny_model):
    out = tmp_path / "profiles" / "tiny.json"
    cmd = [sys.executable, "-m", "tuned", "profile", "--model", str(tiny_model),
           "--out", str(out), "--quick", "--startup-timeout", "300"]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUDGET_S)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert elapsed < BUDGET_S

    p = load_profile(out)
    assert [lv["concurrency"] for lv in p.levels] == [1, 2, 4]
    assert [lv["num_requests"] for lv in p.levels] == [5, 8, 14]
    assert all(lv["throughput_tok_s"] > 0 for lv in p.levels)
    assert set(p.requests["output_tokens"]) == {32}  # ignore_eos: exactly max_tokens
    assert set(p.requests["prompt_tokens"]) == {32}  # token-id prompts of exact length
    assert p.meta["sweep"]["interrupted"] is False
    assert p.meta["model"]["config"]["num_layers"] == 2
    assert p.best_speed in ("usl", "linear", "logistic")
    assert p.speed_tok_s(1) > 0
    if p.meta["engine"]["kind"] == "tuned":
        # per-step samples from tuned's /steps endpoint, tagged with their level
        assert len(p.steps["step_s"]) > 50
        assert set(p.steps["concurrency"]) <= {1, 2, 4}
        assert max(p.steps["num_decode"]) <= 4
        assert p.step_time is not None
        assert p.meta["engine"]["block_size"] > 0

    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    assert "wrote" in r.stderr and "fits:" in r.stdout
