"""A real vLLM CPU engine under a fault in tuned's waiting queue and a log sink that
refuses every write: every request completes.

The fault: a profile whose speed and USL fits are missing
(what ``fit_all`` writes when those fits fail), ``queue_policy = "saber"`` and
requests with a deadline, so that SABER's ``speed_tok_s`` raises ``ProfileError``
inside a method of the waiting queue vLLM calls. Once the server is up, stderr of
every process of it (tuned's log sink) is switched to ``/dev/full``, where every write
fails with ``ENOSPC``: the log line about the fault cannot be written either. (From
the start it cannot be: vLLM's model worker dies on its own weight-loading progress
bar, tqdm, which raises on the full disk.) The switch is a ``sitecustomize`` on the
server's ``PYTHONPATH`` whose thread, in each process, ``dup2``s ``/dev/full`` onto
fd 2 once a trigger file exists. The test reads what happened from ``/metrics``.
"""

from __future__ import annotations

import dataclasses
import os
import time
import urllib.request
from pathlib import Path

import pytest

from serve_harness import ROOT, Load, _wait_ready, metric_values, mval, start_server, stop
from tuned.curves.profile import load_profile, save_profile

pytestmark = [pytest.mark.slow, pytest.mark.parallel, pytest.mark.timeout(900)]

REQUESTS = 16
FALLBACK_CAP = 2
#: a guard against hanging, not a threshold
GIVE_UP_S = 300.0


SITECUSTOMIZE = """\
import os, threading, time

def _watch(trigger):
    while not os.path.exists(trigger):
        time.sleep(0.05)
    fd = os.open("/dev/full", os.O_WRONLY)
    os.dup2(fd, 2)

_t = os.environ.get("TUNED_TEST_STDERR_FULL_TRIGGER")
if _t:
    threading.Thread(target=_watch, args=(_t,), daemon=True, name="stderr-full").start()
"""


def profile_without_speed_fits(path):
    p = load_profile(ROOT / "tests" / "data" / "profile_v1.json")
    return save_profile(dataclasses.replace(p, speed={}, best_speed=None, usl=None), path)


def test_saber_without_speed_fits_and_a_full_disk_under_stderr(tmp_path, tiny_model):
    prof = profile_without_speed_fits(tmp_path / "no-speed.json")
    assert load_profile(prof).usl is None and not load_profile(prof).speed
    config = (f'model = "{tiny_model}"\nmax_num_seqs = 8\nmax_num_batched_tokens = 512\n'
              f"max_model_len = 512\nnum_gpu_blocks = 64\ninterval_s = 0.25\n"
              f"fallback_cap = {FALLBACK_CAP}\nqueue_policy = \"saber\"\n"
              f'profile = "{prof}"\nvllm_args = ["--enforce-eager"]\n')
    pydir = tmp_path / "pythonpath"
    pydir.mkdir()
    (pydir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    trigger = tmp_path / "stderr-full"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(pydir),
           "TUNED_TEST_STDERR_FULL_TRIGGER": str(trigger)}
    srv = start_server(tmp_path, config, env)
    try:
        assert _wait_ready(srv, GIVE_UP_S, last_try=True)
        trigger.touch()
        time.sleep(0.5)
        log_size = Path(srv.log_path).stat().st_size
        load = Load(srv, concurrency=4, prompt_tokens=(8, 32), max_tokens=(4, 16),
                    xargs={"tuned_deadline_s": 60.0}).start()
        deadline = time.monotonic() + GIVE_UP_S
        while load.completed + len(load.errors) < REQUESTS and time.monotonic() < deadline:
            time.sleep(0.2)
        load.stop()
        assert load.errors == []
        assert load.completed == load.sent >= REQUESTS
        v = metric_values(srv)
        faults = {dict(lb)["where"]: val for (name, lb), val in v.items()
                  if name == "tuned_step_path_errors_total"}
        assert sum(faults.values()) >= 1, faults
        assert mval(v, "tuned_fallbacks_total", cause="step_path_error") == 1
        assert mval(v, "tuned_fallback_active") == 1
        assert mval(v, "tuned_applied_cap_seqs") == FALLBACK_CAP
        # the step_path_error line and every later one hit the full disk
        assert mval(v, "tuned_log_lines_dropped_total") >= 1
        # every request left the engine (counted on the controller's next ticks)
        while (mval(v, "tuned_requests_finished_total") < load.sent
               and time.monotonic() < deadline):
            time.sleep(0.25)
            v = metric_values(srv)
        assert mval(v, "tuned_requests_finished_total") == load.sent
        with urllib.request.urlopen(f"{srv.endpoint}/healthz", timeout=5) as r:
            assert r.status == 200
        assert srv.proc.poll() is None
        # tuned's lines went nowhere: not one step_path_error line reached the log
        tail = Path(srv.log_path).read_bytes()[log_size:].decode(errors="replace")
        assert '"step_path_error"' not in tail
        print("\nstep-path faults contained:", faults, "log lines dropped:",
              mval(v, "tuned_log_lines_dropped_total"), "requests:", load.completed)
    finally:
        stop(srv.proc)
