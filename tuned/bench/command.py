"""``tuned bench``: does tuned help here, and by how much?

    tuned bench --engine {sim,vllm} (--hardware NAME | --profile FILE | --model M)
                --workload SPEC --slo ttft=S,tpot=S[,e2el=S] --out DIR [--quick]
    tuned bench --paper {multibin,mcsf,pang,saber,bucketserve} --out DIR [--quick]

Runs every contender of :func:`tuned.bench.runner.contenders` on the same arrivals
(same seed): vLLM's default, static (cap, token budget) pairs (``--caps`` x
``--budgets``), the peers, tuned and its ablations. Computes vLLM-benchmark metrics
per run, the best static pair in hindsight per metric and the best cap at vLLM's
default budget, tuned's ratios to both, to vLLM's default and to each peer, which
ablation produced tuned's gain, any tail regression against the best pair, and (on
the simulator, by default) each contender's capacity: the highest arrival rate with
at least 90% SLA attainment (DistServe), by bisection over the rate of the
workload's first 10 minutes. ``--repeats N`` runs each contender N times (on the
simulator with seeds seed, seed+1, ...: the same arrivals give the same result
there; on the real engine, 3 by default, interleaved: every contender's first
repeat, then every second one, so that a host's drift reaches them all) and
reports the mean, on which the best pair is settled, each contender's spread over
the repeats, and whether tuned's margin over the best pair and over vLLM's default
stands above that spread (:func:`tuned.bench.report.noise_verdict`). An SLO may be a
multiple of the batch-1 decode step (``--slo tpot=2.5x``): measured in the same
run on the real engine, the step model's prediction on the simulator. Writes
DIR/report.{json,csv,md} and PNG plots.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuned import config as config_mod
from tuned.base import log as log_mod
from tuned.base.inputs import CLIP_CHARS, clip_path, clip_text
from tuned.policies import catalog
from tuned.sim.catalog import hardware_help
from tuned.sim.events import HELP as events_help

CAPACITY_HEAD_S = 600.0
#: repeats on the real engine by default: the fewest that give a spread to judge a
#: margin against (a host's speed drifts between runs minutes apart)
LIVE_REPEATS = 3

# set in the parent before forking workers (fork shares them; nothing is pickled)
_JOB: dict[str, Any] = {}


def _runs(kind: str) -> str:
    """The bench runs of ``kind`` the policies declare (tuned.policies.catalog)."""
    return ", ".join(r.name for s in catalog.specs() for r in s.bench if r.kind == kind)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="tuned against static (cap, token budget) pairs and peers' rules, "
        "side by side",
        description=__doc__.split("\n\n")[0] + " Runs tuned, its ablations, vLLM's "
        "default, a sweep of static (cap, token budget) pairs and the peers' rules ("
        + _runs("peer") + ") on the same arrivals; without --quick also "
        + _runs("tuned") + " and tuned-paper.")
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    hw = p.add_mutually_exclusive_group()
    hw.add_argument("--hardware", help="sim: a GPU-shaped step-time model: " + hardware_help())
    hw.add_argument("--profile", help="sim: a profile measured by `tuned profile`")
    hw.add_argument("--model", help="vllm: the model to serve (demo:small, demo:tiny, a "
                    "model folder or a Hugging Face id owner/name, fetched by vLLM)")
    p.add_argument("--data-dir", type=Path, help="folder of Vidur operator tables "
                   "(<gpu>/<model>/mlp.csv) for --hardware and --paper "
                   "pang/saber/bucketserve/mcsf (default: the ones packaged with tuned)")
    p.add_argument("--events", help="sim: the same for every run; " + events_help
                   + "; vllm: throttle=T0-T1@F lets the server run 1/F of the time (stopped "
                   "the rest, as a CPU quota throttles a container) from T0 to T1 seconds "
                   "of each run's workload")
    p.add_argument("--workload", help="workload spec (see `tuned simulate --help`)")
    add_sla_argument(p, "on --engine vllm measured in the same run before the contenders "
                     "(as `tuned demo` derives its SLA), on the simulator ")
    p.add_argument("--out", required=True, help="report folder")
    p.add_argument("--quick", action="store_true", help="fewer contenders and probes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", help="base config of tuned's runs (TOML); the SLO's tpot "
                   "and ttft set tbt_sla_s and ttft_sla_s unless the file sets them")
    p.add_argument("--contenders", help="comma-separated run names to keep (default: all)")
    p.add_argument("--caps", help="comma-separated static caps (default: the sweep)")
    p.add_argument("--budgets", help="comma-separated token budgets paired with each static "
                   "cap (default: sim 512,1024,2048,4096,8192, --quick 512,2048,8192; vllm "
                   "128,256,512,2048, --quick 256,2048); vLLM's default budget is always added")
    p.add_argument("--repeats", type=int, default=None,
                   help="runs of each contender, averaged (default: 1 on the simulator, "
                   f"where repeat k uses seed + k; {LIVE_REPEATS} on the real engine, "
                   "interleaved, so that its spread says whether a margin stands above "
                   "the host's noise)")
    p.add_argument("--default-attainment", type=float, default=None, metavar="SHARE",
                   help="vllm, with a workload in rate=Kx: scale every rate so that "
                   "vLLM's default meets about this share of the requests within the SLO "
                   "(0 < SHARE < 1, e.g. 0.5), found on the simulator of the step fit "
                   "measured before the contenders; the report gives the prediction "
                   "beside what the default met")
    p.add_argument("--capacity", choices=("auto", "on", "off"), default="auto",
                   help="search each contender's capacity (auto: on for sim)")
    p.add_argument("--jobs", type=int, default=0,
                   help="parallel simulator processes (default: the CPU count)")
    p.add_argument("--paper", choices=("multibin", "mcsf", "pang", "saber", "bucketserve"),
                   help="reproduce a paper's result instead (see tuned.bench.papers)")
    p.set_defaults(func=cmd_bench)


def add_sla_argument(p, where: str = "") -> None:
    """``--sla`` (``--slo``, the old spelling), as bench and recommend take it; ``where``
    says where a relative value's batch-1 step comes from, before the simulator's."""
    p.add_argument("--sla", "--slo", dest="slo", default="ttft=2,tpot=0.05",
                   help="SLAs in seconds: ttft=S,tpot=S[,e2el=S] (default %(default)s); "
                        "ttft sets the config's ttft_sla_s, tpot (or tbt) its tbt_sla_s; "
                        "a value MULTIPLEx (tpot=2.5x, ttft=40x) is that multiple of the "
                        "decode step at batch 1: " + where + "the step model's prediction "
                        "for one decode at the calibration load's context; --slo is the "
                        "old spelling")


def _fail(msg: str) -> int:
    print(f"tuned bench: {msg}", file=sys.stderr)
    return 2


def base_config(args, slo, engine: dict[str, int], *,
                model: str | None = None) -> config_mod.Config:
    """tuned's config for the bench: the file's over the engine's defaults
    (:func:`tuned.sim.hardware.engine_defaults`, which `tuned simulate` starts from
    too), and the TPOT SLO as tuned's TBT SLA."""
    raw: dict[str, Any] = {**engine, "log_level": "warning"}
    if not raw.get("num_gpu_blocks"):
        raw.pop("num_gpu_blocks", None)
    if model:
        raw["model"] = model
    if args.config:
        raw.update(config_mod.read_toml(args.config))
    if slo.tpot_s and "tbt_sla_s" not in raw:
        raw["tbt_sla_s"] = slo.tpot_s
        raw.setdefault("eps_d_s", round(slo.tpot_s * 0.04, 6))
    if slo.ttft_s and "ttft_sla_s" not in raw:
        raw["ttft_sla_s"] = slo.ttft_s
    raw.setdefault("fallback_cap", min(4, raw["max_num_seqs"]))
    return config_mod.validate(raw, source=str(args.config or ""))


