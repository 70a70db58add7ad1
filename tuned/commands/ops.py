"""Operator subcommands: ``tuned check-config``, ``tuned status`` and ``tuned reload``.

``register(subparsers)`` adds them to tuned's argparse CLI; each parser sets
``func(args) -> int`` (the exit code).  Neither command lets a traceback reach the
operator: every failure is one line naming the file, field or URL.

Exit codes: 0 ok; 2 invalid config (for reload: the running tuned refused it), bad
usage or a malformed URL; 3 nothing answers at the URL; 4 something answers, but not
with tuned's JSON (or refuses the caller: 403); 5 (reload) applied, but a changed key
needs a restart to take effect.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import math
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any, TextIO

from tuned import config as config_mod
from tuned.config.checks import (UNIT_WATCHDOG_S, hf_cache_findings, model_problems,
                                 service_problems)
from tuned.config.files import MAX_CONFIG_BYTES
from tuned.config.schema import check_field
from tuned.control import sdnotify
from tuned.base.inputs import CLIP_CHARS, clip_path, clip_text
from tuned.policies import catalog

DEFAULT_URL = "http://127.0.0.1:9464"
EXIT_OK, EXIT_INVALID, EXIT_UNREACHABLE, EXIT_BAD_ANSWER = 0, 2, 3, 4
EXIT_RESTART_NEEDED = 5
#: how long `tuned reload` waits for each engine rank's answer by default
RELOAD_TIMEOUT_S = 60.0

# One line per decision reason: what the operator should read into it. The policies'
# own reasons come with their declarations (tuned.policies.catalog); these are the
# composition's and the controller's.
REASONS = {
    **catalog.reasons(),
    "budget_room": "the cap was above the SLA-sized token budget: it yields to the "
                   "budget less one chunk (never below the running count)",
    "cap_raise_hold": "the policy wants a higher cap; held at the applied one until the "
                      "raise has been wanted for cap_raise_hold_s (falls apply at once)",
    "floor_running": "bound below the running count, batch raised to it (running "
                     "requests are never preempted)",
}
#: the decision's two bounds, named in words beside their keys
BOUND_WORDS = {"b_mem": "memory bound", "b_sla": "SLA bound"}
FALLBACK_CAUSES = {
    "stale": "the last decision is older than stale_after_s (controller stalled)",
    "controller_error": "a controller tick raised (see tuned_controller_errors_total)",
    "invalid_decision": "the batch policy returned a cap outside [1, ceiling] (NaN, "
                        "negative, huge)",
    "slow_decision": "the decide step took longer than interval_s",
    "step_path_error": "tuned code on the engine's step path raised (see "
                       "tuned_step_path_errors_total); vLLM's FCFS order meanwhile",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``check-config`` and ``status`` to tuned's CLI."""
    p = subparsers.add_parser(
        "check-config", help="validate config files",
        description="Validate tuned config files without touching the running service. "
                    "Exit 0 when all are valid, 2 with one line per problem otherwise.")
    p.add_argument("files", nargs="*", metavar="FILE", help="TOML config file")
    p.add_argument("--explain", action="store_true",
                   help="print every key with its type, default, range and meaning")
    p.add_argument("--watchdog-s", type=_seconds, default=None, metavar="S",
                   help="systemd's watchdog the service runs under (default: "
                        "WATCHDOG_USEC when set, else the shipped unit's "
                        f"{UNIT_WATCHDOG_S:g} s; 0 = none)")
    p.set_defaults(func=cmd_check_config)

    p = subparsers.add_parser(
        "status", help="show the running engine's current decision and telemetry",
        description="Ask a running tuned for its decisions (GET URL/decisions).",
        epilog="Exit 3 when nothing answers at URL, 4 when the answer is not tuned's. "
               "With data parallelism each rank listens on metrics_port + rank.")
    p.add_argument("--url", default=DEFAULT_URL,
                   help=f"tuned's endpoint (default {DEFAULT_URL}, i.e. metrics_host:metrics_port)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    p.set_defaults(func=cmd_status)

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
    p.add_argument("--timeout", type=_seconds, default=RELOAD_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for each rank's answer (default "
                        f"{RELOAD_TIMEOUT_S:g})")
    p.set_defaults(func=cmd_reload)


def _pipe_safe(func):
    """`tuned check-config --explain | head`: a closed pipe ends output quietly."""
    @functools.wraps(func)
    def wrapper(args):
        try:
            return func(args)
        except BrokenPipeError:
            # Python's recipe: point stdout at devnull so the interpreter's final flush
            # does not raise a second time.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
    return wrapper


# --------------------------------------------------------------------------- check-config

def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= 86400):
        raise argparse.ArgumentTypeError(f"must be a number of seconds in [0, 86400], "
                                         f"got {clip_text(text)}")
    return v


