"""A dependency-free client for systemd's notification protocol (sd_notify(3)).

tuned runs as a ``Type=notify`` service with ``NotifyAccess=all``: READY=1 and the
WATCHDOG=1 pings come from vLLM's EngineCore, a *child* of the process systemd
started, because that is where the controller loop lives.  Two consequences:

* :func:`from_environ` ignores ``WATCHDOG_PID``.  libsystemd's ``sd_watchdog_enabled()``
  disables the watchdog when that PID is not the caller's; here the pings come from
  the child on purpose, and systemd accepts them because of ``NotifyAccess=all``.
* Nothing here raises on socket trouble: a lost notification must never take the
  engine down.  Each method returns False and the first failure is logged.

The protocol is one datagram of newline-separated ``KEY=VALUE`` lines sent to the
AF_UNIX socket named by ``NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract socket).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


def _monotonic_usec() -> int:
    # systemd compares MONOTONIC_USEC with its own CLOCK_MONOTONIC reading.
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class SdNotifier:
    """Sends state changes and watchdog pings to systemd; a no-op when disabled.

    ``socket_path`` is the value of ``NOTIFY_SOCKET`` (``None`` or ``""`` disables the
    notifier); ``watchdog_usec`` the value of ``WATCHDOG_USEC``.  Safe to call from
    several threads.
    """

    def __init__(self, socket_path: str | None, watchdog_usec: int | None = None, *,
                 monotonic_usec: Callable[[], int] = _monotonic_usec,
                 logger: logging.Logger = log):
        self.socket_path = socket_path or None
        self.watchdog_usec = watchdog_usec if watchdog_usec and watchdog_usec > 0 else None
        self._monotonic_usec = monotonic_usec
        self._log = logger
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._warned = False

    @property
    def enabled(self) -> bool:
        """True when a notification socket is configured."""
        return self.socket_path is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """How often to ping: half of ``WATCHDOG_USEC`` (sd_watchdog_enabled(3)'s
        advice), or None when systemd asked for no watchdog."""
        if self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2 / 1e6

    def _address(self) -> str | bytes:
        path = self.socket_path or ""
        if path.startswith("@"):
            # Linux abstract namespace: a leading NUL instead of '@'.
            return b"\0" + path[1:].encode()
        return path

    def notify(self, msg: str) -> bool:
        """Send one raw message (e.g. ``"READY=1\\nSTATUS=serving"``).

        Returns True when the datagram was handed to the socket, False when the
        notifier is disabled or sending failed (logged once, never raised)."""
        if not self.enabled:
            return False
        data = msg.encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX,
                                               socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(data, self._address())
                return True
            except OSError as e:
                self._close_locked()
                if not self._warned:
                    self._warned = True
                    self._log.warning("sd_notify to %s failed: %s (further failures are "
                                      "logged at debug level)", self.socket_path, e)
                else:
                    self._log.debug("sd_notify to %s failed: %s", self.socket_path, e)
                return False

    def ready(self, status: str = "") -> bool:
        """Startup (or a reload) finished: ``READY=1``, with an optional status line."""
        return self.notify("READY=1" + (f"\nSTATUS={_one_line(status)}" if status else ""))

    def watchdog(self) -> bool:
        """Keep-alive ping; send at least every :attr:`watchdog_interval_s` seconds."""
        return self.notify("WATCHDOG=1")

    def reloading(self) -> bool:
        """A reload started.  systemd keeps the unit in "reloading" state until the
        next :meth:`ready`, so send that once the new config is applied or refused."""
        return self.notify(f"RELOADING=1\nMONOTONIC_USEC={self._monotonic_usec()}")

    def stopping(self) -> bool:
        """Shutdown started."""
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        """Free-form one-line status shown by ``systemctl status``."""
        return self.notify(f"STATUS={_one_line(text)}")

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None


def _one_line(text: str) -> str:
    # A newline would start a new KEY=VALUE assignment in the datagram.
    return " ".join(text.splitlines())


def from_environ(environ: Mapping[str, str]) -> SdNotifier:
    """Build a notifier from a process environment (pass ``os.environ``).

    Reads ``NOTIFY_SOCKET`` and ``WATCHDOG_USEC``; a missing or malformed value
    disables that part.  ``WATCHDOG_PID`` is deliberately not checked (see the
    module docstring)."""
    path = environ.get("NOTIFY_SOCKET") or None
    usec: int | None
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        usec = None
    return SdNotifier(path, usec)


def watchdog_s(environ: Mapping[str, str]) -> float | None:
    """systemd's watchdog in seconds (``WATCHDOG_USEC`` / 1e6) from a process
    environment the caller passes in; None when unset or malformed."""
    usec = from_environ(environ).watchdog_usec
    return usec / 1e6 if usec else None
