"""What every user-facing input path shares: one way to quote a value in an error, one
way to read a file the user named, and the error type the CLI turns into exit 2.

A value pasted into a problem line (the CLI, the ``reload_refused`` log, ``/decisions``,
the endpoint's 422 reply) is cut by :func:`clip`, so a 2 MB string stays one short line.
Files the user names (configs, traces, profiles) are read by :func:`read_text`, which
refuses what is not a regular file (a FIFO would block the reader for ever) and what is
larger than the caller allows, before reading a byte.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import Any

#: characters of a value quoted in an error message before it is cut
CLIP_CHARS = 80
#: characters of a file's path in an error message before it is cut: the name of what
#: to fix, so longer than a value (deep deployment and temporary folders run past 80)
PATH_CHARS = 3 * CLIP_CHARS


#: an unsigned decimal in an event's spec (``3``, ``2.5``, ``.5``), one regex group
EVENT_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"


def window_event(kind: str) -> re.Pattern:
    """The form ``KIND=T0-T1@X`` of an event over a window of seconds with one figure
    (the simulator's ``gpu_pressure`` and ``slowdown``, the real engine's
    ``throttle``): groups T0, T1 and X, each an :data:`EVENT_NUMBER`."""
    return re.compile(rf"{re.escape(kind)}={EVENT_NUMBER}-{EVENT_NUMBER}@{EVENT_NUMBER}")


class UserError(ValueError):
    """Bad input from the operator; the CLI prints ``tuned: <message>`` and exits 2.

    The message names the field or argument, the problem and what is allowed;
    ``problem`` is the part after the name."""

    def __init__(self, message: str, problem: str = ""):
        super().__init__(message)
        self.problem = problem or message


def clip(value: Any, limit: int = CLIP_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters with an ellipsis and the full length."""
    return clip_text(repr(value), limit)


def clip_text(text: str, limit: int = CLIP_CHARS) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis and the full length, on one
    line (newlines become spaces)."""
    text = " ".join(str(text).split("\n"))
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def clip_path(path: str | Path) -> str:
    """A file's path for an error message: cut to :data:`PATH_CHARS` like :func:`clip_text`."""
    return clip_text(str(path), PATH_CHARS)


def read_text(path: str | Path, what: str, max_bytes: int) -> str:
    """The UTF-8 text of the regular file ``path``; :class:`UserError` naming ``what``
    (e.g. ``"config file"``) when it is missing, unreadable, not a regular file (a FIFO,
    a device, a directory), larger than ``max_bytes`` or not UTF-8."""
    p = Path(path)
    name = clip_path(p)

    def bad(problem: str) -> UserError:
        return UserError(f"{what} {name}: {problem}", problem)

    try:
        # O_NONBLOCK: opening a FIFO with no writer must not block before the check
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise bad(str(e.strerror or e)) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise bad(os.strerror(errno.EISDIR))
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a special file"
            raise bad(f"must be a regular file, got {kind}")
        if st.st_size > max_bytes:
            raise bad(f"must be at most {max_bytes:,} bytes, got {st.st_size:,}")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise bad(str(e.strerror or e)) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise bad(f"must be at most {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(f"not UTF-8 text (byte {e.start})") from None
