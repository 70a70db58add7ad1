"""``tuned simulate``: one run of tuned's own controller and policies on the
discrete-event engine (:mod:`tuned.engines.sim`).

    tuned simulate --config FILE (--hardware NAME | --profile FILE) --workload SPEC
                   [--seed N] --out DIR

writes ``DIR/result.json`` (keys sorted: two runs with one seed compare byte for
byte) and prints a summary. ``result.json``::

    {"requests": [{"id", "arrival_s", "prompt_tokens", "output_tokens",
                   "first_token_s", "finish_s", "preemptions"}, ...],
     "steps": [{...the fields of the live step ring, tuned.core.ring.StepSample}],
     "decisions": [{...one entry per controller decision, as /decisions shows them}],
     "summary": {...}, "hardware": {...}, "config": {...}, "workload": {...},
     "failed": [ids of requests refused because they need more KV blocks than the
                cache holds]}

``config`` leaves out ``reload_token`` (a secret is never written to a file), and the
file is written readable by its owner only.

Without ``--config`` the controller runs the embedded default's settings on the
KV cache of the hardware or profile (the default's 48 blocks are sized for the CPU
demo's 128-token blocks).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tuned import config as config_mod
from tuned import log as log_mod
from tuned.config import Config, ConfigError
from tuned.inputs import CLIP_CHARS, clip_text


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600): a run's files
    describe the deployment they were made for."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "simulate", help="run tuned's controller on the simulated engine",
        description="Simulate vLLM's continuous batching on a step-time model (a GPU "
                    "model or a profile measured here) with tuned's own controller and "
                    "policies, for one workload.")
    p.add_argument("--config", help="TOML config (default: the embedded default)")
    hw = p.add_mutually_exclusive_group(required=True)
    hw.add_argument("--hardware", help="GPU-shaped step-time model: a100-llama2-7b, "
                    "h100-llama2-7b, a100-llama2-70b, h100-llama2-70b")
    hw.add_argument("--profile", help="a profile from `tuned profile` (this host's speed)")
    p.add_argument("--data-dir", type=Path, help="folder of Vidur operator tables "
                   "(<gpu>/<model>/mlp.csv) for --hardware (default: the ones packaged "
                   "with tuned)")
    p.add_argument("--workload", required=True, help="workload spec, e.g. "
                   "poisson:rate=4,prompt=U(16,512),output=U(16,256),n=500 or "
                   "trace:azure_conv_2023,n=500 (the packaged Azure trace; see docs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for result.json")
    p.add_argument("--static-batching", action="store_true",
                   help="seed 001's model: a batch runs until its longest member ends")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning",
                                                              "error"),
                   help="controller log lines on stderr (default %(default)s)")
    p.set_defaults(func=cmd_simulate)


def sim_config(cfg: Config, hardware) -> Config:
    """The config a simulated engine runs: the file's, with the defaults of the
    hardware where the file leaves the engine's size to vLLM (num_gpu_blocks = 0)."""
    if cfg.num_gpu_blocks:
        return cfg
    return config_mod.validate({**_file_dict(cfg), "num_gpu_blocks": hardware.num_gpu_blocks},
                               source=cfg.source_path)


def _file_dict(cfg: Config) -> dict[str, Any]:
    d = cfg.to_dict()
    d.pop("source_path", None)
    d.pop("reload_token", None)
    return {k: v for k, v in d.items() if v != config_mod.FIELDS[k].metadata["default"]}


def result_json(res, workload, summary: dict) -> str:
    """The run as ``result.json`` text (keys sorted, stable floats)."""
    # the reload secret is never written to a file (result.json is shared, archived)
    config = {k: v for k, v in res.config.items() if k not in config_mod.SECRET_FIELDS}
    doc = {"requests": res.request_rows(), "steps": [s._asdict() for s in res.steps],
           "decisions": res.decisions, "summary": summary, "hardware": res.hardware,
           "config": config, "workload": workload.describe(), "failed": res.failed}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str) + "\n"


def run_summary(res, slo=None) -> dict[str, Any]:
    from tuned.bench.metrics import Slo, summarize
    from tuned.bench.runner import results_from_sim

    s = summarize(results_from_sim(res), slo or Slo())
    caps = [c for c, _ in res.knobs]
    s.update(steps=len(res.steps), decisions=len(res.decisions),
             mean_cap=sum(caps) / len(caps) if caps else None,
             final_cap=res.decisions[-1]["cap"] if res.decisions else None,
             simulated_s=res.duration_s)
    return s


def cmd_simulate(args) -> int:
    from tuned.engines.sim import SimulationError, simulate
    from tuned.sim.hardware import resolve_hardware
    from tuned.workloads import WorkloadError, parse_workload

    log_mod.configure(args.log_level)
    try:
        cfg = (config_mod.load(args.config) if args.config else
               config_mod.validate({**config_mod.EMBEDDED_DEFAULT, "num_gpu_blocks": 0}))
    except ConfigError as e:
        for p in e.problems:
            print(f"{e.source or 'config'}: {p}", file=sys.stderr)
        return 2
    try:
        hw = resolve_hardware(args.hardware, args.profile, args.data_dir)
        wl = parse_workload(args.workload, args.seed, max_model_len=cfg.effective_max_model_len)
    except (ValueError, FileNotFoundError, WorkloadError) as e:
        print(f"tuned simulate: {clip_text(str(e), 4 * CLIP_CHARS)}", file=sys.stderr)
        return 2
    cfg = sim_config(cfg, hw)
    if cfg.num_gpu_blocks < 2:
        why = (f"{hw.name} does not record the engine's KV blocks: set num_gpu_blocks in "
               "the config" if not cfg.num_gpu_blocks else "one is vLLM's null block")
        print(f"tuned simulate: num_gpu_blocks: must be >= 2, got {cfg.num_gpu_blocks} ({why})",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"tuned simulate: --out {clip_text(str(out))}: cannot create the folder "
              f"({e.strerror or e})", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        res = simulate(cfg, hw, wl.requests, static_batching=args.static_batching)
    except SimulationError as e:
        print(f"tuned simulate: {e}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    summary = run_summary(res)
    try:
        write_private(out / "result.json", result_json(res, wl, summary))
    except OSError as e:
        print(f"tuned simulate: --out {clip_text(str(out))}: cannot write result.json "
              f"({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"simulated {len(res.requests)} requests on {hw.name} in {wall:.1f}s wall "
          f"({len(res.steps) / wall:,.0f} steps/s): {res.duration_s:.1f}s simulated")
    for key in ("completed", "failed", "request_throughput_rps", "output_tok_s",
                "ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s", "preemptions",
                "mean_cap", "final_cap"):
        v = summary.get(key)
        print(f"  {key:24s} {v:.4g}" if isinstance(v, float) else f"  {key:24s} {v}")
    print(f"wrote {out / 'result.json'}")
    return 0
