"""The real engine's throttle (``--events throttle=T0-T1@F``): from T0 to T1 the
server's processes (the process and every one under it) are stopped for part of each
period, and every one runs again when the throttle ends or its run is cancelled."""

import asyncio
import subprocess
import sys
import time

import psutil
import pytest

from tuned.bench.throttle import Throttle, parse_throttles, run_throttles, server_pids

# a server stand-in: a process with a child, both asleep
_TREE = ("import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
         "time.sleep(60)\n")


@pytest.fixture
def tree():
    proc = subprocess.Popen([sys.executable, "-c", _TREE])
    deadline = time.monotonic() + 10
    while len(server_pids(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield proc
    for p in server_pids(proc.pid)[::-1]:
        psutil.Process(p).kill()
    proc.wait()


def _states(pid: int) -> set[str]:
    return {psutil.Process(p).status() for p in server_pids(pid)}


def test_parse_reads_each_item():
    assert parse_throttles("throttle=20-50@2, throttle=60-70@1.5") == (
        Throttle(20.0, 50.0, 2.0), Throttle(60.0, 70.0, 1.5))
    assert parse_throttles("") == ()


@pytest.mark.parametrize("text, want", [
    ("slowdown=1-2@2", "--events: 'slowdown=1-2@2' must be throttle=T0-T1@F on the real "
                       "engine"),
    ("throttle=3-3@2", "--events: 'throttle=3-3@2' needs T0 < T1, got T0=3, T1=3"),
    ("throttle=0-1@0.5", "--events: 'throttle=0-1@0.5' needs F in [1, 10], got F=0.5"),
])
def test_parse_refuses_with_the_item_and_its_range(text, want):
    with pytest.raises(ValueError) as e:
        parse_throttles(text)
    assert str(e.value).startswith(want)


def test_the_server_is_stopped_between_t0_and_t1_and_runs_after(tree):
    """At F = 10 the tree is stopped 90 % of each period: sampled 40 times within the
    throttle, a process is seen stopped, and before T0 and after T1 none is."""
    seen = {"before": None, "during": set(), "after": None}

    async def main():
        t0 = time.monotonic()
        task = asyncio.ensure_future(run_throttles((Throttle(0.5, 2.5, 10.0),), tree.pid,
                                                   t0, time.monotonic))
        seen["before"] = _states(tree.pid)
        await asyncio.sleep(1.0)
        for _ in range(40):
            seen["during"] |= _states(tree.pid)
            await asyncio.sleep(0.013)
        await task
        seen["after"] = _states(tree.pid)
        seen["ended_at"] = time.monotonic() - t0

    asyncio.run(main())
    # asleep, or running while the host schedules it, but never stopped outside
    assert psutil.STATUS_STOPPED not in seen["before"]
    assert psutil.STATUS_STOPPED in seen["during"]
    assert psutil.STATUS_STOPPED not in seen["after"]
    assert seen["ended_at"] >= 2.5


def test_cancelling_the_run_continues_the_server(tree):
    seen = {}

    async def main():
        task = asyncio.ensure_future(run_throttles((Throttle(0.0, 60.0, 10.0),), tree.pid,
                                                   time.monotonic(), time.monotonic))
        await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        seen["after"] = _states(tree.pid)
        seen["throttlers"] = [p for p in psutil.Process().children()
                              if "SIGSTOP" in " ".join(p.cmdline())]

    asyncio.run(main())
    assert psutil.STATUS_STOPPED not in seen["after"]
    assert seen["throttlers"] == []


def test_an_attached_server_is_not_throttled_silently(tmp_path):
    from tuned.bench.live import LiveServer, _Server
    from tuned.base.workloads import parse_workload

    server = LiveServer.__new__(LiveServer)   # as LiveServer.attach leaves it, no HTTP
    server.contender = None
    server.srv = _Server(None, "http://127.0.0.1:1", None, tmp_path / "log", None, 0.0)
    wl = parse_workload("poisson:rate=1,prompt=U(8,16),output=U(8,16),n=2")
    with pytest.raises(ValueError) as e:
        server.drive(wl, throttles=(Throttle(0, 1, 2),))
    assert str(e.value) == ("throttles: only a server this bench started can be "
                            "throttled, not an attached one")
