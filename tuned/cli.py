"""The ``tuned`` command: parse, build a config, call one function per subcommand.

Each subcommand lives in its own module, which adds its parser with
``register(subparsers)`` and sets ``func(args) -> exit code``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from tuned import __version__
from tuned.extras import BENCH_EXTRA_MODULES, bench_extra_error, bench_extra_message

SUBCOMMAND_MODULES = ("tuned.serve", "tuned.demo", "tuned.profiler", "tuned.opscli",
                      "tuned.simulate", "tuned.bench.command")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuned", description="Live batch-size autotuner embedded in vLLM.")
    parser.add_argument("--version", action="version", version=f"tuned {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare `--` belongs to vLLM (tuned serve -- --dtype float32 ...).
    passthrough: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if passthrough:
        if not hasattr(args, "vllm_args"):
            parser.error(f"{args.command} takes no arguments after --")
        args.vllm_args = list(args.vllm_args or []) + passthrough
    if msg := bench_extra_error(args.command):
        print(msg, file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in BENCH_EXTRA_MODULES:
            raise
        print(bench_extra_message(args.command, [e.name]), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
