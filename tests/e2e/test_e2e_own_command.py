"""tuned inside an operator's own vLLM command line, end to end.

vLLM's OpenAI server is started as docs/kubernetes.md writes it (the documented
arguments, with the demo model's folder and this test's config file in place of the
documented ones, and this test's interpreter for ``python``; then ``--host``/``--port``
and this host's ``--dtype`` and ``--enforce-eager``, as every slow test starts its
engines), not through `tuned serve`:

- with ``--additional-config '{"tuned": {"config_path": FILE}}'`` it serves requests
  while tuned steers it (tuned's ``/decisions`` answers with the file's config, the
  running count stays at the config's ``b_max`` while more wait), and ``POST /reload``
  re-reads the file;
- with ``TUNED_CONFIG=FILE`` and a config that contradicts the engine's
  ``--max-num-seqs``, the server stops at start with tuned's one-line error;
- the line ``tuned serve --print-command`` prints, run as printed, serves.

Run under ``flock /tmp/engine.lock``: it starts three engines, one after the other.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from serve_harness import dtype_args, engine_args, get_json
from doc_readers import documented_command
from tuned.launch import launcher
from tuned.base.netutil import free_port

pytestmark = [pytest.mark.slow, pytest.mark.parallel]

#: the documented command line's engine settings (docs/kubernetes.md)
CEILING, BATCHED_TOKENS = 256, 8192
B_MAX = 3
REQUESTS = 8
MAX_TOKENS = 24
#: how long a start may take before the test calls it stuck (a guard, not a bound)
GIVE_UP_S = 600.0


def _config(model, metrics_port: int, max_num_seqs: int = CEILING, b_max: int = B_MAX) -> str:
    return (f'model = "{model}"\nmax_num_seqs = {max_num_seqs}\n'
            f"max_num_batched_tokens = {BATCHED_TOKENS}\nmetrics_port = {metrics_port}\n"
            f"b_max = {b_max}\nfallback_cap = {b_max}\ninterval_s = 0.25\n")


def _local(cmd: list[str], port: int) -> list[str]:
    # the documented `python` is the one vLLM and tuned are installed in
    assert cmd[0] == "python"
    return [sys.executable, *cmd[1:], "--host", "127.0.0.1", "--port", str(port),
            *engine_args()]


def _complete(base: str, model: str, i: int, out: list) -> None:
    body = json.dumps({"model": model, "prompt": list(range(10 + i, 40 + i)),
                       "max_tokens": MAX_TOKENS, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out.append(json.loads(r.read()))


def _post_reload(endpoint: str) -> dict:
    req = urllib.request.Request(f"{endpoint}/reload", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_documented_command_line_serves_with_tuned_steering(tmp_path, tiny_model):
    port = free_port()
    mport = free_port(avoid=(port,))
    cfg_path = tmp_path / "tuned.toml"
    cfg_path.write_text(_config(tiny_model, mport))
    cmd = _local(documented_command(str(tiny_model), str(cfg_path)), port)
    assert "tuned serve" not in " ".join(cmd)
    log_path = tmp_path / "vllm.log"
    proc = launcher.spawn(cmd, log_path=log_path, header="$ " + " ".join(cmd))
    base, endpoint = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}"
    try:
        launcher.wait_ready(base, proc, GIVE_UP_S, log_path)
        launcher.wait_decided(endpoint, proc, time.monotonic() + GIVE_UP_S, log_path)
        d = get_json(f"{endpoint}/decisions?limit=0")
        assert d["config"]["source_path"] == str(cfg_path.resolve())
        assert (d["engine"]["ceiling"], d["engine"]["max_num_batched_tokens"]) == (
            CEILING, BATCHED_TOKENS)
        seq0 = get_json(f"{endpoint}/steps?since=0")["next"]

        # more requests at once than tuned lets run: all complete, B_MAX at a time
        model = get_json(f"{base}/v1/models")["data"][0]["id"]
        results: list = []
        threads = [threading.Thread(target=_complete, args=(base, model, i, results))
                   for i in range(REQUESTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=GIVE_UP_S)
        assert [r["usage"]["completion_tokens"] for r in results] == [MAX_TOKENS] * REQUESTS, \
            launcher.log_tail(log_path)
        steps = get_json(f"{endpoint}/steps?since={seq0}")["samples"]
        assert max(s["num_running"] for s in steps) == B_MAX
        assert max(s["num_waiting"] for s in steps) > 0
        d = get_json(f"{endpoint}/decisions?limit=200")
        assert d["recent"] and all(r["cap"] <= B_MAX for r in d["recent"])
        assert d["applied"]["cap"] <= B_MAX

        # no supervisor: POST /reload re-reads the file the command line names
        cfg_path.write_text(_config(tiny_model, mport) + "tbt_sla_s = 0.5\n")
        res = _post_reload(endpoint)
        assert res["outcome"] == "ok", res
        assert get_json(f"{endpoint}/decisions?limit=0")["config"]["tbt_sla_s"] == 0.5
    finally:
        launcher.stop_process(proc)


def test_contradicting_config_stops_the_engine_at_start(tmp_path, tiny_model):
    port = free_port()
    cfg_path = tmp_path / "tuned.toml"
    cfg_path.write_text(_config(tiny_model, free_port(avoid=(port,)), max_num_seqs=32))
    cmd = documented_command(str(tiny_model), str(cfg_path))
    i = cmd.index("--additional-config")
    cmd = _local(cmd[:i] + cmd[i + 2:], port)  # the config named by TUNED_CONFIG instead
    log_path = tmp_path / "vllm.log"
    env = {**launcher.child_env(), "TUNED_CONFIG": str(cfg_path)}
    proc = launcher.spawn(cmd, env=env, log_path=log_path)
    try:
        rc = proc.wait(timeout=GIVE_UP_S)
    finally:
        launcher.stop_process(proc)
    log = log_path.read_text(errors="replace")
    assert rc != 0, log[-3000:]
    line = (f"tuned: config refused: {cfg_path.resolve()}: max_num_seqs: the config says 32, "
            f"vLLM was given --max-num-seqs {CEILING}; remove it from the config or give both "
            "the same value")
    assert line in log.splitlines(), log[-3000:]


def test_printed_command_runs_as_printed(tmp_path, tiny_model):
    """`tuned serve --print-command` for a demo model: the printed line, run as is,
    serves the demo model at its 1024-token length with tuned deciding."""
    port = free_port()
    mport = free_port(avoid=(port,))
    cfg_path = tmp_path / "tuned.toml"
    cfg_path.write_text(f'model = "demo:tiny"\nmax_num_seqs = 8\nmax_num_batched_tokens = 512\n'
                        f"port = {port}\nmetrics_port = {mport}\n"
                        f'vllm_args = ["--enforce-eager", "--dtype", "{dtype_args()[1]}"]\n')
    # the demo model is built where the tests keep theirs (the fixture built it)
    printed = subprocess.run([sys.executable, "-m", "tuned", "serve", "--print-command",
                              str(cfg_path), "--model-cache", str(tiny_model.parent)],
                             capture_output=True, text=True, timeout=300, check=True).stdout
    cmd = shlex.split(printed)
    assert cmd[0] == "env" and cmd[cmd.index("--model") + 1] == str(tiny_model)
    log_path = tmp_path / "vllm.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base, endpoint = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}"
    try:
        launcher.wait_ready(base, proc, GIVE_UP_S, log_path)
        launcher.wait_decided(endpoint, proc, time.monotonic() + GIVE_UP_S, log_path)
        assert launcher.server_info(base)["max_model_len"] == 1024
        d = get_json(f"{endpoint}/decisions?limit=0")
        assert (d["config"]["source_path"], d["engine"]["ceiling"]) == (
            str(cfg_path.resolve()), 8)
        model = get_json(f"{base}/v1/models")["data"][0]["id"]
        results: list = []
        _complete(base, model, 0, results)
        assert results[0]["usage"]["completion_tokens"] == MAX_TOKENS
    finally:
        launcher.stop_process(proc)