@_pipe_safe
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
        return [_one_line(p) for p in problems]
    except config_mod.ConfigError as e:
        return [_one_line(p) for p in e.problems] or [_one_line(str(e))]
    except UnicodeDecodeError as e:
        return [f"not UTF-8 text (byte {e.start}): a TOML file must be UTF-8"]
    except RecursionError:
        return ["not valid TOML: nested too deeply"]
    except Exception as e:  # a validator bug must still read as one line, not a traceback
        return [f"cannot be checked: {type(e).__name__}: {_one_line(str(e))}"]


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


def _one_line(text: str) -> str:
    return clip_text(str(text), 4 * CLIP_CHARS)


# --------------------------------------------------------------------------- reload

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
    except StatusError as e:
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
        return EXIT_INVALID, (f"REFUSED by {url}: {_one_line(problems)}; the previous "
                              "config keeps running")
    if outcome == "forbidden":
        return EXIT_BAD_ANSWER, f"{url} refused the request: {_one_line(res.get('error', ''))}"
    return EXIT_BAD_ANSWER, (f"{url}/reload answered {_one_line(json.dumps(res))[:200]}; is "
                             "this tuned's endpoint?")


# --------------------------------------------------------------------------- status

@_pipe_safe
def cmd_status(args: argparse.Namespace) -> int:
    return status(args.url, as_json=args.json, timeout_s=args.timeout)


