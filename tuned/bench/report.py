"""The benchmark's report: ``report.json``, ``report.csv``, ``report.md`` and plots.

Every figure is computed here from the runs' per-request results; nothing is
pasted in. ``report.json`` follows the schema of the benchmark issue::

    {"engine", "hardware", "workload", "slo", "seed", "repeats", "command", "date",
     "host": {"cpu_model", "cpu_cores"}, "tuned_version", "default_budget",
     "runs": [{"name", "kind", "cap", "budget" (static and ablation runs), "submitted",
               "completed", "failed", "refused", "goodput_rps", "attainment",
               "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s",
               "first_response_p50_s", "first_response_p99_s", "max_wait_s",
               "preemptions", ...more summary keys}],
     "best_static": {"by_goodput": name, "by_attainment": name, "by_throughput": name,
                     "by_capacity": name},          # the best (cap, budget) pair
     "best_cap": {...the same keys...},              # the best cap at the default budget
     "capacity": {name: rps}, "ratios": {...},
     "attribution": {"baseline", "gain_rps", "shares": {ablation: share}, "closest"},
     "noise": [{"vs", "vs_run", "state", "ratio", "words", ...}],  # noise_verdict
     "findings": [sentence, ...]}

``findings`` are the sentences of ``report.md``'s "What produced the gain": which
ablation the gain came from, any tail regression against the best pair, and
whether the batch cap moved.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shlex
import time
from pathlib import Path
from typing import Any, Callable, Sequence

RUN_KEYS = ("name", "kind", "cap", "budget", "submitted", "completed", "failed", "refused",
            "goodput_rps", "attainment", "output_tok_s", "ttft_p50_s", "ttft_p99_s",
            "tpot_p50_s", "tpot_p99_s", "first_response_p50_s", "first_response_p99_s",
            "max_wait_s", "preemptions")
EXTRA_KEYS = ("phases", "request_throughput_rps", "total_tok_s", "ttft_mean_s", "ttft_p90_s",
              "tpot_mean_s", "tpot_p90_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
              "e2el_p50_s", "e2el_p90_s", "e2el_p99_s", "first_response_mean_s",
              "first_response_p90_s", "waits_over_10x_ttft", "recomputed_tokens",
              "duration_s", "mean_cap", "cap_moves", "cap_min", "cap_max", "repeats",
              "goodput_rps_runs", "goodput_rps_min", "goodput_rps_max", "goodput_rps_std",
              "ttft_p99_s_runs", "pace_s_runs", "silence_s_runs")
#: metrics where more is better: label -> summary key
BEST_BY = {"goodput": "goodput_rps", "attainment": "attainment", "throughput": "output_tok_s"}
#: tail metrics checked against the best pair: label -> (key, more is better)
TAIL = {"TTFT p99": ("ttft_p99_s", False), "TPOT p99": ("tpot_p99_s", False),
        "throughput": ("output_tok_s", True)}
#: a tail figure within this fraction of the best pair's is level, not a regression
TAIL_TOLERANCE = 0.05


def provenance(argv: Sequence[str], *, cpuinfo: str | Path = "/proc/cpuinfo",
               cpu_count: Callable[[], int | None] = os.cpu_count,
               now_s: Callable[[], float] = time.time) -> dict[str, Any]:
    """Where, when and how a report was made: the command line that repeats it
    (``tuned`` + ``argv``), the host's CPU model and core count, and the UTC time, so
    a results page can quote each figure with what produced it."""
    from tuned import __version__
    from tuned.base.hostinfo import cpu_model

    return {"command": shlex.join(["tuned", *argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s())),
            "host": {"cpu_model": cpu_model(cpuinfo), "cpu_cores": cpu_count()},
            "tuned_version": __version__}


def run_row(contender, summary: dict[str, Any]) -> dict[str, Any]:
    row = {"name": contender.name, "kind": contender.kind}
    if contender.cap is not None:
        row["cap"] = contender.cap
    if getattr(contender, "budget", None) is not None:
        row["budget"] = contender.budget
    for k in RUN_KEYS[4:] + EXTRA_KEYS:
        if k in summary:
            row[k] = summary[k]
    return row


def cap_figures(timeline: Sequence[tuple[float, int]]) -> dict[str, Any]:
    """How a run's applied cap moved: ``mean_cap`` (over the timeline's entries),
    ``cap_moves`` (changes of value), ``cap_min``, ``cap_max``; empty without a
    timeline."""
    caps = [c for _, c in timeline]
    if not caps:
        return {"mean_cap": None}
    return {"mean_cap": sum(caps) / len(caps),
            "cap_moves": sum(1 for a, b in zip(caps, caps[1:]) if a != b),
            "cap_min": min(caps), "cap_max": max(caps)}


def _num(x) -> float:
    return x if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else -math.inf


def _low(x) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else math.inf


def rank_static(runs: list[dict], key: str = "goodput_rps",
                budget: int | None = None) -> list[dict]:
    """The static runs, best first by ``key`` (more is better); ``budget``: the
    static caps at that token budget only. Ties go to the lower TTFT p99, then to
    the run listed first (the smaller cap, then the smaller budget)."""
    # vLLM's default is a static pair too: an operator could keep it
    statics = [(i, r) for i, r in enumerate(runs) if r["kind"] == "static"
               and (budget is None or r.get("budget") == budget)]
    return [r for _, r in sorted(statics, key=lambda ir: (-_num(ir[1].get(key)),
                                                          _low(ir[1].get("ttft_p99_s")),
                                                          ir[0]))]


def best_static(runs: list[dict], capacity: dict[str, float] | None,
                budget: int | None = None) -> dict[str, str]:
    """The best static pair in hindsight per metric (:data:`BEST_BY`, the first of
    :func:`rank_static`; with ``capacity``, by capacity too); ``budget``: among the
    static caps at that token budget only (the best cap at vLLM's default budget)."""
    out = {}
    for label, key in BEST_BY.items():
        ranked = rank_static(runs, key, budget)
        if ranked:
            out[f"by_{label}"] = ranked[0]["name"]
    statics = [r for r in runs if r["kind"] == "static"
               and (budget is None or r.get("budget") == budget)]
    if capacity and statics:
        named = [r["name"] for r in statics if r["name"] in capacity]
        if named:
            out["by_capacity"] = max(named, key=lambda n: capacity[n])
    return out


def _ratio(a, b) -> float | None:
    if a is None or b is None or not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
        return None
    if b == 0:
        return None if a == 0 else math.inf
    return a / b


def ratios(runs: list[dict], best: dict[str, str], capacity: dict[str, float] | None,
           subject: str = "tuned", best_cap: dict[str, str] | None = None) -> dict[str, Any]:
    """``subject``'s ratio to the best static pair (``best_static``), to the best cap
    at vLLM's default budget (``best_cap``), to vLLM's default and to each peer, per
    metric, for goodput, attainment, throughput and capacity."""
    by = {r["name"]: r for r in runs}
    me = by.get(subject)
    if me is None:
        return {}
    out: dict[str, Any] = {}
    picks = {"best_static": best, "best_cap": best_cap or {}}
    others = {"best_static": None, "best_cap": None, "vllm-default": "vllm-default"}
    others.update({r["name"]: r["name"] for r in runs if r["kind"] == "peer"})
    for label, key in BEST_BY.items():
        for other, name in others.items():
            if other in picks:
                name = picks[other].get(f"by_{label}")
            if name is None or name not in by:
                continue
            out[f"{label}_vs_{other}"] = _ratio(me.get(key), by[name].get(key))
    if capacity and subject in capacity:
        for other, name in others.items():
            if other in picks:
                name = picks[other].get("by_capacity")
            if name is not None and name in capacity:
                out[f"capacity_vs_{other}"] = _ratio(capacity[subject], capacity[name])
    return out


def attribution(runs: list[dict], subject: str = "tuned") -> dict[str, Any]:
    """Which ablation produced ``subject``'s goodput gain: the gain over the static
    pair the ablations hold fixed (the static run with their cap and budget, else
    ``vllm-default``), each ablation's share of it (its own gain over that pair /
    ``subject``'s), and the ablation closest to ``subject``'s goodput. Empty
    without ablations."""
    by = {r["name"]: r for r in runs}
    abl = [r for r in runs if r["kind"] == "ablation"]
    me = by.get(subject)
    if not abl or me is None:
        return {}
    pair = (abl[0].get("cap"), abl[0].get("budget"))
    base = next((r for r in runs if r["kind"] == "static"
                 and (r.get("cap"), r.get("budget")) == pair), by.get("vllm-default"))
    if base is None:
        return {}
    if base.get("goodput_rps") is None or me.get("goodput_rps") is None:
        return {}
    g0 = _num(base.get("goodput_rps"))
    gain = _num(me.get("goodput_rps")) - g0
    out: dict[str, Any] = {"baseline": base["name"], "gain_rps": gain}
    if gain > 0:
        out["shares"] = {r["name"]: (_num(r.get("goodput_rps")) - g0) / gain for r in abl}
    out["closest"] = min(abl, key=lambda r: abs(_num(me.get("goodput_rps"))
                                                - _num(r.get("goodput_rps"))))["name"]
    return out


def tail(runs: list[dict], best: str | None, subject: str = "tuned") -> dict[str, float]:
    """``subject``'s tail figures (:data:`TAIL`) over the best pair's: label -> ratio."""
    by = {r["name"]: r for r in runs}
    if best not in by or subject not in by:
        return {}
    out = {}
    for label, (key, _) in TAIL.items():
        r = _ratio(by[subject].get(key), by[best].get(key))
        if r is not None:
            out[label] = r
    return out


def noise_verdict(subject: str, mine: Sequence[float], other: str,
                  theirs: Sequence[float], short: str | None = None,
                  noise: str = "the host's noise") -> dict[str, Any]:
    """Whether ``subject``'s goodput margin over ``other`` stands above the host's
    noise, from each one's goodput per repeat: ``state`` is ``above`` (its worst
    repeat beats the other's best), ``below`` (its best repeat is under the other's
    worst), ``inside`` (the ranges overlap: the margin is within what repeating the
    same run moves) or ``one_repeat`` (a single repeat of either: no spread
    measured); ``ratio`` is the ratio of the means; ``words`` says it in a sentence,
    naming the other ``other`` and then ``short`` (default ``other``) and the source
    of the spread ``noise`` (on the simulator, repeats differ by their seed)."""
    mine, theirs = [float(x) for x in mine], [float(x) for x in theirs]
    them = short or other
    if not mine or not theirs:
        raise ValueError("noise_verdict: each side needs at least one repeat")
    m, t = sum(mine) / len(mine), sum(theirs) / len(theirs)
    ratio = _ratio(m, t)
    head = (f"{subject}'s mean goodput {m:.3g} req/s is {_fmt_ratio(ratio)} {other}'s "
            f"{t:.3g}" if ratio is not None else
            f"{subject}'s mean goodput {m:.3g} req/s against {other}'s {t:.3g}")
    out: dict[str, Any] = {"vs": other, "ratio": ratio, "mean": m, "other_mean": t,
                           "worst": min(mine), "best": max(mine),
                           "other_worst": min(theirs), "other_best": max(theirs)}
    if len(mine) < 2 or len(theirs) < 2:
        out.update(state="one_repeat", words=f"{head}: one repeat: no spread measured")
    elif min(mine) > max(theirs):
        out.update(state="above", words=f"{head}: above {noise}: {subject}'s "
                   f"worst repeat {min(mine):.3g} above {them}'s best {max(theirs):.3g}")
    elif max(mine) < min(theirs):
        out.update(state="below", words=f"{head}: below, beyond {noise}: "
                   f"{subject}'s best repeat {max(mine):.3g} below {them}'s worst "
                   f"{min(theirs):.3g}")
    elif m >= t:
        out.update(state="inside", words=f"{head}: inside {noise}: {subject}'s "
                   f"worst repeat {min(mine):.3g} below {them}'s best {max(theirs):.3g}")
    else:
        out.update(state="inside", words=f"{head}: inside {noise}: {subject}'s "
                   f"best repeat {max(mine):.3g} above {them}'s worst {min(theirs):.3g}")
    return out


def host_pace(runs: Sequence[dict], subject: str = "tuned") -> dict[str, Any] | None:
    """How fast the host ran during each run, from the runs' ``pace_s_runs`` (per
    repeat, the pace probe's step just before and just after it:
    :data:`tuned.bench.live.PACE_PROBE`): ``min_s`` and ``max_s`` over every probe,
    ``spread`` (max over min), ``by_run`` (name: [min, max, mean]), ``relative``
    (``subject``'s mean over the other runs' mean; above 1: the host was slower
    during ``subject``'s runs) and ``words``. None where no run has a probe.

    A host whose step time drifts by 2x within minutes decides more verdicts than
    a controller can: these figures say how much of a margin the host's speed alone
    could make."""
    per = {r["name"]: [x for pair in r.get("pace_s_runs") or [] for x in pair
                       if isinstance(x, (int, float)) and x > 0]
           for r in runs}
    per = {k: v for k, v in per.items() if v}
    if not per:
        return None
    every = [x for v in per.values() for x in v]
    lo, hi = min(every), max(every)
    by_run = {k: [min(v), max(v), sum(v) / len(v)] for k, v in per.items()}
    out: dict[str, Any] = {"min_s": lo, "max_s": hi, "spread": hi / lo, "by_run": by_run,
                           "relative": None}
    parts = ", ".join(f"{k} {v[0] * 1e3:.1f}-{v[1] * 1e3:.1f}" for k, v in by_run.items())
    words = (f"the host's pace (a lone request's step just before and just after each "
             f"run): {lo * 1e3:.1f}-{hi * 1e3:.1f} ms, {hi / lo:.2f}x ({parts} ms)")
    others = [x for k, v in per.items() if k != subject for x in v]
    if subject in by_run and others:
        rel = by_run[subject][2] / (sum(others) / len(others))
        out["relative"] = rel
        words += (f"; during {subject}'s runs the host's step was {rel:.2f}x its mean "
                  f"during the others' ({'slower' if rel > 1 else 'faster'} for "
                  f"{subject})" if abs(rel - 1) >= 0.005 else
                  f"; the same for {subject}'s runs as for the others'")
    out["words"] = words
    return out


def silence_words(runs: Sequence[tuple[str, Sequence]]) -> str | None:
    """One sentence with each run's longest silence
    (:func:`tuned.bench.metrics.longest_silence`): ``runs`` are (name, one
    ``(seconds, start)`` or None per repeat) pairs; None where no repeat has one."""
    parts = [f"{name} " + ", ".join(f"{x[0]:.2f} s from {x[1]:.1f} s" for x in got)
             for name, per in runs if (got := [x for x in per or () if x])]
    if not parts:
        return None
    return ("the longest time no stream got a token while requests were in flight "
            "(seconds of it point at a host stall, which every request in flight then "
            "pays): " + "; ".join(parts))


def noise(runs: list[dict], best: dict[str, str], subject: str = "tuned",
          what: str = "the host's noise") -> list[dict]:
    """:func:`noise_verdict` of ``subject`` against the best static pair by mean goodput
    and against vLLM's default (once where they are the same run); ``what`` names
    where the repeats' spread comes from."""
    by = {r["name"]: r for r in runs}
    me = by.get(subject)
    if me is None:
        return []

    def per_repeat(r: dict) -> list:
        return r.get("goodput_rps_runs") or [r.get("goodput_rps")]

    out = []
    pair = best.get("by_goodput")
    for name, label, short in ((pair, f"the best pair ({pair})", "the pair"),
                               ("vllm-default", "vllm-default", None)):
        if name not in by or any(v["vs_run"] == name for v in out):
            continue
        a, b = per_repeat(me), per_repeat(by[name])
        if any(x is None for x in a + b):
            continue
        v = noise_verdict(subject, a, label, b, short, noise=what)
        v["vs_run"] = name
        out.append(v)
    return out


def _pct(x: float) -> str:
    return f"{x:.0%}"


def findings(report: dict[str, Any], subject: str = "tuned") -> list[str]:
    """The report's sentences: which ablation produced the gain (and each one's
    share), any tail regression against the best pair (TTFT p99, TPOT p99,
    throughput worse by more than :data:`TAIL_TOLERANCE`), the longest wait and how
    many completed requests waited past 10x the TTFT target (and how many were
    refused), and whether the batch cap moved at all."""
    from tuned.bench.runner import LEVERS

    runs = report["runs"]
    by = {r["name"]: r for r in runs}
    me = by.get(subject)
    if me is None:
        return []
    words = []
    att = attribution(runs, subject)
    if att:
        base = by[att["baseline"]]
        if att.get("shares"):
            shares = att["shares"]
            close = att["closest"]
            rest = sorted((n for n in shares if n != close), key=lambda n: -shares[n])
            words.append(f"{subject}'s goodput gain over {att['baseline']} "
                         f"(+{att['gain_rps']:.3g} req/s) is best matched by {close} "
                         f"({LEVERS.get(close, close)}), {_pct(shares[close])} of it"
                         + "".join(f"; {n} {_pct(shares[n])}" if i == 0 else
                                   f", {n} {_pct(shares[n])}" for i, n in enumerate(rest))
                         + _together(sum(shares.values())) + ".")
        else:
            words.append(f"{subject}'s goodput is not above {att['baseline']}'s "
                         f"({_fmt(me.get('goodput_rps'))} vs "
                         f"{_fmt(base.get('goodput_rps'))} req/s): there is no gain to "
                         "attribute.")
    best = (report.get("best_static") or {}).get("by_goodput")
    tl = tail(runs, best, subject)
    if tl:
        bad = []
        for label, (_, more_better) in TAIL.items():
            r = tl.get(label)
            if r is None:
                continue
            if (r < 1 - TAIL_TOLERANCE) if more_better else (r > 1 + TAIL_TOLERANCE):
                bad.append(f"{subject}'s {label} is {_fmt_ratio(r)} the best pair's")
        if bad:
            words.append(f"Tail regression against the best pair ({best}): "
                         + "; ".join(bad) + ".")
        else:
            words.append(f"No tail regression against the best pair ({best}): {subject}'s "
                         f"TTFT p99, TPOT p99 and throughput are within "
                         f"{_pct(TAIL_TOLERANCE)} of it or better.")
    if me.get("waits_over_10x_ttft") is not None:
        ttft = (report.get("slo_parsed") or {}).get("ttft_s")
        bound = f" ({_fmt(10 * ttft, '_s')})" if ttft else ""
        pair = by.get(best) if best else None
        vs = f" (the best pair's {_fmt(pair.get('max_wait_s'), '_s')})" if pair else ""
        words.append(f"{subject}'s longest wait for a first token was "
                     f"{_fmt(me.get('max_wait_s'), '_s')}{vs}; "
                     f"{_fmt(me['waits_over_10x_ttft'])} completed requests waited more than "
                     f"10x the TTFT target{bound}; {_fmt(me.get('refused'))} were refused.")
    if me.get("cap_moves") == 0:
        why = ""
        if att.get("shares"):
            shares = att["shares"]
            levers = sorted((n for n in shares if n != "tuned-cap-only" and shares[n] > 0),
                            key=lambda n: -shares[n])
            parts = [f"{LEVERS.get(n, n)} ({n} alone: {_pct(shares[n])})" for n in levers]
            why = ("; the gain came from " + _and(parts) if parts else
                   "; no other lever alone produced any of the gain")
        words.append(f"The batch cap never moved (it stayed at {_fmt(me.get('cap_max'))})"
                     f"{why}.")
    elif me.get("cap_moves"):
        per_run = " per run on average" if (me.get("repeats") or 1) > 1 else ""
        times = "once" if me["cap_moves"] == 1 else f"{_fmt(me['cap_moves'])} times"
        words.append(f"The batch cap moved {times}{per_run}, between "
                     f"{_fmt(me.get('cap_min'))} and {_fmt(me.get('cap_max'))}.")
    return words


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _together(total: float) -> str:
    """What the ablations' shares add up to, where that is not about all of it."""
    if abs(total - 1) <= TAIL_TOLERANCE:
        return ""
    if total < 1:
        return (f" (alone they add up to {_pct(total)}: the rest comes from the levers "
                "together)")
    return f" (alone they add up to {_pct(total)}: the levers overlap)"


def _fmt_ratio(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "inf x"


def _ratio_cell(v: float | None) -> str:
    """A ratio's cell: ``1.05x``; over a zero, "above 0 (the other: 0)"; '-' none."""
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "above a zero (the other had none)" if v > 0 else "-"
    return f"{_fmt(v)}x"


def _fmt(v: Any, key: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and not key and abs(v) < 1000:
        return str(int(v))               # a count (a mean of equal counts over repeats)
    if isinstance(v, float):
        if not math.isfinite(v):
            return "inf" if v > 0 else "-"
        if key.endswith("_s"):
            return f"{v * 1e3:.1f} ms" if v < 1 else f"{v:.2f} s"
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def markdown(report: dict[str, Any]) -> str:
    runs = report["runs"]
    cap = report.get("capacity") or {}

    def picks(key: str) -> str:
        return ", ".join(f"{k.removeprefix('by_')} {v}"
                         for k, v in (report.get(key) or {}).items()) or "-"

    lines = [f"# tuned bench: {report['engine']} / {report['hardware']}", "",
             f"- workload: `{report['workload']}` (seed {report['seed']})",
             f"- SLO: {report['slo']}" + _relative(report.get("slo_relative")),
             f"- best static pair (cap, token budget) in hindsight: {picks('best_static')}"]
    if report.get("best_cap"):
        lines.append(f"- best cap at vLLM's default token budget: {picks('best_cap')}")
    aim = (report.get("workload_sized") or {}).get("attainment")
    if aim:
        met = next((r.get("attainment") for r in runs if r["name"] == "vllm-default"), None)
        lines.append(f"- sized for vLLM's default to meet {aim['target']:.0%}: every rate "
                     f"x {aim['factor']:g}, where the simulator of the measured step put it "
                     f"at {aim['predicted']:.0%}"
                     + (f"; it met {met:.0%} here" if met is not None else ""))
    if (report.get("repeats") or 1) > 1:
        lines.append(f"- every figure is the mean of {report['repeats']} repeats")
    lines.append("")
    verdicts = report.get("noise") or []
    pace = report.get("host_pace")
    if verdicts or pace:
        lines += ["## Above the noise?", ""] + [f"- {v['words']}." for v in verdicts]
        if pace:
            lines.append(f"- {pace['words']}.")
        quiet = silence_words([(r["name"], r["silence_s_runs"]) for r in runs
                               if r.get("silence_s_runs")])
        if quiet:
            lines.append(f"- {quiet}.")
        lines.append("")
    words = findings(report)
    if words:
        lines += ["## What produced the gain", ""] + [f"- {w}" for w in words] + [""]
    head = ["run", "kind", "goodput req/s", "attainment", "out tok/s", "TTFT p50", "TTFT p99",
            "TPOT p50", "TPOT p99", "1st resp p99", "max wait", "refused", "preempt",
            "done/sent"]
    spread = any(len(r.get("goodput_rps_runs") or []) > 1 for r in runs)
    if spread:
        head[3:3] = ["goodput min-max (sd)", "TTFT p99 per repeat"]
    if cap:
        head.append("capacity req/s")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        cells = [r["name"], r["kind"], _fmt(r.get("goodput_rps")), _fmt(r.get("attainment")),
                 _fmt(r.get("output_tok_s")), _fmt(r.get("ttft_p50_s"), "_s"),
                 _fmt(r.get("ttft_p99_s"), "_s"), _fmt(r.get("tpot_p50_s"), "_s"),
                 _fmt(r.get("tpot_p99_s"), "_s"), _fmt(r.get("first_response_p99_s"), "_s"),
                 _fmt(r.get("max_wait_s"), "_s"), _fmt(r.get("refused")),
                 _fmt(r.get("preemptions")), f"{_fmt(r.get('completed'))}/"
                 f"{_fmt(r.get('submitted'))}"]
        if spread:
            cells[3:3] = [_spread(r), ", ".join(_fmt(x, "_s") for x in
                                                r.get("ttft_p99_s_runs") or []) or "-"]
        if cap:
            cells.append(_fmt(cap.get(r["name"])))
        lines.append("| " + " | ".join(cells) + " |")
    lines += phase_table(runs)
    rat = report.get("ratios") or {}
    if rat:
        lines += ["", "## tuned's ratios", "", "| ratio | value |", "|---|---|"]
        for k, v in rat.items():
            lines.append(f"| {k.replace('_vs_', ' vs ')} | {_ratio_cell(v)} |")
    lines.append("")
    return "\n".join(lines)


def phase_best_static(runs: list[dict]) -> list[dict]:
    """Per phase of a phased workload, the static run with the most good requests in
    that phase (the ceiling of any fixed setting, phase by phase, in hindsight):
    ``[{name: phase, run, good}]``; [] without phases or static runs."""
    statics = [r for r in runs if r.get("kind") == "static" and r.get("phases")]
    if not statics:
        return []
    out = []
    for i, ph in enumerate(statics[0]["phases"]):
        best = max(statics, key=lambda r: _num(r["phases"][i]["good"]))
        out.append({"name": ph["name"], "run": best["name"],
                    "good": best["phases"][i]["good"]})
    return out


def phase_table(runs: list[dict]) -> list[str]:
    """The markdown lines of the per-phase table: for every run and phase, good /
    served / refused of n, the p99 time to a first response and to a refusal; then the
    best static run of each phase."""
    with_phases = [r for r in runs if r.get("phases")]
    if not with_phases:
        return []
    names = [p["name"] for p in with_phases[0]["phases"]]
    lines = ["", "## Per phase", "",
             "good / served / refused of n; p99 from arrival to a first token or a "
             "refusal, and to a refusal", "",
             "| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in with_phases:
        cells = [f"{_fmt(p['good'])} / {_fmt(p['served'])} / {_fmt(p['refused'])} of "
                 f"{_fmt(p['n'])}; {_fmt(p.get('first_response_p99_s'), '_s')}, "
                 f"{_fmt(p.get('refusal_p99_s'), '_s')}" for p in r["phases"]]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    best = phase_best_static(runs)
    if best:
        lines.append("| best static of the phase | " + " | ".join(
            f"{b['run']}: {_fmt(b['good'])} good" for b in best) + " |")
    return lines


def _relative(rel: dict | None) -> str:
    """How a relative SLO (``tpot=2.5x``) became seconds."""
    if not rel:
        return ""
    return (f" (from {rel['spec']}, a batch-1 decode step of "
            f"{rel['step_s_batch1'] * 1e3:.2f} ms: {rel['source']})")


def _spread(run: dict) -> str:
    """A run's goodput over its repeats: min-max (standard deviation)."""
    if run.get("goodput_rps_min") is None:
        return "-"
    return (f"{_fmt(run['goodput_rps_min'])}-{_fmt(run['goodput_rps_max'])} "
            f"({_fmt(run.get('goodput_rps_std'))})")


def write(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True,
                                                default=_json_default) + "\n")
    keys = list(RUN_KEYS) + [k for k in EXTRA_KEYS if any(k in r for r in report["runs"])]
    cap = report.get("capacity") or {}
    with open(out / "report.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys + (["capacity_rps"] if cap else []))
        for r in report["runs"]:
            w.writerow([r.get(k, "") for k in keys] + ([cap.get(r["name"], "")] if cap else []))
    (out / "report.md").write_text(markdown(report))


def _json_default(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


#: how each kind of contender is drawn in the plots: (legend label, colour). tuned and
#: vLLM's default stand out; the static sweep is the grey background they are read
#: against, its best pair picked out
STYLE = {"tuned": ("tuned", "#d62728"),
         "vllm-default": ("vLLM default", "#1f77b4"),
         "best": ("best static pair", "#2ca02c"),
         "static": ("static (cap, budget) pair", "#b0b0b0"),
         "peer": ("TensorRT-LLM / SGLang rule", "#ff7f0e"),
         "ablation": ("tuned ablation", "#9467bd")}


def _role(run: dict, best: str | None) -> str:
    """Which :data:`STYLE` a run is drawn in."""
    if run["name"] in ("tuned", "vllm-default") or run["name"] == best:
        return {"tuned": "tuned", "vllm-default": "vllm-default"}.get(run["name"], "best")
    return run["kind"] if run["kind"] in STYLE else "static"


def _pyplot():
    """pyplot on the Agg backend (files only: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _legend_outside(ax, **kw):
    """A legend right of the axes, never over the data."""
    return ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                     fontsize=8, **kw)


def _slo_text(report: dict[str, Any]) -> str:
    slo = report.get("slo_parsed") or {}
    parts = [f"{k.removesuffix('_s').upper()} {v * 1e3:g} ms" if v < 1 else
             f"{k.removesuffix('_s').upper()} {v:g} s"
             for k, v in slo.items() if v]
    return ", ".join(parts) or report.get("slo", "")


def goodput_figure(report: dict[str, Any]):
    """Goodput (req/s) and SLA attainment of every contender, one bar each, coloured
    by kind with a legend; tuned's and vLLM's default bars carry their value."""
    from matplotlib.patches import Patch

    plt = _pyplot()

    runs = report["runs"]
    best = report["best_static"].get("by_goodput")
    names = [r["name"] for r in runs]
    roles = [_role(r, best) for r in runs]
    colors = [STYLE[k][1] for k in roles]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(max(9, 0.42 * len(runs) + 3), 7.5),
                                 sharex=True)
    fig.suptitle(f"Goodput and SLA attainment per contender: {report['engine']} / "
                 f"{report['hardware']}, workload {report['workload']}, "
                 f"SLO {_slo_text(report)}", fontsize=10)
    for ax, key, title, ylabel in (
            (a1, "goodput_rps", "Request goodput (req/s): requests that met every SLO, "
             "per second", "goodput (req/s)"),
            (a2, "attainment", "SLA attainment (fraction of requests that met every SLO)",
             "attainment (fraction)")):
        values = [r.get(key) or 0 for r in runs]
        bars = ax.bar(names, values, color=colors, edgecolor="none")
        for bar, role, v in zip(bars, roles, values):
            if role in ("tuned", "vllm-default", "best"):
                ax.annotate(f"{v:.2f}", (bar.get_x() + bar.get_width() / 2, v),
                            ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                            textcoords="offset points")
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_ylabel(ylabel)
        ax.margins(y=0.12)
    a2.set_ylim(0, 1.1)
    a2.set_xlabel("contender (static-C@B: cap C sequences, token budget B tokens)")
    for lbl in a2.get_xticklabels():
        lbl.set_rotation(60)
        lbl.set_ha("right")
    shown = [k for k in STYLE if k in roles]
    _legend_outside(a1, handles=[Patch(color=STYLE[k][1], label=STYLE[k][0] + (
        f" ({best})" if k == "best" else "")) for k in shown], title="contender kind")
    fig.tight_layout()
    return fig


def _cap_line(cap: Sequence[tuple[float, int]], end_s: float) -> tuple[list, list]:
    """A cap timeline as step points drawn to ``end_s``: the last cap holds until the
    run ends (a run whose cap never moved has one point, and a step line of one
    point draws nothing)."""
    xs, ys = (list(v) for v in zip(*cap))
    if end_s > xs[-1]:
        xs.append(end_s)
        ys.append(ys[-1])
    return xs, ys


def timeline_figure(report: dict[str, Any], timelines: dict[str, dict]):
    """The applied cap (sequences) and the time between tokens (ms) over the run, for
    tuned, the best static pair and vLLM's default; None when none ran."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plt = _pyplot()

    best = report["best_static"].get("by_goodput")
    show = [n for n in ("tuned", best, "vllm-default") if n and n in timelines]
    if not show:
        return None
    runs = {r["name"]: r for r in report["runs"]}
    styles = {"tuned": dict(lw=2.2, ls="-", zorder=3),
              best: dict(lw=1.6, ls="--", zorder=4),
              "vllm-default": dict(lw=1.6, ls=":", zorder=5)}
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    fig.suptitle(f"Cap and time between tokens over the run: {report['engine']} / "
                 f"{report['hardware']}, workload {report['workload']}", fontsize=10)
    caps_seen = []
    for n in show:
        tl = timelines[n]
        role = _role(runs.get(n, {"name": n, "kind": "static"}), best)
        label = f"{STYLE[role][0]} ({n})" if role == "best" else STYLE[role][0]
        style = dict(styles[n], color=STYLE[role][1], label=label)
        tbt = tl.get("tbt") or []
        caps = tl.get("cap") or []
        end = max([runs.get(n, {}).get("duration_s") or 0.0]
                  + [t for t, _ in tbt] + [t for t, _ in caps])
        if caps:
            xs, ys = _cap_line(caps, end)
            a1.step(xs, ys, where="post", **style)
            caps_seen += ys
        if tbt:
            xs, ys = zip(*tbt)
            a2.plot(xs, [y * 1e3 for y in ys], **dict(style, lw=style["lw"] * 0.6))
    slo = report.get("slo_parsed") or {}
    if slo.get("tpot_s"):
        a2.axhline(slo["tpot_s"] * 1e3, color="k", ls="--", lw=0.8,
                   label=f"TPOT SLO ({slo['tpot_s'] * 1e3:g} ms)")
    a1.set_title("Applied cap on running sequences (sequences, log scale)", fontsize=9,
                 loc="left")
    a1.set_ylabel("cap (sequences)")
    a1.set_yscale("log", base=2)
    if caps_seen:
        a1.set_ylim(min(caps_seen) / 1.6, max(caps_seen) * 1.6)
    a1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    a1.yaxis.set_minor_formatter(NullFormatter())
    a2.set_title("Time between tokens (ms, mean of each second)", fontsize=9, loc="left")
    a2.set_ylabel("TBT (ms)")
    a2.set_xlabel("time since the first arrival (s)")
    a2.set_ylim(bottom=0)
    _legend_outside(a1)
    _legend_outside(a2)
    fig.tight_layout()
    return fig


def capacity_figure(report: dict[str, Any], probes: dict[str, list]):
    """SLA attainment against arrival rate for every contender whose capacity was
    searched: the static sweep thin and grey, tuned and vLLM's default bold; None
    without probes."""
    from tuned.bench.metrics import CAPACITY_TARGET

    plt = _pyplot()

    probes = {n: sorted(p) for n, p in probes.items() if p}
    if not probes:
        return None
    best = report["best_static"].get("by_capacity") or report["best_static"].get("by_goodput")
    kinds = {r["name"]: r for r in report["runs"]}
    fig, ax = plt.subplots(figsize=(10, 5.5))
    ax.set_title(f"SLA attainment vs arrival rate: {report['engine']} / {report['hardware']}, "
                 f"SLO {_slo_text(report)}\ncapacity = the highest rate with attainment "
                 f">= {CAPACITY_TARGET:g}", fontsize=10)
    roles = {n: _role(kinds.get(n, {"name": n, "kind": "static"}), best) for n in probes}
    n_static = sum(1 for r in roles.values() if r == "static")
    # drawn from the background up; listed in the legend from the top down
    order = {"static": 0, "ablation": 1, "peer": 2, "best": 3, "vllm-default": 4, "tuned": 5}
    markers = {"ablation": iter("v^sDP<>"), "peer": iter("xX+*")}
    handles: list[tuple[int, Any]] = []
    for n, pts in sorted(probes.items(), key=lambda kv: order[roles[kv[0]]]):
        role = roles[n]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        if role == "static":
            # the sweep is the background: one legend entry for all of it
            [line] = ax.plot(xs, ys, "-", color=STYLE["static"][1], lw=0.8, alpha=0.7,
                             zorder=1, label=f"{STYLE['static'][0]}s ({n_static})")
            if not any(h.get_label() == line.get_label() for _, h in handles):
                handles.append((0, line))
        elif role in ("ablation", "peer"):
            # one colour per kind; each run its own marker, so each can be told apart
            [line] = ax.plot(xs, ys, "--" if role == "peer" else ":", color=STYLE[role][1],
                             lw=1.0, marker=next(markers[role], "o"), ms=4, alpha=0.85,
                             zorder=2, label=n)
            handles.append((order[role], line))
        else:
            label = f"{STYLE[role][0]} ({n})" if role == "best" else STYLE[role][0]
            [line] = ax.plot(xs, ys, "o-", ms=4, lw=2.4 if role == "tuned" else 1.8,
                             color=STYLE[role][1], zorder=3 + order[role], label=label)
            handles.append((order[role], line))
    threshold = ax.axhline(CAPACITY_TARGET, color="k", ls="--", lw=0.8,
                           label=f"attainment {CAPACITY_TARGET:g} (capacity threshold)")
    handles.append((-1, threshold))
    ordered = [h for _, h in sorted(handles, key=lambda oh: -oh[0])]
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("SLA attainment (fraction of requests)")
    ax.set_ylim(-0.02, 1.05)
    ax.set_xlim(left=0)
    _legend_outside(ax, handles=ordered)
    fig.tight_layout()
    return fig


def plots(report: dict[str, Any], timelines: dict[str, dict], probes: dict[str, list],
          out: Path) -> list[Path]:
    """goodput.png (goodput and attainment per contender), timeline.png (cap and TBT
    over time, tuned against the best static), capacity.png (attainment vs rate)."""
    plt = _pyplot()
    files = []
    for name, fig in (("goodput.png", goodput_figure(report)),
                      ("timeline.png", timeline_figure(report, timelines)),
                      ("capacity.png", capacity_figure(report, probes))):
        if fig is None:
            continue
        files.append(out / name)
        # the legends sit outside the axes: the saved area grows to hold them
        fig.savefig(files[-1], dpi=110, bbox_inches="tight")
        plt.close(fig)
    return files
