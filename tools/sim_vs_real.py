"""The simulator against the real engine on the same arrivals (issue 29 item 5).

A benchmark, host-dependent, not a test. Runs ``tuned bench`` twice on one workload,
SLO and field of contenders: on the real vLLM CPU engine (``--engine vllm``, its
interleaved repeats) and on the simulator with a profile measured on this host
(``--engine sim --profile``), then prints per contender TTFT p50/p99, TPOT p50/p99 and
goodput, the real engine's mean and min-max over its repeats beside the simulator's,
and sim/real. A figure is flagged where the simulator falls outside the real spread.

The simulated engine is given the real bench's KV cache (``num_gpu_blocks`` of
``engine_defaults(None)``, 48 blocks): a profile carries the cache its own engine had
(hundreds of blocks), which ``--engine sim --profile`` would otherwise simulate.

Start the real engine under the host's engine lock::

    flock /tmp/engine.lock .venv/bin/python tools/sim_vs_real.py --model demo:small \\
        --profile PROFILE.json --workload SPEC --slo ttft=3,tpot=0.03 \\
        --contenders tuned,vllm-default,static-8@256 --caps 8 --budgets 256 --out DIR

or compare two bench folders already run (no engine)::

    .venv/bin/python tools/sim_vs_real.py --real DIR/real --sim DIR/sim
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIGURES = (("ttft_p50", "TTFT p50", "ttft_s", 50), ("ttft_p99", "TTFT p99", "ttft_s", 99),
           ("tpot_p50", "TPOT p50", "tpot_s", 50), ("tpot_p99", "TPOT p99", "tpot_s", 99))


def _csvs(folder: Path, name: str) -> list[Path]:
    """The per-repeat request logs of ``name``, named as ``tuned bench`` names them."""
    from tuned.bench.command import run_stem

    out = []
    while (p := folder / "logs" / f"{run_stem(name, len(out))}.requests.csv").exists():
        out.append(p)
    return out


def _pct(path: Path, col: str, q: float) -> float:
    """``np.percentile`` (the bench's) of a request column over the rows that have it
    (served requests; TPOT of requests with more than one token)."""
    with open(path, newline="") as f:
        vals = [float(r[col]) for r in csv.DictReader(f) if r.get(col) not in (None, "")]
    return float(np.percentile(vals, q)) if vals else math.nan


def repeats(folder: Path) -> dict[str, dict[str, list[float]]]:
    """Per contender of a bench folder, each figure's value in each repeat."""
    rep = json.loads((folder / "report.json").read_text())
    out: dict[str, dict[str, list[float]]] = {}
    for run in rep["runs"]:
        name = run["name"]
        figs = {key: [_pct(p, col, q) for p in _csvs(folder, name)]
                for key, _, col, q in FIGURES}
        figs["goodput"] = list(run.get("goodput_rps_runs") or [run.get("goodput_rps")])
        out[name] = figs
    return out


def _fmt(key: str, v: float) -> str:
    if not math.isfinite(v):
        return "-"
    if key == "goodput":
        return f"{v:.2f}"
    return f"{v * 1e3:.0f} ms" if v < 1 else f"{v:.2f} s"


def table(real: dict, sim: dict) -> str:
    """Markdown: per contender and figure, real mean (min-max), sim, sim/real, and
    whether sim lies outside the real spread."""
    rows = ["| contender | figure | real mean (min-max) | sim | sim/real | outside the real spread |",
            "|---|---|---|---|---|---|"]
    labels = [(k, label) for k, label, _, _ in FIGURES] + [("goodput", "goodput req/s")]
    for name in real:
        if name not in sim:
            continue
        for key, label in labels:
            rv = [v for v in real[name][key] if v is not None and math.isfinite(v)]
            sv = [v for v in sim[name][key] if v is not None and math.isfinite(v)]
            if not rv or not sv:
                continue
            r, s = float(np.mean(rv)), float(np.mean(sv))
            spread = f"{_fmt(key, min(rv))}-{_fmt(key, max(rv))}" if len(rv) > 1 else "one run"
            out = "yes" if len(rv) > 1 and not min(rv) <= s <= max(rv) else "no"
            ratio = f"{s / r:.2f}" if r > 0 else "-"
            rows.append(f"| {name} | {label} | {_fmt(key, r)} ({spread}) | {_fmt(key, s)} "
                        f"| {ratio} | {out} |")
    return "\n".join(rows)


def step_drift(folder: Path, profile: str) -> dict[str, dict[str, float]]:
    """Per tuned-serve run of a real bench folder (its ``logs/NAME[.rK].steps.json``),
    the engine's measured step time over the profile's prediction for the same step
    shapes (``live_over_model`` of the fidelity harness): all busy steps, decode-only
    steps and steps that prefilled. Plain vLLM (the static pairs) records no steps."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fidelity_harness import live_over_model
    from tuned.curves.profile import load_profile

    model = load_profile(profile).step_model()
    out = {}
    for path in sorted((folder / "logs").glob("*.steps.json")):
        steps = json.loads(path.read_text())
        out[path.name.removesuffix(".steps.json")] = {
            "all": live_over_model(steps, model),
            "decode-only": live_over_model([s for s in steps if not s["prefill_tokens"]], model),
            "prefill": live_over_model([s for s in steps if s["prefill_tokens"]], model),
            "steps": len(steps)}
    return out


def _bench(args, engine: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "tuned", "bench", "--engine", engine,
           "--workload", args.workload, "--slo", args.slo, "--contenders", args.contenders,
           "--capacity", "off", "--seed", str(args.seed), "--out", str(out)]
    for flag in ("caps", "budgets"):
        if getattr(args, flag):
            cmd += [f"--{flag}", getattr(args, flag)]
    if engine == "vllm":
        cmd += ["--model", args.model, "--repeats", str(args.repeats)]
    else:
        from tuned.sim.hardware import engine_defaults

        conf = out.parent / "sim-engine.toml"
        conf.write_text(f"num_gpu_blocks = {engine_defaults(None)['num_gpu_blocks']}\n")
        cmd += ["--profile", args.profile, "--config", str(conf)]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real", help="a `tuned bench --engine vllm` folder (compare only)")
    p.add_argument("--sim", help="a `tuned bench --engine sim` folder (compare only)")
    p.add_argument("--model", default="demo:small")
    p.add_argument("--profile", help="a profile of --model measured on this host")
    p.add_argument("--workload")
    p.add_argument("--slo")
    p.add_argument("--contenders", default="tuned,vllm-default")
    p.add_argument("--caps")
    p.add_argument("--budgets")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="folder for the two bench runs (real/, sim/)")
    args = p.parse_args(argv)
    if bool(args.real) != bool(args.sim):
        p.error("--real and --sim go together")
    if args.real:
        real, sim = Path(args.real), Path(args.sim)
    else:
        missing = [f for f in ("profile", "workload", "slo", "out") if not getattr(args, f)]
        if missing:
            p.error("running both needs " + ", ".join("--" + m for m in missing))
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        real, sim = out / "real", out / "sim"
        _bench(args, "sim", sim)
        _bench(args, "vllm", real)
    print(table(repeats(real), repeats(sim)))
    if args.profile:     # with --real/--sim too: the profile the sim folder ran
        for run, d in step_drift(real, args.profile).items():
            print(f"{run}: real steps / profile {d['all']:.3f} over {d['steps']} steps "
                  f"(decode-only {d['decode-only']:.3f}, with prefill {d['prefill']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
