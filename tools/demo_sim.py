"""`tuned demo`'s side by side on the simulator: tuned (the embedded default, plus any
``--set`` lines) against vLLM's default static cap on the demo's own workload, on a host
slower or faster than the shipped CPU profile, with per-step jitter.

The live demo takes minutes and measures one host once; this runs the same comparison
across host speeds and seeds in seconds, to choose a setting before spending a live run
on it. Each simulated step takes ``profile x slow x exp(N(0, sigma))``
(:class:`host_drift.DriftingHost`); the workload is sized as the demo sizes it
(:func:`tuned.commands.demo.demo_workload`) from the profile's step fit times ``slow``; the TPOT
SLO is ``tbt_sla_auto`` x the batch-1 step, the TTFT SLO the config's ``ttft_sla_s``.
Prints one line per (slow, seed) and the means: requests within both SLOs, goodput,
output throughput, TTFT p99 and how often the applied cap moved. Example::

    .venv/bin/python tools/demo_sim.py --slow 0.8,1.0,1.3,1.6,2.0 --seeds 0,1,2,3 \\
        --set "cap_raise_hold_s = 1.0"
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_drift import DriftingHost, _numbers  # noqa: E402
from tuned import config as config_mod  # noqa: E402
from tuned.base import log as log_mod  # noqa: E402
from tuned.bench.metrics import Slo, summarize  # noqa: E402
from tuned.bench.runner import Contender, SimBench  # noqa: E402
from tuned.curves.profile import load_profile  # noqa: E402
from tuned.commands.demo import demo_workload  # noqa: E402
from tuned.sim.hardware import VLLM_DEFAULTS, resolve_hardware  # noqa: E402

PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "demo-small-cpu.json"


def demo_contenders(cfg) -> list[Contender]:
    """tuned with ``cfg`` and vLLM's default static cap and budget on a CPU host, as the
    demo runs them."""
    seqs, toks = VLLM_DEFAULTS["cpu"]
    static = dataclasses.replace(
        cfg, max_num_seqs=seqs, max_num_batched_tokens=toks, b_max=0,
        fallback_cap=min(cfg.fallback_cap, seqs), batch_policy="static",
        token_budget_policy="max", queue_policy="fcfs", queue_options={}, ttft_sla_s=0.0,
        admission_guard="off", on_max_wait="off")
    return [Contender("tuned", "tuned", cfg), Contender("vllm-default", "static", static, seqs)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--slow", default="0.8,1.0,1.3,1.6,2.0",
                    help="host slowdowns vs the profile")
    ap.add_argument("--seeds", default="0,1,2,3", help="workload and jitter seeds")
    ap.add_argument("--sigma", type=float, default=0.1, help="per-step jitter (log spread)")
    ap.add_argument("--phase-s", type=float, default=15.0,
                    help="seconds of arrivals per phase, as tuned demo --phase-s")
    ap.add_argument("--set", action="append", default=[], metavar="KEY = VALUE",
                    help="a TOML line over tuned's embedded default (repeatable)")
    ap.add_argument("--caps", action="store_true", help="print tuned's cap, tick by tick")
    a = ap.parse_args(argv)
    log_mod.configure("warning")
    slows, seeds = _numbers(a.slow, "--slow"), _numbers(a.seeds, "--seeds", int)
    if a.sigma < 0 or any(s <= 0 for s in slows):
        raise SystemExit("--sigma must be >= 0 and every --slow > 0")
    hw0 = resolve_hardware(None, a.profile)
    fit0 = load_profile(a.profile).step_model()
    raw = {**config_mod.EMBEDDED_DEFAULT, **tomllib.loads("\n".join(a.set)),
           "log_level": "warning"}
    cfg = config_mod.validate(raw)
    if cfg.tbt_sla_s or not cfg.tbt_sla_auto:
        raise SystemExit("the demo derives its SLA: keep tbt_sla_s = 0 and tbt_sla_auto > 1")
    field = demo_contenders(cfg)
    rows: dict[str, list[tuple]] = {c.name: [] for c in field}
    for slow in slows:
        sla = round(cfg.tbt_sla_auto * fit0.predict_step_s(1, 0.0, 0.0) * slow, 4)
        fit = {k: getattr(fit0, k) * slow for k in ("a", "beta", "gamma", "eta")}
        slo = Slo(ttft_s=cfg.ttft_sla_s or 3.0, tpot_s=sla)
        for seed in seeds:
            wl, _ = demo_workload(sla, fit, seed=seed, phase_s=a.phase_s,
                                  max_model_len=cfg.effective_max_model_len,
                                  ceiling=cfg.max_num_seqs)
            line = []
            for c in field:
                host = DriftingHost(hw0.step_model, slow, a.sigma, seed * 100 + 7)
                out = SimBench(dataclasses.replace(hw0, step_model=host)).run(c, wl.requests)
                s = summarize(out.results, slo)
                caps = [d["cap"] for d in out.decisions]
                moves = sum(1 for x, y in zip(caps, caps[1:]) if x != y)
                row = (s["good"], s["goodput_rps"] or 0.0, s["output_tok_s"] or 0.0,
                       s["ttft_p99_s"] or 0.0, moves)
                rows[c.name].append(row)
                line.append(f"{c.name} good={row[0]} goodput={row[1]:.3f}/s "
                            f"tok/s={row[2]:.1f} ttft_p99={row[3]:.2f}s moves={row[4]}")
                if a.caps and c.kind == "tuned":
                    print("  caps:", " ".join(map(str, caps)))
            print(f"slow={slow:g} seed={seed} sla={sla * 1e3:.1f}ms n={len(wl.requests)}: "
                  + "; ".join(line), flush=True)
    for name, v in rows.items():
        mean = [statistics.mean(x[i] for x in v) for i in range(5)]
        print(f"mean {name}: good={mean[0]:.1f} goodput={mean[1]:.3f}/s tok/s={mean[2]:.1f} "
              f"ttft_p99={mean[3]:.2f}s moves={mean[4]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
