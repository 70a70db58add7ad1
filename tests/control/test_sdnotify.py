"""tuned.control.sdnotify against a real AF_UNIX datagram socket standing in for systemd."""

from __future__ import annotations

import logging
import os
import socket
import uuid

import pytest

from tuned.control.sdnotify import SdNotifier, from_environ


@pytest.fixture
def notify_socket(tmp_path):
    """A bound datagram socket, like the one systemd passes in NOTIFY_SOCKET."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    yield str(path), sock
    sock.close()


def recv(sock: socket.socket) -> bytes:
    return sock.recv(4096)


def test_messages_arrive_byte_exact(notify_socket):
    path, sock = notify_socket
    n = SdNotifier(path, monotonic_usec=lambda: 123456789)
    assert n.enabled
    assert n.ready("serving demo:small") is True
    assert recv(sock) == b"READY=1\nSTATUS=serving demo:small"
    assert n.ready() is True
    assert recv(sock) == b"READY=1"
    assert n.watchdog() is True
    assert recv(sock) == b"WATCHDOG=1"
    assert n.reloading() is True
    assert recv(sock) == b"RELOADING=1\nMONOTONIC_USEC=123456789"
    assert n.stopping() is True
    assert recv(sock) == b"STOPPING=1"
    assert n.status("cap 12 (sla_hold)") is True
    assert recv(sock) == b"STATUS=cap 12 (sla_hold)"
    assert n.notify("EXTEND_TIMEOUT_USEC=5000000") is True
    assert recv(sock) == b"EXTEND_TIMEOUT_USEC=5000000"
    n.close()


def test_status_newlines_cannot_inject_assignments(notify_socket):
    path, sock = notify_socket
    n = SdNotifier(path)
    n.status("line one\nREADY=1")
    assert recv(sock) == b"STATUS=line one READY=1"


def test_reloading_uses_clock_monotonic_by_default(notify_socket):
    import time
    path, sock = notify_socket
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    SdNotifier(path).reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = recv(sock).decode().split("\n")
    assert lines[0] == "RELOADING=1"
    key, value = lines[1].split("=")
    assert key == "MONOTONIC_USEC" and before <= int(value) <= after


def test_abstract_socket():
    name = f"tuned-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2.0)
    try:
        n = from_environ({"NOTIFY_SOCKET": "@" + name})
        assert n.enabled
        assert n.ready("up") is True
        assert recv(sock) == b"READY=1\nSTATUS=up"
    finally:
        sock.close()


def test_disabled_when_unset():
    n = from_environ({})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    assert n.ready() is False
    assert n.watchdog() is False
    assert from_environ({"NOTIFY_SOCKET": ""}).enabled is False


def test_watchdog_interval_is_half_of_watchdog_usec_and_ignores_watchdog_pid(notify_socket):
    path, sock = notify_socket
    # WATCHDOG_PID names the process systemd started; the pings come from the engine's
    # child process, so a foreign pid must not disable the watchdog.
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "30000000",
           "WATCHDOG_PID": str(os.getpid() + 1)}
    n = from_environ(env)
    assert n.watchdog_interval_s == pytest.approx(15.0)
    assert n.watchdog() is True
    assert recv(sock) == b"WATCHDOG=1"


@pytest.mark.parametrize("value", ["", "abc", "0", "-5"])
def test_malformed_watchdog_usec_disables_watchdog_only(notify_socket, value):
    path, _ = notify_socket
    n = from_environ({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": value})
    assert n.enabled
    assert n.watchdog_interval_s is None


def test_socket_errors_return_false_and_log_once(tmp_path, caplog):
    n = SdNotifier(str(tmp_path / "nobody-listens.sock"))
    with caplog.at_level(logging.DEBUG, logger="tuned.control.sdnotify"):
        assert n.ready() is False
        assert n.watchdog() is False
        assert n.watchdog() is False
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "nobody-listens.sock" in warnings[0].getMessage()


def test_recovers_when_the_socket_appears_later(tmp_path):
    path = tmp_path / "late.sock"
    n = SdNotifier(str(path))
    assert n.watchdog() is False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2.0)
    try:
        assert n.watchdog() is True
        assert recv(sock) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_child_process_can_notify(notify_socket):
    """The engine's child process inherits NOTIFY_SOCKET and sends READY itself."""
    import subprocess
    import sys
    path, sock = notify_socket
    code = ("import os, sys; from tuned.control.sdnotify import from_environ; "
            "sys.exit(0 if from_environ(os.environ).ready('child') else 1)")
    env = dict(os.environ, NOTIFY_SOCKET=path)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, timeout=60)
    assert r.returncode == 0
    assert recv(sock) == b"READY=1\nSTATUS=child"
