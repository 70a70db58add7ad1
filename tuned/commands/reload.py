"""``tuned reload``: ask the running tuned (every data-parallel rank) to re-read its config
file and wait for the outcome; `systemctl reload tuned` runs it.
``register(subparsers)`` adds it to tuned's CLI."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import urllib.error
from typing import TextIO

from tuned import config as config_mod
from tuned.commands.endpoint import DEFAULT_URL, EndpointError, base_url
from tuned.commands.lines import (EXIT_BAD_ANSWER, EXIT_INVALID, EXIT_OK, EXIT_RESTART_NEEDED,
                                  EXIT_UNREACHABLE, one_line, seconds)
from tuned.config.files import MAX_CONFIG_BYTES
from tuned.config.schema import check_field

#: how long `tuned reload` waits for each engine rank's answer by default
RELOAD_TIMEOUT_S = 60.0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``reload`` to tuned's CLI."""
    p = subparsers.add_parser(
        "reload", help="reload the running tuned's config and wait for the outcome",
        description="Ask the running tuned (every data-parallel rank) to re-read its config "
                    "file (POST /reload) and wait for the outcome: one line, exit 0 once the "
                    "new config is live. `systemctl reload tuned` runs this.",
        epilog="Exit 2 when tuned refused the config (the previous one keeps running), 3 "
               "when nothing answers, 4 when the answer is not tuned's or the caller is "
               "refused (403), 5 when the config applied but a changed [restart] key needs "
               "`systemctl restart`. The endpoint is the config file's "
               "metrics_host:metrics_port (plus the rank); --url names it instead.")
    p.add_argument("--config", metavar="FILE",
                   help="the config file the running tuned was started with: where its "
                        "endpoint listens, how many ranks, the reload token")
    p.add_argument("--url", help=f"tuned's endpoint instead (default {DEFAULT_URL}); one "
                                 "rank")
    p.add_argument("--timeout", type=seconds, default=RELOAD_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for each rank's answer (default "
                        f"{RELOAD_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_reload)


def cmd_reload(args: argparse.Namespace) -> int:
    if args.config and args.url:
        print("tuned reload: --config and --url both name the endpoint; give one",
              file=sys.stderr)
        return EXIT_INVALID
    return reload(config_path=args.config, url=args.url, timeout_s=args.timeout)


def reload_targets(config_path: str | None, url: str | None) -> tuple[list[str], str]:
    """The endpoint URL of every rank and the reload token, from ``url`` or the config
    file. The file is read leniently: a config that fails validation (the very one a
    reload will refuse) still names its endpoint; a key that is itself invalid is read
    as its default."""
    from tuned.launch import serve

    if url:
        return [base_url(url)], ""
    if not config_path:
        return [DEFAULT_URL], ""
    try:
        cfg = config_mod.load(config_path)
    except config_mod.ConfigError:
        cfg = _lenient_endpoint_config(config_path)
    try:
        ranks = max(1, serve._dp_size(list(cfg.vllm_args)))
    except ValueError:
        ranks = 1
    return [serve.endpoint_url(cfg, r) for r in range(ranks)], cfg.reload_token


def _lenient_endpoint_config(path: str) -> config_mod.Config:
    try:
        raw = config_mod.read_toml(path)
    except config_mod.ConfigError:
        raw = _toml_lines(path)
    keep = {}
    for key in ("metrics_host", "metrics_port", "reload_token", "vllm_args"):
        if key in raw:
            value, err = check_field(key, raw[key])
            if err is None:
                keep[key] = value
    try:
        return config_mod.Config(**keep)
    except TypeError:
        return config_mod.Config()


def _toml_lines(path: str) -> dict:
    """The top-level ``key = value`` lines of a file that is not valid TOML as a whole
    (the broken line is usually another one), each parsed on its own."""
    import tomllib

    raw: dict = {}
    try:
        text = open(path, encoding="utf-8", errors="replace").read(MAX_CONFIG_BYTES)
    except OSError:
        return raw
    for line in text.splitlines():
        if line.lstrip().startswith("["):
            break  # a table: what follows is no longer top-level
        try:
            raw.update(tomllib.loads(line))
        except (tomllib.TOMLDecodeError, ValueError):
            continue
    return raw


def reload(config_path: str | None = None, url: str | None = None,
           timeout_s: float = RELOAD_TIMEOUT_S, out: TextIO | None = None,
           err: TextIO | None = None) -> int:
    """POST /reload to every rank and wait for each answer (the engine validates and
    applies the file before it answers); one line per rank, the exit code of the worst
    outcome. Nothing is retried: a reload is not idempotent with respect to the file,
    which may change again in between."""
    from tuned.launch import serve

    out = out or sys.stdout
    err = err or sys.stderr
    try:
        urls, token = reload_targets(config_path, url)
    except EndpointError as e:
        print(f"tuned reload: {e}", file=err)
        return e.code
    code = EXIT_OK
    for rank_url in urls:
        rank_code, line = _reload_one(serve, rank_url, token, timeout_s)
        print(f"tuned reload: {line}", file=out if rank_code == EXIT_OK else err)
        code = max(code, rank_code)
    return code


def _reload_one(serve, url: str, token: str, timeout_s: float) -> tuple[int, str]:
    try:
        res = serve.post_reload(url, timeout=timeout_s, token=token)
    except urllib.error.URLError as e:
        reason = e.reason
        why = ("connection refused" if isinstance(reason, ConnectionRefusedError) else
               f"no answer within {timeout_s:g} s" if isinstance(reason, TimeoutError) else
               getattr(reason, "strerror", None) or str(reason))
        return EXIT_UNREACHABLE, (f"nothing answers at {url} ({why}); is tuned running and "
                                  "is this its metrics_host:metrics_port?")
    except TimeoutError:
        return EXIT_UNREACHABLE, f"no answer from {url} within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as e:
        return EXIT_UNREACHABLE, f"nothing answers at {url} ({type(e).__name__}: {e})"
    except ValueError:
        return EXIT_BAD_ANSWER, f"{url}/reload did not answer with JSON; is this tuned's endpoint?"
    outcome = res.get("outcome") if isinstance(res, dict) else None
    if outcome == "ok":
        changed = ", ".join(res.get("changed") or ()) or "nothing"
        if res.get("restart_needed"):
            return EXIT_RESTART_NEEDED, (
                f"applied at {url} (changed: {changed}) but "
                f"{', '.join(res['restart_needed'])} only change with a restart "
                "(systemctl restart tuned); their running values are kept")
        return EXIT_OK, f"applied at {url} (changed: {changed})"
    if outcome == "refused":
        problems = "; ".join(str(p) for p in res.get("problems") or ()) or "no reason given"
        return EXIT_INVALID, (f"REFUSED by {url}: {one_line(problems)}; the previous "
                              "config keeps running")
    if outcome == "forbidden":
        return EXIT_BAD_ANSWER, f"{url} refused the request: {one_line(res.get('error', ''))}"
    return EXIT_BAD_ANSWER, (f"{url}/reload answered {one_line(json.dumps(res))[:200]}; is "
                             "this tuned's endpoint?")
