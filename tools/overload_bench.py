#!/usr/bin/env python3
"""An overload and the light load after it, driven by vLLM's own benchmark client.

    .venv/bin/python tools/overload_bench.py OUT [--model demo:small] [--repeats 3]
        [--k 10] [--burst-s 20] [--light 0.25] [--light-n 20] [--slo ttft=3,tpot=2.5x]
        [--pair 8@256] [--seed 0]

What a user of ``vllm bench serve`` sees when a burst far past capacity hits a server
and a light load follows it on the same server:

1. The host's capacity: a batch-1 decode step measured as ``tuned bench`` measures it
   (the TPOT SLO is a multiple of it) and its step fit give the requests a second
   served within the TPOT SLO for vLLM's random dataset lengths
   (:func:`tuned.bench.live.sla_capacity`, as ``rate=Kx`` sizes a workload).
2. Per repeat, for tuned, vLLM's default and the static pair (each on a fresh server,
   started as ``tuned bench`` starts it; the order rotates each repeat):
   - each server first gets its capacity run: ``vllm bench serve`` at the
     capacity for ``--burst-s`` seconds (for a static setting, the reference: what the
     engine serves within both SLOs when offered exactly its capacity; every server,
     tuned's too, so meets the burst warm, after the same kind of load);
   - the scenario: ``vllm bench serve`` at k x capacity for ``--burst-s`` seconds and,
     a second one started ``--burst-s`` seconds after it, ``--light-n`` requests at
     ``--light`` x capacity. Prompts and outputs: vLLM's random dataset, 256 and 128
     tokens +-90 %, ``--ignore-eos``.
3. Per run: good / served / refused of each phase by vLLM's client (good: vLLM's
   goodput rule, TTFT and TPOT within the SLO); on tuned, its own count of refusals
   (``tuned_requests_refused_total`` + ``tuned_gateway_refused_total``) beside the
   client's, the time from arrival to each 429 (``tuned_gateway_refusal_wait_seconds``),
   and whether the server answered /health and logged no traceback throughout.

Writes OUT/report.md (printed too) and OUT/report.json; vLLM's detailed results and
the servers' logs under OUT/runs/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

#: ``vllm bench serve`` as its command runs it (the CPU build's distribution is not
#: ``vllm``, which the ``vllm`` command asks for), its benchmark loop started at
#: START_AT on the monotonic clock (``time.perf_counter``, which its results'
#: ``start_times`` use), after its tokenizer and dataset are ready
VLLM_BENCH_SERVE = ("import asyncio, os, sys, time\n"
                    "import vllm.benchmarks.serve as s\n"
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                    "run = s.benchmark\n"
                    "async def at_start(*a, **k):\n"
                    "    await asyncio.sleep(max(float(os.environ['START_AT'])"
                    " - time.perf_counter(), 0))\n"
                    "    return await run(*a, **k)\n"
                    "s.benchmark = at_start\n"
                    "p = FlexibleArgumentParser()\ns.add_cli_args(p)\n"
                    "s.main(p.parse_args(sys.argv[1:]))\n")
INPUT_LEN, OUTPUT_LEN, RANGE = 256, 128, 0.9
REFUSED = "Too Many Requests"


def lengths_mean(mean: int) -> float:
    """The mean of vLLM's random dataset lengths around ``mean`` with range ratio
    RANGE (uniform on [floor(mean (1 - r)), ceil(mean (1 + r))])."""
    return (math.floor(mean * (1 - RANGE)) + math.ceil(mean * (1 + RANGE))) / 2


def bench_cmd(srv, model_path: str, rate: float, n: int, seed: int, slo, out: Path) -> list:
    return [sys.executable, "-c", VLLM_BENCH_SERVE, "--backend", "openai", "--base-url",
            srv.url, "--endpoint", "/v1/completions", "--model", srv.model_id,
            "--tokenizer", model_path, "--dataset-name", "random",
            "--random-input-len", str(INPUT_LEN), "--random-output-len", str(OUTPUT_LEN),
            "--random-range-ratio", str(RANGE), "--num-prompts", str(n),
            "--request-rate", f"{rate:.4f}", "--seed", str(seed), "--ignore-eos",
            "--ready-check-timeout-sec", "0", "--disable-tqdm",
            "--goodput", f"ttft:{slo.ttft_s * 1e3:g}", f"tpot:{slo.tpot_s * 1e3:g}",
            "--save-result", "--save-detailed", "--result-dir", str(out.parent),
            "--result-filename", out.name]


def run_benches(parts: list[tuple[list, float, Path]], log: Path) -> list[dict]:
    """Start each ``(command, start offset s, result path)`` at its offset from a
    common start (their imports done first) and wait for all; their results."""
    # together: vLLM's imports, tokenizer and dataset first
    t0 = time.perf_counter() + (30.0 if len(parts) > 1 else 0.0)
    procs = []
    with open(log, "a") as f:
        for cmd, offset, _ in parts:
            env = dict(os.environ, START_AT=str(t0 + offset))
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env))
        for p in procs:
            if p.wait(timeout=3600) != 0:
                raise SystemExit(f"vllm bench serve failed (exit {p.returncode}): see {log}")
    return [json.loads(out.read_text()) for _, _, out in parts]


def counts(res: dict, slo) -> dict:
    """good / served / refused / failed of one ``vllm bench serve`` result, good by
    :meth:`tuned.bench.metrics.Slo.is_good` (vLLM's goodput rule); TTFT p99 of the
    served."""
    from tuned.bench.metrics import RequestResult

    good = served = refused = other = 0
    ttfts = []
    for ttft, lat, n, err in zip(res["ttfts"], res["latencies"], res["output_lens"],
                                 res["errors"]):
        if err:
            refused += err == REFUSED
            other += err != REFUSED
            continue
        served += 1
        ttfts.append(ttft)
        good += slo.is_good(RequestResult("", 0.0, 0, n, ttft, lat))
    ttfts.sort()
    p99 = ttfts[min(len(ttfts) - 1, math.ceil(0.99 * len(ttfts)) - 1)] if ttfts else None
    return {"n": len(res["errors"]), "good": good, "served": served, "refused": refused,
            "failed_other": other, "ttft_p99_s": p99,
            "vllm_goodput_rps": res.get("request_goodput"), "duration_s": res["duration"],
            "start_s": min(res["start_times"]) if res.get("start_times") else None}


def scrape(url: str) -> dict:
    """{(name, labels...): value} of a Prometheus exposition at ``url`` ({} if none)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
    except Exception:
        return {}
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(m: dict, name: str) -> float:
    return sum(v for (n, _), v in m.items() if n == name)


def refusal_waits(m: dict) -> dict:
    """The gateway's refusal-wait histogram, both ``where`` labels together:
    {bucket bound: cumulative count}."""
    out: dict[float, float] = {}
    for (n, labels), v in m.items():
        if n == "tuned_gateway_refusal_wait_seconds_bucket":
            le = float(dict(labels)["le"])
            out[le] = out.get(le, 0.0) + v
    return dict(sorted(out.items()))


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status == 200
    except Exception:
        return False


#: the fractions of the capacity estimate a static setting is offered, highest first,
#: until it meets both SLOs for CAPACITY_ATTAINMENT of them (DistServe's capacity)
CAPACITY_FRACTIONS = (1.0, 0.75, 0.55, 0.4, 0.3)
CAPACITY_ATTAINMENT = 0.9


def run_contender(c, cfg_args, out: Path, rep: int, cap_rps: float, slo,
                  found: dict) -> dict:
    from tuned.bench.live import LiveServer

    k, burst_s, light, light_n, seed = (cfg_args.k, cfg_args.burst_s, cfg_args.light,
                                        cfg_args.light_n, cfg_args.seed + rep)
    d = out / "runs" / f"r{rep}-{c.name}"
    d.mkdir(parents=True, exist_ok=True)
    row: dict = {"contender": c.name, "repeat": rep}
    print(f"[{time.strftime('%H:%M:%S')}] repeat {rep}: {c.name}", file=sys.stderr, flush=True)
    with LiveServer(c, model_path=cfg_args.model_path, log_dir=d, seed=seed) as srv:
        blog = d / "bench.log"
        # its capacity: the highest of the estimate's fractions at which it meets
        # both SLOs for CAPACITY_ATTAINMENT of the requests (searched on the first
        # repeat, then offered again on each). tuned has this run too, so that every
        # server meets the burst warm, after the same kind of load
        known = found.get(c.name)
        for f in ([known] if known is not None else CAPACITY_FRACTIONS):
            rate = f * cap_rps
            n = max(round(rate * burst_s), 1)
            out_json = d / f"capacity-{f:g}.json"
            (res,) = run_benches([(bench_cmd(srv, cfg_args.model_path, rate, n, seed,
                                             slo, out_json), 0.0, out_json)], blog)
            row.setdefault("capacity_tries", []).append(
                {"fraction": f, "rate_rps": rate, **counts(res, slo)})
            row["capacity"], row["capacity_fraction"] = counts(res, slo), f
            if row["capacity"]["good"] >= CAPACITY_ATTAINMENT * n:
                break
        found.setdefault(c.name, row["capacity_fraction"])
        before = (scrape(srv.endpoint + "/metrics") if srv.endpoint else {},
                  scrape(srv.url + "/metrics"))
        n_burst = max(round(k * cap_rps * burst_s), 1)
        burst, after = run_benches([
            (bench_cmd(srv, cfg_args.model_path, k * cap_rps, n_burst, seed, slo,
                       d / "burst.json"), 0.0, d / "burst.json"),
            (bench_cmd(srv, cfg_args.model_path, light * cap_rps, light_n, seed + 1000, slo,
                       d / "light.json"), burst_s, d / "light.json")], blog)
        row["burst"], row["light"] = counts(burst, slo), counts(after, slo)
        if row["burst"]["start_s"] is not None and row["light"]["start_s"] is not None:
            row["light_started_after_s"] = round(row["light"]["start_s"]
                                                 - row["burst"]["start_s"], 2)
        row["health_200"] = healthy(srv.url)
        if srv.endpoint:
            eng, api = scrape(srv.endpoint + "/metrics"), scrape(srv.url + "/metrics")
            row["tuned_refused_queue"] = (total(eng, "tuned_requests_refused_total")
                                          - total(before[0], "tuned_requests_refused_total"))
            row["tuned_refused_door"] = (total(api, "tuned_gateway_refused_total")
                                         - total(before[1], "tuned_gateway_refused_total"))
            w0, w1 = refusal_waits(before[1]), refusal_waits(api)
            row["refusal_wait_buckets"] = {le: v - w0.get(le, 0.0) for le, v in w1.items()}
        logtext = Path(srv.srv.log_path).read_text(errors="replace")
        row["tracebacks"] = logtext.count("Traceback (most recent call last)")
    return row


def bucket_p99(buckets: dict) -> float | None:
    """The smallest bucket bound holding 99 % of the refusals (None without any)."""
    n = buckets.get(math.inf, 0.0)
    if not n:
        return None
    return next(le for le, v in buckets.items() if v >= 0.99 * n)


def within(buckets: dict, bound: float) -> float:
    """Refusals answered within ``bound`` s (the largest bucket bound not above it)."""
    les = [le for le in buckets if le <= bound]
    return buckets[max(les)] if les else 0.0


def report(rows: list[dict], meta: dict) -> str:
    slo = meta["slo"]
    lines = [f"# An overload then a light load, through `vllm bench serve`", "",
             f"- host: {meta['host']}; date {meta['date']}; model {meta['model']}",
             f"- SLO: TTFT {slo['ttft_s']:g} s, TPOT {slo['tpot_s'] * 1e3:.2f} ms "
             f"({meta['tpot_multiple']:g} x the batch-1 step {meta['step_s'] * 1e3:.2f} ms)",
             f"- capacity within the TPOT SLO: {meta['capacity_rps']:.3f} req/s; burst "
             f"{meta['k']:g}x = {meta['burst_rps']:.2f} req/s for {meta['burst_s']:g} s "
             f"({meta['burst_n']} requests), then {meta['light_n']} at {meta['light']:g}x = "
             f"{meta['light_rps']:.3f} req/s",
             f"- command: `{meta['command']}`", "",
             "good / served / refused (other failures) of n, by vLLM's client; TTFT p99 of "
             "the served", "",
             "| repeat | run | capacity run | burst | light | light started after | tuned's "
             "refusals (queue + door) | refusal p99 | within TTFT | health, tracebacks |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(p: dict | None) -> str:
        if not p:
            return "-"
        t = f"{p['ttft_p99_s']:.2f} s" if p["ttft_p99_s"] is not None else "-"
        other = f" ({p['failed_other']})" if p["failed_other"] else ""
        return f"{p['good']} / {p['served']} / {p['refused']}{other} of {p['n']}; {t}"

    for r in rows:
        b = r.get("refusal_wait_buckets")
        tuned = "-"
        p99 = inside = "-"
        if b is not None:
            tuned = (f"{r['tuned_refused_queue']:.0f} + {r['tuned_refused_door']:.0f} = "
                     f"{r['tuned_refused_queue'] + r['tuned_refused_door']:.0f} (client "
                     f"{r['burst']['refused'] + r['light']['refused']})")
            q = bucket_p99(b)
            p99 = f"<= {q:g} s" if q is not None else "none"
            inside = f"{within(b, slo['ttft_s']):.0f} of {b.get(math.inf, 0):.0f}"
        lines.append(f"| {r['repeat']} | {r['contender']} | {cell(r.get('capacity'))} | "
                     f"{cell(r['burst'])} | {cell(r['light'])} | "
                     f"{r.get('light_started_after_s', '-')} s | {tuned} | {p99} | {inside} | "
                     f"{'200' if r['health_200'] else 'NOT 200'}, {r['tracebacks']} |")
    tuned_burst = [r["burst"]["good"] for r in rows if r["contender"] == "tuned"]
    by_name: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("capacity"):
            by_name.setdefault(r["contender"], []).append(r)
    lines.append("")
    for name, runs in by_name.items():
        tries = "; ".join(f"{t['fraction']:g}x: {t['good']} of {t['n']}"
                          for t in runs[0].get("capacity_tries", []))
        lines.append(f"- {name}'s capacity: {runs[0].get('capacity_fraction', 1.0):g} x "
                     f"the estimate (searched on the first repeat, good of offered: "
                     f"{tries or '-'}); at it, per repeat: "
                     + ", ".join(f"{r['capacity']['good']} of {r['capacity']['n']}"
                                 for r in runs))
    # the reference is a static setting's: tuned's run is its warm-up, shown above
    by_static = {name: runs for name, runs in by_name.items() if name != "tuned"}
    if by_static and tuned_burst:
        def mean_good(runs):
            return sum(r["capacity"]["good"] for r in runs) / len(runs)
        best = max(by_static, key=lambda s: mean_good(by_static[s]))
        ref = mean_good(by_static[best])
        offered = by_static[best][0]["capacity"]["n"]
        lines.append(f"- during the burst tuned had {', '.join(map(str, tuned_burst))} "
                     f"within both SLOs: {min(tuned_burst) / ref:.2f}-"
                     f"{max(tuned_burst) / ref:.2f}x what the best static ({best}) has "
                     f"offered its capacity for the same time (mean {ref:.1f} of "
                     f"{offered})")
    for name in dict.fromkeys(r["contender"] for r in rows):
        light = [r["light"] for r in rows if r["contender"] == name]
        lines.append(f"- {name}: light load good {', '.join(str(p['good']) for p in light)} "
                     f"of {light[0]['n']}, refused "
                     f"{', '.join(str(p['refused']) for p in light)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="demo:small")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--k", type=float, default=10.0, help="the burst's rate in capacities")
    ap.add_argument("--burst-s", type=float, default=20.0)
    ap.add_argument("--light", type=float, default=0.25,
                    help="the light load's rate in capacities")
    ap.add_argument("--light-n", type=int, default=20)
    ap.add_argument("--slo", default="ttft=3,tpot=2.5x")
    ap.add_argument("--pair", default="8@256", help="the static pair: CAP@TOKEN_BUDGET")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--contenders", default="tuned,vllm-default,pair",
                    help="which to run, comma-separated: tuned, vllm-default, pair")
    ap.add_argument("--log-level", default=None,
                    help="tuned's log level on its server (default: the bench's, warning)")
    ap.add_argument("--report-only", action="store_true",
                    help="write OUT/report.md again from OUT/report.json; run nothing")
    a = ap.parse_args(argv)
    if a.report_only:
        saved = json.loads((a.out / "report.json").read_text())
        for r in saved["rows"]:
            if "refusal_wait_buckets" in r:
                r["refusal_wait_buckets"] = {float(k): v for k, v in
                                             r["refusal_wait_buckets"].items()}
        text = report(saved["rows"], saved["meta"])
        (a.out / "report.md").write_text(text)
        print(text)
        return 0

    from tuned.base.demo_model import resolve_model
    from tuned.base.hostinfo import cpu_model, preferred_cpu_dtype
    from tuned.bench import runner
    from tuned.bench.command import base_config
    from tuned.bench.live import measure_batch1_step, sla_capacity
    from tuned.bench.metrics import SloSpec
    from tuned.launch.serve import DEFAULT_MODEL_CACHE
    from tuned.sim.hardware import engine_defaults

    a.out.mkdir(parents=True, exist_ok=True)
    a.model_path = str(resolve_model(a.model, DEFAULT_MODEL_CACHE, log=lambda m: None))
    spec = SloSpec.parse(a.slo)
    factor = spec.multiples.get("tpot")
    if not factor or "ttft" not in spec.seconds:
        raise SystemExit("--slo: needs ttft in seconds and tpot as a multiple (tpot=2.5x)")
    engine = engine_defaults(None)
    base = base_config(SimpleNamespace(config=None), spec.resolve(0.02), engine, model=a.model)
    print("measuring the batch-1 step and the step fit", file=sys.stderr, flush=True)
    derived = measure_batch1_step(base, model_path=a.model_path, log_dir=a.out / "runs",
                                  seed=a.seed, factor=factor, step_fit=True)
    step = derived["step_s_batch1"]
    slo = spec.resolve(step)
    base = base_config(SimpleNamespace(config=None), slo, engine, model=a.model)
    fit = derived.get("burst_fit") or derived.get("fit") or {}
    cap_rps, b_sla = sla_capacity(fit, slo.tpot_s, lengths_mean(INPUT_LEN),
                                  lengths_mean(OUTPUT_LEN), ceiling=base.max_num_seqs)
    cap, budget = (int(x) for x in a.pair.split("@"))
    field = runner.contenders(base, default_seqs=engine["max_num_seqs"],
                              default_tokens=engine["max_num_batched_tokens"], quick=True,
                              caps=[cap], budgets=[budget], peers=False, ablate=False)
    pair = runner.static_name(cap, max(budget, cap + base.min_chunk_tokens),
                              engine["max_num_batched_tokens"])
    wanted = [pair if w == "pair" else w for w in a.contenders.split(",")]
    unknown = [w for w in wanted if w not in {c.name for c in field}]
    if unknown:
        raise SystemExit(f"--contenders: {', '.join(unknown)} not among tuned, "
                         f"vllm-default, pair")
    field = [c for c in field if c.name in wanted]
    if a.log_level:
        field = [dataclasses.replace(c, config=dataclasses.replace(
            c.config, log_level=a.log_level)) if c.kind == "tuned" else c for c in field]
    meta = {"host": f"{cpu_model()}, {os.cpu_count()} cores, {preferred_cpu_dtype()}",
            "date": time.strftime("%Y-%m-%d %H:%M"), "model": a.model,
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s}, "tpot_multiple": factor,
            "step_s": step, "fit": fit, "capacity_rps": cap_rps, "batch_at_sla": b_sla,
            "k": a.k, "burst_rps": a.k * cap_rps, "burst_s": a.burst_s,
            "burst_n": max(round(a.k * cap_rps * a.burst_s), 1), "light": a.light,
            "light_rps": a.light * cap_rps, "light_n": a.light_n,
            "command": " ".join(["tools/overload_bench.py", *(argv or sys.argv[1:])])}
    print(json.dumps({k: meta[k] for k in ("slo", "step_s", "capacity_rps", "burst_n")}),
          file=sys.stderr, flush=True)
    rows: list = []
    found: dict = {}
    for rep in range(a.repeats):
        order = field[rep % len(field):] + field[:rep % len(field)]
        for c in order:
            rows.append(run_contender(c, a, a.out, rep, cap_rps, slo, found))
            (a.out / "report.json").write_text(json.dumps(
                {"meta": meta, "rows": rows}, indent=1, default=str))
    text = report(rows, meta)
    (a.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
