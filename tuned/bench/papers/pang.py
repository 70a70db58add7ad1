"""Paper scenario ``pang``: Tables I and II of seed 000 (Pang, Li, Wang, *Optimizing
LLM Inference Throughput via Memory-aware and SLA-constrained Dynamic Batching*,
``shared/seeds/000_9c922f4ecf264ae4.txt``), on the simulator's A100 Llama-2-70B
(TP 4) model.

(a) Table I, memory-aware dynamic batching (Algorithm 1) against static batching,
"the request arrival rate is set to infinite, meaning that all requests are sent
to the LLMs simultaneously at the start". The row simulated is LLaMA3-70B with
191.0 prompt and 381.9 output tokens on average, 3000 requests (paper: 2296 →
2575 tokens/s, +12.2%; +8–28% over all rows). The baseline is "a static batch size
as configured by vLLM": vLLM's default ``max_num_seqs`` (256 on an A100, token
budget 2048); tuned runs ``batch_policy = "memory"`` with B_max = 1024 (vLLM's
H100 default), so Algorithm 1 decides the batch inside [1, 1024]. The figure is
generated tokens per second over the makespan (``output_tok_s``); the ratio to
every static cap run is reported. Two KV-cache sizes: the hardware as modelled
(``gpu_memory_utilization`` 0.9: 496k KV tokens, where 256 requests of these
lengths never fill the cache, so only a higher cap gains) and a tight one
(:data:`TIGHT_GPU_MEMORY_UTILIZATION` = 0.5: 77k KV tokens, about 134 mean
requests, where vLLM's default 256 overflows and recomputes preempted requests,
as the paper's motivation describes).

(b) Table II / Fig. 4, capacity under a 50 ms TBT SLA: the LLaMA3-70B row with
256.6 prompt and 61.5 output tokens, 3000 requests (paper: 5.4 → 6.6 qps, +22%).
Capacity is "the maximum number of requests that a system can handle while
meeting the specified SLA targets", the definition of the paper's reference [21]
(in its list of continuous-batching systems, Sarathi-Serve's: a P99 TBT target
and a median scheduling delay under 2 s). Here, as everywhere in ``tuned bench``:
the highest Poisson rate at which at least 90% of the requests meet TPOT ≤ 50 ms
and TTFT ≤ 2 s (:func:`tuned.bench.metrics.capacity_search`, DistServe's 90%
attainment), the 2 s TTFT standing for [21]'s scheduling-delay bound: a TBT bound
alone is met at any rate by a controller that lets the queue grow. Contenders:
vLLM's default static batch (256, budget 2048) against Algorithms 1+2 as
published (``tuned-paper``: :data:`PAPER_ALGORITHM`, the paper's interval rule,
vLLM's own token budget, no admission guard; the paper's check) and ``tuned`` as
shipped (memory and SLA bounds, token budget against the SLA, admission guard,
ceiling 256; tuned's check), plus (full mode) the static caps 16..128 for the best
static in hindsight.

Tolerances are the paper's own spread over its rows: Table I's gains
(:data:`PAPER_THROUGHPUT_GAIN_RANGE`) for (a), Table II's capacity gains
(:data:`PAPER_CAPACITY_GAIN_RANGE`) for (b); tuned's check asks at least the
lowest. Where the published algorithm falls short, the table's notes say why from
the runs' and the step model's own numbers.

Lengths: the paper gives only means; as for SABER's Table I in
:mod:`tuned.workloads`, they are lognormal with those means and a coefficient of
variation of 0.5 (:data:`LENGTH_CV`). The simulator is vLLM v1, whose chunked
prefill is always on, so (b) corresponds to the paper's PD-fusion setting (its
third Table II row); the paper's Table II row 2 ran without it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tuned import config as config_mod
from tuned.bench.metrics import Slo, capacity_search, summarize
from tuned.bench.runner import results_from_sim
from tuned.sim.hardware import gpu_hardware
from tuned.workloads import parse_workload

HARDWARE = "a100-llama2-70b"
LENGTH_CV = 0.5
MAX_MODEL_LEN = 8192
TIGHT_GPU_MEMORY_UTILIZATION = 0.5
MEMORY_B_MAX = 1024

#: Table I, LLaMA3-70B, 191.0 / 381.9 tokens, 3000 requests
THROUGHPUT_ROW = {"prompt_mean": 191.0, "output_mean": 381.9, "requests": 3000,
                  "static_tok_s": 2296.0, "dynamic_tok_s": 2575.0}
PAPER_THROUGHPUT_GAIN_RANGE = (0.065, 0.282)
"""Table I's spread over its six rows (+6.5% .. +28.2%; the text rounds it to 8–28%)."""
#: Table II, LLaMA3-70B, D_SLA 50 ms, 256.6 / 61.5 tokens, 3000 requests
CAPACITY_ROW = {"prompt_mean": 256.6, "output_mean": 61.5, "requests": 3000,
                "static_qps": 5.4, "dynamic_qps": 6.6}
