"""``tuned status``: ask a running tuned for its decisions (GET URL/decisions) and print
them as an operator reads them: the cap and its reason, the bounds, the telemetry, the
last reload. ``register(subparsers)`` adds it to tuned's CLI."""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import time
import urllib.error
from typing import Any, TextIO

from tuned.commands.endpoint import DEFAULT_URL, OPENER, EndpointError, base_url
from tuned.commands.lines import (EXIT_BAD_ANSWER, EXIT_INVALID, EXIT_OK, EXIT_UNREACHABLE,
                                  pipe_safe)
from tuned.policies import catalog


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
    """Add ``status`` to tuned's CLI."""
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


@pipe_safe
def cmd_status(args: argparse.Namespace) -> int:
    return status(args.url, as_json=args.json, timeout_s=args.timeout)


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
            raise EndpointError(EXIT_BAD_ANSWER, f"{base}/decisions did not return JSON; "
                              "is this tuned's endpoint (metrics_port)?") from None
        if not isinstance(data, dict) or "applied" not in data:
            raise EndpointError(EXIT_BAD_ANSWER, f"{base}/decisions returned JSON that is "
                              "not tuned's decisions document")
    except EndpointError as e:
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


def _get(url: str, timeout_s: float) -> bytes:
    try:
        with OPENER.open(url, timeout=timeout_s) as resp:
            return resp.read()
    except urllib.error.HTTPError as e:
        raise EndpointError(EXIT_BAD_ANSWER, f"{url} answered HTTP {e.code} {e.reason}; "
                          "is this tuned's endpoint (metrics_port)?") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, ConnectionRefusedError):
            why = "connection refused"
        elif isinstance(reason, TimeoutError):
            why = f"no answer within {timeout_s:g} s"
        else:
            why = getattr(reason, "strerror", None) or str(reason)
        raise EndpointError(EXIT_UNREACHABLE, f"nothing answers at {url} ({why}); is tuned "
                          "running (systemctl status tuned) and is this its "
                          "metrics_host:metrics_port?") from None
    except (TimeoutError, OSError) as e:
        raise EndpointError(EXIT_UNREACHABLE, f"nothing answers at {url} "
                          f"({getattr(e, 'strerror', None) or e or 'timed out'})") from None
    except (ValueError, http.client.InvalidURL) as e:
        raise EndpointError(EXIT_INVALID, f"bad URL {url!r}: {e}") from None
    except http.client.HTTPException as e:  # something that does not speak HTTP
        raise EndpointError(EXIT_BAD_ANSWER, f"{url} did not answer with HTTP "
                          f"({type(e).__name__}); is this tuned's endpoint?") from None


def _healthy(base: str, timeout_s: float) -> bool | None:
    """GET /healthz: True, False (controller stalled) or None (no answer / no such path)."""
    try:
        with OPENER.open(base + "/healthz", timeout=timeout_s) as resp:
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
