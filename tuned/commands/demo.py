"""``tuned demo``: the embedded default end to end on a CPU, then tuned and vLLM's
default static cap side by side on the same load, through the benchmark's code.

1. Build the demo model (its dtype follows this CPU: bfloat16 only with AVX-512
   BF16 or AMX, float32 elsewhere, where vLLM's bfloat16 matmuls fall back).
2. Start ``tuned serve`` with the embedded default. Its TBT SLA is derived on this
   host (``tbt_sla_auto``: a multiple of the decode step measured at batch 1), so
   the demo tells the same story on a fast and on a slow machine; a short
   calibration load (two requests in flight) lets the controller measure it. Then a
   burst of chat-sized requests (batches 1 to the cap) and four long prompts one at
   a time, whose step times are fitted (the cost a prompt token from the long
   prompts' steps); that server stops. (A fit from the calibration alone, one or two requests
   in flight, can put the SLA's batch at twice the engine's and size a load past
   what any cap serves.)
   Where the SLA is below 1.2 x one decode beside the smallest prefill chunk
   (``min_chunk_tokens``) on the burst's fit, it is raised to that, and the demo says
   so: below the step itself no chunk fits and the token budget, one of tuned's two
   knobs, could not act; just above it the chunk fits beside a few decodes only (a
   prompt token costs several decodes' time on some CPUs).
3. Size an open-loop, phase-shifting workload from the burst's fit and the SLA
   (chat, then long prompts with short answers, then heavier chat) and drive it
   through a fresh ``tuned serve`` with that SLA, printing each decision of its first
   run that changes the cap or the token budget.
4. Drive the very same arrivals through plain vLLM with its own default
   ``max_num_seqs`` and token budget for this engine kind (the cap an operator gets
   without tuning). Each side runs ``--repeats`` times (2 by default), a fresh server
   each run, in the order tuned, default, default, tuned: a host whose speed drifts
   steadily through the demo then costs both sides alike, and the runs' spread says
   whether the margin stands above the host's noise.
5. Print both side by side with the benchmark's metrics (goodput, SLA attainment,
   throughput, TTFT and TPOT percentiles; each side's mean over its runs), the SLO
   being the derived SLA for TPOT.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from tuned import config as config_mod
from tuned.config import ConfigError
from tuned.control.sla import CHUNK_HEADROOM, sla_fitting_chunk
from tuned.launch.serve import DEFAULT_MODEL_CACHE


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="tuned on the embedded default, then side by side with vLLM's "
                     "default static cap on the same load",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="TOML config applied over the embedded demo default "
                                    "(the keys it sets replace the demo's)")
    p.add_argument("--model-cache", default=str(DEFAULT_MODEL_CACHE))
    p.add_argument("--phase-s", type=float, default=15.0,
                   help="seconds of arrivals per phase of the side-by-side workload "
                        "(default %(default)s)")
    p.add_argument("--ttft-sla-s", "--ttft-slo-s", dest="ttft_slo_s", type=float, default=0.0,
                   help="TTFT SLA in seconds, the config's ttft_sla_s (default: the "
                        "config's, else 40 x the derived TBT SLA, at least 3 s); "
                        "--ttft-slo-s is the old spelling")
    p.add_argument("--log-dir", default="runs/demo",
                   help="where the servers' logs go (default %(default)s)")
    p.add_argument("--repeats", type=int, default=DEMO_REPEATS,
                   help="runs of each side on the same arrivals, alternating which runs "
                        "first (tuned, default, default, tuned, ...) so that a host whose "
                        "speed drifts reaches both alike; 1 runs each once "
                        "(default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.set_defaults(func=cmd_demo)


#: runs of each side: two, in the order tuned, default, default, tuned, cancel a drift
#: of the host's speed that is linear over the demo, and give each side a spread
DEMO_REPEATS = 2


def run_order(repeats: int) -> list[tuple[str, int]]:
    """(side, repeat) in the order they run: each pair of runs alternates which side
    goes first (tuned, default; default, tuned; ...), so that over two repeats a host
    that slows down (or speeds up) steadily through the demo costs both sides alike."""
    out = []
    for k in range(repeats):
        pair = [("tuned", k), ("vllm-default", k)]
        out.extend(pair if k % 2 == 0 else pair[::-1])
    return out


def _say(msg: str) -> None:
    print(msg, flush=True)


class _DecisionPrinter:
    """Prints each decision that changes the applied cap or the token budget."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.last = None
        self.reasons: dict[str, int] = {}

    def __call__(self, d: dict) -> None:
        self.reasons[d["reason"]] = self.reasons.get(d["reason"], 0) + 1
        key = (d["cap"], d["token_budget"])
        if key == self.last:
            return
        self.last = key
        inp = d.get("inputs") or {}
        tbt = inp.get("tbt_mean_s")
        _say(f"  [{time.monotonic() - self.t0:6.1f}s] cap={d['cap']:3d} "
             f"budget={d['token_budget']:5d} reason={d['reason']:16s} "
             f"tbt={'%.1fms' % (tbt * 1e3) if tbt else '-':>8s} "
             f"running={inp.get('running', '-')} waiting={inp.get('waiting', '-')} "
             f"cap {'binds' if inp.get('cap_binds') else 'does not bind'}")