TBT_SLA_S = 0.05
SLO = Slo(ttft_s=2.0, tpot_s=TBT_SLA_S)
CAPACITY_TARGET = 0.9

#: Table II's spread of capacity gains over its three rows (3 → 3.3, 5.4 → 6.6,
#: 3.0 → 3.8 qps): the tolerance of Algorithms 1+2 as published ("tuned-paper")
PAPER_CAPACITY_GAIN_RANGE = (0.10, 0.267)
#: tuned's own check (its additions included): at least the paper's lowest row
MIN_CAPACITY_GAIN = 0.10

QUICK = {"throughput_requests": 1000, "capacity_requests": 1000,
         "throughput_caps": (128, 256, 1024), "capacity_caps": ()}
FULL = {"throughput_requests": 3000, "capacity_requests": 3000,
        "throughput_caps": (64, 128, 256, 512, 1024), "capacity_caps": (16, 32, 64, 128)}


def lognormal(mean: float, cv: float = LENGTH_CV) -> str:
    """``LN(mean,median)`` with coefficient of variation ``cv``: median = mean/√(1+cv²)."""
    return f"LN({mean:g},{mean / math.sqrt(1 + cv * cv):.4g})"


def workload_spec(prompt_mean: float, output_mean: float, n: int, rate: float = 1.0) -> str:
    return (f"poisson:rate={rate:g},prompt={lognormal(prompt_mean)},"
            f"output={lognormal(output_mean)},n={n}")


def _config(hw, **changes) -> config_mod.Config:
    raw = {"max_num_seqs": hw.vllm_default_max_num_seqs,
           "max_num_batched_tokens": hw.vllm_default_max_num_batched_tokens,
           "max_model_len": MAX_MODEL_LEN, "log_level": "warning", "fallback_cap": 4}
    raw.update(changes)
    return config_mod.validate(raw)


def static_config(hw, cap: int) -> config_mod.Config:
    """A static cap with vLLM's default token budget (``tuned bench``'s static runs)."""
    return _config(hw, max_num_seqs=cap, batch_policy="static", token_budget_policy="max",
                   b_max=0, fallback_cap=min(4, cap),
                   max_num_batched_tokens=max(hw.vllm_default_max_num_batched_tokens,
                                              cap + 32))


# ------------------------------------------------------------------ (a) throughput

def _throughput_run(cfg, hw, requests) -> dict:
    from tuned.engines.sim import simulate

    res = simulate(cfg, hw, requests, record_steps=True)
    s = summarize(results_from_sim(res), SLO)
    busy = [st for st in res.steps if st.step_s > 0]
    total_s = sum(st.step_s for st in busy) or 1.0
    peak_kv = max((st.kv_used_blocks for st in res.steps), default=0)
    return {"output_tok_s": s["output_tok_s"], "total_tok_s": s["total_tok_s"],
            "duration_s": s["duration_s"], "preemptions": s["preemptions"],
            "recomputed_tokens": s["recomputed_tokens"], "completed": s["completed"],
            "submitted": s["submitted"],
            "mean_running": sum(st.num_running * st.step_s for st in busy) / total_s,
            "peak_kv_share": peak_kv / max((cfg.num_gpu_blocks or hw.num_gpu_blocks) - 1, 1)}


