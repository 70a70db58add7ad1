"""``tuned recommend``: the best static vLLM flags for a workload and SLOs, without
running tuned inside the engine.

    tuned recommend (--hardware NAME | --profile FILE) --workload SPEC
                    [--sla ttft=S,tpot=S] [--seeds N] [--json FILE]

vLLM's own way to find a good (``max_num_seqs``, ``max_num_batched_tokens``) pair
restarts the server for every point of a grid. This command runs the same grid on
the simulator instead (the static pairs of ``tuned bench --engine sim``, vLLM's
default pair and tuned, on ``--seeds`` seeds each: seed, seed+1, ...; a pair under
half the best pair's goodput on the first seed runs on that seed only) and prints:

* first, the best pair by mean goodput as flags for ``vllm serve``;
* a table of that pair, vLLM's default pair and tuned running inside the engine,
  each figure the mean over the seeds with its range, and what tuned would add over
  the best pair (its goodput ratio, whether the margin stands above the spread over
  seeds, its tail);
* the runner-up pairs, so that an operator sees how flat the optimum is.

The arguments are ``tuned bench``'s, checked by the same code with the same
messages, and the runs are its simulator runs: for one workload, SLO, seed and
sweep, the pair printed here is the report's ``best_static.by_goodput`` of ``tuned
bench --engine sim --repeats N --quick`` (``--full``: without ``--quick``).
``--json FILE`` writes the same as JSON.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tuned.base import log as log_mod
from tuned.bench import command as bench
from tuned.base.inputs import clip_path
from tuned.sim.catalog import hardware_help
from tuned.sim.events import HELP as events_help

#: seeds by default: the fewest that give a spread to read a margin against
SEEDS = 3
#: the figures each setting gets, as mean and range over the seeds: summary key -> label
FIGURES = {"goodput_rps": "goodput req/s", "attainment": "attainment",
           "ttft_p50_s": "TTFT p50", "ttft_p99_s": "TTFT p99", "tpot_p99_s": "TPOT p99",
           "max_wait_s": "longest wait"}
#: a progress line on stderr at most this often (logs, CI; a terminal gets a bar)
PROGRESS_EVERY_S = 5.0
#: a static pair whose goodput on the first seed is under this share of the best
#: pair's there runs on that seed only: the small caps that cannot keep up are the
#: slowest runs to simulate (a backlog to the horizon), and no seed turns one into the
#: best
KEEP_SHARE = 0.5


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "recommend", help="the best static --max-num-seqs / --max-num-batched-tokens "
        "for a workload and SLOs, found on the simulator",
        description=__doc__.split("\n\n")[0].replace("``", "") + " Runs the static "
        "(cap, token budget) pairs of `tuned bench --engine sim`, vLLM's default pair and "
        "tuned on the simulator, over several seeds, and prints the best pair as vLLM "
        "flags, then a table.")
    hw = p.add_mutually_exclusive_group()
    hw.add_argument("--hardware", help="a GPU-shaped step-time model: " + hardware_help())
    hw.add_argument("--profile", help="a profile measured by `tuned profile` (this host)")
    p.add_argument("--data-dir", type=Path, help="folder of Vidur operator tables "
                   "(<gpu>/<model>/mlp.csv) for --hardware (default: the packaged ones)")
    p.add_argument("--events", help="the same for every run; " + events_help)
    p.add_argument("--workload", help="workload spec: a trace, or rates and lengths, "
                   "phases included (see `tuned simulate --help`)")
    bench.add_sla_argument(p)
    p.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    p.add_argument("--seeds", type=int, default=SEEDS,
                   help=f"seeds per setting, seed to seed+N-1 (default {SEEDS}); the best "
                   "pair is the best mean")
    p.add_argument("--config", help="base config of tuned's run (TOML); the SLO's tpot "
                   "and ttft set tbt_sla_s and ttft_sla_s unless the file sets them")
    p.add_argument("--caps", help="comma-separated max_num_seqs to try (default: powers "
                   "of two up to vLLM's default max_num_seqs; --full: their midpoints too)")
    p.add_argument("--budgets", help="comma-separated max_num_batched_tokens paired with "
                   "each cap (default 512,2048,8192; --full 512,1024,2048,4096,8192); "
                   "vLLM's default budget is always added")
    p.add_argument("--full", action="store_true", help="the finer sweep of `tuned bench` "
                   "without --quick (about three times the runs); the default is its "
                   "--quick sweep, which fits in a minute on two cores")
    p.add_argument("--top", type=int, default=5, help="runner-up pairs shown (default 5)")
    p.add_argument("--json", dest="json_path", metavar="FILE",
                   help="also write the recommendation and every pair's figures as JSON")
    p.add_argument("--jobs", type=int, default=0,
                   help="parallel simulator processes (default: the CPU count)")
    p.set_defaults(func=cmd_recommend, engine="sim", model=None, contenders=None,
                   paper=None, quick=True)


def _check(args) -> None:
    """The arguments bench's own checks do not cover; :class:`bench._Refused` names
    the flag and what it takes."""
    if args.jobs < 0:
        raise bench._Refused(f"--jobs: must be >= 0 (0 = the CPU count), got {args.jobs}")
    if not 1 <= args.seeds <= 100:
        raise bench._Refused(f"--seeds: must be in [1, 100], got {args.seeds}")
    if args.top < 1:
        raise bench._Refused(f"--top: must be >= 1, got {args.top}")
    if not args.workload:
        raise bench._Refused("--workload is required")
    if args.json_path:
        folder = Path(args.json_path).parent
        if Path(args.json_path).is_dir() or not folder.is_dir() \
                or not os.access(folder, os.W_OK | os.X_OK):
            raise bench._Refused(f"--json {clip_path(args.json_path)}: must be a file in "
                                 "an existing, writable folder")


def cmd_recommend(args) -> int:
    """Check everything, run the sweep, print the flags and the table."""
    t0 = time.monotonic()
    log_mod.configure("warning")
    args.repeats = args.seeds
    args.quick = not args.full
    try:
        _check(args)
        target, slo, wl, wls, field = bench.prepare(args)
    except bench._Refused as e:
        print(f"tuned recommend: {e}", file=sys.stderr)
        return 2
    # the static pairs (vLLM's default among them) and tuned: no peers, no ablations
    field = [c for c in field if c.kind == "static" or c.name == "tuned"]
    jobs = args.jobs or os.cpu_count() or 1
    pairs = sum(1 for c in field if c.kind == "static")
    print(f"tuned recommend: {pairs} static pairs (vLLM's default among them) and tuned, "
          f"on {args.seeds} seed(s), in {jobs} process(es)", file=sys.stderr, flush=True)
    per = _sweep(target, field, wls, slo, jobs)
    result = recommendation(args, target, wl, slo, field, per)
    result["elapsed_s"] = round(time.monotonic() - t0, 2)
    result["jobs"] = jobs
    print(render(result))
    if args.json_path:
        try:
            Path(args.json_path).write_text(json.dumps(result, indent=1) + "\n")
        except OSError as e:
            print(f"tuned recommend: --json {clip_path(args.json_path)}: cannot write "
                  f"({e.strerror or e})", file=sys.stderr)
            return 2
    return 0


def _sweep(target, field, wls, slo, jobs: int) -> list[list[tuple[dict, dict]]]:
    """Every contender on the first seed, then on the other seeds all but the static
    pairs under :data:`KEEP_SHARE` of the best pair's goodput on the first (vLLM's
    default and tuned run on every seed): per contender, one (summary, timelines)
    per seed run."""
    def run(contenders, workloads):
        return bench.sim_runs(target.hw, contenders, workloads, slo, jobs=jobs,
                              events=target.events, timelines=False,
                              every_s=PROGRESS_EVERY_S)

    per = [list(p) for p in run(field, wls[:1])]
    if len(wls) > 1:
        good = [p[0][0].get("goodput_rps") or 0.0 for p in per]
        top = max(g for c, g in zip(field, good) if c.kind == "static")
        keep = [i for i, (c, g) in enumerate(zip(field, good))
                if c.kind != "static" or c.name == "vllm-default" or g >= KEEP_SHARE * top]
        for i, p in zip(keep, run([field[i] for i in keep], wls[1:])):
            per[i] += p
    return per


def recommendation(args, target, wl, slo, field, per) -> dict[str, Any]:
    """The result as ``--json`` writes it: ``flags`` (the line for ``vllm serve``),
    ``best``, ``vllm_default`` and ``tuned`` (each with its figures as mean, min and
    max over the seeds; tuned's with its ratios to the best pair, its tail against it
    and the noise verdicts), ``pairs`` (every static pair, best first by mean goodput,
    as ``tuned bench`` ranks them) and what was run."""
    from tuned.bench import report as report_mod
    from tuned.bench.metrics import mean_summary

    runs = [report_mod.run_row(c, mean_summary([s for s, _ in p])) for c, p in zip(field, per)]
    spread = {c.name: [s for s, _ in p] for c, p in zip(field, per)}
    # pairs run on the first seed only rank after those run on every seed
    full = [r for r in runs if len(spread[r["name"]]) == args.seeds]
    ranked = report_mod.rank_static(full) + report_mod.rank_static(
        [r for r in runs if r not in full])
    best = {"by_goodput": ranked[0]["name"]}
    by = {r["name"]: r for r in runs}
    tuned_cfg = next(c.config for c in field if c.name == "tuned")

    def setting(row: dict, seqs: int, tokens: int) -> dict[str, Any]:
        out: dict[str, Any] = {"name": row["name"], "max_num_seqs": seqs,
                               "max_num_batched_tokens": tokens,
                               "seeds_run": len(spread[row["name"]])}
        for key in FIGURES:
            vals = [s.get(key) for s in spread[row["name"]]]
            known = [v for v in vals if isinstance(v, (int, float))]
            out[key] = {"mean": row.get(key),
                        "min": min(known) if len(known) == len(vals) else None,
                        "max": max(known) if len(known) == len(vals) else None}
        return out

    top = ranked[0]
    pairs = [setting(r, r["cap"], r["budget"]) for r in ranked]
    tuned = setting(by["tuned"], tuned_cfg.max_num_seqs, tuned_cfg.max_num_batched_tokens)
    rat = report_mod.ratios(runs, best, None)
    tuned.update(goodput_vs_best=rat.get("goodput_vs_best_static"),
                 goodput_vs_vllm_default=rat.get("goodput_vs_vllm-default"),
                 tail_vs_best=report_mod.tail(runs, top["name"]),
                 noise=report_mod.noise(runs, best, what="the spread over seeds"))
    return {"flags": f"--max-num-seqs {top['cap']} --max-num-batched-tokens {top['budget']}",
            "hardware": target.name, "workload": wl.spec, "workload_info": wl.describe(),
            "slo": str(slo), "seed": args.seed,
            "seeds": list(range(args.seed, args.seed + args.seeds)),
            "sweep": {"caps": sorted({r["cap"] for r in ranked}),
                      "budgets": sorted({r["budget"] for r in ranked}),
                      "pairs": len(ranked), "runs": sum(len(v) for v in spread.values()),
                      "first_seed_only": len(runs) - len(full)},
            "best": pairs[0], "vllm_default": next(p for p in pairs
                                                   if p["name"] == "vllm-default"),
            "tuned": tuned, "pairs": pairs, "top": args.top,
            **report_mod.provenance(bench.command_argv(
                args, "recommend", skip=("engine", "repeats", "quick"),
                flags={"json_path": "--json"}))}


def _cell(fig: dict, key: str) -> str:
    """A figure as ``mean (min-max)``; the mean alone when the seeds agree."""
    from tuned.bench.report import _fmt

    unit = "_s" if key.endswith("_s") else ""
    mean, lo, hi = (_fmt(fig[k], unit) for k in ("mean", "min", "max"))
    if fig["min"] is None or lo == hi:
        return mean
    for suffix in (" ms", " s"):       # one unit for the three: said once
        if all(x.endswith(suffix) for x in (mean, lo, hi)):
            lo, hi = lo.removesuffix(suffix), hi.removesuffix(suffix)
    return f"{mean} ({lo}-{hi})"


def _row(label: str, s: dict) -> str:
    return "| " + " | ".join([label, str(s["max_num_seqs"]), str(s["max_num_batched_tokens"])]
                             + [_cell(s[k], k) for k in FIGURES]) + " |"


def render(result: dict[str, Any]) -> str:
    """The text ``tuned recommend`` prints: the flags first, then the tables."""
    from tuned.bench.report import _fmt, _fmt_ratio

    best, default, tuned = result["best"], result["vllm_default"], result["tuned"]
    seeds = result["seeds"]
    head = ["setting", "max_num_seqs", "max_num_batched_tokens", *FIGURES.values()]
    lines = [result["flags"], "",
             f"{result['hardware']}, workload {result['workload']}, SLO {result['slo']}; "
             f"{len(seeds)} seed(s) ({', '.join(map(str, seeds))}), each figure the mean "
             "(min-max over the seeds)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head),
             _row(f"best static pair ({best['name']})", best),
             _row("vLLM's default pair", default),
             _row("tuned inside the engine (ceilings)", tuned), ""]
    words = []
    if tuned.get("goodput_vs_best") is not None:
        words.append(f"tuned inside the engine: goodput {_fmt_ratio(tuned['goodput_vs_best'])} "
                     "the best pair's")
    tail = tuned.get("tail_vs_best") or {}
    if tail:
        words.append(", ".join(f"{k} {_fmt_ratio(v)}" for k, v in tail.items())
                     + " the pair's")
    if words:
        lines.append("; ".join(words) + ".")
    lines += [f"- {v['words']}." for v in tuned.get("noise") or []]
    top = result["pairs"][:result["top"]]
    lines += ["", f"Runner-up pairs ({len(top)} of {result['sweep']['pairs']}, best first "
              "by mean goodput):", "",
              "| rank | max_num_seqs | max_num_batched_tokens | goodput req/s | attainment "
              "| TTFT p99 | TPOT p99 |", "|---|---|---|---|---|---|---|"]
    for i, p in enumerate(top, 1):
        lines.append(f"| {i} | {p['max_num_seqs']} | {p['max_num_batched_tokens']} | "
                     + " | ".join(_cell(p[k], k) for k in ("goodput_rps", "attainment",
                                                          "ttft_p99_s", "tpot_p99_s"))
                     + " |")
    cut = result["sweep"]["first_seed_only"]
    if cut:
        lines += ["", f"{cut} pair(s) under {KEEP_SHARE:.0%} of the best pair's goodput on "
                  f"seed {seeds[0]} ran on that seed only."]
    lines += ["", f"tuned recommend took {result['elapsed_s']:.1f} s: "
              f"{result['sweep']['runs']} simulator runs ({result['sweep']['pairs']} static "
              f"pairs, vLLM's default among them, and tuned) in {result['jobs']} "
              "process(es)"]
    return "\n".join(lines)
