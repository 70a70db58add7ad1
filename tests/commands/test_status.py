"""`tuned status` against a fake tuned endpoint, and as a real subprocess where it
matters: the summary an operator reads, one line for anything that is not tuned, and
every decision reason explained."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tuned import config as config_mod
from tuned.commands import status as status_mod
from tuned.commands.endpoint import DEFAULT_URL

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "tuned", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=timeout)


NOW = 1_763_800_000.0

DOC = {
    "current": {"t": NOW - 0.4, "seq": 57, "target": 12, "lower": 8, "upper": 16, "cap": 12,
                "token_budget": 544, "reason": "sla_over", "b_mem": 24, "b_sla": 12,
                "inputs": {"running": 12, "waiting": 3}},
    "recent": [
        {"t": NOW - 1.4, "seq": 55, "target": 14, "lower": 10, "upper": 18, "cap": 14,
         "token_budget": 560, "reason": "sla_hold", "b_mem": 24, "b_sla": 14, "inputs": {}},
        {"t": NOW - 0.9, "seq": 56, "target": 14, "lower": 10, "upper": 18, "cap": 14,
         "token_budget": 560, "reason": "sla_hold", "b_mem": 24, "b_sla": 14, "inputs": {}},
        {"t": NOW - 0.4, "seq": 57, "target": 12, "lower": 8, "upper": 16, "cap": 12,
         "token_budget": 544, "reason": "sla_over", "b_mem": 24, "b_sla": 12, "inputs": {}},
    ],
    "applied": {"cap": 12, "token_budget": 544, "fallback": False, "fallback_cause": None},
    "config": {"queue_policy": "mcsf", "profile": "/var/lib/tuned/profiles/demo.json",
               "tbt_sla_s": 0.05, "source_path": "/etc/tuned/tuned.toml", "interval_s": 0.5},
    "last_reload": {"t": NOW - 30.0, "outcome": "refused",
                    "problems": ["b_min: must be <= b_max (10), got 20"],
                    "restart_needed": []},
    "telemetry": {"tbt_mean_s": 0.0523, "decode_batch_mean": 11.8, "kv_usage": 0.625,
                  "kv_capacity_tokens": 65536,
                  "gpu": [{"index": 0, "name": "NVIDIA L4", "used_bytes": 18 * 2**30,
                           "total_bytes": 24 * 2**30}],
                  "running": 12, "waiting": 3},
    "engine": {"ceiling": 32, "max_num_batched_tokens": 2048, "dp_rank": 0},
}


class FakeTuned:
    """tuned's endpoint as far as `tuned status` sees it: /decisions and /healthz."""

    def __init__(self, doc, healthy=True, decisions_status=200, body=None):
        self.doc, self.healthy = doc, healthy
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.startswith("/decisions"):
                    code = decisions_status
                    data = body if body is not None else json.dumps(outer.doc).encode()
                elif self.path == "/healthz":
                    code = 200 if outer.healthy else 503
                    data = json.dumps({"healthy": outer.healthy}).encode()
                else:
                    code, data = 404, b"{}"
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def status_lines(url, **kw):
    out, err = io.StringIO(), io.StringIO()
    code = status_mod.status(url, out=out, err=err, now=NOW, **kw)
    return code, out.getvalue().splitlines(), err.getvalue()


def test_status_summary_lines():
    with FakeTuned(DOC) as srv:
        code, lines, err = status_lines(srv.url)
    assert code == 0 and err == ""
    assert lines[0] == (f"tuned at {srv.url} (dp rank 0): engine ceiling 32 seqs, "
                        "max_num_batched_tokens 2048")
    assert lines[1] == ("decision:    #57 (0.4 s ago): target 12 seqs in [8, 16] -> cap 12, "
                        "token budget 544 (memory bound b_mem 24, SLA bound b_sla 12)")
    assert lines[2] == ("reason:      sla_over: TBT above the SLA plus its tolerance "
                        "eps_d_s: the SLA search moves down")
    assert lines[3] == "applied:     cap 12 seqs, token budget 544 tokens, fallback no"
    assert lines[4] == ("TBT:         mean 52.3 ms vs SLA 50.0 ms: over by 5%; "
                        "decode batch mean 11.8")
    assert lines[5] == "requests:    running 12, waiting 3"
    assert lines[6] == "KV cache:    62.5% used of 65,536 tokens"
    assert lines[7] == "GPU 0:       NVIDIA L4: 18.0 GiB / 24.0 GiB used (75%)"
    assert lines[8] == ("config:      queue policy mcsf, profile /var/lib/tuned/profiles/demo.json, "
                        "interval 0.5 s, file /etc/tuned/tuned.toml")
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(NOW - 30))
    assert lines[9] == (f"last reload: REFUSED at {stamp} (30.0 s ago); "
                        "the previous config keeps running")
    assert lines[10] == "  problem: b_min: must be <= b_max (10), got 20"
    assert lines[11] == "recent:      3 decisions: sla_hold 2, sla_over 1; cap 12..14"
    assert len(lines) == 12

def test_status_says_whether_the_cap_binds():
    doc = copy.deepcopy(DOC)
    doc["current"].setdefault("inputs", {})["cap_note"] = "the cap binds: 12 running at cap 12"
    with FakeTuned(doc) as srv:
        code, lines, _ = status_lines(srv.url)
    assert code == 0 and lines[3] == "binding:     the cap binds: 12 running at cap 12"