def throughput_part(seed: int, n: int, caps: Sequence[int],
                    utilizations: Sequence[float] = (0.9, TIGHT_GPU_MEMORY_UTILIZATION),
                    data_dir: Path | None = None) -> list[dict]:
    """(a): all requests at t = 0; static caps vs ``batch_policy = "memory"`` per cache
    size (operator tables from ``data_dir``, by default the packaged ones)."""
    row = THROUGHPUT_ROW
    wl = parse_workload(workload_spec(row["prompt_mean"], row["output_mean"], n), seed,
                        max_model_len=MAX_MODEL_LEN)
    requests = [dataclasses.replace(r, arrival_s=0.0) for r in wl.requests]
    out = []
    for util in utilizations:
        hw = gpu_hardware(HARDWARE, data_dir, gpu_memory_utilization=util)
        default_cap = hw.vllm_default_max_num_seqs
        runs = {}
        for cap in sorted(set(caps) | {default_cap}):
            runs[f"static-{cap}"] = _throughput_run(static_config(hw, cap), hw, requests)
        mem_cfg = _config(hw, max_num_seqs=MEMORY_B_MAX, batch_policy="memory")
        runs["tuned-memory"] = _throughput_run(mem_cfg, hw, requests)
        tuned = runs["tuned-memory"]["output_tok_s"]
        ratios = {name: tuned / r["output_tok_s"] for name, r in runs.items()
                  if name.startswith("static-") and r["output_tok_s"]}
        best = max((k for k in runs if k.startswith("static-")),
                   key=lambda k: runs[k]["output_tok_s"])
        out.append({"gpu_memory_utilization": util, "kv_tokens": (hw.num_gpu_blocks - 1)
                    * hw.block_size, "default_cap": default_cap, "runs": runs,
                    "tuned_over_static": ratios,
                    "gain_vs_default": ratios[f"static-{default_cap}"] - 1.0,
                    "best_static": best, "gain_vs_best_static": ratios[best] - 1.0,
                    "workload": wl.describe()})
    return out


# ------------------------------------------------------------------ (b) capacity

#: Algorithms 1 and 2 as published: the paper's interval rule, vLLM's own token
#: budget (the paper tunes the batch size only) and no admission guard
PAPER_ALGORITHM = {"sla_mode": "paper", "token_budget_policy": "max", "admission_guard": "off"}


def prefill_stall_ms(hw, prompt_tokens: float, decodes: Sequence[int] = (32, 64, 128),
                     context_tokens: float = 290.0) -> dict[int, tuple[float, float]]:
    """Per decode batch n: (step ms with n decodes alone, with one prompt of
    ``prompt_tokens`` prefilled beside them), from the hardware's step model: what a
    running request's token interval becomes when a prompt joins its step."""
    from tuned.sim.stepmodel import StepShape

    c = int(round(prompt_tokens))
    out = {}
    for n in decodes:
        ctx = int(n * context_tokens)
        alone = hw.step_model.step_s(StepShape(n, ctx, 0, 0, 0.0, ctx))
        mixed = hw.step_model.step_s(StepShape(n, ctx, c, 1, c * (c + 1) / 2, ctx + c))
        out[n] = (alone * 1e3, mixed * 1e3)
    return out


#: full mode: the published algorithm plus one of tuned's additions each, to measure
#: which addition carries tuned's capacity beyond the paper's (diagnostics, unchecked)
ABLATIONS = {"paper+sla-budget": {"token_budget_policy": "sla"},
             "paper+guard": {"admission_guard": "tpot"},
             "paper+evidence": {"sla_mode": "evidence"}}