def _out_dir(out: str) -> str | None:
    """A problem line when ``--out`` cannot be created or written; None when it can."""
    p = Path(out)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--out {clip_path(out)}: cannot create the folder ({e.strerror or e})"
    if not os.access(p, os.W_OK | os.X_OK):
        return f"--out {clip_path(out)}: must be a writable folder"
    return None


class _Refused(Exception):
    """A bad argument: its one-line problem, printed by :func:`cmd_bench` (exit 2)."""


@dataclass
class _Target:
    """Where the bench runs: the simulated hardware (None for vLLM) and its events
    (the real engine's: its throttles), the engine's defaults, tuned's base config and
    the hardware's name in the report."""

    hw: Any
    events: Any
    engine: dict[str, int]
    base: config_mod.Config
    name: str
    step: dict | None = None        # how a relative SLO's batch-1 step was found
    sized: dict | None = None       # a workload's rate=Kx made req/s, and from what


def cmd_bench(args) -> int:
    """Argument checks, the engine, the field of contenders, the SLO relative to the
    host where asked, the sweep, the report."""
    log_mod.configure("warning")
    try:
        _check_args(args)
        if args.paper:
            return _run_paper(args)
        if not args.workload:
            raise _Refused("--workload is required (or --paper NAME)")
        target, slo, wl, wls, field = prepare(args)
    except _Refused as e:
        return _fail(str(e))
    t0 = time.monotonic()
    print(f"tuned bench: {len(field)} contenders x {args.repeats} repeat(s): "
          + ", ".join(c.name for c in field), file=sys.stderr, flush=True)
    results = _sweep(args, target, field, wls, slo)
    _write_report(args, target, wl, slo, results, t0)
    return 0