def _step_source(derived: dict) -> str:
    """Where the calibration's batch-1 step came from, for the line that prints it."""
    if derived.get("step_source") == "probe":
        n = sum(1 for s in derived["probe_steps_s"] if s is not None)
        return (f": the median of {n} lone request{'s' if n != 1 else ''}' steps; the "
                f"controller's first fit read {derived['fit_step_s_batch1'] * 1e3:.1f} ms")
    return ": the controller's first fit, no lone request gave a figure"


def demo_workload(sla_s: float, fit: dict, *, seed: int, max_model_len: int | None,
                  phase_s: float = 15.0, ceiling: int = 32):
    """An open-loop, phase-shifting workload sized to this host's measured speed.

    With the fitted step model T(b, c) = a + beta*b + gamma*c (+ eta*kv), the SLA
    holds up to about b_sla = (SLA - a) / (beta + eta*ctx) decodes (at most
    ``ceiling``). One chat request (prompts U(32,128), 80 tokens on average; outputs
    U(32,96), 64) costs the engine 80*gamma of prefill plus 64 decode steps shared
    with b_sla - 1 others, so the engine serves at most mu = 1 / (80*gamma +
    64*SLA/b_sla) chat requests a second within the SLA. The phases, ``phase_s``
    each: chat at 0.3 mu; long prompts (U(300,700)) with short answers taking a
    quarter of the engine's time in prefill; chat at 0.6 mu (mu counts the decodes at
    the SLA's batch as if no prefill shared their steps, so 0.6 mu is near what the
    SLA lets a cap serve once the prompts' prefill does). A CPU host spends most
    of a chat request in its prefill (a prompt costs several decode steps), so
    leaving prefill out sizes the load past what any cap could serve.
    """
    from tuned.base.workloads import parse_workload

    from tuned.bench.live import sla_capacity

    mu, b_sla = sla_capacity(fit, sla_s, 80.0, 64.0, ceiling=ceiling)
    gamma = fit.get("gamma", 0.0)

    def chat(load: float) -> tuple[float, int]:
        r = max(load * mu, 0.05)
        return round(r, 3), max(int(r * phase_s), 4)

    r1, n1 = chat(0.3)
    r3, n3 = chat(0.6)
    r2 = round(max(0.25 / (max(gamma, 1e-6) * 500.0), 0.05), 3)  # prompts ~500 tokens
    n2 = max(int(r2 * phase_s), 4)
    spec = (f"phases:poisson:rate={r1},prompt=U(32,128),output=U(32,96),n={n1};"
            f"poisson:rate={r2},prompt=U(300,700),output=U(16,48),n={n2};"
            f"poisson:rate={r3},prompt=U(32,128),output=U(32,96),n={n3}")
    return parse_workload(spec, seed, max_model_len=max_model_len), b_sla


