"""The ``bench`` extra: what the outer commands need and the core does not.

``pip install 'tuned-llm[bench]'`` adds plotting, the HTTP and OpenAI clients and
progress bars; what vLLM's EngineCore loads from tuned needs none of them
(tests/package/test_package_data.py follows its imports). :func:`bench_extra_error` is the
one line a command that needs the extra prints when it is missing.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

BENCH_EXTRA_MODULES: tuple[str, ...] = ("matplotlib", "openai", "requests", "tqdm")
"""Top-level modules of the bench extra's packages (pyproject.toml, ``bench``)."""

BENCH_EXTRA_COMMANDS: tuple[str, ...] = ("bench", "profile", "demo", "recommend")
"""``tuned`` subcommands that need the bench extra."""

INSTALL_HINT = "pip install 'tuned-llm[bench]'"


def missing_bench_modules(find_spec: Callable[[str], object] | None = None) -> list[str]:
    """The bench extra's modules that cannot be imported here."""
    find = find_spec or importlib.util.find_spec
    return [m for m in BENCH_EXTRA_MODULES if find(m) is None]


def bench_extra_message(command: str, missing: list[str]) -> str:
    """The one line ``tuned COMMAND`` prints when ``missing`` modules are absent."""
    return f"tuned {command}: needs {', '.join(missing)} from the bench extra: {INSTALL_HINT}"


def bench_extra_error(command: str, missing: list[str] | None = None) -> str | None:
    """:func:`bench_extra_message` when ``command`` needs the bench extra and it is
    missing (``missing``: by default :func:`missing_bench_modules`), else None."""
    if command not in BENCH_EXTRA_COMMANDS:
        return None
    missing = missing_bench_modules() if missing is None else missing
    return bench_extra_message(command, missing) if missing else None


__all__ = ["BENCH_EXTRA_COMMANDS", "BENCH_EXTRA_MODULES", "INSTALL_HINT",
           "bench_extra_error", "bench_extra_message", "missing_bench_modules"]