def prepare(args) -> tuple["_Target", Any, Any, list, list]:
    """From the arguments of a bench (or of ``tuned recommend``, which runs its
    simulator part): the target, the SLO in seconds, the workload, one workload per
    repeat and the contenders; :class:`_Refused` with the one line a bad argument
    prints, before any engine starts."""
    from tuned.base.workloads import has_relative_rates
    from tuned.bench.metrics import SloSpec

    try:
        spec = SloSpec.parse(args.slo)
    except ValueError as e:
        raise _Refused(f"--sla: {e}") from None
    # the keys in seconds first: every argument is checked before any engine starts
    slo = SloSpec(spec.seconds, {}, args.slo).resolve(None)
    sized = has_relative_rates(args.workload or "")
    if sized:
        _check_sized(args, spec)
    target = _sim_target(args, slo) if args.engine == "sim" else _vllm_target(args, slo)
    if not sized:
        wl, wls, field = _field(args, target)
    if spec.relative:
        slo = _relative_slo(args, spec, target, step_fit=sized)
        if sized:
            _size_workload(args, target, slo)
            if getattr(args, "default_attainment", None) is not None:
                _size_for_attainment(args, target, slo)
        wl, wls, field = _field(args, target)
    return target, slo, wl, wls, field


def _check_sized(args, spec) -> None:
    """A workload with ``rate=Kx`` checked before any engine starts: the engine and
    SLO it needs, and its grammar (sized at 1 req/s a capacity)."""
    from tuned.base.workloads import WorkloadError, parse_workload, sized_workload

    share = getattr(args, "default_attainment", None)
    if share is not None and not 0.0 < share < 1.0:
        raise _Refused(f"--default-attainment: must be a share in (0, 1), e.g. 0.5, "
                       f"got {share:g}")
    if args.engine != "vllm" or "tpot" not in spec.multiples:
        raise _Refused(f"--workload: a rate in x (K times this host's capacity) is sized "
                       f"from the engine's measured step: it needs --engine vllm and a "
                       f"relative --slo such as tpot=2.5x (got --engine {args.engine} "
                       f"--slo {args.slo})")
    try:
        parse_workload(sized_workload(args.workload, lambda prompt, output: 1.0), args.seed)
    except WorkloadError as e:
        raise _Refused(f"--workload: {clip_text(str(e), 4 * CLIP_CHARS)}") from None


def _size_workload(args, target: "_Target", slo) -> None:
    """``args.workload`` with its ``rate=Kx`` made req/s: K x this host's capacity
    within the TPOT SLO for each part's lengths (:func:`tuned.bench.live.sla_capacity`
    on the step fit measured with the batch-1 step); ``target.sized`` records it."""
    from tuned.base.workloads import WorkloadError, sized_workload
    from tuned.bench.live import sla_capacity

    fit = target.step.get("fit") or {}
    ceiling = target.base.max_num_seqs
    caps: list[dict] = []

    def capacity(prompt, output) -> float:
        mu, b_sla = sla_capacity(fit, slo.tpot_s, prompt.mean, output.mean, ceiling=ceiling)
        caps.append({"prompt_mean": round(prompt.mean, 1), "output_mean": round(output.mean, 1),
                     "capacity_rps": round(mu, 4), "batch_at_sla": round(b_sla, 2)})
        return mu

    given = args.workload
    try:
        args.workload = sized_workload(given, capacity)
    except WorkloadError as e:
        raise _Refused(f"--workload: {clip_text(str(e), 4 * CLIP_CHARS)}") from None
    target.sized = {"given": given, "sized": args.workload, "fit": fit, "parts": caps}
    print(f"tuned bench: --workload sized to this host: {args.workload} (capacity "
          + ", ".join(f"{c['capacity_rps']:g} req/s" for c in caps) + ")",
          file=sys.stderr, flush=True)


