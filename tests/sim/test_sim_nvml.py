"""Memory-pressure events in the simulator: a simulated NVML on the virtual clock
drives the controller's GPU-memory guard, the path a real GPU runs."""

from __future__ import annotations

import json

import pytest
import structlog

from tuned import config
from tuned.commands.cli import main
from tuned.sim.engine import simulate
from tuned.policies.gpu_memory import RECOVER_TICKS
from tuned.sim.hardware import gpu_hardware, profile_hardware
from tuned.sim.nvml import GpuPressure, SimNvml, parse_events
from tuned.base.workloads import parse_workload

SPEC = "poisson:rate=8,prompt=U(16,512),output=U(16,256),n=300"


@pytest.fixture(autouse=True)
def _structlog_defaults():
    yield
    structlog.reset_defaults()


def test_parse_events():
    assert parse_events("gpu_pressure=10-20@0.995, gpu_pressure=30.5-31@1") == (
        GpuPressure(10.0, 20.0, 0.995), GpuPressure(30.5, 31.0, 1.0))
    assert parse_events("") == ()


@pytest.mark.parametrize("text, message", [
    ("gpu_pressure=10-20", "--events: 'gpu_pressure=10-20' must be gpu_pressure=T0-T1@U "
                           "(seconds T0 < T1, used fraction U in [0, 1])"),
    ("oom=1-2@0.5", "--events: 'oom=1-2@0.5' must be gpu_pressure=T0-T1@U"),
    ("gpu_pressure=20-10@0.9", "--events: 'gpu_pressure=20-10@0.9' needs T0 < T1 and U in "
                               "[0, 1], got T0=20, T1=10, U=0.9"),
    ("gpu_pressure=1-2@1.5", "needs T0 < T1 and U in [0, 1], got T0=1, T1=2, U=1.5"),
])
def test_a_bad_event_names_the_form(text, message):
    with pytest.raises(ValueError) as e:
        parse_events(text)
    assert message in str(e.value)


def test_sim_nvml_samples_like_the_sampler():
    t = [0.0]
    n = SimNvml([GpuPressure(10, 20, 0.995)], total_bytes=80 << 30,
                baseline_used_fraction=0.9, clock=lambda: t[0])
    got = []
    for now in (0.0, 10.0, 19.999, 20.0):
        t[0] = now
        (g,) = n.sample()
        got.append(g.used_bytes / g.total_bytes)
    assert got == pytest.approx([0.9, 0.995, 0.995, 0.9])


def test_a_profile_has_no_gpu_memory():
    from pathlib import Path

    prof = Path(__file__).resolve().parents[2] / "profiles" / "demo-small-cpu.json"
    with pytest.raises(ValueError, match="--events: gpu_pressure needs a GPU model"):
        profile_hardware(prof).nvml(parse_events("gpu_pressure=1-2@0.99"))


def run(events):
    hw = gpu_hardware("a100-llama2-7b")
    cfg = config.validate({**hw.engine_defaults(), "batch_policy": "static",
                           "interval_s": 0.5})
    wl = parse_workload(SPEC, 0, max_model_len=cfg.max_model_len)
    kw = {"nvml": hw.nvml(parse_events(events))} if events else {}
    return simulate(cfg, hw, wl.requests, **kw)


def test_the_cap_falls_during_the_window_and_recovers_after():
    res = run("gpu_pressure=10-20@0.995")
    caps = [(d["t"], d["cap"], d["reason"]) for d in res.decisions]
    before = [c for t, c, _ in caps if t < 10]
    assert set(before) == {256}
    # the tick at t = 10 already sees the pressure: the cap falls at once, halving
    first = next((t, c, r) for t, c, r in caps if t >= 10)
    assert first[0] == 10.0 and first[2] == "gpu_memory_pressure" and first[1] < 256
    inside = [(c, r) for t, c, r in caps if 10 <= t < 20]
    assert all(r == "gpu_memory_pressure" for _, r in inside)
    assert [c for c, _ in inside][-1] == 1          # b_min while it lasts
    # cleared at 20: held RECOVER_TICKS - 1 ticks, then doubling back to the ceiling
    after = [(c, r) for t, c, r in caps if t >= 20]
    assert [r for _, r in after[:RECOVER_TICKS]] == ["gpu_memory_hold"] * RECOVER_TICKS
    assert [c for c, _ in after[:RECOVER_TICKS - 1]] == [1] * (RECOVER_TICKS - 1)
    assert [c for c, _ in after[RECOVER_TICKS - 1:RECOVER_TICKS + 8]] == \
        [2, 4, 8, 16, 32, 64, 128, 256, 256]
    assert after[-1] == (256, "static")
    assert res.events == [{"kind": "gpu_pressure", "start_s": 10.0, "end_s": 20.0,
                           "used_fraction": 0.995}]


def test_without_events_decisions_are_the_ones_without_nvml():
    a, b = run(""), run("gpu_pressure=1000-1001@0.995")   # after the run: never seen
    assert a.decisions == b.decisions and b.events and not a.events


def test_simulate_cli_events(tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(["simulate", "--hardware", "a100-llama2-7b", "--workload", SPEC,
               "--events", "gpu_pressure=10-20@0.995", "--out", str(out)])
    assert rc == 0
    assert "events:\n  gpu_pressure 10-20 s: 0.995 of a100-llama2-7b's memory used\n" in \
        capsys.readouterr().out
    doc = json.loads((out / "result.json").read_text())
    assert doc["events"] == [{"kind": "gpu_pressure", "start_s": 10.0, "end_s": 20.0,
                              "used_fraction": 0.995}]
    reasons = {d["reason"] for d in doc["decisions"] if 10 <= d["t"] < 20}
    assert reasons == {"gpu_memory_pressure"}
    rc = main(["simulate", "--hardware", "a100-llama2-7b", "--workload", SPEC,
               "--events", "gpu_pressure=1-2", "--out", str(out)])
    assert rc == 2
    assert capsys.readouterr().err.startswith("tuned simulate: --events: 'gpu_pressure=1-2'")


def test_bucketserve_n_max_reads_the_simulated_nvml():
    """BucketServe's M_remain is NVML's free memory in KV tokens where NVML answers:
    with the GPU 99.5 % used for the whole run, N_max stays within 0.9 x the free
    device memory in tokens; without NVML it reads the (far larger) free KV."""
    from tuned.sim.engine import SimEngine

    hw = gpu_hardware("a100-llama2-7b")
    cfg = config.validate({**hw.engine_defaults(), "queue_policy": "bucket"})
    wl = parse_workload(SPEC, 0, max_model_len=cfg.max_model_len)
    n_max = {}
    for name, events in (("nvml", "gpu_pressure=0-100000@0.995"), ("none", "")):
        kw = {"nvml": hw.nvml(parse_events(events))} if events else {}
        eng = SimEngine(cfg, hw.step_model, block_size=hw.block_size,
                        num_gpu_blocks=hw.num_gpu_blocks,
                        kv_bytes_per_token=hw.kv_bytes_per_token, **kw)
        eng.run(wl.requests)
        n_max[name] = eng.waiting.policy.n_max
    free_bytes = hw.gpu_memory_bytes - round(0.995 * hw.gpu_memory_bytes)
    free_tokens = int(free_bytes // hw.kv_bytes_per_token)
    assert 0 < n_max["nvml"] <= int(0.9 * free_tokens) < n_max["none"]
