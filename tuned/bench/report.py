"""The benchmark's report: ``report.json``, ``report.csv``, ``report.md`` and plots.

Every figure is computed here from the runs' per-request results; nothing is
pasted in. ``report.json`` follows the schema of the benchmark issue::

    {"engine", "hardware", "workload", "slo", "seed", "command", "date",
     "host": {"cpu_model", "cpu_cores"}, "tuned_version",
     "runs": [{"name", "kind", "cap" (static only), "submitted", "completed", "failed",
               "goodput_rps", "attainment", "output_tok_s", "ttft_p50_s", "ttft_p99_s",
               "tpot_p50_s", "tpot_p99_s", "preemptions", ...more summary keys}],
     "best_static": {"by_goodput": name, "by_attainment": name, "by_output_tok_s": name,
                     "by_capacity": name},
     "capacity": {name: rps}, "ratios": {...}}
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

RUN_KEYS = ("name", "kind", "cap", "submitted", "completed", "failed", "goodput_rps",
            "attainment", "output_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s",
            "tpot_p99_s", "preemptions")
EXTRA_KEYS = ("request_throughput_rps", "total_tok_s", "ttft_mean_s", "ttft_p90_s",
              "tpot_mean_s", "tpot_p90_s", "itl_p50_s", "itl_p90_s", "itl_p99_s",
              "e2el_p50_s", "e2el_p90_s", "e2el_p99_s", "recomputed_tokens", "duration_s",
              "mean_cap")
#: metrics where more is better: label -> summary key
BEST_BY = {"goodput": "goodput_rps", "attainment": "attainment", "throughput": "output_tok_s"}


def provenance(argv: Sequence[str], *, cpuinfo: str | Path = "/proc/cpuinfo",
               cpu_count: Callable[[], int | None] = os.cpu_count,
               now_s: Callable[[], float] = time.time) -> dict[str, Any]:
    """Where, when and how a report was made: the command line that repeats it
    (``tuned`` + ``argv``), the host's CPU model and core count, and the UTC time, so
    a results page can quote each figure with what produced it."""
    from tuned import __version__
    from tuned.hostinfo import cpu_model

    return {"command": shlex.join(["tuned", *argv]),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_s())),
            "host": {"cpu_model": cpu_model(cpuinfo), "cpu_cores": cpu_count()},
            "tuned_version": __version__}


def run_row(contender, summary: dict[str, Any]) -> dict[str, Any]:
    row = {"name": contender.name, "kind": contender.kind}
    if contender.kind == "static":
        row["cap"] = contender.cap
    for k in RUN_KEYS[3:] + EXTRA_KEYS:
        if k in summary:
            row[k] = summary[k]
    return row


def _num(x) -> float:
    return x if isinstance(x, (int, float)) and x is not None and math.isfinite(x) else -math.inf


def best_static(runs: list[dict], capacity: dict[str, float] | None) -> dict[str, str]:
    # vLLM's default is a static cap too: an operator could keep it
    statics = [r for r in runs if r["kind"] == "static"]
    out = {}
    for label, key in BEST_BY.items():
        if statics:
            # max() keeps the first of equals: ties go to the smaller cap
            out[f"by_{label}"] = max(statics, key=lambda r: _num(r.get(key)))["name"]
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
           subject: str = "tuned") -> dict[str, Any]:
    """``subject``'s ratio to the best static (per metric), to vLLM's default and to
    each peer, for goodput, attainment, throughput and capacity."""
    by = {r["name"]: r for r in runs}
    me = by.get(subject)
    if me is None:
        return {}
    out: dict[str, Any] = {}
    metrics = BEST_BY
    others = {"best_static": None, "vllm-default": "vllm-default"}
    others.update({r["name"]: r["name"] for r in runs if r["kind"] == "peer"})
    for label, key in metrics.items():
        for other, name in others.items():
            if other == "best_static":
                name = best.get(f"by_{label}")
            if name is None or name not in by:
                continue
            out[f"{label}_vs_{other}"] = _ratio(me.get(key), by[name].get(key))
    if capacity and subject in capacity:
        for other, name in others.items():
            if other == "best_static":
                name = best.get("by_capacity")
            if name is not None and name in capacity:
                out[f"capacity_vs_{other}"] = _ratio(capacity[subject], capacity[name])
    return out


def _fmt(v: Any, key: str = "") -> str:
    if v is None:
        return "-"
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
    lines = [f"# tuned bench: {report['engine']} / {report['hardware']}", "",
             f"- workload: `{report['workload']}` (seed {report['seed']})",
             f"- SLO: {report['slo']}",
             f"- best static in hindsight: " + ", ".join(
                 f"{k.removeprefix('by_')} {v}" for k, v in report["best_static"].items()), ""]
    head = ["run", "kind", "goodput req/s", "attainment", "out tok/s", "TTFT p50", "TTFT p99",
            "TPOT p50", "TPOT p99", "preempt", "done/sent"]
    if cap:
        head.append("capacity req/s")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        cells = [r["name"], r["kind"], _fmt(r.get("goodput_rps")), _fmt(r.get("attainment")),
                 _fmt(r.get("output_tok_s")), _fmt(r.get("ttft_p50_s"), "_s"),
                 _fmt(r.get("ttft_p99_s"), "_s"), _fmt(r.get("tpot_p50_s"), "_s"),
                 _fmt(r.get("tpot_p99_s"), "_s"), str(r.get("preemptions", "-")),
                 f"{r.get('completed')}/{r.get('submitted')}"]
        if cap:
            cells.append(_fmt(cap.get(r["name"])))
        lines.append("| " + " | ".join(cells) + " |")
    rat = report.get("ratios") or {}
    if rat:
        lines += ["", "## tuned's ratios", "", "| ratio | value |", "|---|---|"]
        for k, v in rat.items():
            lines.append(f"| {k.replace('_vs_', ' vs ')} | {_fmt(v)}x |" if v is not None
                         else f"| {k} | - |")
    lines.append("")
    return "\n".join(lines)


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


def plots(report: dict[str, Any], timelines: dict[str, dict], probes: dict[str, list],
          out: Path) -> list[Path]:
    """goodput.png (goodput and attainment per contender), timeline.png (cap and TBT
    over time, tuned against the best static), capacity.png (attainment vs rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    runs = report["runs"]
    names = [r["name"] for r in runs]
    colors = ["#1f77b4" if r["kind"] == "static" else "#ff7f0e" if r["kind"] == "peer"
              else "#2ca02c" for r in runs]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(max(8, 0.45 * len(runs)), 7), sharex=True)
    a1.bar(names, [r.get("goodput_rps") or 0 for r in runs], color=colors)
    a1.set_ylabel("request goodput (req/s)")
    a1.set_title(f"{report['engine']} / {report['hardware']}: SLO {report['slo']}")
    a2.bar(names, [r.get("attainment") or 0 for r in runs], color=colors)
    a2.set_ylabel("SLA attainment")
    a2.set_ylim(0, 1)
    for lbl in a2.get_xticklabels():
        lbl.set_rotation(60)
        lbl.set_ha("right")
    fig.tight_layout()
    files.append(out / "goodput.png")
    fig.savefig(files[-1], dpi=110)
    plt.close(fig)

    best = report["best_static"].get("by_goodput")
    show = [n for n in ("tuned", best, "vllm-default") if n and n in timelines]
    if show:
        fig, (a1, a2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
        for n in show:
            tl = timelines[n]
            caps = tl.get("cap") or []
            if caps:
                xs, ys = zip(*caps)
                a1.step(xs, ys, where="post", label=n)
            tbt = tl.get("tbt") or []
            if tbt:
                xs, ys = zip(*tbt)
                a2.plot(xs, [y * 1e3 for y in ys], label=n, lw=0.8)
        slo = report.get("slo_parsed") or {}
        if slo.get("tpot_s"):
            a2.axhline(slo["tpot_s"] * 1e3, color="k", ls="--", lw=0.8, label="TPOT SLO")
        a1.set_ylabel("applied cap (seqs)")
        a1.set_yscale("log", base=2)
        a2.set_ylabel("TBT (ms, mean per s)")
        a2.set_xlabel("time (s)")
        a1.legend()
        a2.legend()
        fig.tight_layout()
        files.append(out / "timeline.png")
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    if probes:
        fig, ax = plt.subplots(figsize=(8, 5))
        for n, pts in probes.items():
            if not pts:
                continue
            pts = sorted(pts)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3, lw=1,
                    label=n, alpha=1.0 if n in ("tuned", best, "vllm-default") else 0.35)
        ax.axhline(0.9, color="k", ls="--", lw=0.8)
        ax.set_xlabel("arrival rate (req/s)")
        ax.set_ylabel("SLA attainment")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        files.append(out / "capacity.png")
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)
    return files