#: how close the simulator's attainment of vLLM's default must come to
#: ``--default-attainment``, and the scales searched between
ATTAINMENT_TOLERANCE = 0.02
ATTAINMENT_SCALES = (0.05, 20.0)


def _size_for_attainment(args, target: "_Target", slo) -> None:
    """``--default-attainment A``: every rate of the sized workload times the factor at
    which vLLM's default meets a share A of the requests on the simulator of the step
    fit measured before the contenders (the engine's time between steps taken as the
    batch-1 step's excess over the fit), found by bisection on the factor's log (the
    share falls as the load rises); ``target.sized["attainment"]`` records it."""
    import math

    from tuned.base.workloads import parse_workload, sized_workload
    from tuned.bench import runner
    from tuned.bench.metrics import summarize
    from tuned.sim.hardware import fitted_hardware

    share = args.default_attainment
    sized, fit = target.sized, target.sized["fit"]
    step = float(target.step.get("step_s_batch1") or 0.0)
    gap = max(step - float(fit.get("a", 0.0)) - float(fit.get("beta", 0.0)), 0.0)
    try:
        hw = fitted_hardware(fit, target.engine, gap)
    except ValueError as e:
        raise _Refused(f"--default-attainment: {e}") from None
    engine = target.engine
    default = runner.contenders(target.base, default_seqs=engine["max_num_seqs"],
                                default_tokens=engine["max_num_batched_tokens"],
                                quick=True, peers=False, ablate=False,
                                only=["vllm-default"])[0]
    bench = runner.SimBench(hw)
    caps = {(c["prompt_mean"], c["output_mean"]): c["capacity_rps"] for c in sized["parts"]}

    def spec_at(k: float) -> str:
        return sized_workload(sized["given"], lambda p, o: k * caps[(round(p.mean, 1),
                                                                     round(o.mean, 1))])

    def attainment(k: float) -> float:
        wl = parse_workload(spec_at(k), args.seed, max_model_len=target.base.max_model_len)
        out = bench.run(default, wl.requests, timelines=False)
        return float(summarize(out.results, slo)["attainment"] or 0.0)

    lo, hi = ATTAINMENT_SCALES
    a_lo, a_hi = attainment(lo), attainment(hi)
    if not a_hi <= share <= a_lo:
        raise _Refused(f"--default-attainment {share:g}: vLLM's default meets "
                       f"{a_hi:.0%}-{a_lo:.0%} of this workload on the simulator from "
                       f"{lo:g}x to {hi:g}x its rates; give a share in that range")
    k, a = (lo, a_lo) if abs(a_lo - share) < abs(a_hi - share) else (hi, a_hi)
    for _ in range(24):
        if abs(a - share) <= ATTAINMENT_TOLERANCE:
            break
        mid = math.sqrt(lo * hi)
        a_mid = attainment(mid)
        if abs(a_mid - share) < abs(a - share):
            k, a = mid, a_mid
        if a_mid > share:
            lo = mid
        else:
            hi = mid
    args.workload = spec_at(k)
    sized["sized"] = args.workload
    sized["attainment"] = {"target": share, "factor": round(k, 4),
                           "predicted": round(a, 4), "gap_s": round(gap, 6)}
    print(f"tuned bench: --default-attainment {share:g}: every rate x {k:.3g} "
          f"(vLLM's default meets {a:.0%} on the simulator of the measured step): "
          f"{args.workload}", file=sys.stderr, flush=True)


