"""Write docs/results.md from the report folders that ``tuned bench`` writes.

Every figure on that page comes from a ``report.json`` (and the per-request logs
beside it), quoted with the command, host and date the report records, so a
reader can repeat any row. Nothing is typed in by hand; to refresh the page, run
the benches again and then this script::

    tuned bench --engine sim --hardware a100-llama2-7b --workload "phase-shift:rate=12,n=300" \\
        --quick --out runs/results-a100-phase-shift
    .venv/bin/python tools/results.py runs/results-*      # writes docs/results.md

Per report: the command, host (CPU model, cores), date, SLO, and a table of the
contenders with goodput, attainment, throughput and the tail: TTFT p99, TPOT p99
and the longest wait (the largest time to first token of any request; requests
refused and requests never served are counted beside it), then the report's
findings (which ablation produced tuned's gain, tail regressions against the best
static pair, whether the cap moved). A summary table on top gives tuned's ratios
to the best static (cap, token budget) pair, the best cap at vLLM's default token
budget and vLLM's default.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuned.bench.report import _fmt as fmt  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "results.md"
#: below this line the page holds measurements run by hand (benchmarks that are not a
#: `tuned bench` report, each with its command, host and date); a rewrite keeps them
KEPT_MARKER = "<!-- measurements run by hand below this line: kept by tools/results.py -->"
NOT_RECORDED = "not recorded"


class ResultsError(Exception):
    """A report folder that cannot be read; the message names the folder."""


def load(folder: Path) -> dict[str, Any]:
    """The folder's ``report.json``, each run given ``longest_wait_s``,
    ``never_served`` (neither a token nor a refusal) and ``refused_requests`` from
    ``logs/<run>.requests.csv`` (None when the log is absent)."""
    path = folder / "report.json"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResultsError(f"{path}: not a readable tuned bench report ({e})") from None
    if not isinstance(report, dict) or not isinstance(report.get("runs"), list):
        raise ResultsError(f"{path}: no 'runs' list; is this a tuned bench report?")
    for run in report["runs"]:
        run["longest_wait_s"], run["never_served"], run["refused_requests"] = _longest_wait(
            folder / "logs" / f"{run['name']}.requests.csv")
    report["folder"] = str(folder)
    return report


def _longest_wait(requests_csv: Path) -> tuple[float | None, int | None, int | None]:
    try:
        with open(requests_csv, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None, None, None
    waits = [float(r["ttft_s"]) for r in rows if r.get("ttft_s")]
    refused = sum(1 for r in rows if r.get("refused") == "1")
    never = sum(1 for r in rows if not r.get("ttft_s") and r.get("refused") != "1")
    return (max(waits) if waits else None), never, refused


def _ratio(v: Any) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _host(report: dict[str, Any]) -> str:
    host = report.get("host")
    if not isinstance(host, dict):
        return NOT_RECORDED
    return f"{host.get('cpu_model', 'unknown')}, {host.get('cpu_cores', '?')} cores"


def _title(report: dict[str, Any]) -> str:
    return f"{report['engine']} / {report['hardware']} / `{report['workload']}`"


def summary_rows(reports: Sequence[dict[str, Any]]) -> list[str]:
    """One markdown row per report: tuned's goodput against the best static pair, the
    best cap at vLLM's default budget and vLLM's default, the TTFT p99 of tuned and
    of the best static pair, and capacity."""
    rows = []
    for rep in reports:
        by = {r["name"]: r for r in rep["runs"]}
        rat = rep.get("ratios") or {}
        best = (rep.get("best_static") or {}).get("by_goodput")
        tuned, best_run = by.get("tuned", {}), by.get(best, {})
        rows.append("| " + " | ".join([
            rep["engine"], rep["hardware"], f"`{rep['workload']}`",
            f"{_ratio(rat.get('goodput_vs_best_static'))} ({best or '-'})",
            f"{_ratio(rat.get('goodput_vs_best_cap'))} "
            f"({(rep.get('best_cap') or {}).get('by_goodput') or '-'})",
            _ratio(rat.get("goodput_vs_vllm-default")),
            f"{fmt(tuned.get('ttft_p99_s'), '_s')} / {fmt(best_run.get('ttft_p99_s'), '_s')}",
            _ratio(rat.get("capacity_vs_best_static")),
            f"`{rep.get('command', NOT_RECORDED)}`"]) + " |")
    return rows


def run_rows(report: dict[str, Any]) -> list[str]:
    """One markdown row per contender of ``report``."""
    cap = report.get("capacity") or {}
    rows = []
    for r in report["runs"]:
        wait = fmt(r.get("longest_wait_s"), "_s")
        if r.get("refused_requests"):
            wait += f" (+{r['refused_requests']} refused)"
        if r.get("never_served"):
            wait += f" (+{r['never_served']} never served)"
        cells = [r["name"], r["kind"], fmt(r.get("goodput_rps")), fmt(r.get("attainment")),
                 fmt(r.get("output_tok_s")), fmt(r.get("ttft_p99_s"), "_s"),
                 fmt(r.get("tpot_p99_s"), "_s"), wait,
                 f"{r.get('completed')}/{r.get('submitted')}"]
        if cap:
            cells.append(fmt(cap.get(r["name"])))
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def render(reports: Sequence[dict[str, Any]]) -> str:
    lines = ["# Results", "",
             "Generated by `tools/results.py` from `tuned bench` reports; do not edit by "
             "hand. Each section gives the command that produced it, the host and the "
             "date. `sim` runs model the named GPU and model on a simulator (step times "
             "from Vidur's measured operator tables); `vllm` runs are the real engine on "
             "the host named. Goodput counts requests that met every SLO, per second; "
             "attainment is their share; capacity is the highest arrival rate with 90% "
             "attainment. Compare ratios within one report only.", "",
             "## Summary", "",
             "| engine | hardware | workload | tuned goodput vs best static pair | vs best "
             "cap at default budget | vs vLLM default | TTFT p99 tuned / best static pair "
             "| capacity vs best static pair | command |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += summary_rows(reports)
    for rep in reports:
        best = ", ".join(f"{k.removeprefix('by_')} {v}"
                         for k, v in (rep.get("best_static") or {}).items()) or "-"
        head = ["run", "kind", "goodput req/s", "attainment", "out tok/s", "TTFT p99",
                "TPOT p99", "longest wait", "done/sent"]
        if rep.get("capacity"):
            head.append("capacity req/s")
        lines += ["", f"## {_title(rep)}", "",
                  f"- command: `{rep.get('command', NOT_RECORDED)}`",
                  f"- host: {_host(rep)}",
                  f"- date: {rep.get('date', NOT_RECORDED)}",
                  f"- SLO: {rep['slo']}; seed {rep['seed']}",
                  f"- best static pair (cap, token budget) in hindsight: {best}"]
        if rep.get("best_cap"):
            lines.append("- best cap at vLLM's default token budget: " + ", ".join(
                f"{k.removeprefix('by_')} {v}" for k, v in rep["best_cap"].items()))
        lines += ["",
                  "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += run_rows(rep)
        if rep.get("findings"):
            lines += [""] + [f"- {w}" for w in rep["findings"]]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", help="report folders (tuned bench --out DIR)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="page to write "
                    "(default: docs/results.md)")
    args = ap.parse_args(argv)
    try:
        reports = [load(Path(f)) for f in sorted(args.folders)]
    except ResultsError as e:
        print(f"results: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    kept = ""
    if out.is_file() and KEPT_MARKER in out.read_text():
        kept = out.read_text().split(KEPT_MARKER, 1)[1]
    out.write_text(render(reports).rstrip("\n") + "\n\n" + KEPT_MARKER + kept.rstrip("\n")
                   + "\n")
    print(f"wrote {args.out} from {len(reports)} reports")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
