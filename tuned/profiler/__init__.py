"""``tuned profile`` and ``tuned fit`` (see :mod:`tuned.profiler.command`).

Importing the package stays light: tuned's CLI imports it for :func:`register`,
which loads the command only when called.
"""

from __future__ import annotations


def register(subparsers) -> None:
    """Add ``profile`` and ``fit`` to tuned's CLI (see :func:`tuned.profiler.command.register`)."""
    from tuned.profiler.command import register as _register

    _register(subparsers)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m tuned.profiler profile ...``)."""
    from tuned.profiler.command import main as _main

    return _main(argv)
