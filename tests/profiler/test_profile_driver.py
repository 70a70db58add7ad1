"""The sweep driver without an engine: workloads, the closed loop, step samples,
Ctrl-C, the CLI layout, `tuned fit` and `tuned profile show`."""

import argparse
import json
import re
import signal
import threading
import time
import tomllib

import numpy as np
import pytest

from tuned.curves.profile import time_weighted_load
from tuned.profiler import command as P
from tuned.profiler.engine import profiling_settings, serve_config_toml
from tuned.profiler.lengths import parse_sweep_workload
from tuned.base.workloads import WorkloadError
from tuned.curves.profile import Profile, build_profile, load_profile, save_profile

from fakes import META, V1, make_samples

AZURE = "azure_conv_2023"  # packaged with tuned (tuned/data/traces/)


# --- workloads ---------------------------------------------------------------------------

def test_synthetic_fixed_workload():
    w = parse_sweep_workload("synthetic:prompt=64,output=32")
    assert [w.next() for _ in range(3)] == [(64, 32)] * 3
    assert w.describe()["prompt"] == "64"


def test_synthetic_uniform_workload_stays_in_range_and_is_seeded():
    w = parse_sweep_workload("synthetic:prompt=U(16,128),output=U(16, 128)", seed=7)
    pairs = [w.next() for _ in range(2000)]
    p = np.array([x[0] for x in pairs])
    o = np.array([x[1] for x in pairs])
    assert p.min() == 16 and p.max() == 128 and o.min() == 16 and o.max() == 128
    assert abs(p.mean() - 72) < 3
    w2 = parse_sweep_workload("synthetic:prompt=U(16,128),output=U(16, 128)", seed=7)
    assert [w2.next() for _ in range(2000)] == pairs


def test_workload_clamps_to_max_model_len_and_output_cap():
    w = parse_sweep_workload("synthetic:prompt=1000,output=300").bind(1024)
    assert w.next() == (724, 300)
    assert w.clamped == 1
    w = parse_sweep_workload("synthetic:prompt=100,output=3000").bind(1024)
    assert w.next() == (1, 1023)
    w = parse_sweep_workload("synthetic:prompt=64,output=128").bind(1024, output_cap=32)
    assert w.next() == (64, 32)
    assert w.clamped == 0  # the quick cap is not a clamp


def test_trace_workload_scales_and_cycles(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                   "0.0,374,44\n1.0,3000,109\n2.0,5,1\n")
    w = parse_sweep_workload(f"trace:{csv}:scale=0.1").bind(256)
    assert [w.next() for _ in range(4)] == [(37, 4), (245, 11), (1, 1), (37, 4)]
    assert w.clamped == 1  # 300 + 11 > 256
    d = w.describe()
    assert d["rows"] == 3 and d["scale"] == 0.1 and d["path"] == str(csv)


def test_the_trace_lengths_take_the_workloads_grammar_and_the_old_spelling(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n"
                   "0.0,374,44\n1.0,3000,109\n2.0,5,1\n")
    new = parse_sweep_workload(f"trace:{csv},length_scale=0.1")
    old = parse_sweep_workload(f"trace:{csv}:scale=0.1")
    assert [new.next() for _ in range(3)] == [old.next() for _ in range(3)] == \
        [(37, 4), (300, 11), (1, 1)]
    assert new.describe()["scale"] == old.describe()["scale"] == 0.1


def test_azure_trace_reads():
    w = parse_sweep_workload(f"trace:{AZURE}:scale=0.1").bind(1024)
    assert w.describe()["rows"] == 19366
    assert w.next() == (37, 4)  # first row 374, 44


@pytest.mark.parametrize("spec, message", [
    ("synthetic:prompt=64", "missing output="),
    ("synthetic:prompt=64,output=abc", "output='abc' is neither a token count"),
    ("synthetic:prompt=U(9,3),output=4", "must have 1 <= low <= high"),
    ("synthetic:prompt=4,output=4,temp=1", "unknown field 'temp'"),
    ("poisson:rate=3", "workload 'poisson:rate=3': expected 'synthetic:prompt=P,output=O' "
                       "or 'trace:PATH[,length_scale=Y]'"),
    ("synthetic", "expected 'synthetic:prompt=P,output=O' or 'trace:PATH[,length_scale=Y]'"),
    ("trace:/nonexistent/x.csv", "trace /nonexistent/x.csv: No such file or directory"),
    ("trace:/x.csv:scale=0", "length_scale='0' must be a number in (0, "),
    ("trace:/x.csv,length_scale=0", "length_scale='0' must be a number in (0, "),
    ("trace:/x.csv,time_scale=2", "unknown field 'time_scale' for trace (allowed: length_scale)"),
])
def test_bad_workloads(spec, message):
    with pytest.raises(WorkloadError, match=re.escape(message)):
        parse_sweep_workload(spec)


