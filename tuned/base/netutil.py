"""Picking a TCP port for a child process to listen on.

Binding port 0 and closing it hands back a port from the kernel's ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default). Between closing it and
the child binding it, any outgoing connection on the host (an HTTP client, vLLM's
own ZMQ/gloo sockets) may be given the same port, and the child then fails with
EADDRINUSE. Ports below the ephemeral range are only ever taken by listeners, so
picking a free one there leaves a much smaller window.
"""

from __future__ import annotations

import random
import socket

_FALLBACK_RANGE = (32768, 60999)


def ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _FALLBACK_RANGE


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", rng: random.Random | None = None,
              avoid: tuple[int, ...] = ()) -> int:
    """A port free on ``host`` now, preferably below the ephemeral range."""
    rng = rng or random.Random()
    lo, _ = ephemeral_range()
    if lo > 10000:
        for _ in range(200):
            port = rng.randrange(10000, lo)
            if port not in avoid and _bindable(host, port):
                return port
    while True:  # the ephemeral range is all there is: let the kernel pick
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def connect_host(host: str) -> str:
    """Where a client on this host reaches a server bound to ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