def _relative_slo(args, spec, target: "_Target", step_fit: bool = False):
    """``--slo tpot=2.5x``: the batch-1 decode step (measured on the real engine, the
    step model's on the simulator), the SLO in seconds, and tuned's base config
    rebuilt on it; ``target.step`` records how it was made."""
    from tuned.bench.runner import sim_batch1_step_s

    if args.engine == "sim":
        try:
            step = sim_batch1_step_s(target.hw)
        except ValueError as e:
            raise _Refused(f"--sla {spec}: {e}") from None
        how = "the simulated hardware's step model at batch 1"
    else:
        from tuned.bench.live import measure_batch1_step

        print("tuned bench: measuring this host's decode step at batch 1 for --sla "
              f"{spec}", file=sys.stderr, flush=True)
        log_dir = Path(args.out) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        derived = measure_batch1_step(target.base, model_path=_model_path(args),
                                      log_dir=log_dir, seed=args.seed,
                                      factor=spec.multiples.get("tpot", 2.5),
                                      step_fit=step_fit)
        step = derived["step_s_batch1"]
        how = ("measured on this engine before the contenders, the median of lone "
               "requests' steps (as tuned demo does)" if derived.get("step_source") == "probe"
               else "measured on this engine before the contenders, the controller's "
               "first fit (no lone request gave a figure)")
    try:
        slo = spec.resolve(step)
    except ValueError as e:
        raise _Refused(f"--sla: {e}") from None
    try:
        target.base = base_config(args, slo, target.engine,
                                  model=args.model if args.engine == "vllm" else None)
    except config_mod.ConfigError as e:
        raise _Refused(clip_text(str(e), 4 * CLIP_CHARS)) from None
    target.step = {"spec": str(spec), "step_s_batch1": step, "source": how}
    if args.engine == "vllm" and step_fit:
        target.step["fit"] = derived.get("burst_fit") or derived.get("fit") or {}
    print(f"tuned {getattr(args, 'command', None) or 'bench'}: --sla {spec} -> {slo} "
          f"(batch-1 step {step * 1e3:.2f} ms, {how})",
          file=sys.stderr, flush=True)
    return slo


def _model_path(args) -> str:
    from tuned.base.demo_model import resolve_model
    from tuned.launch.serve import DEFAULT_MODEL_CACHE

    return str(resolve_model(args.model, DEFAULT_MODEL_CACHE, log=lambda m: None))


def _check_args(args) -> None:
    """The checks every bench passes first, the paper's too."""
    if args.jobs < 0:
        raise _Refused(f"--jobs: must be >= 0 (0 = the CPU count), got {args.jobs}")
    if args.repeats is None:
        args.repeats = LIVE_REPEATS if args.engine == "vllm" and not args.paper else 1
    if not 1 <= args.repeats <= 100:
        raise _Refused(f"--repeats: must be in [1, 100], got {args.repeats}")
    problem = _out_dir(args.out)
    if problem:
        raise _Refused(problem)


def _run_paper(args) -> int:
    from tuned.bench.papers import run_paper

    try:
        return run_paper(args.paper, Path(args.out), quick=args.quick, seed=args.seed,
                         data_dir=args.data_dir)
    except FileNotFoundError as e:
        raise _Refused(f"--paper {args.paper}: needs {clip_text(str(e.filename or e))}, "
                       "which is not there") from None


def _sim_target(args, slo) -> _Target:
    """The simulator: --hardware or --profile, with --events."""
    from tuned.sim.events import parse_events
    from tuned.sim.hardware import engine_defaults, resolve_hardware

    if args.model:
        raise _Refused("--model is for --engine vllm; the simulator takes --hardware or "
                       "--profile")
    try:
        hw = resolve_hardware(args.hardware, args.profile, args.data_dir)
        events = parse_events(args.events or "")
        if events.pressure:
            hw.nvml(events.pressure)        # refuses a hardware without GPU memory
    except (ValueError, FileNotFoundError) as e:
        raise _Refused(str(e)) from None
    engine = engine_defaults(hw)
    try:
        base = base_config(args, slo, engine)
    except config_mod.ConfigError as e:
        raise _Refused(clip_text(str(e), 4 * CLIP_CHARS)) from None
    return _Target(hw, events, engine, base, hw.name)


def _vllm_target(args, slo) -> _Target:
    """A real vLLM engine on --model; checked before any engine starts."""
    from tuned.base.demo_model import model_form
    from tuned.sim.hardware import engine_defaults

    if not args.model:
        raise _Refused("--engine vllm needs --model (e.g. demo:small)")
    try:  # before any engine starts
        model_form(args.model)
    except ValueError as e:
        raise _Refused(f"--model: {e}") from None
    if args.data_dir:
        raise _Refused("--data-dir is for the simulator's --hardware (--engine sim)")
    from tuned.bench.throttle import parse_throttles

    try:
        throttles = parse_throttles(args.events or "")
    except ValueError as e:
        raise _Refused(str(e)) from None
    engine = engine_defaults(None)
    try:
        base = base_config(args, slo, engine, model=args.model)
    except config_mod.ConfigError as e:
        raise _Refused(str(e)) from None
    return _Target(None, throttles, engine, base, f"vllm-cpu:{args.model}")


