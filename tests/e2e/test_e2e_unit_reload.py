"""`systemctl reload tuned` on the real vLLM CPU engine: the unit's own ExecReload line
(systemd/tuned.service, run by this checkout's interpreter on the test's config file)
against a running `tuned serve`.

1. A config tuned refuses (``tbt_sla_s = 50``, milliseconds meant): the command exits 2
   with the reason on stderr (what the journal gets); the running config is unchanged,
   decisions keep coming and a completion is still served.
2. A good config (an SLA): the command exits 0 and, the moment it returns, the new
   config is live (/decisions and /metrics carry it).
"""

from __future__ import annotations

import subprocess
import time

import pytest

from serve_harness import (ROOT, get_json, metric_values, mval, tuned_serve, unit_command,
                           wait_for)

pytestmark = [pytest.mark.slow, pytest.mark.parallel]

CONFIG = ("max_num_seqs = 8\nmax_num_batched_tokens = 512\nmax_model_len = 512\n"
          "num_gpu_blocks = 16\ninterval_s = 0.5\nstale_after_s = 5.0\ntbt_sla_s = 0.0\n"
          "eps_d_s = 0.0\n" 'vllm_args = ["--enforce-eager"]\n')


def complete(srv) -> int:
    """One completion through the OpenAI API; the number of tokens it produced."""
    import json
    import urllib.error
    import urllib.request

    body = json.dumps({"model": srv.model_id(), "prompt": list(range(20, 52)), "max_tokens": 8,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(srv.api + "/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:
        raise AssertionError(f"HTTP {e.code}: {e.read()[:2000]!r}\n{srv.log_tail(120)}") from None


def reload_cmd(srv) -> subprocess.CompletedProcess:
    return subprocess.run(unit_command("ExecReload", srv.config_path), capture_output=True,
                          text=True, timeout=180, cwd=ROOT)


@pytest.mark.timeout(600)
def test_unit_reload_tells_the_truth(tmp_path, tiny_model):
    with tuned_serve(tmp_path, f'model = "{tiny_model}"\n' + CONFIG) as srv:
        base = srv.config_path.read_text()
        before = srv.decisions(0)
        assert before["config"]["tbt_sla_s"] == 0.0

        # ---- 1. refused: exit 2, the reason, the old config keeps serving
        srv.config_path.write_text(base.replace("tbt_sla_s = 0.0\n", "tbt_sla_s = 50\n"))
        r = reload_cmd(srv)
        assert (r.returncode, r.stdout) == (2, ""), r.stderr + srv.log_tail()
        assert r.stderr == (f"tuned reload: REFUSED by {srv.endpoint}: tbt_sla_s: must be "
                            "in [0, 1), got 50 (probably milliseconds: the SLA is in "
                            "seconds, 50 ms is 0.05); the previous config keeps running\n")
        d = srv.decisions(0)
        assert d["last_reload"]["outcome"] == "refused"
        assert d["config"] == before["config"]
        seq = d["current"]["seq"]
        wait_for("decisions after the refusal",
                 lambda: srv.decisions(0)["current"]["seq"] >= seq + 2, 60, 0.2)
        assert complete(srv) == 8
        vals = metric_values(srv)
        assert mval(vals, "tuned_reloads_total", outcome="refused") == 1
        assert mval(vals, "tuned_reloads_total", outcome="ok") == 0

        # ---- 2. applied: exit 0, live the moment the command returns
        srv.config_path.write_text(base.replace("tbt_sla_s = 0.0\n", "tbt_sla_s = 0.5\n"))
        r = reload_cmd(srv)
        t_returned = time.time()
        assert (r.returncode, r.stderr) == (0, ""), r.stderr + srv.log_tail()
        assert r.stdout == f"tuned reload: applied at {srv.endpoint} (changed: tbt_sla_s)\n"
        d = get_json(f"{srv.endpoint}/decisions?limit=0")
        assert d["config"]["tbt_sla_s"] == 0.5
        assert d["last_reload"]["outcome"] == "ok" and d["last_reload"]["t"] <= t_returned
        vals = metric_values(srv)
        assert mval(vals, "tuned_tbt_sla_seconds") == 0.5
        assert mval(vals, "tuned_reloads_total", outcome="ok") == 1
        assert complete(srv) == 8
