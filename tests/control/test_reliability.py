"""The reliability fixes behind tests/e2e/test_e2e_faults.py, checked fast and without an
engine: hostile request hints, NVML that comes and goes, the knob slot's staleness
mark, all-or-nothing reloads, rate-limited error lines, live KV usage, an endpoint
that always answers a reload."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from fakes import FakeEngine
from tuned import config
from tuned.control.controller import Controller
from tuned.core.knobs import KnobSlot
from tuned.control.runtime import Runtime
from tuned.control.metrics import Endpoint, Metrics
from tuned.policies.batch import Decision
from tuned.core.predictor import parse_request_hints
from tuned.telemetry.nvml import NvmlSampler

ROOT = Path(__file__).resolve().parents[2]




# ------------------------------------------------------------------ hints
@pytest.mark.parametrize("value", [10 ** 400, 10 ** 5000, float("inf"), float("nan")],
                         ids=["1e400-int", "1e5000-int", "inf", "nan"])
def test_hints_beyond_float_range_are_ignored_not_raised(value):
    for key in ("tuned_deadline_s", "tuned_output_tokens"):
        hints, warnings = parse_request_hints({key: value})
        assert hints.deadline_s is None and hints.output_tokens is None
        assert len(warnings) == 1 and warnings[0].startswith(f"{key}: must be")
        shown = warnings[0].split("got ", 1)[1].rsplit("; ignored", 1)[0]
        assert len(shown) <= 40, shown


def test_unknown_tuned_keys_give_one_warning_other_keys_none():
    assert parse_request_hints({"session_id": "a", "foo": [1]}) == (
        parse_request_hints({})[0], [])
    _, warnings = parse_request_hints({"tuned_dedline_s": 3, "tuned_x": 1,
                                       "tuned_deadline_s": 5, "other": 1})
    assert warnings == ["unknown: 'tuned_dedline_s' and 1 more is not a tuned hint (known: "
                        "tuned_output_tokens, tuned_deadline_s, tuned_class); ignored"]
    _, warnings = parse_request_hints({"tuned_" + "y" * 10_000: 1})
    assert len(warnings) == 1 and len(warnings[0]) < 200


# ------------------------------------------------------------------ NVML
class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self):
        self.state = "ok"
        self.calls: list[str] = []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlDeviceGetMemoryInfo(self, h):
        if self.state != "ok":
            raise self.NVMLError(self.state)
        return SimpleNamespace(used=3, total=10)


def test_nvml_lost_recovered_lost_again_one_line_each(logs):
    nv = FakeNvml()
    s = NvmlSampler(pynvml=nv)
    assert s.start()
    assert [g.used_bytes for g in s.sample()] == [3]
    nv.state = "Unknown Error"
    assert s.sample() is None and s.sample() is None and s.available is False
    nv.state = "ok"
    assert s.sample()[0].total_bytes == 10 and s.available is True
    nv.state = "GPU is lost"
    assert s.sample() is None and s.sample() is None
    assert [(e["event"], e.get("reason")) for e in logs()] == [
        ("nvml_ready", None), ("nvml_lost", "NVMLError: Unknown Error"),
        ("nvml_recovered", None), ("nvml_lost", "NVMLError: GPU is lost")]
    # stop shuts NVML down once, even while lost; Runtime.stop reaches it
    Runtime(controller=SimpleNamespace(stop=lambda: None), metrics=None, slot=None,
            queue_channel=None, nvml=s).stop()
    s.stop()
    assert nv.calls == ["init", "shutdown"]


def test_controller_withdraws_gpu_series_while_nvml_is_lost():
    nv = FakeNvml()
    s = NvmlSampler(pynvml=nv)
    s.start()
    m = Metrics()
    ctrl = Controller(config.default(), FakeEngine(), m, nvml=s)
    ctrl.run_once()
    assert b'tuned_gpu_memory_used_bytes{engine="0",gpu="0"} 3.0' in m.exposition()
    nv.state = "lost"
    ctrl.run_once()
    assert b"tuned_gpu_memory_used_bytes{" not in m.exposition()
    nv.state = "ok"
    ctrl.run_once()
    assert b'tuned_gpu_memory_total_bytes{engine="0",gpu="0"} 10.0' in m.exposition()


# ------------------------------------------------------------------ knob slot
def test_a_fresh_decision_is_never_applied_with_a_stale_mark():
    """The tick offers its decision before it marks itself good; a step taking the
    decision in between used to find the old mark stale and fall back again."""
    now = [100.0]
    slot = KnobSlot(8, 512, stale_after_s=1.0, fallback_cap=2, clock=lambda: now[0],
                    metrics=Metrics())
    dec = Decision(target=6, lower=1, upper=8, cap=6, batch=6, token_budget=512, reason="x")
    slot.offer(dec)
    assert slot.take().cap == 6
    now[0] = 105.0                # the controller stalled
    assert slot.take().cap == 2 and slot.fallback_cause == "stale"
    slot.offer(Decision(target=5, lower=1, upper=8, cap=5, batch=5, token_budget=512,
                        reason="x"))
    knobs = slot.take()          # before the tick's mark_ok
    assert knobs.cap == 5 and slot.fallback_cause is None
    assert slot.metrics.fallbacks.labels("stale")._value.get() == 1


# ------------------------------------------------------------------ reload
def test_reload_with_a_corrupted_profile_keeps_the_running_one(tmp_path, logs):
    """The running config uses a profile that is corrupted on disk since: a reload
    is refused and answered, the loaded profile and policy stay in force (the old
    rollback re-read the corrupted file and raised out of the HTTP handler)."""
    from tuned.curves.profile import load_profile

    prof = tmp_path / "p.json"
    shutil.copy(ROOT / "tests" / "data" / "profile_v1.json", prof)
    cfg_path = tmp_path / "tuned.toml"
    cfg_path.write_text(f'max_num_seqs = 32\nprofile = "{prof}"\ntbt_sla_s = 0.05\n')
    ctrl = Controller(config.load(cfg_path), FakeEngine(), Metrics())
    policy, profile = ctrl.policy, ctrl.profile
    cfg_path.write_text(cfg_path.read_text() + "b_min = 2\n")
    prof.write_text('{"schema": 1, "levels": [')
    res = ctrl.reload()
    assert res["outcome"] == "refused" and res["problems"][0].startswith("ProfileError: ")
    assert ctrl.policy is policy and ctrl.profile is profile and ctrl.cfg.b_min == 1
    assert ctrl.run_once() is not None
    shutil.copy(ROOT / "tests" / "data" / "profile_v1.json", prof)
    assert ctrl.reload()["outcome"] == "ok" and ctrl.cfg.b_min == 2
    assert isinstance(ctrl.profile, type(load_profile(prof)))


def test_reload_reads_the_file_under_the_lock(tmp_path):
    """Two reloads at once: the second reads the file only once the first is applied."""
    import threading

    cfg_path = tmp_path / "tuned.toml"
    cfg_path.write_text("max_num_seqs = 32\n")
    ctrl = Controller(config.load(cfg_path), FakeEngine(), Metrics())
    order: list[str] = []
    real = ctrl.reloader.read_config_file
    first = threading.Event()
    release = threading.Event()

    def source():
        order.append("read")
        cfg = real()
        if not first.is_set():
            first.set()
            release.wait(10)      # the first reload is still being applied
        return cfg

    ctrl.reloader.source = source
    a = threading.Thread(target=ctrl.reload)
    a.start()
    assert first.wait(10)
    b = threading.Thread(target=ctrl.reload)
    b.start()
    b.join(0.2)                   # without the lock b would read and finish at once
    assert b.is_alive() and order == ["read"]      # b waits for a
    release.set()
    a.join(10)
    b.join(10)
    assert order == ["read", "read"]


# ------------------------------------------------------------------ error lines
def test_a_lasting_fault_logs_once_then_again_after_recovery(logs):
    class Boom:
        fail = True

        def decide(self, obs):
            if self.fail:
                raise RuntimeError("injected")
            return Decision(target=4, lower=1, upper=8, cap=4, batch=4, token_budget=100,
                            reason="ok")

    ctrl = Controller(config.default(), FakeEngine(), m := Metrics())
    ctrl.policy = boom = Boom()
    for _ in range(5):
        ctrl.run_once()
    boom.fail = False
    ctrl.run_once()
    boom.fail = True
    ctrl.run_once()
    errors = [e for e in logs() if e["event"] == "controller_error"]
    assert len(errors) == 2 and m.errors._value.get() == 6


# ------------------------------------------------------------------ KV usage
def test_kv_usage_is_read_live_where_the_engine_offers_it():
    eng = FakeEngine()
    eng.add_step(0.01, 1)         # its sample says 0.1
    m = Metrics()
    ctrl = Controller(config.default(), eng, m)
    ctrl.run_once()
    assert m.kv_usage._value.get() == 0.1
    eng.kv_usage_now = lambda: 0.0          # an abort freed the blocks since
    ctrl.run_once()
    assert m.kv_usage._value.get() == 0.0
    assert ctrl.decisions_json()["telemetry"]["kv_usage"] == 0.0


# ------------------------------------------------------------------ endpoint
def test_a_reload_that_raises_is_answered_500():
    def reload():
        raise RuntimeError("boom")

    ep = Endpoint("127.0.0.1", 0, Metrics(), decisions=lambda n: {}, steps=lambda s: {},
                  reload=reload, healthy=lambda: True).start()
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{ep.port}/reload", data=b"",
                                     method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 500
        assert json.loads(e.value.read()) == {"outcome": "error",
                                              "error": "RuntimeError: boom"}
    finally:
        ep.stop()
