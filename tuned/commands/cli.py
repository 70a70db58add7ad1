"""The ``tuned`` command: parse, build a config, call one function per subcommand.

Each subcommand lives in its own module, which adds its parser with
``register(subparsers)`` and sets ``func(args) -> exit code``.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from tuned import __version__
from tuned.config import ConfigError
from tuned.config.schema import did_you_mean
from tuned.config.vllm_args import VLLM_FLAGS_SET
from tuned.curves.profile import ProfileError
from tuned.base.extras import BENCH_EXTRA_MODULES, bench_extra_error, bench_extra_message
from tuned.base.inputs import CLIP_CHARS, UserError, clip_text
from tuned.launch.launcher import EngineError
from tuned.base.workloads import WorkloadError

#: the errors that mean bad input, not a bug: one line and exit 2, never a traceback
USER_ERRORS = (UserError, ConfigError, ProfileError, WorkloadError)

SUBCOMMAND_MODULES = ("tuned.launch.serve", "tuned.commands.demo", "tuned.profiler",
                      "tuned.commands.check_config", "tuned.commands.status",
                      "tuned.commands.reload", "tuned.commands.simulate", "tuned.bench.command",
                      "tuned.bench.recommend")


class Parser(argparse.ArgumentParser):
    """tuned's argument parser: no abbreviated options (``--model`` must never be read
    as ``--model-cache``), and a usage error is one line on stderr and exit 2.

    Subcommand parsers (``add_subparsers``) are of this class too."""

    def __init__(self, *args, **kw) -> None:
        kw["allow_abbrev"] = False
        super().__init__(*args, **kw)

    def error(self, message: str):
        m = re.match(r"argument .*: invalid choice: '(.*)' \(choose from (.*)\)$", message)
        if m:
            message += did_you_mean(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        self.exit(2, f"{self.prog}: {clip_text(message, 3 * CLIP_CHARS)} "
                     f"(see {self.prog} --help)\n")

    def unrecognized(self, extras: list[str], takes_vllm_args: bool = False):
        """``unrecognized arguments`` from this (sub)command's parser, naming its own
        help page, with the closest option when one is near (a typo) and, for a command
        that hands arguments to vLLM, where those go."""
        after = f"vLLM arguments go after -- ({self.prog} [options] -- {' '.join(extras)})"
        if takes_vllm_args and not extras[0].startswith("-"):
            self.error(f"unexpected argument {clip_text(extras[0])!r}: {after}")
        message = "unrecognized arguments: " + " ".join(extras)
        options = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        flags = [w.split("=", 1)[0] for w in extras if w.startswith("--")]
        # a vLLM flag that tuned sets from a config key (--model, --max-num-seqs ...)
        keys = [k for f in flags if (k := VLLM_FLAGS_SET.get("--" + f[2:].replace("_", "-")))]
        # close spellings only (a typo): --model is not --model-cache
        hints = [h for f in flags if (h := did_you_mean(f, options, cutoff=0.8))]
        if takes_vllm_args and keys:
            message += f"; set {keys[0]} in the config file (--config FILE)"
        elif hints:
            message += hints[0]
        elif takes_vllm_args:
            message += "; " + after
        self.error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    args, extras = parser.parse_known_args(argv)
    if extras:
        sub = _subparser(parser, getattr(args, "command", None))
        if sub is None:
            parser.unrecognized(extras)
        sub.unrecognized(extras, takes_vllm_args=hasattr(args, "vllm_args"))
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
    except USER_ERRORS as e:
        for line in user_error_lines(e):
            print(f"tuned {args.command}: {line}", file=sys.stderr)
        return 2
    except EngineError as e:
        # an engine that did not start or answered wrongly (a bench contender, the
        # demo's servers): what it said and its log's tail, not a traceback of ours
        first, *rest = str(e).splitlines() or [type(e).__name__]
        print(f"tuned {args.command}: error: {first}", file=sys.stderr)
        for line in rest:
            print(f"  {line}", file=sys.stderr)
        return 1


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> "Parser | None":
    """The parser of subcommand ``command`` (None for none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return None


def user_error_lines(e: Exception) -> list[str]:
    """The one line (one per problem for a config) that a user error prints."""
    from tuned.config import ConfigError

    if isinstance(e, ConfigError):
        where = f"{e.source}: " if e.source else ""
        return [clip_text(where + p, 4 * CLIP_CHARS) for p in e.problems] or \
            [clip_text(str(e), 4 * CLIP_CHARS)]
    return [clip_text(str(e), 4 * CLIP_CHARS)]
