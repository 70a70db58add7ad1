"""``tuned simulate``: one run of tuned's own controller and policies on the
discrete-event engine (:mod:`tuned.sim.engine`).

    tuned simulate --config FILE (--hardware NAME | --profile FILE) --workload SPEC
                   [--seed N] --out DIR

writes ``DIR/result.json`` (keys sorted: two runs with one seed compare byte for
byte) and prints a summary. ``result.json``::

    {"requests": [{"id", "arrival_s", "prompt_tokens", "output_tokens",
                   "first_token_s", "finish_s", "preemptions", "refused_s"}, ...],
     "steps": [{...the fields of the live step ring, tuned.core.ring.StepSample}],
     "decisions": [{...one entry per controller decision, as /decisions shows them}],
     "summary": {...}, "hardware": {...}, "config": {...}, "workload": {...},
     "failed": [ids of requests refused because they need more KV blocks than the
                cache holds],
     "refused": [ids of requests refused at the wait bound (``max_wait_s``)],
     "events": [{"kind": "gpu_pressure", "start_s", "end_s", "used_fraction"},
                {"kind": "slowdown", "start_s", "end_s", "factor"},
                {"kind": "drift", "period_s", "peak"}, ...]}  (only with --events)

The run starts from the engine vLLM 0.32 would start on the hardware
(:func:`tuned.sim.hardware.engine_defaults`: ``max_num_seqs``,
``max_num_batched_tokens``, ``max_model_len``, KV blocks), as ``tuned bench`` does,
with the config file's keys over it; the config it ran is printed first and is
``config`` in ``result.json``.

``config`` leaves out ``reload_token`` (a secret is never written to a file), and the
file is written readable by its owner only.

Without ``--config`` the controller runs the embedded default's controller settings
(its derived TBT SLA, TTFT target) on that engine; the default's engine keys (32
sequences, 48 blocks: the CPU demo's) are replaced by the hardware's.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from tuned import config as config_mod
from tuned.base import log as log_mod
from tuned.config import Config, ConfigError
from tuned.config.schema import SECRET_FIELDS
from tuned.base.inputs import CLIP_CHARS, clip_path, clip_text
from tuned.sim.catalog import hardware_help
from tuned.sim.events import HELP as events_help


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
    hw.add_argument("--hardware", help="GPU-shaped step-time model: " + hardware_help())
    hw.add_argument("--profile", help="a profile from `tuned profile` (this host's speed)")
    p.add_argument("--data-dir", type=Path, help="folder of Vidur operator tables "
                   "(<gpu>/<model>/mlp.csv) for --hardware (default: the ones packaged "
                   "with tuned)")
    p.add_argument("--workload", required=True, help="workload spec, e.g. "
                   "poisson:rate=4,prompt=U(16,512),output=U(16,256),n=500 or "
                   "trace:azure_conv_2023,n=500 (the packaged Azure trace; see docs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="folder for result.json")
    p.add_argument("--events", help=events_help)
    p.add_argument("--static-batching", action="store_true",
                   help="static batching, the Multi-bin batching paper's model: a "
                        "batch runs until its longest member ends")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning",
                                                              "error"),
                   help="controller log lines on stderr (default %(default)s)")
    p.set_defaults(func=cmd_simulate)


#: the embedded default's engine keys, which the hardware's defaults replace
ENGINE_KEYS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_gpu_blocks")


def sim_config(path: str | None, hardware) -> Config:
    """The config a simulated engine runs: the engine as vLLM starts it on the
    hardware (:func:`tuned.sim.hardware.engine_defaults`, what `tuned bench` starts
    from too) under the file's keys; without a file, the embedded default's controller
    settings on that engine. ``ConfigError`` as :func:`tuned.config.load`."""
    from tuned.sim.hardware import engine_defaults

    raw: dict[str, Any] = dict(engine_defaults(hardware))
    if path is None:
        raw.update({k: v for k, v in config_mod.EMBEDDED_DEFAULT.items()
                    if k not in ENGINE_KEYS})
        return config_mod.validate(raw)
    p = Path(path)
    raw.update(config_mod.read_toml(p))
    return config_mod.validate(raw, source=str(p.resolve()), base_dir=p.resolve().parent)


def config_block(cfg: Config) -> str:
    """The config a run uses, as the lines ``simulate`` prints before it runs: the
    engine's keys, then every key that differs from its default (no secret)."""
    d = cfg.to_dict()
    keys = list(ENGINE_KEYS) + sorted(
        k for k, v in d.items() if k in config_mod.FIELDS and k not in ENGINE_KEYS
        and k not in SECRET_FIELDS
        and getattr(cfg, k) != config_mod.FIELDS[k].metadata["default"])
    lines = [f"  {k:24s} {d[k]!r}" for k in keys]
    return "config:\n" + "\n".join(lines)


