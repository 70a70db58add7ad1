"""The README's picture: tuned's cap and the time between tokens over the demo's
workload, beside vLLM's default, on the simulator.

The demo's own comparison (``tuned demo``'s phases, sized from the shipped CPU profile
as :mod:`demo_sim` sizes them, at the profile's speed with its per-step jitter), drawn
with the bench report's timeline plot. The simulator is deterministic for a seed, so
the picture is the same on every host::

    .venv/bin/python tools/demo_figure.py --out docs/demo-timeline.png
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_sim import PROFILE, demo_contenders  # noqa: E402
from host_drift import DriftingHost  # noqa: E402
from tuned import config as config_mod  # noqa: E402
from tuned.base import log as log_mod  # noqa: E402
from tuned.bench.metrics import Slo, summarize  # noqa: E402
from tuned.bench.report import timeline_figure  # noqa: E402
from tuned.bench.runner import SimBench  # noqa: E402
from tuned.curves.profile import load_profile  # noqa: E402
from tuned.commands.demo import demo_workload  # noqa: E402
from tuned.sim.hardware import resolve_hardware  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sigma", type=float, default=0.1, help="per-step jitter (log spread)")
    ap.add_argument("--out", default="docs/demo-timeline.png")
    a = ap.parse_args(argv)
    log_mod.configure("warning")
    hw = resolve_hardware(None, a.profile)
    fit0 = load_profile(a.profile).step_model()
    cfg = config_mod.validate({**config_mod.EMBEDDED_DEFAULT, "log_level": "warning"})
    sla = round(cfg.tbt_sla_auto * fit0.predict_step_s(1, 0.0, 0.0), 4)
    fit = {k: getattr(fit0, k) for k in ("a", "beta", "gamma", "eta")}
    slo = Slo(ttft_s=cfg.ttft_sla_s or 3.0, tpot_s=sla)
    wl, _ = demo_workload(sla, fit, seed=a.seed, max_model_len=cfg.effective_max_model_len,
                          ceiling=cfg.max_num_seqs)
    runs, timelines = [], {}
    for c in demo_contenders(cfg):
        host = DriftingHost(hw.step_model, 1.0, a.sigma, a.seed * 100 + 7)
        out = SimBench(dataclasses.replace(hw, step_model=host)).run(c, wl.requests)
        s = summarize(out.results, slo)
        runs.append({"name": c.name, "kind": c.kind, "duration_s": out.duration_s})
        timelines[c.name] = {"cap": out.cap_timeline, "tbt": out.tbt_timeline}
        print(f"{c.name}: goodput {s['goodput_rps']:.3f} req/s, good {s['good']} of "
              f"{len(wl.requests)}, TTFT p99 {s['ttft_p99_s']:.2f} s, "
              f"TPOT p99 {s['tpot_p99_s'] * 1e3:.1f} ms")
    report = {"engine": "sim", "hardware": Path(a.profile).stem, "workload": "tuned demo's phases",
              "best_static": {}, "runs": runs, "slo_parsed": {"tpot_s": sla}}
    fig = timeline_figure(report, timelines)
    # a whole long prompt in one step stalls every decode for about a second; drawn to
    # scale, that spike flattens the part of the run where the two sides differ
    tbt_ax = fig.axes[1]
    tbt_ax.set_ylim(0, 4 * sla * 1e3)
    tbt_ax.set_title("Time between tokens (ms, mean of each second; axis cut at 4x the SLO)",
                     fontsize=9, loc="left")
    fig.savefig(a.out, dpi=80)
    print(f"SLO TPOT {sla * 1e3:.1f} ms; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