def cmd_demo(args) -> int:
    from tuned.bench.live import LiveServer, calibrate, measure_step_fit, run_live
    from tuned.bench.metrics import Slo, mean_summary, summarize
    from tuned.bench.runner import Contender
    from tuned.base.demo_model import resolve_model
    from tuned.base.hostinfo import BF16_FLAGS, cpu_flags, preferred_cpu_dtype
    from tuned.sim.hardware import VLLM_DEFAULTS

    if not 1 <= args.repeats <= 10:
        print(f"tuned demo: --repeats: must be in [1, 10], got {args.repeats}",
              file=sys.stderr)
        return 2
    try:
        cfg = (config_mod.load(args.config, base=config_mod.EMBEDDED_DEFAULT)
               if args.config else config_mod.default())
        if not (cfg.tbt_sla_s or cfg.tbt_sla_auto):
            raise ConfigError(["tbt_sla_s, tbt_sla_auto: the demo needs a TPOT SLA, so "
                               "one of them must be set (tbt_sla_s > 0 in seconds, or "
                               "tbt_sla_auto > 1, a multiple of the batch-1 step; the "
                               f"demo's default is tbt_sla_auto = "
                               f"{config_mod.EMBEDDED_DEFAULT['tbt_sla_auto']:g}); both are 0"],
                              cfg.source_path)
    except ConfigError as e:
        for p in e.problems:
            print(f"{e.source or 'config'}: {p}", file=sys.stderr)
        return 2
    flags = cpu_flags()
    dtype = preferred_cpu_dtype(flags)
    why = ("this CPU has " + "/".join(f for f in BF16_FLAGS if f in flags)
           if dtype == "bfloat16" else "this CPU has no AVX-512 BF16 or AMX, where "
           "vLLM's bfloat16 matmuls fall back to a slow path")
    _say(f"[1/5] demo model ({cfg.model}), {dtype}: {why}")
    model_path = str(resolve_model(cfg.model, Path(args.model_cache),
                                   log=lambda m: _say("  " + m)))
    log_dir = Path(args.log_dir)
    t0 = time.monotonic()
    _say(f"[2/5] starting tuned serve ({cfg.source_path or 'embedded default'}; logs in "
         f"{log_dir}/) and measuring this host")
    with LiveServer(Contender("calibration", "tuned", cfg), model_path=model_path,
                    log_dir=log_dir, seed=args.seed,
                    startup_timeout_s=args.startup_timeout_s) as server:
        _say(f"  ready after {time.monotonic() - t0:.0f}s")
        derived = None
        if cfg.tbt_sla_s:
            sla_s, fit = cfg.tbt_sla_s, {}
            _say(f"  TBT SLA from the config: {sla_s * 1e3:.1f} ms")
        else:
            derived = calibrate(server, cfg)
            sla_s, fit = derived["sla_s"], derived.get("fit") or {}
            _say(f"  TBT SLA derived on this host: {derived['factor']:g} x "
                 f"{derived['step_s_batch1'] * 1e3:.1f} ms (decode step at batch 1"
                 f"{_step_source(derived)}) = {sla_s * 1e3:.1f} ms")
        probe = measure_step_fit(server, cfg)
    if probe:
        fit = probe
        _say(f"  step time over a burst (medians of {probe['n_samples']} decode steps, "
             f"batches up to {probe['batch_max']}): {probe['a'] * 1e3:.2f} ms + "
             f"{probe['beta'] * 1e3:.3f} ms a sequence + {probe['gamma'] * 1e3:.4f} ms "
             f"a prompt token")
    else:
        _say("  no step fit from the burst: the load is sized from the calibration's")
    if derived is not None:
        raised = sla_fitting_chunk(sla_s, fit, cfg.min_chunk_tokens)
        if raised > sla_s:
            step = raised / CHUNK_HEADROOM
            room = int((sla_s - step) / fit["beta"]) + 1 if fit.get("beta") else 1
            why = ("no chunk fits beside a decode and the token budget could not act"
                   if sla_s < step else
                   f"that chunk fits beside {room} decode{'s' if room != 1 else ''} at most")
            _say(f"  TBT SLA raised to {raised * 1e3:.1f} ms, {CHUNK_HEADROOM:g} x the "
                 f"{step * 1e3:.1f} ms that one decode beside a {cfg.min_chunk_tokens}-token "
                 f"prefill chunk takes on the burst's fit: at {sla_s * 1e3:.1f} ms {why}")
            derived = {**derived, "sla_s_batch1": sla_s, "sla_s": raised,
                       "raised_for_chunk": True}
            sla_s = raised
    wl, b_sla = demo_workload(sla_s, fit, seed=args.seed, phase_s=args.phase_s,
                              max_model_len=cfg.effective_max_model_len,
                              ceiling=cfg.max_num_seqs)
    info = wl.describe()
    # tuned runs the load on a fresh server with the SLA just derived, as vLLM's
    # default runs it on a fresh one: the calibration and the burst (24 requests at
    # once) would otherwise hand it an SLA search already narrowed to the batch the
    # burst overloaded, and the run would measure that start, not the controller
    tuned = Contender("tuned", "tuned", replace(cfg, tbt_sla_s=sla_s))
    seqs, toks = VLLM_DEFAULTS["cpu"]
    static_cfg = replace(cfg, max_num_seqs=seqs, max_num_batched_tokens=toks,
                         fallback_cap=min(cfg.fallback_cap, seqs))
    static = Contender("vllm-default", "static", static_cfg, seqs)
    n = args.repeats
    order = run_order(n)
    _say(f"[3/5] tuned (a fresh server each run, TBT SLA {sla_s * 1e3:.1f} ms) and vLLM's "
         f"default static cap (max_num_seqs {seqs}, max_num_batched_tokens {toks}), "
         f"{n} run{'s' if n != 1 else ''} each on the same arrivals, in the order "
         f"{', '.join(side for side, _ in order)}: {len(wl.requests)} requests open-loop "
         f"over {info.get('duration_s', 0):.0f}s (chat, long prompts, heavier chat; sized "
         f"for about {b_sla:.0f} decodes within the SLA)")
    done: dict[str, list] = {"tuned": [], "vllm-default": []}
    printer = _DecisionPrinter(time.monotonic())
    for i, (side, k) in enumerate(order):
        first_tuned = side == "tuned" and k == 0
        _say(f"[4/5] run {i + 1} of {len(order)}: {side}"
             + (f" #{k + 1}" if n > 1 else "")
             + ("; tuned's decisions as they change:" if first_tuned else ""))
        if side == "tuned":
            with LiveServer(tuned, model_path=model_path, log_dir=log_dir, seed=args.seed,
                            startup_timeout_s=args.startup_timeout_s) as server:
                if first_tuned:
                    printer.t0 = time.monotonic()
                run = server.drive(wl, on_decision=printer if first_tuned else None,
                                   pace=True)
        else:
            run = run_live(static, wl, model_path=model_path, log_dir=log_dir,
                           seed=args.seed, startup_timeout_s=args.startup_timeout_s,
                           pace=True)
        done[side].append(run)
    ttft = args.ttft_slo_s or cfg.ttft_sla_s or max(3.0, round(40 * sla_s, 1))
    slo = Slo(ttft_s=ttft, tpot_s=sla_s)
    rows = [(side, mean_summary([summarize(r.results, slo) for r in done[side]]))
            for side in ("tuned", "vllm-default")]
    _write_records(log_dir, slo, done)
    verdict, pace, quiet = _summary(rows, slo, printer.reasons, done["tuned"],
                                    done["vllm-default"])
    (log_dir / "demo-summary.json").write_text(json.dumps(
        {"slo": str(slo), "workload": wl.spec, "step_fit": fit, "runs": dict(rows),
         "order": [f"{side} #{k + 1}" for side, k in order],
         "reasons": printer.reasons, "noise": verdict, "host_pace": pace,
         "silence_s": quiet,
         "calibration": ({k: v for k, v in derived.items() if k != "fit"}
                         if derived else None)},
        indent=1, default=str))
    bad_exit = [r for runs in done.values() for r in runs if r.server_returncode is not None]
    return 0 if _lost(rows) == 0 and not bad_exit else 1