def test_trace_missing_column(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("arrived_at,num_decode_tokens\n0,2\n")
    with pytest.raises(WorkloadError, match="missing column 'num_prefill_tokens'"):
        parse_sweep_workload(f"trace:{csv}")
    # the one trace reader of tuned.base.workloads: a trace has arrival times
    csv.write_text("num_prefill_tokens,num_decode_tokens\n1,2\n")
    with pytest.raises(WorkloadError, match="missing column 'arrived_at'"):
        parse_sweep_workload(f"trace:{csv}")


def test_a_bad_workload_is_a_usage_error(tmp_path, capsys):
    a = parser().parse_args(["profile", "--model", "m", "--out", str(tmp_path / "p.json"),
                             "--workload", "synthetic:prompt=64"])
    assert P.cmd_profile(a) == 2
    assert "workload 'synthetic:prompt=64': missing output=" in capsys.readouterr().err


def test_levels():
    assert P.parse_levels("8, 1,2,4,4") == [1, 2, 4, 8]
    assert P.default_levels(32) == [1, 2, 4, 8, 16, 32]
    assert P.default_levels(24) == [1, 2, 4, 8, 16, 24]
    with pytest.raises(P.UsageError, match="levels must be integers >= 1"):
        P.parse_levels("0,2")


# --- the closed loop ---------------------------------------------------------------------

class FakeEngine:
    """send(): sleeps like a server whose per-request time grows with the load."""

    def __init__(self, base_s=0.01, per_req_s=0.005):
        self.base_s, self.per_req_s = base_s, per_req_s
        self.inflight = 0
        self.max_inflight: dict[int, int] = {}
        self.lock = threading.Lock()
        self.level = 0
        self.calls = 0

    def send(self, prompt, max_tokens):
        with self.lock:
            self.inflight += 1
            self.calls += 1
            n = self.inflight
            self.max_inflight[self.level] = max(self.max_inflight.get(self.level, 0), n)
        time.sleep(self.base_s + self.per_req_s * n)
        with self.lock:
            self.inflight -= 1
        return len(prompt), max_tokens


class LevelTrackingSweep(P.Sweep):
    def __init__(self, engine, *a, **kw):
        super().__init__(engine.send, *a, **kw)
        self.engine = engine

    def run_level(self, n):
        self.engine.level = n
        return super().run_level(n)


def test_closed_loop_keeps_exactly_n_in_flight():
    eng = FakeEngine()
    w = parse_sweep_workload("synthetic:prompt=8,output=4")
    sweep = LevelTrackingSweep(eng, w, P.PromptFactory(list(range(10, 50))), [1, 2, 4], 30.0,
                               lambda n: 5 * n, progress=False).run()
    assert sweep.measured == [1, 2, 4]
    assert not sweep.interrupted and sweep.failure is None
    assert eng.max_inflight == {1: 1, 2: 2, 4: 4}
    cols = sweep.request_columns()
    assert [cols["concurrency"].count(n) for n in (1, 2, 4)] == [5, 10, 20]
    assert set(cols["prompt_tokens"]) == {8} and set(cols["output_tokens"]) == {4}
    # time-weighted load: the steady-state requests of level 4 saw ~4 in flight
    loads = np.array(cols["load"])[np.array(cols["concurrency"]) == 4]
    assert np.median(loads) == pytest.approx(4.0, abs=0.3)
    assert max(cols["load"]) <= 4.0 + 1e-6
    speeds = np.array(cols["speed_tok_s"])
    np.testing.assert_allclose(speeds, 4 / np.array(cols["duration_s"]), rtol=1e-3)


def test_level_time_budget_stops_issuing():
    eng = FakeEngine(base_s=0.05, per_req_s=0.0)
    w = parse_sweep_workload("synthetic:prompt=8,output=4")
    t0 = time.monotonic()
    sweep = P.Sweep(eng.send, w, P.PromptFactory([5]), [2], 0.3, lambda n: 10_000,
                    progress=False).run()
    assert time.monotonic() - t0 < 2.0
    n = len(sweep.records)
    assert 8 <= n <= 16  # 2 slots x 0.3 s / 0.05 s = 12, give or take the edges


def test_time_weighted_load_hand_values():
    # [0,2] and [1,3] overlap for 1 s: each saw (2 + 1) / 2 = 1.5 in flight
    np.testing.assert_allclose(time_weighted_load([0, 1], [2, 3]), [1.5, 1.5])
    # add [0,4]: the first saw (2 + 1 + 2) / 2 = 2.5; the third (4 + 2 + 2) / 4 = 2
    np.testing.assert_allclose(time_weighted_load([0, 1, 0], [2, 3, 4]), [2.5, 2.5, 2.0])


def test_failing_engine_stops_the_level_with_its_error():
    def send(prompt, max_tokens):
        raise ConnectionError("refused")

    sweep = P.Sweep(send, parse_sweep_workload("synthetic:prompt=8,output=4"),
                    P.PromptFactory([5]), [1, 2], 5.0, lambda n: 20, progress=False).run()
    assert sweep.measured == []
    assert sweep.failure.startswith("level N=1: 3 requests failed, last: N=1: "
                                    "ConnectionError: refused")


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handling, unblocked, whatever earlier tests in this process
    left behind (a CI run once saw this test's Ctrl-C ignored for 60 s)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_keeps_measured_levels(default_sigint):
    eng = FakeEngine()
    fired = threading.Event()
    main = threading.main_thread().ident

    def send(prompt, max_tokens):
        if eng.level == 4 and not fired.is_set():
            fired.set()
            # the operator presses Ctrl-C: the terminal signals the process, and
            # Python raises KeyboardInterrupt in the main thread. Aimed at that
            # thread here, so that the kernel cannot hand it to a worker thread
            signal.pthread_kill(main, signal.SIGINT)
        return eng.send(prompt, max_tokens)

    sweep = P.Sweep(send, parse_sweep_workload("synthetic:prompt=8,output=4"),
                    P.PromptFactory([5]), [1, 2, 4, 8], 30.0,
                    lambda n: 4 if n < 4 else 100_000, progress=False)
    orig = sweep.run_level

    def run_level(n):
        eng.level = n
        return orig(n)

    sweep.run_level = run_level
    t0 = time.monotonic()
    sweep.run()
    assert time.monotonic() - t0 < 10
    assert sweep.interrupted
    assert sweep.measured == [1, 2]
    assert {r.concurrency for r in sweep.records} == {1, 2}


# --- step samples ------------------------------------------------------------------------

class FakeSteps:
    """The /steps contract: 'next' may be read before samples appended during the answer."""

    def __init__(self):
        self.samples = []
        self.calls = []

    def add(self, **kw):
        seq = len(self.samples)
        s = {"seq": seq, "t": float(seq), "step_s": 0.01, "num_decode": 0,
             "num_prefill_reqs": 0, "prefill_tokens": 0, "scheduled_tokens": 0,
             "kv_usage": 0.1, "kv_used_blocks": 3, "kv_tokens_resident": 100,
             "num_running": 1, "num_waiting": 0, "preempted": 0}
        s.update(kw)
        self.samples.append(s)

    def fetch(self, since=None):
        self.calls.append(since)
        return {"next": len(self.samples) - 1 if self.samples else 0, "block_size": 16,
                "num_gpu_blocks": 512,
                "samples": [s for s in self.samples if s["seq"] >= (since or 0)]}


def test_step_collector_tags_levels_and_skips_repeats_and_idle():
    fake = FakeSteps()
    fake.add(num_decode=9)  # before the sweep: skipped by start()
    col = P.StepCollector(fake)
    d = fake.fetch()
    col.since, col.block_size = d["next"] + 1, d["block_size"]
    col.flush(1)
    fake.add(num_decode=1, step_s=0.011)
    fake.add(num_decode=0)  # idle
    col.poll()
    col.poll()  # 'next' lagged one behind: the repeat must not be stored twice
    col.flush(2)
    fake.add(num_decode=2, prefill_tokens=64, step_s=0.02)
    col.flush(0)
    assert col.columns["num_decode"] == [1, 2]
    assert col.columns["prefill_tokens"] == [0, 64]
    assert col.columns["step_s"] == [0.011, 0.02]
    assert col.columns["concurrency"] == [1, 2]
    assert col.dropped == 0


def test_step_collector_measures_the_gap_between_back_to_back_steps():
    fake = FakeSteps()
    col = P.StepCollector(fake)
    col.since, col.level = 0, 1
    fake.add(num_decode=1, t=10.0, step_s=0.02)                   # no step before it
    fake.add(num_decode=1, t=10.025, step_s=0.02)                 # 5 ms unmeasured
    fake.add(num_decode=1, t=10.050, step_s=0.02, num_running=0)  # 5 ms; then nothing ran
    fake.add(num_decode=1, t=11.0, step_s=0.02)                   # after an idle wait
    fake.add(num_decode=1, t=11.019, step_s=0.02)                 # overlapped: 0, not < 0
    col.poll()
    assert col.columns["gap_s"] == [-1.0, 0.005, 0.005, -1.0, 0.0]
    def prof(gaps):
        return Profile(meta={}, requests={}, steps={"gap_s": gaps}, levels=[])

    assert prof([-1.0] * 9 + [0.004] * 21).step_gap_s == 0.004
    assert prof([0.004] * 19).step_gap_s == 0.0             # too few to say
    assert prof([]).step_gap_s == 0.0                       # profiles made before the column


def test_step_collector_counts_dropped_samples():
    fake = FakeSteps()
    col = P.StepCollector(fake)
    col.since, col.level = 0, 1
    for _ in range(5):
        fake.add(num_decode=1)
    fake.samples = fake.samples[3:]  # the ring wrapped: seq 0..2 are gone
    col.poll()
    assert col.dropped == 3
    assert len(col.columns["step_s"]) == 2


# --- the whole command without an engine -------------------------------------------------

def parser():
    p = argparse.ArgumentParser(prog="tuned")
    sub = p.add_subparsers(dest="command")
    P.register(sub)
    return p


def test_cli_layout():
    a = parser().parse_args(["profile", "show", "x.json"])
    assert (a.action, a.file, a.func) == ("show", "x.json", P.cmd_profile)
    a = parser().parse_args(["profile", "--model", "demo:tiny", "--out", "p.json", "--quick",
                             "--levels", "1,2", "--workload", "trace:/x.csv:scale=0.1"])
    assert (a.action, a.model, a.out, a.quick, a.levels) == (None, "demo:tiny", "p.json",
                                                             True, "1,2")
    a = parser().parse_args(["fit", "p.json"])
    assert (a.file, a.func) == ("p.json", P.cmd_fit)


def test_plan_quick_and_usage_errors(tmp_path):
    a = parser().parse_args(["profile", "--model", "m", "--out", str(tmp_path / "p.json"),
                             "--quick"])
    plan = P.make_plan(a)
    assert plan.levels == [1, 2, 4]
    assert [plan.requests_for(n) for n in plan.levels] == [5, 8, 14]
    assert plan.workload.spec == P.QUICK_WORKLOAD and plan.level_s == 10.0
    a = parser().parse_args(["profile", "--model", "m", "--out", "p.json",
                             "--max-concurrency", "12"])
    assert P.make_plan(a).levels == [1, 2, 4, 8, 12]
    assert P.cmd_profile(parser().parse_args(["profile", "--model", "m"])) == 2
    assert P.cmd_profile(parser().parse_args(["profile", "--out", "x.json"])) == 2
    assert P.cmd_profile(parser().parse_args(["profile", "--model", "m", "--out",
                                              "x.txt"])) == 2


def test_serve_config_is_fixed_cap_and_valid():
    s = profiling_settings("demo:tiny", 4, 2048, 1024, 8123, 9123)
    raw = tomllib.loads(serve_config_toml(s))
    assert raw == s
    assert raw["b_min"] == raw["b_max"] == raw["max_num_seqs"] == 4
    from tuned.config import validate

    cfg = validate(raw)
    assert cfg.effective_b_max == 4 and cfg.b_min == 4


def test_profile_target_interrupted_writes_partial_profile(tmp_path, monkeypatch, capsys):
    eng = FakeEngine(base_s=0.002, per_req_s=0.001)
    monkeypatch.setattr(P, "server_info", lambda url: {
        "id": "fake", "root": "/models/fake", "max_model_len": 512, "version": "0.32.0"})
    monkeypatch.setattr(P.PromptFactory, "from_server",
                        classmethod(lambda cls, *a, **k: cls(list(range(10, 90)))))
    orig = P.Sweep.run_level

    def run_level(self, n):
        if n == 8:
            raise KeyboardInterrupt
        eng.level = n
        return orig(self, n)

    monkeypatch.setattr(P.Sweep, "run_level", run_level)
    a = parser().parse_args(["profile", "--url", "http://x:1", "--out",
                             str(tmp_path / "p.json"), "--levels", "1,2,4,8",
                             "--level-requests", "12", "--workload",
                             "synthetic:prompt=U(8,16),output=8"])
    plan = P.make_plan(a)
    code = P.profile_target(plan, P.Target(url="http://x:1"), send=eng.send, progress=False)
    assert code == 130
    p = load_profile(tmp_path / "p.json")
    assert [lv["concurrency"] for lv in p.levels] == [1, 2, 4]
    assert [lv["num_requests"] for lv in p.levels] == [12, 12, 12]
    assert p.meta["sweep"]["interrupted"] is True
    assert p.meta["sweep"]["measured"] == [1, 2, 4]
    assert p.meta["model"]["path"] == "/models/fake"
    assert p.meta["workload"]["spec"] == "synthetic:prompt=U(8,16),output=8"
    assert p.best_speed in ("usl", "linear", "logistic")
    assert (tmp_path / "p.png").stat().st_size > 10_000
    err = capsys.readouterr().err
    assert "interrupted: kept levels [1, 2, 4] of [1, 2, 4, 8]" in err
    assert "no step samples" in err


def test_show_and_fit_commands(tmp_path, capsys):
    assert P.cmd_profile(parser().parse_args(["profile", "show", str(V1)])) == 0
    out = capsys.readouterr().out
    assert "migrated from schema 1" in out and "throughput (USL): lam=40" in out

    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 9}')
    assert P.cmd_profile(parser().parse_args(["profile", "show", str(bad)])) == 2
    assert "schema_version 9 is newer" in capsys.readouterr().err

    req, steps = make_samples()
    prof = build_profile(json.loads(json.dumps(META)), req, steps)
    path = tmp_path / "p.json"
    save_profile(prof, path)
    d = json.loads(path.read_text())
    d["fits"]["step_time"] = None  # an edited / older file: fits gone
    d["levels"][0]["throughput_tok_s"] = 1.0
    path.write_text(json.dumps(d))
    assert P.cmd_fit(parser().parse_args(["fit", str(path)])) == 0
    q = load_profile(path)
    assert q.step_time is not None
    assert q.step_time.params == pytest.approx(prof.step_time.params)
    assert q.levels == prof.levels  # re-aggregated from the samples
    assert (tmp_path / "p.png").stat().st_size > 10_000

    v1 = tmp_path / "v1.json"
    v1.write_text(V1.read_text())
    assert P.cmd_fit(parser().parse_args(["fit", str(v1), "--no-plot"])) == 0
    q = load_profile(v1)
    assert q.migrated_from is None and json.loads(v1.read_text())["schema_version"] == 2
    assert q.usl.params["sigma"] == pytest.approx(0.1, rel=1e-3)
    assert not (tmp_path / "v1.png").exists()


def test_hardware_info_from_injected_sources(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU @ 3GHz\n")

    class NoGpu:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    class OneGpu:
        def nvmlInit(self): ...
        def nvmlDeviceGetCount(self): return 1
        def nvmlDeviceGetHandleByIndex(self, i): return i
        def nvmlDeviceGetName(self, h): return b"NVIDIA A100-SXM4-80GB"

    hw = P.hardware_info(str(cpuinfo), NoGpu())
    assert hw["cpu_model"] == "Test CPU @ 3GHz" and hw["gpu"] is None and hw["cpu_cores"] >= 1
    hw = P.hardware_info(str(cpuinfo), OneGpu())
    assert hw["gpu"] == "NVIDIA A100-SXM4-80GB" and hw["gpu_count"] == 1


def test_model_config_summary(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16",
        "vocab_size": 128256}))
    s = P.model_config_summary(tmp_path)
    assert s["head_dim"] == 128 and s["num_kv_heads"] == 8
    assert s["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert P.model_config_summary(tmp_path / "missing") is None