def _field(args, target: _Target):
    """The workload (one per repeat: on the simulator repeat k uses seed + k) and the
    contenders (:func:`tuned.bench.runner.contenders`)."""
    from tuned.bench import runner
    from tuned.base.workloads import WorkloadError, parse_workload

    base, engine = target.base, target.engine
    try:
        wl = parse_workload(args.workload, args.seed, max_model_len=base.max_model_len)
    except (WorkloadError, ValueError) as e:
        raise _Refused(clip_text(str(e), 4 * CLIP_CHARS)) from None
    try:
        caps = _int_list("--caps", args.caps)
        budgets = _int_list("--budgets", args.budgets) or runner.sweep_budgets(
            "cpu" if args.engine == "vllm" else "gpu", engine["max_num_batched_tokens"],
            quick=args.quick)
        field = runner.contenders(
            base, default_seqs=engine["max_num_seqs"],
            default_tokens=engine["max_num_batched_tokens"],
            quick=args.quick or args.engine == "vllm",
            caps=caps or (([4, 8, 16] if args.quick else [2, 4, 8, 16, 32])
                          if args.engine == "vllm" else None),
            budgets=budgets,
            # a real engine run costs minutes: --quick keeps the pair sweep and tuned
            peers=not (args.engine == "vllm" and args.quick),
            ablate=not (args.engine == "vllm" and args.quick),
            only=args.contenders.split(",") if args.contenders else None)
    except ValueError as e:
        raise _Refused(str(e)) from None
    if args.repeats > 1 and args.engine == "sim":
        try:
            wls = [wl] + [parse_workload(args.workload, args.seed + k,
                                         max_model_len=base.max_model_len)
                          for k in range(1, args.repeats)]
        except (WorkloadError, ValueError) as e:
            raise _Refused(clip_text(str(e), 4 * CLIP_CHARS)) from None
    else:
        wls = [wl] * args.repeats
    return wl, wls, field


def _sweep(args, target: _Target, field, wls, slo):
    """Every contender on every repeat's workload (and each one's capacity where
    searched): (runs, timelines, capacity, probes)."""
    capacity = args.capacity == "on" or (args.capacity == "auto" and args.engine == "sim")
    if args.engine == "sim":
        return _bench_sim(target.hw, field, wls, slo, capacity, args, target.events)
    return _bench_live(field, wls, slo, args, target.events)


def _write_report(args, target: _Target, wl, slo, results, t0: float) -> None:
    """DIR/report.{json,csv,md} and the plots; the markdown on stdout."""
    from tuned.bench import report as report_mod

    runs, timelines, cap, probes = results
    default_budget = target.engine["max_num_batched_tokens"]
    report = _report(args, target.name, wl, slo, runs, cap, default_budget)
    if target.step:
        report["slo_relative"] = target.step
    if target.sized:
        report["workload_sized"] = target.sized
    out = Path(args.out)
    report_mod.write(report, out)
    pngs = report_mod.plots(report, timelines, probes, out)
    print(report_mod.markdown(report))
    print(f"bench took {time.monotonic() - t0:.0f}s; wrote {out / 'report.json'}, "
          f"report.csv, report.md, " + ", ".join(p.name for p in pngs))


def _int_list(flag: str, text: str | None) -> list[int] | None:
    """``--caps`` / ``--budgets``: comma-separated whole numbers, or None when absent."""
    if not text:
        return None
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag}: expected comma-separated whole numbers, got "
                         f"{clip_text(text)!r}") from None


def command_argv(args, name: str = "bench", skip: tuple[str, ...] = (),
                 flags: dict[str, str] | None = None) -> list[str]:
    """The options this run was given, as the arguments that repeat it (``--jobs`` is
    left out: it changes how fast a run goes, not what it reports); ``name`` is the
    subcommand, ``skip`` more keys to leave out, ``flags`` the flag of a key whose
    flag is not its name."""
    argv = [name]
    for key, value in vars(args).items():
        if key in ("func", "command", "jobs", *skip) or value is None or value is False \
                or (key == "repeats" and value == 1):
            continue
        flag = (flags or {}).get(key) or "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def _report(args, hardware, wl, slo, runs, capacity, default_budget: int) -> dict[str, Any]:
    from tuned.bench import report as report_mod

    best = report_mod.best_static(runs, capacity)
    best_cap = report_mod.best_static(runs, capacity, budget=default_budget)
    rep = {"engine": args.engine, "hardware": hardware, "workload": wl.spec,
           "workload_info": wl.describe(), "slo": str(slo),
           "slo_parsed": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2el_s": slo.e2el_s},
           "seed": args.seed, "repeats": args.repeats, "default_budget": default_budget,
           "runs": runs, "best_static": best, "best_cap": best_cap}
    rep.update(report_mod.provenance(command_argv(args)))
    if getattr(args, "events", None):
        rep["events"] = args.events
    if capacity:
        rep["capacity"] = capacity
    rep["ratios"] = report_mod.ratios(runs, best, capacity, best_cap=best_cap)
    rep["attribution"] = report_mod.attribution(runs)
    rep["noise"] = report_mod.noise(runs, best, what="the host's noise" if args.engine == "vllm"
                                    else "the spread over seeds")
    pace = report_mod.host_pace(runs)
    if pace:
        rep["host_pace"] = pace
    rep["findings"] = report_mod.findings(rep)
    return rep