def capacity_part(seed: int, n: int, caps: Sequence[int], with_paper_mode: bool = True,
                  data_dir: Path | None = None, ablations: bool = False) -> dict:
    """(b): capacity at TPOT ≤ 50 ms and TTFT ≤ 2 s (90% attainment) per contender."""
    from tuned.engines.sim import simulate

    hw = gpu_hardware(HARDWARE, data_dir)
    row = CAPACITY_ROW
    wl = parse_workload(workload_spec(row["prompt_mean"], row["output_mean"], n), seed,
                        max_model_len=MAX_MODEL_LEN)
    base_rate = wl.describe()["rate_rps"] or 1.0
    tuned_kw = {"tbt_sla_s": TBT_SLA_S, "eps_d_s": round(TBT_SLA_S * 0.04, 6)}
    contenders = {"vllm-default": static_config(hw, hw.vllm_default_max_num_seqs),
                  "tuned": _config(hw, **tuned_kw)}
    for cap in caps:
        contenders[f"static-{cap}"] = static_config(hw, cap)
    if with_paper_mode:
        contenders["tuned-paper"] = _config(hw, **PAPER_ALGORITHM, **tuned_kw)
    if ablations:
        for name, change in ABLATIONS.items():
            contenders[name] = _config(hw, **{**PAPER_ALGORITHM, **change}, **tuned_kw)
    out: dict = {"hardware": HARDWARE, "slo": str(SLO), "target": CAPACITY_TARGET,
                 "workload": wl.describe(), "contenders": {}}
    for name, cfg in contenders.items():
        summaries: dict[float, dict] = {}

        def attainment(rate: float, cfg=cfg, summaries=summaries) -> float:
            res = simulate(cfg, hw, wl.scaled_rate(rate / base_rate).requests,
                           record_steps=False)
            s = summarize(results_from_sim(res), SLO)
            summaries[rate] = s
            return float(s["attainment"] or 0.0)

        cap = capacity_search(attainment, 1.0, 4.0, target=CAPACITY_TARGET, tol_rel=0.02)
        at = summaries.get(cap.capacity_rps, {})
        out["contenders"][name] = {**cap.as_dict(),
                                   "at_capacity": {k: at.get(k) for k in (
                                       "attainment", "output_tok_s", "tpot_mean_s",
                                       "tpot_p90_s", "ttft_p90_s")}}
    c = out["contenders"]
    static_names = [k for k in c if k == "vllm-default" or k.startswith("static-")]
    best = max(static_names, key=lambda k: c[k]["capacity_rps"])
    out["best_static"] = best
    base = c["vllm-default"]["capacity_rps"]
    out["gain_vs_default"] = c["tuned"]["capacity_rps"] / base - 1.0 if base else None
    out["paper_gain_vs_default"] = (c["tuned-paper"]["capacity_rps"] / base - 1.0
                                    if base and "tuned-paper" in c else None)
    out["prefill_stall_ms"] = prefill_stall_ms(hw, row["prompt_mean"])
    out["gain_vs_best_static"] = (c["tuned"]["capacity_rps"] / c[best]["capacity_rps"] - 1.0
                                  if c[best]["capacity_rps"] else None)
    return out


# ------------------------------------------------------------------ scenario

def run(seed: int = 0, *, quick: bool = False,
        cpu_clock: Callable[[], float] = time.process_time,
        data_dir: Path | None = None) -> dict:
    """Both parts; ``quick`` runs 1000 requests per run and fewer contenders;
    ``data_dir``: the operator tables (by default the packaged ones)."""
    plan = QUICK if quick else FULL
    began = cpu_clock()
    t0 = cpu_clock()
    tp = throughput_part(seed, plan["throughput_requests"], plan["throughput_caps"],
                         data_dir=data_dir)
    t1 = cpu_clock()
    cap = capacity_part(seed, plan["capacity_requests"], plan["capacity_caps"],
                        data_dir=data_dir, ablations=not quick)
    t2 = cpu_clock()
    out = {"scenario": "pang", "seed": seed, "quick": quick, "hardware": HARDWARE,
           "length_cv": LENGTH_CV, "throughput": tp, "capacity": cap,
           "paper": {"throughput_row": THROUGHPUT_ROW,
                     "throughput_gain_range": PAPER_THROUGHPUT_GAIN_RANGE,
                     "capacity_row": CAPACITY_ROW},
           "cpu_s_throughput": t1 - t0, "cpu_s_capacity": t2 - t1}
    out["checks"] = checks(out)
    out["cpu_s"] = cpu_clock() - began
    return out


def checks(result: dict) -> list[dict]:
    """The paper's checks: Algorithm 1's throughput gain over vLLM's default inside
    Table I's spread at each cache size, and Algorithms 1+2 as published
    (``tuned-paper``) inside Table II's spread of capacity gains; tuned's check:
    tuned as shipped at least the paper's lowest capacity gain."""
    out = []
    lo, hi = PAPER_THROUGHPUT_GAIN_RANGE
    for part in result["throughput"]:
        g = part["gain_vs_default"]
        out.append({"figure": f"paper's: (a) Algorithm 1 over static-{part['default_cap']} "
                              f"throughput gain, gpu_memory_utilization "
                              f"{part['gpu_memory_utilization']:g}",
                    "ours": g, "target": f"{lo:+.1%}..{hi:+.1%} (Table I's rows)",
                    "ok": g is not None and lo <= g <= hi})
    c = result["capacity"]
    lo, hi = PAPER_CAPACITY_GAIN_RANGE
    g = c.get("paper_gain_vs_default")
    out.append({"figure": "paper's: (b) Algorithms 1+2 as published over vLLM default "
                          "capacity gain", "ours": g,
                "target": f"{lo:+.1%}..{hi:+.1%} (Table II's rows)",
                "ok": g is not None and lo <= g <= hi})
    g = c["gain_vs_default"]
    out.append({"figure": "tuned's: (b) tuned as shipped over vLLM default capacity gain",
                "ours": g, "target": f">= {MIN_CAPACITY_GAIN:+.0%}",
                "ok": g is not None and g >= MIN_CAPACITY_GAIN})
    return out


