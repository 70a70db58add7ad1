"""tuned's HTTP endpoint is bounded: at most ``max_handler_threads`` handler threads
whatever the number of connections (the rest get 503 at once), idle connections are
closed after ``conn_timeout_s``, and a client hanging up mid-response is counted, not
printed as a traceback. Loopback only; every wait is bounded."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from tuned.control.metrics import CONN_TIMEOUT_S, MAX_HANDLER_THREADS, Endpoint, Metrics

BIG_BODY_BYTES = 8 << 20     # far beyond what the loopback socket buffers hold


class Calls:
    def decisions(self, limit):
        return {"current": None, "recent": [], "limit": limit}

    def steps(self, since):
        return {"samples": [], "since": since}

    def reload(self):
        return {"outcome": "ok", "changed": []}

    def healthy(self):
        return True


def start(metrics=None, steps=None, **kw) -> Endpoint:
    c = Calls()
    return Endpoint("127.0.0.1", 0, metrics or Metrics(), decisions=c.decisions,
                    steps=steps or c.steps, reload=c.reload, healthy=c.healthy, **kw).start()


def handler_threads() -> int:
    return sum(t.name == "tuned-endpoint-conn" for t in threading.enumerate())


def get(port: int, path: str = "/metrics") -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def wait_until(cond, limit_s: float = 10.0) -> bool:
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def dropped(m: Metrics, reason: str) -> float:
    return m.endpoint_dropped.labels(reason)._value.get()


def is_closed_by_peer(s: socket.socket) -> bool:
    """True once the server closed ``s``: whatever it sent is read, then EOF (or the
    reset) shows; False if the socket's own timeout passes first."""
    try:
        while s.recv(65536):
            pass
        return True
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def test_production_defaults():
    ep = start()
    try:
        assert (ep.server.max_threads, ep.server.timeout_s) == (MAX_HANDLER_THREADS,
                                                                 CONN_TIMEOUT_S)
        assert 1 <= MAX_HANDLER_THREADS <= 16 and 1.0 <= CONN_TIMEOUT_S <= 10.0
    finally:
        ep.stop()


@pytest.mark.parametrize("kw,error", [
    ({"max_handler_threads": 0}, "Endpoint: max_handler_threads must be an integer >= 1, got 0"),
    ({"max_handler_threads": 2.5},
     "Endpoint: max_handler_threads must be an integer >= 1, got 2.5"),
    ({"conn_timeout_s": 0}, "Endpoint: conn_timeout_s must be a number of seconds > 0, got 0"),
    ({"conn_timeout_s": float("inf")},
     "Endpoint: conn_timeout_s must be a number of seconds > 0, got inf"),
])
def test_bad_bounds_are_refused(kw, error):
    with pytest.raises(ValueError) as e:
        start(**kw)
    assert str(e.value) == error


def open_idle(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.settimeout(10)
        out.append(s)
    return out


def test_many_idle_connections_hold_at_most_the_cap_and_metrics_still_answers():
    cap, n_idle = 4, 40
    m = Metrics()
    # a timeout far beyond the test: no idle connection is let go while it runs
    ep = start(m, max_handler_threads=cap, conn_timeout_s=60.0)
    before = handler_threads()
    idle: list[socket.socket] = []
    try:
        assert get(ep.port)[0] == 200            # answers while nothing else is open
        assert wait_until(lambda: ep.server.active_handlers == 0)
        idle = open_idle(ep.port, n_idle)
        # the first `cap` got a thread each; every other one was answered 503 and closed
        assert wait_until(lambda: dropped(m, "busy") == n_idle - cap)
        assert ep.server.active_handlers == cap
        assert handler_threads() - before == cap
        # busy: a quick answer, not a hang (read without sending, so that the server's
        # close finds nothing unread and cannot turn into a reset that races the 503)
        with socket.create_connection(("127.0.0.1", ep.port), timeout=5) as s:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503 ") and b"Retry-After: 1" in head
        assert body == b'{"error": "busy: every handler thread is in use"}'
        assert all(is_closed_by_peer(s) for s in idle[cap:])
        # the clients holding the threads go away: the threads end, /metrics answers
        for s in idle[:cap]:
            s.close()
        assert wait_until(lambda: ep.server.active_handlers == 0)
        assert wait_until(lambda: handler_threads() == before)
        code, body = get(ep.port)
        assert code == 200
        assert f'tuned_endpoint_connections_dropped_total{{engine="0",reason="busy"}} ' \
               f'{n_idle - cap + 1}.0'.encode() in body
        assert dropped(m, "timeout") == 0 and dropped(m, "disconnect") == 0
    finally:
        for s in idle:
            s.close()
        ep.stop()


def test_idle_connections_are_closed_after_the_timeout():
    cap = 4
    m = Metrics()
    ep = start(m, max_handler_threads=cap, conn_timeout_s=0.5)
    before = handler_threads()
    idle: list[socket.socket] = []
    try:
        idle = open_idle(ep.port, cap)
        # each is closed by the server (it sent nothing), well within the client's wait
        assert all(is_closed_by_peer(s) for s in idle)
        assert wait_until(lambda: dropped(m, "timeout") == cap)
        assert wait_until(lambda: ep.server.active_handlers == 0)
        assert wait_until(lambda: handler_threads() == before)
        assert get(ep.port)[0] == 200
        assert dropped(m, "busy") == 0
    finally:
        for s in idle:
            s.close()
        ep.stop()


def test_client_hanging_up_mid_response_is_counted_without_a_traceback(capfd):
    served = threading.Event()

    def big_steps(since):
        served.set()
        return {"samples": "x" * BIG_BODY_BYTES}

    m = Metrics()
    ep = start(m, steps=big_steps, conn_timeout_s=5.0)
    try:
        for _ in range(3):
            served.clear()
            s = socket.create_connection(("127.0.0.1", ep.port), timeout=5)
            # RST on close, so the server's next write fails at once
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(b"GET /steps?since=0 HTTP/1.0\r\nHost: x\r\n\r\n")
            assert served.wait(5)
            s.recv(1024)                          # the response has started
            s.close()
        assert wait_until(lambda: dropped(m, "disconnect") == 3)
        assert wait_until(lambda: ep.server.active_handlers == 0)
        assert get(ep.port)[0] == 200             # still serving
    finally:
        ep.stop()
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Exception occurred" not in err, err[-2000:]
    assert "BrokenPipe" not in err and "ConnectionReset" not in err


def test_a_bug_in_a_handler_is_answered_500_and_keeps_its_traceback(capfd):
    """Only client hang-ups are quiet: an error in tuned's own code keeps its trace on
    stderr, and the client still gets an answer (500 with the error), not a connection
    closed without one; the endpoint keeps serving."""
    def broken_steps(since):
        raise RuntimeError("a bug in tuned")

    ep = start(steps=broken_steps)
    try:
        status, body = get(ep.port, "/steps?since=0")
        assert status == 500
        assert json.loads(body) == {"error": "RuntimeError: a bug in tuned",
                                    "path": "/steps"}
        assert get(ep.port)[0] == 200             # still serving
        assert wait_until(lambda: ep.server.active_handlers == 0)
    finally:
        ep.stop()
    err = capfd.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug in tuned" in err
