"""The GPU-memory guard around a batch policy: unit rules, and the controller path
with pynvml faked at its functions (the hardware boundary)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pynvml
import pytest

from tuned import config
from tuned.control.controller import Controller
from tuned.core.types import Observation
from tuned.control.metrics import Metrics
from tuned.policies.gpu_memory import (RECOVER_TICKS, GpuMemoryGuard, recover_fraction)
from tuned.policies.registry import StaticPolicy, build_batch_policy
from tuned.telemetry.nvml import GpuMemory, NvmlSampler, free_fraction

GIB = 1 << 30
FLOOR = 0.02


def obs(free, running=16, waiting=4):
    return Observation(num_running=running, num_waiting=waiting, kv_capacity_blocks=1000,
                       demand_mean=None, demand_std=None, demand_samples=0,
                       tbt_mean_s=None, decode_batch_mean=None, gpu_free_fraction=free)


def guard(cap=16, b_min=1, floor=FLOOR):
    return GpuMemoryGuard(StaticPolicy(cap, 2048), floor=floor, b_min=b_min, ceiling=cap)


def test_without_nvml_the_inner_decision_passes_through_unchanged():
    g = guard()
    inner = StaticPolicy(16, 2048)
    for _ in range(3):
        got = g.decide(obs(None))
        assert got == inner.decide(obs(None)) and got.reason == "static"
    # free memory above the floor: the same
    assert g.decide(obs(0.5)) == inner.decide(obs(0.5))
    assert g.limit is None


def test_cap_falls_within_one_decision_with_the_figures():
    g = guard()
    d = g.decide(obs(0.005, running=16))
    assert (d.cap, d.reason) == (8, "gpu_memory_pressure")
    assert d.inputs["gpu_free_fraction"] == 0.005 and d.inputs["gpu_memory_floor"] == FLOOR
    assert d.inputs["policy_cap"] == 16 and d.inputs["policy_reason"] == "static"
    assert d.inputs["gpu_memory_recover_at"] == 2 * FLOOR
    assert d.batch == 16  # b_t stays at the running decodes; the gate is the cap
    # pressure on: halves again each tick (of the running count, when lower), to b_min
    assert [g.decide(obs(0.005, running=r)).cap for r in (8, 3, 1, 1)] == [4, 1, 1, 1]


def test_cap_never_below_b_min():
    g = guard(cap=16, b_min=3)
    caps = [g.decide(obs(0.0, running=16)).cap for _ in range(5)]
    assert caps == [8, 4, 3, 3, 3]


def test_hysteresis_holds_between_floor_and_twice_the_floor():
    g = guard()
    assert g.decide(obs(0.01)).cap == 8
    # free 3%: above the floor, below 2 x floor: held, however long
    for _ in range(10):
        d = g.decide(obs(0.03, running=8))
        assert (d.cap, d.reason) == (8, "gpu_memory_hold")
    assert g.clear_ticks == 0


def test_recovers_after_the_pressure_clears():
    g = guard()
    g.decide(obs(0.005))
    g.decide(obs(0.005, running=8))                           # limit 4
    caps, reasons = [], []
    for _ in range(RECOVER_TICKS + 3):
        d = g.decide(obs(0.10, running=4))
        caps.append(d.cap)
        reasons.append(d.reason)
    # RECOVER_TICKS - 1 held, then doubling to the inner cap, then let go
    assert caps == [4] * (RECOVER_TICKS - 1) + [8, 16, 16, 16]
    assert reasons == ["gpu_memory_hold"] * RECOVER_TICKS + ["static"] * 3
    assert g.limit is None


def test_a_dip_restarts_the_clear_count_and_a_relapse_lowers_again():
    g = guard()
    g.decide(obs(0.005))                                      # limit 8
    g.decide(obs(0.10, running=8))
    g.decide(obs(0.03, running=8))                            # in the band: count restarts
    assert g.clear_ticks == 0
    d = g.decide(obs(0.001, running=8))
    assert (d.cap, d.reason) == (4, "gpu_memory_pressure")


def test_nvml_lost_mid_pressure_holds_the_limit():
    g = guard()
    g.decide(obs(0.005))
    d = g.decide(obs(None, running=8))
    assert (d.cap, d.reason) == (8, "gpu_memory_hold")


def test_an_invalid_inner_cap_is_left_to_the_controller():
    import dataclasses
    import math

    class NanPolicy:
        def decide(self, obs):
            return dataclasses.replace(StaticPolicy(16, 2048).decide(obs), cap=math.nan)

    g = GpuMemoryGuard(NanPolicy(), floor=FLOOR, b_min=1, ceiling=16)
    assert math.isnan(g.decide(obs(0.001)).cap) and g.limit is None


def test_floor_zero_is_off():
    g = guard(floor=0.0)
    assert g.decide(obs(0.0)).reason == "static"


def test_recover_fraction():
    assert recover_fraction(0.02) == 0.04
    assert recover_fraction(0.6) == 0.8


def test_guard_rejects_a_floor_out_of_range():
    with pytest.raises(ValueError, match=r"gpu_memory_floor: must be in \[0, 1\), got 1.0"):
        guard(floor=1.0)


def test_config_floor_is_validated():
    assert config.validate({}).gpu_memory_floor == 0.02
    with pytest.raises(config.ConfigError,
                       match=r"gpu_memory_floor: must be in \[0, 1\), got 1"):
        config.validate({"gpu_memory_floor": 1})


def test_registry_wraps_every_policy():
    for name in ("tuned", "static", "trtllm", "memory"):
        cfg = config.validate({"batch_policy": name, "max_num_seqs": 16})
        pol, _ = build_batch_policy(cfg, ceiling=16, max_num_batched_tokens=2048,
                                    block_size=16)
        assert isinstance(pol, GpuMemoryGuard) and pol.floor == 0.02
        d = pol.decide(obs(0.001, running=16))
        assert d.reason == "gpu_memory_pressure" and d.cap <= 8, name


def test_free_fraction_is_the_lowest_over_devices():
    gpus = [GpuMemory(0, "a", 70 * GIB, 80 * GIB), GpuMemory(1, "b", 79 * GIB, 80 * GIB)]
    assert free_fraction(gpus) == pytest.approx(1 / 80)
    assert free_fraction(None) is None and free_fraction([]) is None


# ------------------------------------------------------- controller, pynvml faked
@pytest.fixture
def fake_gpu(monkeypatch):
    state = {"used": 0.9}
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 1)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(
        total=80 * GIB, used=int(state["used"] * 80 * GIB), free=0))
    return state


def test_controller_cap_falls_and_recovers_at_the_pynvml_boundary(fake_gpu):
    from fakes import FakeEngine

    s = NvmlSampler()
    s.start()
    cfg = config.validate({"batch_policy": "static", "max_num_seqs": 16})
    ctrl = Controller(cfg, FakeEngine(ceiling=16, running=16, waiting=4), Metrics(), nvml=s)
    assert ctrl.run_once().cap == 16
    assert ctrl.last_observation.gpu_free_fraction == pytest.approx(0.1)
    fake_gpu["used"] = 0.995
    d = ctrl.run_once()
    assert (d.cap, d.reason) == (8, "gpu_memory_pressure")
    assert d.inputs["gpu_free_fraction"] == pytest.approx(0.005, abs=1e-6)
    fake_gpu["used"] = 0.9
    caps = [ctrl.run_once().cap for _ in range(RECOVER_TICKS + 1)]
    assert caps == [8] * (RECOVER_TICKS - 1) + [16, 16]
    assert ctrl.current.reason == "static"


def test_controller_without_nvml_decides_as_before():
    from fakes import FakeEngine

    cfg = config.validate({"batch_policy": "static", "max_num_seqs": 16})
    ctrl = Controller(cfg, FakeEngine(ceiling=16, running=16), Metrics())
    d = ctrl.run_once()
    assert ctrl.last_observation.gpu_free_fraction is None
    # the guard hands back the policy's own decision; the controller adds only whether
    # the cap binds
    inner = ctrl.policy.last_inner
    assert d == dataclasses.replace(inner, inputs={**inner.inputs, "cap_binds": False,
                                                   "cap_note": d.inputs["cap_note"]})
    assert (d.cap, d.reason) == (16, "static") and "gpu_free_fraction" not in d.inputs


def test_controller_publishes_nvml_free_memory_in_kv_tokens(fake_gpu):
    """BucketServe's M_remain: the lowest GPU's free bytes over the engine's KV bytes
    per token, in the queue's inputs; None where the engine does not know its bytes."""
    from fakes import FakeEngine

    s = NvmlSampler()
    s.start()
    eng = FakeEngine(ceiling=16, running=16)
    eng.kv_bytes_per_token = 512 * 1024
    ctrl = Controller(config.validate({"max_num_seqs": 16}), eng, Metrics(), nvml=s)
    ctrl.run_once()
    # 80 GiB, 90 % used: 8 GiB free / 0.5 MiB per token = 16384 tokens
    free8 = int(80 * GIB - int(0.9 * 80 * GIB))
    assert ctrl.queue_channel.inputs.gpu_free_tokens == free8 // (512 * 1024) == 16384
    fake_gpu["used"] = 0.995
    ctrl.run_once()
    assert ctrl.queue_channel.inputs.gpu_free_tokens == \
        (80 * GIB - int(0.995 * 80 * GIB)) // (512 * 1024)
    plain = Controller(config.validate({"max_num_seqs": 16}), FakeEngine(ceiling=16),
                       Metrics(), nvml=s)
    plain.run_once()
    assert plain.queue_channel.inputs.gpu_free_tokens is None


def test_vllm_kv_bytes_per_token_from_the_kv_cache_config():
    from tuned.engines.vllm_queue import kv_bytes_per_token

    t = SimpleNamespace
    cfg = t(kv_cache_tensors=[t(size=1 << 20), t(size=1 << 20),
                              t(size=1 << 30, host_resident=True)])
    assert kv_bytes_per_token(cfg, 64) == (2 << 20) / 64
    assert kv_bytes_per_token(None, 64) is None
    assert kv_bytes_per_token(t(kv_cache_tensors=[]), 64) is None