def result_json(res, workload, summary: dict) -> str:
    """The run as ``result.json`` text (keys sorted, stable floats)."""
    # the reload secret is never written to a file (result.json is shared, archived)
    config = {k: v for k, v in res.config.items() if k not in SECRET_FIELDS}
    doc = {"requests": res.request_rows(), "steps": [s._asdict() for s in res.steps],
           "decisions": res.decisions, "summary": summary, "hardware": res.hardware,
           "config": config, "workload": workload.describe(), "failed": res.failed,
           "refused": res.refused}
    if res.events:
        doc["events"] = res.events
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str) + "\n"


def run_summary(res, slo=None) -> dict[str, Any]:
    from tuned.bench.metrics import Slo, summarize
    from tuned.bench.runner import results_from_sim

    s = summarize(results_from_sim(res), slo or Slo())
    caps = [c for c, _ in res.knobs]
    s.update(steps=len(res.steps), decisions=len(res.decisions),
             mean_cap=sum(caps) / len(caps) if caps else None,
             final_cap=res.decisions[-1]["cap"] if res.decisions else None,
             simulated_s=res.duration_s, refused=len(res.refused))
    return s


def cmd_simulate(args) -> int:
    from tuned.sim.engine import SimulationError, simulate
    from tuned.sim.hardware import resolve_hardware
    from tuned.sim.events import parse_events
    from tuned.base.workloads import WorkloadError, parse_workload

    log_mod.configure(args.log_level)
    try:
        hw = resolve_hardware(args.hardware, args.profile, args.data_dir)
        events = parse_events(args.events or "")
        nvml = hw.nvml(events.pressure) if events.pressure else None
    except (ValueError, FileNotFoundError) as e:
        print(f"tuned simulate: {clip_text(str(e), 4 * CLIP_CHARS)}", file=sys.stderr)
        return 2
    try:
        cfg = sim_config(args.config, hw)
    except ConfigError as e:
        for p in e.problems:
            print(f"{e.source or 'config'}: {p}", file=sys.stderr)
        return 2
    try:
        wl = parse_workload(args.workload, args.seed, max_model_len=cfg.effective_max_model_len)
    except (ValueError, WorkloadError) as e:
        print(f"tuned simulate: {clip_text(str(e), 4 * CLIP_CHARS)}", file=sys.stderr)
        return 2
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
        print(f"tuned simulate: --out {clip_path(out)}: cannot create the folder "
              f"({e.strerror or e})", file=sys.stderr)
        return 2
    print(config_block(cfg))
    if events:
        print("events:\n" + "\n".join(f"  {line}" for line in events.lines(hw.name)))
    t0 = time.perf_counter()
    try:
        res = simulate(cfg, hw, wl.requests, static_batching=args.static_batching,
                       drift=events.drift, **({"nvml": nvml} if nvml is not None else {}))
    except SimulationError as e:
        print(f"tuned simulate: {e}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - t0
    summary = run_summary(res)
    try:
        write_private(out / "result.json", result_json(res, wl, summary))
    except OSError as e:
        print(f"tuned simulate: --out {clip_path(out)}: cannot write result.json "
              f"({e.strerror or e})", file=sys.stderr)
        return 2
    print(f"simulated {len(res.requests)} requests on {hw.name} in {wall:.1f}s wall "
          f"({len(res.steps) / wall:,.0f} steps/s): {res.duration_s:.1f}s simulated")
    for key in ("completed", "failed", "refused", "request_throughput_rps", "output_tok_s",
                "ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s", "preemptions",
                "mean_cap", "final_cap"):
        v = summary.get(key)
        print(f"  {key:24s} {v:.4g}" if isinstance(v, float) else f"  {key:24s} {v}")
    print(f"wrote {out / 'result.json'}")
    return 0