# ---------------------------------------------------------------- simulator

def run_stem(name: str, k: int) -> str:
    """The file stem of contender ``name``'s repeat ``k`` under ``logs/`` (the first
    keeps the plain name): NAME.requests.csv, NAME.r1.requests.csv, ..."""
    return name if k == 0 else f"{name}.r{k}"


def _requests_csv(name: str, k: int) -> str:
    """The per-request log of repeat ``k``."""
    return f"{run_stem(name, k)}.requests.csv"


def phases_of(wl) -> dict[str, str | None] | None:
    """A phased workload's request id -> phase name (None for one without phases)."""
    got = {r.request_id: r.phase for r in wl.requests}
    return got if any(v is not None for v in got.values()) else None


def _sim_one(j: int) -> tuple[dict, dict]:
    from tuned.bench.metrics import summarize, write_requests_csv
    from tuned.bench.report import cap_figures

    i, k = divmod(j, len(_JOB["wls"]))
    c = _JOB["field"][i]
    wl = _JOB["wls"][k]
    out = _JOB["bench"].run(c, wl.requests, timelines=_JOB["timelines"])
    s = summarize(out.results, _JOB["slo"], phase_of=phases_of(wl))
    if _JOB["log_dir"] is not None:
        write_requests_csv(_JOB["log_dir"] / _requests_csv(c.name, k), out.results,
                           _JOB["slo"])
    s.update(cap_figures(out.cap_timeline))
    return s, {"cap": out.cap_timeline, "tbt": out.tbt_timeline}


def _sim_capacity(i: int) -> dict:
    from tuned.bench.metrics import capacity_search
    from tuned.bench.runner import attainment_at

    c = _JOB["field"][i]
    head = _JOB["cap_wl"]
    base_rate = _JOB["base_rate"]
    run = attainment_at(_JOB["bench"], c, head, _JOB["slo"], base_rate)
    res = capacity_search(run, base_rate / 16, base_rate, tol_rel=0.1 if _JOB["quick"] else 0.05,
                          max_iter=6 if _JOB["quick"] else 10)
    return res.as_dict()


