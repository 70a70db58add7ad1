"""Contenders on the simulator when the host is slower than its profile and its steps
jitter: how a rule holds up on a host it was not tuned on.

``tuned bench --engine sim`` runs each contender at the profile's exact speed; a real
host drifts (a shared CPU host can run well slower or faster than its own profile
taken minutes earlier) and every step varies. Here each simulated step takes ``profile x slow x exp(N(0,
sigma))`` while every controller sees only what it measures, as on a real engine.
Prints, per (seed, slow), the requests each contender served within both SLOs, then
the means. Used to choose what a violation caused by prefill does on a CPU host
(``EvidenceSlaBound.budget_controlled``). Example::

    .venv/bin/python tools/host_drift.py --profile PROFILE.json --num-gpu-blocks 48 \\
        --seeds 0,1,2,3,4,5,6,7 --slow 1.0,1.15,1.3
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuned.base import log as log_mod  # noqa: E402
from tuned.bench.command import base_config  # noqa: E402
from tuned.bench.metrics import Slo, summarize  # noqa: E402
from tuned.bench.runner import SimBench, contenders  # noqa: E402
from tuned.sim.hardware import engine_defaults, resolve_hardware  # noqa: E402
from tuned.base.workloads import parse_workload  # noqa: E402


class DriftingHost:
    """A step model ``slow`` times slower than ``model``, each step scaled by a
    lognormal factor of spread ``sigma`` (seeded)."""

    def __init__(self, model, slow: float, sigma: float, seed: int) -> None:
        self.model, self.slow, self.sigma = model, slow, sigma
        self.rng = random.Random(seed)
        self.gap_s = getattr(model, "gap_s", 0.0)

    def step_s(self, shape) -> float:
        return self.model.step_s(shape) * self.slow * math.exp(self.rng.gauss(0.0, self.sigma))

    def __getattr__(self, name):
        return getattr(self.model, name)


def _numbers(text: str, name: str, kind=float) -> list:
    try:
        return [kind(x) for x in text.split(",")]
    except ValueError:
        what = "numbers" if kind is float else "integers"
        raise SystemExit(f"{name}: a comma-separated list of {what}, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="a profile measured by `tuned profile`")
    ap.add_argument("--num-gpu-blocks", type=int, default=48)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--workload", default="phase-shift:rate=0.6,n=37,scale=0.5")
    ap.add_argument("--slo", default="ttft=3,tpot=0.05")
    ap.add_argument("--seeds", default="0,1,2,3", help="workload and jitter seeds")
    ap.add_argument("--slow", default="1.0,1.15,1.3", help="host slowdowns vs the profile")
    ap.add_argument("--sigma", type=float, default=0.1, help="per-step jitter (log spread)")
    ap.add_argument("--contenders", default="vllm-default,static-4,tuned")
    ap.add_argument("--set", action="append", default=[], metavar="KEY = VALUE",
                    help="a TOML line added to every contender's config (repeatable)")
    a = ap.parse_args(argv)
    log_mod.configure("warning")
    slows = _numbers(a.slow, "--slow")
    seeds = _numbers(a.seeds, "--seeds", int)
    if a.sigma < 0 or any(s <= 0 for s in slows):
        raise SystemExit("--sigma must be >= 0 and every --slow > 0")
    slo = Slo.parse(a.slo)
    hw0 = resolve_hardware(None, a.profile)
    engine = engine_defaults(hw0)
    defaults = (engine["max_num_seqs"], engine["max_num_batched_tokens"])
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(f"num_gpu_blocks = {a.num_gpu_blocks}\nmax_model_len = {a.max_model_len}\n")
        f.write("".join(line + "\n" for line in a.set))
    base = base_config(argparse.Namespace(config=f.name), slo, engine)
    Path(f.name).unlink()
    totals: dict[str, list[int]] = {}
    for seed in seeds:
        wl = parse_workload(a.workload, seed, max_model_len=base.max_model_len)
        field = contenders(base, default_seqs=defaults[0], default_tokens=defaults[1],
                           quick=True, caps=[4, 8, 16], peers=False,
                           only=a.contenders.split(","))
        for slow in slows:
            row = []
            for c in field:
                host = DriftingHost(hw0.step_model, slow, a.sigma, seed * 100 + 7)
                out = SimBench(dataclasses.replace(hw0, step_model=host)).run(
                    c, wl.requests, timelines=False)
                good = summarize(out.results, slo)["good"]
                totals.setdefault(c.name, []).append(good)
                row.append(f"{c.name}={good}")
            print(f"seed={seed} slow={slow:g}", " ".join(row), flush=True)
    n = len(seeds) * len(slows)
    print("mean within both SLOs of", n, "runs:",
          " ".join(f"{k}={sum(v) / n:.1f}" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
