"""NVML telemetry against the real pynvml API: faked at its functions (no GPU here)."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from tuned import config
from tuned.control.controller import Controller
from tuned.control.metrics import Metrics
from tuned.telemetry.nvml import NvmlSampler

GIB = 1 << 30




@pytest.fixture
def fake_gpus(monkeypatch):
    """Two devices behind the real module's function names."""
    state = {"used": [3 * GIB, 5 * GIB], "calls": []}
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: state["calls"].append("init"))
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: state["calls"].append("shutdown"))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: ("handle", i))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda h: f"NVIDIA A100-SXM4-80GB #{h[1]}")

    def meminfo(h):
        if state.get("fail"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(total=80 * GIB, used=state["used"][h[1]], free=0)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", meminfo)
    return state


def test_samples_every_device(fake_gpus, logs):
    s = NvmlSampler()
    assert s.start() is True
    got = s.sample()
    assert [(g.index, g.used_bytes, g.total_bytes) for g in got] == [
        (0, 3 * GIB, 80 * GIB), (1, 5 * GIB, 80 * GIB)]
    assert got[0].name == "NVIDIA A100-SXM4-80GB #0"
    s.stop()
    assert fake_gpus["calls"] == ["init", "shutdown"]
    assert [e["event"] for e in logs()] == ["nvml_ready"]


def test_controller_exports_gpu_memory(fake_gpus):
    from fakes import FakeEngine

    s = NvmlSampler()
    s.start()
    m = Metrics()
    ctrl = Controller(config.default(), FakeEngine(), m, nvml=s)
    ctrl.run_once()
    assert m.gpu_used.labels("1")._value.get() == 5 * GIB
    assert m.gpu_total.labels("0")._value.get() == 80 * GIB
    gpu = ctrl.decisions_json()["telemetry"]["gpu"]
    assert gpu[1] == {"index": 1, "name": "NVIDIA A100-SXM4-80GB #1",
                      "used_bytes": 5 * GIB, "total_bytes": 80 * GIB}


def test_lost_device_degrades_once_and_keeps_deciding(fake_gpus, logs):
    from fakes import FakeEngine

    s = NvmlSampler()
    s.start()
    ctrl = Controller(config.default(), FakeEngine(), Metrics(), nvml=s)
    fake_gpus["fail"] = True
    assert ctrl.run_once() is not None
    assert ctrl.run_once() is not None
    assert s.available is False and ctrl.decisions_json()["telemetry"]["gpu"] is None
    lost = [e for e in logs() if e["event"] == "nvml_lost"]
    assert len(lost) == 1 and lost[0]["telemetry"] == "engine-only"


def _has_gpu() -> bool:
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:
        return False


@pytest.mark.skipif(_has_gpu(), reason="this host has a GPU: the no-GPU path is not reachable")
def test_no_gpu_here_means_engine_only_with_one_log_line(logs):
    # the real pynvml on this machine: no driver library
    s = NvmlSampler()
    assert s.start() is False
    assert s.sample() is None and s.sample() is None
    events = logs()
    assert [e["event"] for e in events] == ["nvml_unavailable"]
    assert events[0]["telemetry"] == "engine-only"
    assert "NVML" in events[0]["reason"] or "nvml" in events[0]["reason"].lower()