class _Progress:
    """A tqdm bar on a terminal; otherwise (logs, CI) one line per finished run, or
    with ``every_s`` one line at most that often and one for the last run."""

    def __init__(self, total: int, desc: str, every_s: float = 0.0) -> None:
        from tqdm import tqdm

        self.tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr,
                        disable=not self.tty)
        self.total, self.done, self.desc, self.t0 = total, 0, desc, time.monotonic()
        self.every_s, self.last = every_s, self.t0

    def update(self, name: str) -> None:
        self.done += 1
        self.bar.set_postfix_str(name)
        self.bar.update(1)
        now = time.monotonic()
        if not self.tty and (now - self.last >= self.every_s or self.done == self.total):
            self.last = now
            print(f"[{self.desc} {self.done}/{self.total}] {name} "
                  f"({now - self.t0:.0f}s)", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.bar.close()


def _pool_map(fn, items, jobs: int, desc: str, names: list[str] | None = None,
              every_s: float = 0.0):
    prog = _Progress(len(items), desc, every_s)
    names = names or [c.name for c in _JOB["field"]]
    out: dict[int, Any] = {}
    if jobs <= 1:
        for i in items:
            out[i] = fn(i)
            prog.update(names[i])
    else:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(jobs) as pool:
            for i, r in pool.imap_unordered(_indexed(fn), items):
                out[i] = r
                prog.update(names[i])
    prog.close()
    return [out[i] for i in items]


class _indexed:
    def __init__(self, fn):
        self.fn = fn

    def __call__(self, i):
        return i, self.fn(i)


def sim_runs(hw, field, wls, slo, *, jobs: int, events=None, log_dir: Path | None = None,
             timelines: bool = True, every_s: float = 0.0) -> list[list[tuple[dict, dict]]]:
    """Every contender of ``field`` on every workload of ``wls`` (one per repeat) on the
    simulated ``hw``, in ``jobs`` processes, with a progress line at most every
    ``every_s`` on stderr: per contender, one (summary, timelines) per repeat. With
    ``log_dir``, each run's per-request CSV goes there; ``timelines`` False leaves the
    cap and TBT timelines empty (a faster run)."""
    from tuned.bench.runner import SimBench

    _JOB.update(field=field, bench=SimBench(hw, events=events or None), wls=wls, slo=slo,
                log_dir=log_dir, timelines=timelines)
    reps = len(wls)
    names = [c.name if reps == 1 else f"{c.name} #{k + 1}" for c in field for k in range(reps)]
    outs = _pool_map(_sim_one, list(range(len(field) * reps)), jobs, "runs", names, every_s)
    return [outs[i * reps:(i + 1) * reps] for i in range(len(field))]


def _bench_sim(hw, field, wls, slo, capacity: bool, args, events=None):
    from tuned.bench import report as report_mod
    from tuned.bench.metrics import mean_summary

    jobs = args.jobs or os.cpu_count() or 1
    log_dir = Path(args.out) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    wl = wls[0]
    per = sim_runs(hw, field, wls, slo, jobs=jobs, events=events, log_dir=log_dir)
    _JOB["quick"] = args.quick
    runs = [report_mod.run_row(c, mean_summary([s for s, _ in p])) for c, p in zip(field, per)]
    timelines = {c.name: p[0][1] for c, p in zip(field, per)}
    cap: dict[str, float] = {}
    probes: dict[str, list] = {}
    if capacity:
        head = wl.head(CAPACITY_HEAD_S) if (wl.describe().get("duration_s") or 0) > CAPACITY_HEAD_S else wl
        base_rate = head.describe().get("rate_rps") or 1.0
        _JOB.update(cap_wl=head, base_rate=base_rate)
        idx = list(range(len(field)))
        res = _pool_map(_sim_capacity, idx, jobs, "capacity")
        for c, r in zip(field, res):
            cap[c.name] = r["capacity_rps"]
            probes[c.name] = r["probes"]
    return runs, timelines, cap, probes


# ---------------------------------------------------------------- real engine

def _bench_live(field, wls, slo, args, throttles=()):
    from tuned.bench import report as report_mod
    from tuned.bench.live import run_live
    from tuned.bench.metrics import (longest_silence, mean_summary, summarize,
                                     write_requests_csv)
    from tuned.bench.runner import itl_timeline

    model_path = _model_path(args)
    log_dir = Path(args.out) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    runs, timelines = [], {}
    _JOB["field"] = field
    prog = _Progress(len(field) * len(wls), "runs")
    # repeat by repeat, so that a host's drift over the bench reaches every contender
    per: dict[str, list[dict]] = {c.name: [] for c in field}
    paces: dict[str, list[list]] = {c.name: [] for c in field}
    silences: dict[str, list] = {c.name: [] for c in field}
    for k, wl in enumerate(wls):
        for c in field:
            live = run_live(c, wl, model_path=model_path, log_dir=log_dir, seed=args.seed,
                            throttles=throttles, pace=True)
            s = summarize(live.results, slo, phase_of=phases_of(wl))
            s.update(report_mod.cap_figures(live.cap_timeline))
            per[c.name].append(s)
            paces[c.name].append(list(live.pace_s))
            silences[c.name].append(longest_silence(live.results))
            if k == 0:
                timelines[c.name] = {"cap": live.cap_timeline,
                                     "tbt": itl_timeline(live.results)}
            stem = run_stem(c.name, k)
            (log_dir / f"{stem}.decisions.json").write_text(json.dumps(live.decisions))
            if live.steps:
                (log_dir / f"{stem}.steps.json").write_text(json.dumps(live.steps))
            # how late each send began: a client stalled on the shared host is told
            # apart from a server that held the requests (both show as TTFT)
            (log_dir / f"{stem}.send_lags.json").write_text(json.dumps(live.send_lags_s))
            write_requests_csv(log_dir / _requests_csv(c.name, k), live.results, slo)
            prog.update(c.name if len(wls) == 1 else f"{c.name} #{k + 1}")
    prog.close()
    runs = [report_mod.run_row(c, {**mean_summary(per[c.name]), "pace_s_runs": paces[c.name],
                                   "silence_s_runs": silences[c.name]})
            for c in field]
    return runs, timelines, {}, {}