def test_status_without_decision_gpu_or_reload_and_in_fallback():
    doc = copy.deepcopy(DOC)
    doc.update(current=None, recent=[])
    doc["applied"].update(cap=4, fallback=True, fallback_cause="stale")
    doc["config"].update(tbt_sla_s=0.0, profile="", source_path="")
    doc["telemetry"].update(gpu=None, tbt_mean_s=None, decode_batch_mean=None)
    doc["last_reload"] = {"t": None, "outcome": "none", "problems": [], "restart_needed": []}
    with FakeTuned(doc, healthy=False) as srv:
        code, lines, _ = status_lines(srv.url)
    assert code == 0
    text = "\n".join(lines)
    assert "controller:  STALLED (/healthz 503)" in text
    assert "decision:    none yet (the controller has not completed a tick)" in lines
    assert ("applied:     cap 4 seqs, token budget 544 tokens, FALLBACK (stale: the last "
            "decision is older than stale_after_s (controller stalled))") in lines
    assert ("TBT:         mean n/a (no decode steps in the window) "
            "(no SLA: tbt_sla_s = 0, memory bound only)") in lines
    assert "GPU:         no GPU (engine-only telemetry)" in lines
    assert ("config:      queue policy mcsf, profile none, interval 0.5 s, "
            "file embedded default") in lines
    assert "last reload: none since start" in lines
    assert not any(ln.startswith("recent:") for ln in lines)


def test_status_shows_draining_when_the_batch_is_above_the_cap():
    doc = copy.deepcopy(DOC)
    doc["current"].update(cap=10, batch=14)
    with FakeTuned(doc) as srv:
        _, lines, _ = status_lines(srv.url)
    assert lines[3] == ("draining:    batch 14 running above cap 10: no admissions until "
                        "they finish (none is preempted)")
    doc["current"].update(batch=10)
    with FakeTuned(doc) as srv:
        _, lines, _ = status_lines(srv.url)
    assert not any(ln.startswith("draining:") for ln in lines)


def test_status_reload_ok_with_restart_needed():
    doc = copy.deepcopy(DOC)
    doc["last_reload"] = {"t": NOW - 5, "outcome": "ok", "problems": [],
                          "restart_needed": ["max_num_seqs"], "changed": ["tbt_sla_s"]}
    with FakeTuned(doc) as srv:
        _, lines, _ = status_lines(srv.url)
    reload_at = next(i for i, ln in enumerate(lines) if ln.startswith("last reload:"))
    assert lines[reload_at].startswith("last reload: ok at ")
    assert lines[reload_at].endswith("(5.0 s ago); changed tbt_sla_s")
    assert lines[reload_at + 1] == ("  restart needed (running values kept until "
                                    "`systemctl restart`): max_num_seqs")


def test_status_json_prints_the_document_via_the_cli():
    with FakeTuned(DOC) as srv:
        r = run_cli("status", "--url", srv.url, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == DOC


def test_status_summary_via_the_cli_accepts_host_port_and_path():
    with FakeTuned(DOC) as srv:
        r = run_cli("status", "--url", srv.url.removeprefix("http://") + "/decisions")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(f"tuned at {srv.url} (dp rank 0)")
    assert "applied:     cap 12 seqs" in r.stdout


def test_status_when_nothing_listens():
    # A bound socket that never listens: connections to it are refused, and no other
    # process can take the port while the test runs.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        r = run_cli("status", "--url", url)
    assert r.returncode == 3
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tuned status:")]
    assert len(lines) == 1
    assert lines[0].startswith(f"tuned status: nothing answers at {url}/decisions "
                               "(connection refused)")


def test_status_default_url_is_tunes_metrics_port():
    assert DEFAULT_URL == f"http://127.0.0.1:{config_mod.Config().metrics_port}"


@pytest.mark.parametrize("kind", ["http_404", "not_json", "not_tuned_json"])
def test_status_when_something_else_answers(kind):
    kw = {"http_404": dict(decisions_status=404),
          "not_json": dict(body=b"<html>hello</html>"),
          "not_tuned_json": dict(body=b'{"status": "success"}')}[kind]
    with FakeTuned(DOC, **kw) as srv:
        code, lines, err = status_lines(srv.url)
    assert code == 4 and lines == []
    assert err.startswith(f"tuned status: {srv.url}/decisions ")
    assert len(err.strip().splitlines()) == 1


def test_status_unexpected_shape_is_one_line_not_a_traceback():
    doc = copy.deepcopy(DOC)
    doc["current"] = {"seq": 1}  # no target/lower/upper
    with FakeTuned(doc) as srv:
        code, lines, err = status_lines(srv.url)
    assert code == 4
    assert "cannot read the answer" in err and "try --json" in err


def test_status_rejects_a_non_http_url():
    code, lines, err = status_lines("ftp://example.invalid")
    assert code == 2 and "bad URL" in err


def test_every_reason_the_policies_emit_is_explained():
    import re

    from tuned.control.metrics import FALLBACK_CAUSES

    # every reason literal in the batch policies' sources has an explanation
    root = Path(status_mod.__file__).parents[1]
    src = "".join((root / "policies" / f).read_text()
                  for f in ("batch.py", "memory_bound.py", "sla_bound.py", "static.py", "trtllm.py"))
    emitted = set(re.findall(r'reason(?:=|, | = )"([a-z_]+)"', src))
    emitted |= set(re.findall(r'"(sla_[a-z_]+|memory[a-z_]*|hold_[a-z_]+)"', src))
    emitted |= {"profile_initial", "floor_running"}
    assert {"initial", "memory", "sla_over", "sla_under", "sla_hold", "sla_idle",
            "sla_expand", "sla_over_prefill", "sla_infeasible", "static",
            "trtllm"} <= emitted
    inputs = {"sla_feasible", "sla_infeasible_why", "sla_s", "sla_statistic",
              "sla_setpoint_s", "sla_margin", "sla_attainment_target"}   # input keys
    assert emitted - inputs <= set(status_mod.REASONS)
    assert set(status_mod.FALLBACK_CAUSES) == set(FALLBACK_CAUSES)
