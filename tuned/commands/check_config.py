"""``tuned check-config``: validate config files without touching the running service,
with the checks `tuned serve` makes at start; ``--explain`` prints the manual.
``register(subparsers)`` adds it to tuned's CLI."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from tuned import config as config_mod
from tuned.base.inputs import CLIP_CHARS, clip_path, clip_text
from tuned.commands.lines import EXIT_INVALID, EXIT_OK, one_line, pipe_safe, seconds
from tuned.config.checks import (UNIT_WATCHDOG_S, hf_cache_findings, model_problems,
                                 service_problems)
from tuned.control import sdnotify


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``check-config`` to tuned's CLI."""
    p = subparsers.add_parser(
        "check-config", help="validate config files",
        description="Validate tuned config files without touching the running service. "
                    "Exit 0 when all are valid, 2 with one line per problem otherwise.")
    p.add_argument("files", nargs="*", metavar="FILE", help="TOML config file")
    p.add_argument("--explain", action="store_true",
                   help="print every key with its type, default, range and meaning")
    p.add_argument("--watchdog-s", type=seconds, default=None, metavar="S",
                   help="systemd's watchdog the service runs under (default: "
                        "WATCHDOG_USEC when set, else the shipped unit's "
                        f"{UNIT_WATCHDOG_S:g} s; 0 = none)")
    p.set_defaults(func=cmd_check_config)


@pipe_safe
def cmd_check_config(args: argparse.Namespace) -> int:
    watchdog_s = args.watchdog_s
    if watchdog_s is None:
        watchdog_s = sdnotify.watchdog_s(os.environ) or UNIT_WATCHDOG_S
    return check_config(args.files, explain=args.explain, watchdog_s=watchdog_s or None)


def check_config(paths: list[str] | str, explain: bool = False, out: TextIO | None = None,
                 err: TextIO | None = None, watchdog_s: float | None = None) -> int:
    """Validate each file; print ``FILE: ok`` (stdout) or one ``FILE: <problem>`` line
    per problem (stderr); return 0 when all are valid, else 2.

    Beyond the file itself, it finds what `tuned serve` refuses: the model as
    :func:`tuned.config.checks.model_problems` reads it (a missing folder; a Hugging Face id is
    passed to vLLM unchecked), and what it would fail on only after the model loaded:
    the profile's contents (:func:`profile_problems`), a plugin that
    cannot be imported or is not a policy class, and what the service cannot live
    with under a watchdog of ``watchdog_s`` (:func:`tuned.config.checks.service_problems`)."""
    out = out or sys.stdout
    err = err or sys.stderr
    if isinstance(paths, str):
        paths = [paths]
    if not paths and not explain:
        print("tuned check-config: give a FILE to validate, or --explain to list the keys",
              file=err)
        return EXIT_INVALID
    code = EXIT_OK
    for path in paths:
        problems = config_problems(path, watchdog_s=watchdog_s, deep=True)
        notes: list[str] = []
        if not problems:
            found, notes = model_cache_findings(path)
            problems += found
        if problems:
            for line in problems:
                print(f"{clip_path(path)}: {line}", file=err)
            code = EXIT_INVALID
        else:
            print(f"{clip_path(path)}: ok", file=out)
            for line in notes:
                print(f"{clip_path(path)}: note: {line}", file=err)
    if explain:
        print(config_mod.explain(), file=out)
    return code


def config_problems(path: str, watchdog_s: float | None = None,
                    deep: bool = False) -> list[str]:
    """Every problem :func:`tuned.config.load` finds, one line each; [] when valid.
    ``deep`` adds the start-up checks of :func:`check_config`."""
    try:
        cfg = config_mod.load(path)
        if not deep:
            return []
        problems = model_problems(cfg)
        problems += service_problems(cfg, watchdog_s)
        problems += plugin_problems(cfg)
        problems += profile_problems(cfg)
        return [one_line(p) for p in problems]
    except config_mod.ConfigError as e:
        return [one_line(p) for p in e.problems] or [one_line(str(e))]
    except UnicodeDecodeError as e:
        return [f"not UTF-8 text (byte {e.start}): a TOML file must be UTF-8"]
    except RecursionError:
        return ["not valid TOML: nested too deeply"]
    except Exception as e:  # a validator bug must still read as one line, not a traceback
        return [f"cannot be checked: {type(e).__name__}: {one_line(str(e))}"]


def model_cache_findings(path: str) -> tuple[list[str], list[str]]:
    """(problems, notes) on a valid config's Hugging Face id from the local cache
    (:func:`tuned.config.checks.hf_cache_findings`; no network)."""
    try:
        cfg = config_mod.load(path)
    except Exception:  # already reported by config_problems
        return [], []
    return hf_cache_findings(cfg.model, os.environ)


def plugin_problems(cfg: config_mod.Config) -> list[str]:
    """A ``package.module:Class`` batch policy that cannot be imported or is not a
    policy class (the controller would fail on it after the model loaded)."""
    from tuned.policies.registry import is_builtin, load_plugin

    if is_builtin(cfg.batch_policy):
        return []
    try:
        load_plugin(cfg.batch_policy)
    except ValueError as e:
        return [str(e)]
    return []


def profile_problems(cfg: config_mod.Config) -> list[str]:
    """The profile read as the controller reads it, and the fits this config uses:
    the SLA search starts from the profile's step-time (or speed) curve, the saber
    queue asks it for speeds."""
    if not cfg.profile:
        return []
    from tuned.curves.profile import ProfileError, load_profile

    try:
        prof = load_profile(cfg.profile)
    except ProfileError as e:
        return [f"profile: {clip_text(e.problem, 2 * CLIP_CHARS)} ({e.source})"]
    speed = prof.best_speed is not None or prof.usl is not None
    if prof.step_time is None and not speed:
        return ["profile: must have a step-time, speed or USL fit, has none (re-fit it "
                "with `tuned fit`)"]
    if cfg.queue_policy == "saber" and not speed:
        return ["profile: must have a speed or USL fit for queue_policy 'saber' (it "
                "predicts each request's speed), has only a step-time fit"]
    return []