def _pct(x) -> str:
    return "—" if x is None else f"{x:+.1%}"


def _num(x, digits: int = 0) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def format_table(result: dict) -> str:
    """'figure | ours | paper' rows for (a) and (b), diagnostics, tolerance checks,
    and a note where the gain falls short of the paper's."""
    from tuned.bench.papers import format_checks

    p = result["paper"]
    tr, cr = p["throughput_row"], p["capacity_row"]
    lines = [f"pang (seed 000, Tables I/II) on {result['hardware']}, lognormal lengths "
             f"(CV {result['length_cv']:g}), seed {result['seed']}"
             + (" (quick)" if result["quick"] else ""),
             "figure | ours | paper"]
    lo, hi = p["throughput_gain_range"]
    paper_gain = tr["dynamic_tok_s"] / tr["static_tok_s"] - 1
    for part in result["throughput"]:
        util = part["gpu_memory_utilization"]
        runs = part["runs"]
        d = f"static-{part['default_cap']}"
        tag = f"(a) util {util:g}, KV {part['kv_tokens'] / 1000:.0f}k tok"
        lines.append(f"{tag}: static {part['default_cap']} (vLLM default) tok/s | "
                     f"{_num(runs[d]['output_tok_s'])} | {tr['static_tok_s']:g}")
        lines.append(f"{tag}: memory-aware (B_max {MEMORY_B_MAX}) tok/s | "
                     f"{_num(runs['tuned-memory']['output_tok_s'])} | {tr['dynamic_tok_s']:g}")
        lines.append(f"{tag}: gain over vLLM default | {_pct(part['gain_vs_default'])} | "
                     f"{paper_gain:+.1%} (row), {lo:+.1%}..{hi:+.1%} (all rows)")
        for name, ratio in sorted(part["tuned_over_static"].items(),
                                  key=lambda kv: int(kv[0].split("-")[1])):
            r = runs[name]
            lines.append(f"{tag}: memory-aware / {name} | {ratio:.3f} "
                         f"({r['preemptions']} preemptions, mean running "
                         f"{r['mean_running']:.0f}, peak KV {r['peak_kv_share']:.0%}) | —")
        m = runs["tuned-memory"]
        lines.append(f"{tag}: memory-aware run | {m['preemptions']} preemptions, mean "
                     f"running {m['mean_running']:.0f}, peak KV {m['peak_kv_share']:.0%} | —")
    cap = result["capacity"]
    c = cap["contenders"]
    lines.append(f"(b) capacity (qps), vLLM default static | "
                 f"{_num(c['vllm-default']['capacity_rps'], 2)} | {cr['static_qps']:g}")
    lines.append(f"(b) capacity (qps), tuned | {_num(c['tuned']['capacity_rps'], 2)} | "
                 f"{cr['dynamic_qps']:g}")
    lines.append(f"(b) capacity gain over vLLM default (tuned's) | "
                 f"{_pct(cap['gain_vs_default'])} | "
                 f"{cr['dynamic_qps'] / cr['static_qps'] - 1:+.1%}")
    if "tuned-paper" in c:
        lines.append(f"(b) capacity (qps), Algorithms 1+2 as published (tuned-paper) | "
                     f"{_num(c['tuned-paper']['capacity_rps'], 2)} | {cr['dynamic_qps']:g}")
        lines.append(f"(b) capacity gain over vLLM default (paper's) | "
                     f"{_pct(cap.get('paper_gain_vs_default'))} | "
                     f"{cr['dynamic_qps'] / cr['static_qps'] - 1:+.1%}")
    if len([k for k in c if k.startswith("static-")]):
        lines.append(f"(b) capacity gain over best static in hindsight ({cap['best_static']}) | "
                     f"{_pct(cap['gain_vs_best_static'])} | —")
    for name, v in c.items():
        a = v["at_capacity"]
        lines.append(f"(b) {name}: capacity {v['capacity_rps']:.2f} qps, at it attainment "
                     f"{_num(a.get('attainment'), 3)}, TPOT p90 "
                     f"{_num((a.get('tpot_p90_s') or 0) * 1e3, 1)} ms, TTFT p90 "
                     f"{_num(a.get('ttft_p90_s'), 2)} s | —")
    lines.append(f"(b) SLO: {cap['slo']} at {cap['target']:.0%} attainment, "
                 f"{cap['workload']['n']} Poisson requests")
    lines.append(format_checks(result["checks"]))
    notes = _notes(result)
    if notes:
        lines.extend(notes)
    lines.append(f"CPU {result['cpu_s']:.1f} s ((a) {result['cpu_s_throughput']:.1f} s, "
                 f"(b) {result['cpu_s_capacity']:.1f} s)")
    return "\n".join(lines)