def _write_records(log_dir: Path, slo, done: dict[str, list]) -> None:
    """Each run's requests (``NAME.requests.csv``, then ``NAME.r1.requests.csv`` for
    the second repeat, as ``tuned bench`` names them) and tuned's decisions and engine
    steps, to see which requests a run missed and why."""
    from tuned.bench.command import run_stem
    from tuned.bench.metrics import write_requests_csv

    for name, runs in done.items():
        for k, run in enumerate(runs):
            stem = run_stem(name, k)
            write_requests_csv(log_dir / f"{stem}.requests.csv", run.results, slo)
            if name == "tuned":
                (log_dir / f"{stem}.decisions.json").write_text(json.dumps(run.decisions))
                (log_dir / f"{stem}.steps.json").write_text(json.dumps(run.steps))


def _fmt_s(v) -> str:
    if v is None:
        return "-"
    return f"{v * 1e3:.0f}ms" if v < 1 else f"{v:.2f}s"


def _total(row: dict, key: str) -> int:
    """A count summed over a side's runs (:func:`tuned.bench.metrics.mean_summary`
    keeps their mean)."""
    return int(round((row.get(key) or 0) * (row.get("repeats") or 1)))


def _lost(rows) -> int:
    """Requests that got neither their answer nor a refusal: a request refused with
    HTTP 429 and ``Retry-After`` was answered, and is counted as refused, not lost."""
    return sum(_total(r, "submitted") - _total(r, "completed") - _total(r, "refused")
               for _, r in rows)


