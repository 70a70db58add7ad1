#!/usr/bin/env python3
"""The simulator's regression grid: tuned against vLLM's default and the best static
pair on every row, as docs/results.md shows it ("The simulator's grid").

    .venv/bin/python tools/sim_grid.py OUT_DIR [--jobs 2]

Each row runs ``tuned bench --engine sim ... --quick --capacity off --seed 0`` with
the contenders tuned, vllm-default and the row's best pair (the full sweep's, named
in ROWS), writes its report under OUT_DIR and prints one markdown row; the phased
rows also print tuned's and the others' good requests phase by phase. The simulator
is deterministic: a row's figures do not move with the host.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CPU = "profile:profiles/demo-small-cpu.json"
BURST = ("phases:poisson:rate=10,prompt=U(26,486),output=U(13,243),n=200;"
         "poisson:rate=0.2,prompt=U(26,486),output=U(13,243),n=20")
#: (hardware or profile, workload, SLO, best pair, its token budget)
ROWS = [
    ("a100-llama2-7b", "phase-shift:rate=12,n=300", "ttft=2,tpot=0.05", "static-64@512", 512),
    ("a100-llama2-7b", "phase-shift:rate=12,n=300", "ttft=2,tpot=0.025", "static-128@8192", 8192),
    ("a100-llama2-7b", "trace:azure_conv_2023,n=1500", "ttft=2,tpot=0.05", "static-64@512", 512),
    ("a100-llama2-7b", "trace:azure_conv_2023,n=1500", "ttft=2,tpot=0.025", "static-128@512", 512),
    ("a100-llama2-7b", "saber:mix=W2,rate=12,n=300", "ttft=2,tpot=0.05", "static-32@512", 512),
    ("a100-llama2-7b", "saber:mix=W2,rate=12,n=300", "ttft=2,tpot=0.025", "static-32@512", 512),
    ("a100-llama2-7b", "lmsys:rate=12,n=300", "ttft=2,tpot=0.05", "static-16", 2048),
    ("a100-llama2-7b", "lmsys:rate=12,n=300", "ttft=2,tpot=0.025", "static-16@512", 512),
    ("h100-llama2-70b", "phase-shift:rate=12,n=300", "ttft=2,tpot=0.05", "static-64@512", 512),
    ("h100-llama2-70b", "trace:azure_conv_2023,n=1500", "ttft=2,tpot=0.05", "static-128@512", 512),
    ("h100-llama2-70b", "saber:mix=W2,rate=12,n=300", "ttft=2,tpot=0.05", "static-64@512", 512),
    ("h100-llama2-70b", "lmsys:rate=12,n=300", "ttft=2,tpot=0.05", "static-32@512", 512),
    # a CPU host past capacity, then lighter: long prompts between chat phases, and a
    # burst at about 5x the best pair's throughput followed by a light load
    (CPU, "phase-shift:rate=1.5,n=50", "ttft=3,tpot=0.05", "static-64@8192", 8192),
    (CPU, BURST, "ttft=3,tpot=0.05", "static-12", 2048),
]


def run_row(i: int, row: tuple, out: Path) -> dict:
    target, wl, slo, pair, budget = row
    where = (["--profile", target.removeprefix("profile:")] if target.startswith("profile:")
             else ["--hardware", target])
    d = out / f"row{i:02d}"
    cmd = [sys.executable, "-m", "tuned", "bench", "--engine", "sim", *where, "--workload",
           wl, "--slo", slo, "--quick", "--capacity", "off", "--seed", "0", "--jobs", "1",
           "--contenders", f"tuned,vllm-default,{pair}", "--budgets", str(budget),
           "--caps", pair.removeprefix("static-").split("@")[0],
           "--out", str(d)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return json.loads((d / "report.json").read_text())


def _short(wl: str) -> str:
    return "burst then light (phases)" if wl == BURST else wl


def table(reports: list[tuple[tuple, dict]]) -> list[str]:
    lines = ["| hardware | workload | SLO | best pair | goodput tuned / pair | vs vLLM default "
             "| TTFT p99 tuned / pair | refused (tuned) |", "|---|---|---|---|---|---|---|---|"]
    phased = []
    for (target, wl, slo, pair, _), rep in reports:
        runs = {r["name"]: r for r in rep["runs"]}
        t, p, d = runs["tuned"], runs[pair], runs["vllm-default"]
        g = lambda r: r.get("goodput_rps") or 0.0  # noqa: E731
        lines.append(
            f"| {target.removeprefix('profile:profiles/')} | `{_short(wl)}` | {slo} | {pair} | "
            f"{g(t):.3g} / {g(p):.3g} = **{g(t) / max(g(p), 1e-12):.2f}x** | "
            f"{g(t) / max(g(d), 1e-12):.2f}x | {t.get('ttft_p99_s') or 0:.2f} / "
            f"{p.get('ttft_p99_s') or 0:.2f} s | {t.get('refused') or 0:.0f} |")
        if t.get("phases"):
            phased.append((target, wl, [(n, runs[n]["phases"]) for n in
                                        ("tuned", "vllm-default", pair)]))
    for target, wl, per in phased:
        lines += ["", f"Per phase, `{_short(wl)}` ({target.removeprefix('profile:')}): good "
                  "requests of n (refused)", ""]
        names = [ph["name"] for ph in per[0][1]]
        lines += ["| run | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for name, phases in per:
            lines.append(f"| {name} | " + " | ".join(
                f"{ph['good']:.0f} of {ph['n']:.0f} ({ph['refused']:.0f})" for ph in phases)
                + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
        reports = list(pool.map(lambda ir: run_row(ir[0], ir[1], args.out), enumerate(ROWS)))
    print("\n".join(table(list(zip(ROWS, reports)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
