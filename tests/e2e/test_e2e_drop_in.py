"""tuned dropped into an existing vLLM command line, end to end: the operator's own
``python -m vllm.entrypoints.openai.api_server ... --scheduler-cls
tuned.engines.vllm.TunedScheduler --max-num-seqs N --max-num-batched-tokens M``.

- With no TOML and no ``TUNED_CONFIG`` (tuned's own keys from a ``TUNED_<KEY>``
  variable and ``--additional-config``), it serves, and tuned runs on the engine's
  ceiling N and token budget M.
- With a TOML that says ``max_num_seqs = 8`` against ``--max-num-seqs 16``, the server
  exits non-zero with tuned's one-line refusal, before vLLM starts loading the model
  (tuned's vLLM plugin refuses in the process that parses the arguments).

Run under ``flock /tmp/tuned-engine.lock``: it starts two servers, one after the other.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

import pytest

from serve_harness import engine_args, get_json, get_text, mval, parse_metric_values
from tuned.launch import launcher
from tuned.base.netutil import free_port

pytestmark = [pytest.mark.slow, pytest.mark.parallel]

CEILING, BATCHED_TOKENS = 6, 384
MAX_TOKENS = 16
#: what vLLM's CPU model runner logs as it starts loading the weights
MODEL_LOADING = "Starting to load model"
GIVE_UP_S = 600.0


def _command(model, port: int, max_num_seqs: int, additional: dict | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--scheduler-cls", "tuned.engines.vllm.TunedScheduler",
           "--max-num-seqs", str(max_num_seqs), "--max-num-batched-tokens", str(BATCHED_TOKENS),
           "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(port),
           *engine_args()]
    if additional is not None:
        cmd += ["--additional-config", json.dumps(additional)]
    return cmd


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TUNED_CONFIG"}
    return {**env, **extra}


def test_drop_in_with_no_toml_reads_the_engines_settings(tmp_path, tiny_model, capsys):
    port = free_port()
    mport = free_port(avoid=(port,))
    cmd = _command(tiny_model, port, CEILING, {"tuned": {"queue_policy": "mcsf"}})
    log_path = tmp_path / "vllm.log"
    start = time.monotonic()
    proc = launcher.spawn(cmd, env=_env(TUNED_METRICS_PORT=str(mport)), log_path=log_path,
                        header="$ " + " ".join(cmd))
    base, endpoint = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}"
    try:
        launcher.wait_ready(base, proc, GIVE_UP_S, log_path)
        with capsys.disabled():
            print(f"\nserving {time.monotonic() - start:.1f} s after the start")
        launcher.wait_decided(endpoint, proc, time.monotonic() + GIVE_UP_S, log_path)
        model = get_json(f"{base}/v1/models")["data"][0]["id"]
        body = json.dumps({"model": model, "prompt": list(range(10, 40)),
                           "max_tokens": MAX_TOKENS, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            assert json.loads(r.read())["usage"]["completion_tokens"] == MAX_TOKENS
        values = parse_metric_values(get_text(f"{endpoint}/metrics"))
        assert mval(values, "tuned_ceiling_seqs") == CEILING
        assert 0 < mval(values, "tuned_token_budget_tokens") <= BATCHED_TOKENS
        d = get_json(f"{endpoint}/decisions?limit=0")
        assert (d["engine"]["ceiling"], d["engine"]["max_num_batched_tokens"],
                d["config"]["queue_policy"], d["config"]["source_path"]) == (
            CEILING, BATCHED_TOKENS, "mcsf", "")
    finally:
        launcher.stop_process(proc)
    # what the refusal below must come before
    assert MODEL_LOADING in log_path.read_text(errors="replace")


def test_contradicting_toml_is_refused_before_the_model_loads(tmp_path, tiny_model, capsys):
    port = free_port()
    cfg_path = tmp_path / "tuned.toml"
    cfg_path.write_text(f"max_num_seqs = 8\nmetrics_port = {free_port(avoid=(port,))}\n")
    cmd = _command(tiny_model, port, 16, {"tuned": {"config_path": str(cfg_path)}})
    log_path = tmp_path / "vllm.log"
    start = time.monotonic()
    proc = launcher.spawn(cmd, env=_env(), log_path=log_path)
    try:
        rc = proc.wait(timeout=GIVE_UP_S)
    finally:
        launcher.stop_process(proc)
    refused_s = time.monotonic() - start
    log = log_path.read_text(errors="replace")
    line = (f"tuned: config refused: {cfg_path.resolve()}: max_num_seqs: the config says 8, "
            "vLLM was given --max-num-seqs 16; remove it from the config or give both the "
            "same value")
    assert rc == 1, log[-3000:]
    assert [ln for ln in log.splitlines() if ln.startswith("tuned: ")] == [line], log[-3000:]
    # refused in the API server: no engine core started, no weights loaded, no traceback
    assert MODEL_LOADING not in log and "EngineCore" not in log and "Traceback" not in log, \
        log[-3000:]
    with capsys.disabled():
        print(f"\nrefused {refused_s:.1f} s after the start")