def _summary(rows, slo, reasons, tuned_runs, static_runs) -> tuple[dict, dict | None, dict]:
    """The side-by-side table and ratios; returns the noise verdict, the host's pace
    it printed (:func:`tuned.bench.report.host_pace`; None without a probe) and each
    run's longest silence (:func:`tuned.bench.metrics.longest_silence`)."""
    from tuned.bench.metrics import longest_silence
    from tuned.bench.report import host_pace, noise_verdict, silence_words

    _say(f"[5/5] side by side, SLO {slo} (TPOT = the derived SLA)")
    _say(f"  {'run':13s} {'goodput':>9s} {'attain':>7s} {'out tok/s':>9s} {'TTFT p50':>9s} "
         f"{'TTFT p99':>9s} {'TPOT p50':>9s} {'TPOT p99':>9s} {'preempt':>7s} {'done':>8s}")
    for name, r in rows:
        _say(f"  {name:13s} {r['goodput_rps'] or 0:8.3f}/s {r['attainment'] or 0:7.2f} "
             f"{r['output_tok_s'] or 0:9.1f} {_fmt_s(r['ttft_p50_s']):>9s} "
             f"{_fmt_s(r['ttft_p99_s']):>9s} {_fmt_s(r['tpot_p50_s']):>9s} "
             f"{_fmt_s(r['tpot_p99_s']):>9s} {_total(r, 'preemptions'):7d} "
             f"{_total(r, 'completed'):>3d}/{_total(r, 'submitted'):<4d}")
    (_, t), (_, s) = rows

    def ratio(k):
        return (t[k] or 0) / s[k] if s.get(k) else float("inf")

    _say(f"  tuned vs vLLM's default: goodput x{ratio('goodput_rps'):.2f}, attainment "
         f"x{ratio('attainment'):.2f}, throughput x{ratio('output_tok_s'):.2f}")
    def per_run(r):
        return [x or 0.0 for x in r.get("goodput_rps_runs") or [r["goodput_rps"]]]

    if len(per_run(t)) > 1:
        _say(f"  goodput per run: tuned {', '.join(f'{x:.3f}' for x in per_run(t))}; "
             f"vllm-default {', '.join(f'{x:.3f}' for x in per_run(s))} req/s (the table "
             f"gives each side's mean over its runs)")
    # with one run each the verdict says so rather than read a margin as a result
    verdict = noise_verdict("tuned", per_run(t), "vllm-default", per_run(s))
    _say(f"  above the host's noise? {verdict['words']}")
    # what the host's speed did around each run
    pace = host_pace([{"name": "tuned", "pace_s_runs": [list(r.pace_s) for r in tuned_runs]},
                      {"name": "vllm-default",
                       "pace_s_runs": [list(r.pace_s) for r in static_runs]}])
    if pace:
        _say(f"  {pace['words']}")
    quiet = {name: [longest_silence(r.results) for r in runs]
             for name, runs in (("tuned", tuned_runs), ("vllm-default", static_runs))}
    words = silence_words(list(quiet.items()))
    if words:
        _say(f"  {words}")
    _say(f"  tuned's decisions by reason: {json.dumps(reasons, sort_keys=True)}")
    alive = all(r.server_returncode is None for r in (*tuned_runs, *static_runs))
    refused = sum(_total(r, "refused") for _, r in rows)
    _say(f"  requests lost: {_lost(rows)} (refused with HTTP 429: {refused}); servers "
         f"still serving at the end: {alive}")
    return verdict, pace, quiet