def _notes(result: dict) -> list[str]:
    """Why a gain falls short of the paper's, from the runs' own numbers."""
    notes = []
    lo = PAPER_THROUGHPUT_GAIN_RANGE[0]
    for part in result["throughput"]:
        runs = part["runs"]
        top = f"static-{MEMORY_B_MAX}"
        if top in runs and runs[top]["preemptions"] == 0:
            notes.append(
                f"note: at gpu_memory_utilization {part['gpu_memory_utilization']:g} memory "
                f"never binds (static-{MEMORY_B_MAX} peaks at {runs[top]['peak_kv_share']:.0%} "
                f"of the KV cache), so Algorithm 1's gain over vLLM's default is its larger "
                f"ceiling: {part['tuned_over_static'].get(top, float('nan')):.3f}x "
                f"static-{MEMORY_B_MAX}.")
        if part["gain_vs_default"] >= lo:
            continue
        d = runs[f"static-{part['default_cap']}"]
        m = runs["tuned-memory"]
        notes.append(
            f"note: at gpu_memory_utilization {part['gpu_memory_utilization']:g} the gain "
            f"({part['gain_vs_default']:+.1%}) is below the paper's lowest ({lo:+.1%}): "
            f"vLLM's default peaks at {d['peak_kv_share']:.0%} of the KV cache with "
            f"{d['preemptions']} preemptions, the memory-aware run at "
            f"{m['peak_kv_share']:.0%} with {m['preemptions']}, keeping "
            f"{m['mean_running']:.0f} requests running on average against "
            f"{d['mean_running']:.0f} (Algorithm 1 plans every request at its full "
            f"l_in + l_out, so it admits fewer than fit when memory binds).")
    cap = result["capacity"]
    g = cap.get("paper_gain_vs_default")
    if g is not None and g < PAPER_CAPACITY_GAIN_RANGE[0]:
        stall = cap.get("prefill_stall_ms") or {}
        pairs = ", ".join(f"{n} decodes {a:.0f} -> {b:.0f} ms" for n, (a, b) in
                          sorted(stall.items(), key=lambda kv: int(kv[0])))
        c = cap["contenders"]
        notes.append(
            f"note: Algorithms 1+2 as published gain {g:+.1%}, below Table II's lowest "
            f"({PAPER_CAPACITY_GAIN_RANGE[0]:+.0%}). Algorithm 2 moves only the batch size "
            f"against the decode step time; on this model one mean prompt "
            f"({CAPACITY_ROW['prompt_mean']:g} tokens) prefilled in a step stretches it past "
            f"the {TBT_SLA_S * 1e3:.0f} ms SLA whatever the batch ({pairs}), and vLLM's "
            f"2048-token budget prefills prompts whole, so per-request TPOT is set by "
            f"prefill stalls the batch size cannot remove. tuned's token budget against the "
            f"SLA cuts those chunks: {_num(c['tuned']['capacity_rps'], 2)} qps against "
            f"{_num(c['tuned-paper']['capacity_rps'], 2)}; that gain is tuned's, not the "
            f"paper's." + ("" if "paper+sla-budget" not in c else " One addition at a time: "
                           + ", ".join(f"{k} {_num(c[k]['capacity_rps'], 2)} qps"
                                       for k in ABLATIONS if k in c) + "."))
    return notes


if __name__ == "__main__":   # pragma: no cover
    print(format_table(run(quick=True)))
