"""structlog set-up: one JSON object per line on stderr, through a sink that never
raises.

structlog's own ``PrintLogger`` raises whatever the stream raises. tuned logs from
inside vLLM's step path (the scheduler hooks, the waiting queue), so a full disk
(``OSError: [Errno 28]``) or a closed pipe (``BrokenPipeError``) under stderr would
reach the engine through a log call. :class:`SafePrintLogger` drops such a line
instead and counts it (:func:`dropped_lines`, exported as
``tuned_log_lines_dropped_total``), as vLLM's stdlib handlers do with theirs.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}

_drops_lock = threading.Lock()
_dropped = 0


def dropped_lines() -> int:
    """Log lines dropped because the stream could not take them, since the process
    started."""
    return _dropped


def _count_drop() -> None:
    global _dropped
    with _drops_lock:
        _dropped += 1


class SafePrintLogger:
    """A structlog logger writing one line per event to ``file``; a write or flush
    that fails (``OSError``: full disk, closed pipe; ``ValueError``: closed file) drops
    the line and counts it instead of raising."""

    def __init__(self, file: TextIO | None = None):
        self._file = file if file is not None else sys.stderr
        self._lock = threading.Lock()

    def msg(self, message: str) -> None:
        try:
            with self._lock:
                self._file.write(message + "\n")
                self._file.flush()
        except (OSError, ValueError):
            _count_drop()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg

    def __repr__(self) -> str:
        return f"<SafePrintLogger(file={self._file!r})>"


class SafePrintLoggerFactory:
    """structlog logger factory for :class:`SafePrintLogger` (one per stream)."""

    def __init__(self, file: TextIO | None = None):
        self._logger = SafePrintLogger(file)

    def __call__(self, *args: Any) -> SafePrintLogger:
        return self._logger


def configure(level: str = "info", stream=None) -> None:
    # apscheduler warns in plain text on every tick it skips while one runs long (a
    # line per interval_s through a stall); tuned reports the same once, in JSON
    # (slow_decision, stale)
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=False, default=str),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=SafePrintLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
