"""The one way tuned starts vLLM: command lines, the child's environment, the
start, the wait and the stop (no engine: children are small Python scripts)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tuned.launch import launcher
from tuned.config import Config, engine_handoff, validate
from tuned.launch.launcher import EngineError


def test_static_command_carries_the_cap_and_the_engine_settings():
    cfg = validate({"max_num_seqs": 32, "max_num_batched_tokens": 1024, "max_model_len": 512,
                    "num_gpu_blocks": 48, "vllm_args": ["--dtype", "float32"]})
    cmd = launcher.static_command(cfg, "/m", port=8001, max_num_seqs=8, extra=["--seed", "1"],
                                python="py")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert " ".join(cmd[3:]) == (
        "--model /m --host 127.0.0.1 --port 8001 --max-num-seqs 8 "
        "--max-num-batched-tokens 1024 --max-model-len 512 "
        "--num-gpu-blocks-override 48 --dtype float32 --seed 1")
    plain = launcher.static_command(validate({"model": "/models/x"}), "/m", port=1)
    assert "--num-gpu-blocks-override" not in plain and "--scheduler-cls" not in plain
    assert plain[plain.index("--max-num-seqs") + 1] == "32"  # the config's by default


def test_the_demo_model_gets_this_cpus_dtype_unless_one_is_given():
    cmd = launcher.static_command(validate({"model": "demo:tiny"}), "/m", port=1)
    assert cmd[-2] == "--dtype" and cmd[-1] in ("bfloat16", "float32")
    cmd = launcher.static_command(validate({"model": "demo:tiny"}), "/m", port=1,
                                extra=["--dtype=float32"])
    assert cmd.count("--dtype=float32") == 1 and "--dtype" not in cmd


def test_scheduler_command_embeds_tuned_with_its_config():
    cfg = validate({"model": "/models/x", "host": "0.0.0.0", "port": 8100,
                    "max_num_seqs": 16, "max_num_batched_tokens": 512, "max_model_len": 256,
                    "num_gpu_blocks": 40, "vllm_args": ["--enforce-eager"]})
    cmd = launcher.scheduler_command(cfg, "/resolved", extra=["--seed", "2"], python="py")
    assert cmd == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model", "/resolved",
                   "--host", "0.0.0.0", "--port", "8100", "--max-num-seqs", "16",
                   "--max-num-batched-tokens", "512", "--max-model-len", "256",
                   "--num-gpu-blocks-override", "40",
                   "--scheduler-cls", "tuned.engines.vllm.TunedScheduler",
                   "--enforce-eager", "--seed", "2"]
    env = launcher.scheduler_env(cfg, {"PATH": "/bin"})
    assert env["PATH"] == "/bin" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert json.loads(env["TUNED_HANDOFF"]) == \
        engine_handoff(cfg, "http://127.0.0.1:8100/health")["tuned"]


def test_the_config_rides_in_the_environment_not_in_vllms_compile_cache_key():
    """vLLM hashes ``additional_config`` into the key of its compile cache
    (``VllmConfig.compute_hash``), the API server's port not: two configs that differ
    in a tuned key and in their ports give the same engine arguments but the port, and
    the engine reads each one's own config from its environment."""
    from tuned.config import engine_setup

    a = validate({"model": "/m", "interval_s": 0.5, "port": 8100, "metrics_port": 9100})
    b = validate({"model": "/m", "interval_s": 1.0, "port": 8200, "metrics_port": 9200})
    cmd_a, cmd_b = (launcher.scheduler_command(c, "/m", python="py") for c in (a, b))
    assert "--additional-config" not in cmd_a
    assert [x if x != "8100" else "PORT" for x in cmd_a] == \
        [x if x != "8200" else "PORT" for x in cmd_b]
    for cfg in (a, b):
        setup = engine_setup({}, launcher.scheduler_env(cfg, {}))
        assert (setup.cfg.interval_s, setup.cfg.metrics_port) == (cfg.interval_s,
                                                                   cfg.metrics_port)
        assert setup.serving_url == f"http://127.0.0.1:{cfg.port}/health"


def test_the_429_gateway_rides_along_where_the_wait_bound_refuses():
    """tuned.engines.gateway is loaded into the API server only where the queue may
    refuse: a TTFT target (so a wait bound) with on_max_wait = "refuse"."""
    mw = ["--middleware", "tuned.engines.gateway.RefuseWhenOverloaded"]

    def has_gateway(**kw):
        cmd = launcher.scheduler_command(validate({"model": "/m", **kw}), "/m", python="py")
        return any(cmd[i:i + 2] == mw for i in range(len(cmd)))

    assert has_gateway(ttft_sla_s=2.0)
    assert has_gateway(max_wait_s=30.0)
    assert not has_gateway(ttft_sla_s=2.0, on_max_wait="serve")
    assert not has_gateway()


def test_serve_command_for_a_tuned_run():
    assert launcher.serve_command("/r/c.toml", python="py") == \
        ["py", "-m", "tuned", "serve", "--config", "/r/c.toml"]
    assert launcher.serve_command(Path("c.toml"), model_cache="/cache", extra=["--dtype",
                                "float32"], python="py") == \
        ["py", "-m", "tuned", "serve", "--config", "c.toml", "--model-cache", "/cache", "--",
         "--dtype", "float32"]


