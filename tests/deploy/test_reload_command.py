"""`systemctl reload tuned` tells the truth: the unit's ExecReload line (`tuned reload
--config FILE`, read from systemd/tuned.service) against tuned's real endpoint and
controller (on the fake engine) exits 0 only once the new config is live, 2 with the
reason when tuned refuses it (the running config is kept), 5 when a changed key needs
a restart, 3 when nothing answers. And the unit's ExecStartPre line refuses a bad
config before the engine starts. tests/e2e/test_e2e_unit_reload.py runs the same
ExecReload line against the real vLLM engine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tuned import config
from tuned.control.controller import Controller
from tuned.control.metrics import Endpoint, Metrics
from tuned.base.netutil import free_port
from serve_harness import unit_command

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)


BASE = "interval_s = 0.1\nstale_after_s = 1.0\nmax_num_seqs = 16\n"


@pytest.fixture
def live(tmp_path):
    """A controller on the fake engine, its config read from a file, behind tuned's
    real endpoint on the file's metrics_port."""
    from fakes import FakeEngine

    port = free_port()
    path = tmp_path / "tuned.toml"
    path.write_text(f"metrics_port = {port}\n" + BASE)
    eng = FakeEngine(running=4, waiting=2)
    ctrl = Controller(config.load(path), eng, Metrics())
    ctrl.run_once()
    ep = Endpoint("127.0.0.1", port, ctrl.metrics, decisions=ctrl.decisions_json,
                  steps=lambda since: {"samples": []}, reload=ctrl.reload,
                  healthy=ctrl.healthy).start()
    try:
        yield ctrl, path, f"http://127.0.0.1:{port}"
    finally:
        ep.stop()


def test_a_refused_config_fails_the_reload_and_the_old_one_keeps_running(live):
    ctrl, path, url = live
    good = path.read_text()
    path.write_text(good + "tbt_sla_s = 50\n")
    r = run(unit_command("ExecReload", path))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"tuned reload: REFUSED by {url}: tbt_sla_s: must be in [0, 1), "
                        "got 50 (probably milliseconds: the SLA is in seconds, 50 ms "
                        "is 0.05); the previous config keeps running\n")
    assert ctrl.cfg.tbt_sla_s == 0.0 and ctrl.reloader.last["outcome"] == "refused"
    # a file that is not even TOML: still refused by tuned, and still said so
    path.write_text(good + "tbt_sla_s = \n")
    r = run(unit_command("ExecReload", path))
    assert r.returncode == 2 and r.stderr.startswith(f"tuned reload: REFUSED by {url}: not "
                                                     "valid TOML: "), r.stderr
    assert ctrl.cfg.tbt_sla_s == 0.0


def test_a_good_config_is_live_when_the_reload_returns(live):
    ctrl, path, url = live
    path.write_text(path.read_text() + "tbt_sla_s = 0.05\n")
    r = run(unit_command("ExecReload", path))
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == f"tuned reload: applied at {url} (changed: tbt_sla_s)\n"
    assert ctrl.cfg.tbt_sla_s == 0.05 and ctrl.reloader.last["outcome"] == "ok"


def test_a_restart_only_change_is_not_reported_as_live(live):
    ctrl, path, url = live
    path.write_text(path.read_text().replace("max_num_seqs = 16", "max_num_seqs = 8")
                    + "tbt_sla_s = 0.05\n")
    r = run(unit_command("ExecReload", path))
    assert (r.returncode, r.stdout) == (5, "")
    assert r.stderr == (f"tuned reload: applied at {url} (changed: tbt_sla_s) but "
                        "max_num_seqs only change with a restart (systemctl restart tuned); "
                        "their running values are kept\n")
    assert ctrl.cfg.max_num_seqs == 16 and ctrl.cfg.tbt_sla_s == 0.05


def test_nothing_answering_fails_the_reload(tmp_path):
    port = free_port()
    path = tmp_path / "tuned.toml"
    path.write_text(f"metrics_port = {port}\n")
    r = run(unit_command("ExecReload", path))
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr == (f"tuned reload: nothing answers at http://127.0.0.1:{port} "
                        "(connection refused); is tuned running and is this its "
                        "metrics_host:metrics_port?\n")


def test_the_start_refuses_a_bad_config_before_the_engine(tmp_path):
    path = tmp_path / "tuned.toml"
    path.write_text('model = "./no-such-folder"\ntbt_sla_s = 50\n')
    r = run(unit_command("ExecStartPre", path))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"{path}: tbt_sla_s: must be in [0, 1), got 50 (probably "
                        "milliseconds: the SLA is in seconds, 50 ms is 0.05)\n")
    path.write_text('model = "demo:tiny"\ntbt_sla_s = 0.05\n')
    r = run(unit_command("ExecStartPre", path))
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{path}: ok\n", "")