class StatusError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def status(url: str = DEFAULT_URL, as_json: bool = False, timeout_s: float = 5.0,
           out: TextIO | None = None, err: TextIO | None = None,
           now: float | None = None) -> int:
    """Fetch ``URL/decisions`` and print a summary (or the raw JSON); return the exit code."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        base = base_url(url)
        body = _get(base + "/decisions", timeout_s)
        try:
            data = json.loads(body)
        except ValueError:
            raise StatusError(EXIT_BAD_ANSWER, f"{base}/decisions did not return JSON; "
                              "is this tuned's endpoint (metrics_port)?") from None
        if not isinstance(data, dict) or "applied" not in data:
            raise StatusError(EXIT_BAD_ANSWER, f"{base}/decisions returned JSON that is "
                              "not tuned's decisions document")
    except StatusError as e:
        print(f"tuned status: {e}", file=err)
        return e.code
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True), file=out)
        return EXIT_OK
    healthy = _healthy(base, timeout_s)
    try:
        lines = format_status(data, base, now=time.time() if now is None else now,
                              healthy=healthy)
    except Exception as e:  # a newer/older tuned with another shape: still no traceback
        print(f"tuned status: cannot read the answer of {base}/decisions "
              f"({type(e).__name__}: {e}); try --json", file=err)
        return EXIT_BAD_ANSWER
    print("\n".join(lines), file=out)
    return EXIT_OK


def base_url(url: str) -> str:
    """``127.0.0.1:9464``, ``http://h:9464/`` or ``http://h:9464/decisions`` -> ``http://h:9464``."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    if not url.lower().startswith(("http://", "https://")):
        raise StatusError(EXIT_INVALID, f"bad URL {url!r}: tuned's endpoint speaks http")
    url = url.rstrip("/")
    for suffix in ("/decisions", "/metrics"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


# Status asks a local daemon: never route it through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str, timeout_s: float) -> bytes:
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise StatusError(EXIT_BAD_ANSWER, f"{url} answered HTTP {e.code} {e.reason}; "
                          "is this tuned's endpoint (metrics_port)?") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(reason, TimeoutError):
            why = f"no answer within {timeout_s:g} s"
        else:
            why = getattr(reason, "strerror", None) or str(reason)
        raise StatusError(EXIT_UNREACHABLE, f"nothing answers at {url} ({why}); is tuned "
                          "running (systemctl status tuned) and is this its "
                          "metrics_host:metrics_port?") from None
    except (TimeoutError, OSError) as e:
        raise StatusError(EXIT_UNREACHABLE, f"nothing answers at {url} "
                          f"({getattr(e, 'strerror', None) or e or 'timed out'})") from None
    except (ValueError, http.client.InvalidURL) as e:
        raise StatusError(EXIT_INVALID, f"bad URL {url!r}: {e}") from None
    except http.client.HTTPException as e:  # something that does not speak HTTP
        raise StatusError(EXIT_BAD_ANSWER, f"{url} did not answer with HTTP "
                          f"({type(e).__name__}); is this tuned's endpoint?") from None


def _healthy(base: str, timeout_s: float) -> bool | None:
    """GET /healthz: True, False (controller stalled) or None (no answer / no such path)."""
    try:
        with _OPENER.open(base + "/healthz", timeout=timeout_s) as resp:
            return resp.status == 200
    except urllib.error.HTTPError as e:
        return False if e.code == 503 else None
    except Exception:
        return None


def _ms(s: float | None) -> str:
    if s is None:
        return "n/a"
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _ago(t: float | None, now: float) -> str:
    if t is None:
        return ""
    age = now - t
    if age < 0 or age > 10 * 365 * 86400:  # not wall-clock time: show nothing rather than nonsense
        return ""
    if age < 120:
        return f"{age:.1f} s ago"
    if age < 7200:
        return f"{age / 60:.0f} min ago"
    return f"{age / 3600:.1f} h ago"


def _when(t: float | None, now: float) -> str:
    ago = _ago(t, now)
    if not ago:
        return ""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    return f" at {stamp} ({ago})"


def format_status(data: dict[str, Any], base: str, now: float,
                  healthy: bool | None = None) -> list[str]:
    """The human-readable summary of a /decisions document, one string per line."""
    eng = data.get("engine") or {}
    applied = data.get("applied") or {}
    cfg = data.get("config") or {}
    tel = data.get("telemetry") or {}
    rel = data.get("last_reload") or {}
    cur = data.get("current")
    lines = []

    lines.append(f"tuned at {base} (dp rank {eng.get('dp_rank', '?')}): engine ceiling "
                 f"{eng.get('ceiling', '?')} seqs, max_num_batched_tokens "
                 f"{eng.get('max_num_batched_tokens', '?')}")
    if healthy is False:
        lines.append("controller:  STALLED (/healthz 503): no tick within stale_after_s; "
                     "the scheduler runs on the fallback cap")

    if cur:
        ago = _ago(cur.get("t"), now)
        bounds = ", ".join(f"{label} {k} {cur[k]}" for k, label in BOUND_WORDS.items()
                           if cur.get(k) is not None)
        reason = cur.get("reason", "?")
        lines.append(f"decision:    #{cur.get('seq', '?')}{' (' + ago + ')' if ago else ''}: "
                     f"target {cur['target']} seqs in [{cur['lower']}, {cur['upper']}] -> cap "
                     f"{cur['cap']}, token budget {cur['token_budget']}"
                     + (f" ({bounds})" if bounds else ""))
        meaning = REASONS.get(reason)
        lines.append(f"reason:      {reason}" + (f": {meaning}" if meaning else ""))
        note = (cur.get("inputs") or {}).get("cap_note")
        if note:
            lines.append(f"binding:     {note}")
        batch = cur.get("batch")
        if isinstance(batch, int) and batch > cur["cap"]:
            lines.append(f"draining:    batch {batch} running above cap {cur['cap']}: no "
                         "admissions until they finish (none is preempted)")
    else:
        lines.append("decision:    none yet (the controller has not completed a tick)")

    fb = applied.get("fallback")
    if fb:
        cause = applied.get("fallback_cause") or "unknown"
        fb_text = f"FALLBACK ({cause}: {FALLBACK_CAUSES.get(cause, 'see the log')})"
    else:
        fb_text = "fallback no"
    lines.append(f"applied:     cap {applied.get('cap', '?')} seqs, token budget "
                 f"{applied.get('token_budget', '?')} tokens, {fb_text}")

    sla = cfg.get("tbt_sla_s") or 0.0
    tbt = tel.get("tbt_mean_s")
    if tbt is None:
        tbt_text = "mean n/a (no decode steps in the window)"
    else:
        tbt_text = f"mean {_ms(tbt)}"
    src = cfg.get("sla_source")
    derived = cfg.get("derived_sla") or {}
    if sla > 0:
        tbt_text += f" vs SLA {_ms(sla)}"
        if src == "derived" and derived:
            tbt_text += (f" (derived on this host: {derived.get('factor'):g} x "
                         f"{_ms(derived.get('step_s_batch1') or 0)} measured at batch 1)")
        if tbt is not None:
            tbt_text += (f": over by {(tbt / sla - 1) * 100:.0f}%" if tbt > sla
                         else f": within ({tbt / sla * 100:.0f}% of SLA)")
    elif src == "pending":
        tbt_text += " (SLA pending: tbt_sla_auto waits for the first measured steps)"
    else:
        tbt_text += " (no SLA: tbt_sla_s = 0, memory bound only)"
    if cur and (cur.get("inputs") or {}).get("sla_feasible") is False:
        tbt_text += ("; SLA INFEASIBLE: " + str(cur["inputs"].get("sla_infeasible_why") or "")
                     + " (throughput maximised instead)")
    dbm = tel.get("decode_batch_mean")
    if dbm is not None:
        tbt_text += f"; decode batch mean {dbm:.1f}"
    lines.append(f"TBT:         {tbt_text}")
    lines.append(f"requests:    running {tel.get('running', '?')}, waiting {tel.get('waiting', '?')}")

    cap_tok = tel.get("kv_capacity_tokens")
    usage = tel.get("kv_usage")
    kv_text = f"{usage * 100:.1f}% used" if usage is not None else "usage n/a"
    if cap_tok is not None:
        kv_text += f" of {cap_tok:,} tokens"
    lines.append(f"KV cache:    {kv_text}")

    gpus = tel.get("gpu")
    if not gpus:
        lines.append("GPU:         no GPU (engine-only telemetry)")
    for g in gpus or ():
        used, total = g.get("used_bytes", 0), g.get("total_bytes", 0)
        pct = f" ({used / total * 100:.0f}%)" if total else ""
        lines.append(f"GPU {g.get('index', '?')}:       {g.get('name', '?')}: "
                     f"{_gib(used)} / {_gib(total)} used{pct}")

    lines.append(f"config:      queue policy {cfg.get('queue_policy', '?')}, profile "
                 f"{cfg.get('profile') or 'none'}, interval {cfg.get('interval_s', '?')} s, "
                 f"file {cfg.get('source_path') or 'embedded default'}")

    outcome = rel.get("outcome", "none")
    if outcome == "none":
        lines.append("last reload: none since start")
    else:
        head = f"last reload: {outcome.upper() if outcome == 'refused' else outcome}"
        head += _when(rel.get("t"), now)
        if outcome == "refused":
            head += "; the previous config keeps running"
        elif rel.get("changed"):
            head += "; changed " + ", ".join(rel["changed"])
        lines.append(head)
        for p in rel.get("problems") or ():
            lines.append(f"  problem: {p}")
        if rel.get("restart_needed"):
            lines.append("  restart needed (running values kept until `systemctl restart`): "
                         + ", ".join(rel["restart_needed"]))

    recent = data.get("recent") or []
    if recent:
        counts: dict[str, int] = {}
        for d in recent:
            r = d.get("reason", "?")
            counts[r] = counts.get(r, 0) + 1
        caps = [d.get("cap") for d in recent if isinstance(d.get("cap"), int)]
        summary = ", ".join(f"{r} {n}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        span = f"; cap {min(caps)}..{max(caps)}" if caps else ""
        lines.append(f"recent:      {len(recent)} decisions: {summary}{span}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m tuned.commands.ops``), same commands as ``tuned``."""
    parser = argparse.ArgumentParser(prog="tuned", allow_abbrev=False)
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