def test_serve_uses_the_launcher():
    from tuned.launch import serve

    cfg = Config(model="/models/x")
    assert serve.server_command(cfg, "/m", ["--x"]) == launcher.scheduler_command(cfg, "/m",
                                                                                ["--x"])
    assert serve.build_env(cfg, {}) == launcher.scheduler_env(cfg, {})


def test_one_kv_cache_default_that_the_operator_overrides():
    assert launcher.child_env({"PATH": "/bin"}) == {"PATH": "/bin",
                                                  "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert launcher.child_env({"VLLM_CPU_KVCACHE_SPACE": "4"})["VLLM_CPU_KVCACHE_SPACE"] == "4"


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_spawn_logs_in_a_new_session_and_stop_process_ends_the_group(tmp_path):
    log = tmp_path / "engine.log"
    # the child starts a grandchild in its group and ignores nothing: SIGTERM ends both
    proc = launcher.spawn(_child(
        "import os, subprocess, sys, time\n"
        "g = subprocess.Popen(['sleep', '60'])\n"
        "print('kv', os.environ['VLLM_CPU_KVCACHE_SPACE'], 'grandchild', g.pid, flush=True)\n"
        "time.sleep(60)\n"), env={"PATH": "/usr/bin:/bin"}, log_path=log, header="# started")
    assert os.getpgid(proc.pid) == proc.pid != os.getpgid(0)
    deadline = time.monotonic() + 30
    while "grandchild" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = log.read_text().splitlines()
    assert lines[0] == "# started" and lines[1].startswith("kv 1 grandchild ")
    grandchild = int(lines[1].split()[-1])
    launcher.stop_process(proc, grace_s=10)
    assert proc.returncode == -15
    deadline = time.monotonic() + 10
    while Path(f"/proc/{grandchild}").exists() and time.monotonic() < deadline:
        # a zombie until init reaps it: only its state matters
        if Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{grandchild}").exists() or \
        Path(f"/proc/{grandchild}/stat").read_text().split()[2] == "Z"


def test_stop_process_kills_a_child_that_ignores_sigterm(tmp_path):
    proc = launcher.spawn(_child("import signal, time\n"
                               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                               "print('ready', flush=True)\n"
                               "time.sleep(60)\n"), log_path=tmp_path / "log")
    while "ready" not in (tmp_path / "log").read_text():
        assert proc.poll() is None
        time.sleep(0.05)
    launcher.stop_process(proc, grace_s=0.5)
    assert proc.returncode == -9
    launcher.stop_process(proc)  # already gone: nothing to do


def test_a_sleep_child_stops_on_sigterm():
    proc = launcher.spawn(["sleep", "60"])
    launcher.stop_process(proc, grace_s=10)
    assert proc.returncode == -15


def test_wait_ready_on_a_child_that_exits_early_shows_the_log_tail(tmp_path):
    log = tmp_path / "engine.log"
    proc = launcher.spawn(_child("for i in range(40): print('line', i)\n"
                               "raise SystemExit(3)"), log_path=log)
    with pytest.raises(EngineError) as e:
        launcher.wait_ready("http://127.0.0.1:9", proc, 60, log, poll_s=0.05)
    msg = str(e.value)
    assert msg.startswith(f"engine exited with code 3 while starting; last lines of {log}:\n")
    assert msg.splitlines()[1:] == [f"line {i}" for i in range(10, 40)]


class _Answer:
    def __init__(self, status: int, body: dict):
        self.status, self._body = status, json.dumps(body).encode()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self) -> bytes:
        return self._body


def test_wait_ready_returns_when_health_and_models_answer(tmp_path):
    proc = launcher.spawn(["sleep", "60"])
    seen: list[str] = []

    def opener(url, timeout):
        seen.append(url)
        if len(seen) < 3:
            raise ConnectionRefusedError(111, "refused")
        return _Answer(200, {})

    try:
        launcher.wait_ready("http://h:1", proc, 60, tmp_path / "log", opener=opener, poll_s=0)
    finally:
        launcher.stop_process(proc)
    assert seen == ["http://h:1/health", "http://h:1/health", "http://h:1/health",
                    "http://h:1/v1/models"]


def test_wait_ready_times_out_with_the_log_tail(tmp_path):
    log = tmp_path / "engine.log"
    log.write_text("loading weights\n")
    proc = launcher.spawn(["sleep", "60"])
    try:
        with pytest.raises(EngineError, match=r"engine not ready after 0s; last lines of "
                                              r".*engine.log:\nloading weights$"):
            launcher.wait_ready("http://127.0.0.1:9", proc, 0.2, log, poll_s=0.05,
                              opener=lambda url, timeout: _Answer(503, {}))
    finally:
        launcher.stop_process(proc)


def test_server_info_reads_the_model_card_and_version():
    answers = {"http://h:1/v1/models": _Answer(200, {"data": [
        {"id": "m", "root": "/models/m", "max_model_len": 512}]}),
        "http://h:1/version": _Answer(200, {"version": "0.32.0"})}
    info = launcher.server_info("http://h:1", opener=lambda url, timeout: answers[url])
    assert info == {"id": "m", "root": "/models/m", "max_model_len": 512, "version": "0.32.0"}
    with pytest.raises(EngineError, match=r"^http://h:1/v1/models lists no model$"):
        launcher.server_info("http://h:1", opener=lambda url, timeout: _Answer(200, {"data": []}))
