"""Paper scenario ``bucketserve``: Section V of seed 004 (Zheng et al., *BucketServe:
Bucket-Based Dynamic Batching for Smart and Efficient LLM Inference Serving*,
``shared/seeds/004_8072b537153b1f44.txt``), on the simulator's A100 Llama-2-7B model,
with the shipped :class:`tuned.policies.bucket.BucketPolicy` (``queue_policy =
"bucket"``) against a length-blind baseline (vLLM's first-come first-served queue),
both under vLLM's default static batch (256 requests, 2048-token budget).

The paper's comparisons (Fig. 5, Llama-2-13B on 4 × A100 40 GB, Alpaca, LongBench
and their mix):

(a) offline throughput, every request at t = 0: BucketServe 1.31× DistServe's and
    up to 3.58× UELLM's tokens per second; the bucket policy runs in its offline
    longest-first mode (the paper's choice for tokens per second);
(b) online load at 80 % SLO attainment: 1.37× (Alpaca) and 1.93× (Mixed)
    DistServe's server RPS; the bucket policy in its online mode (earliest arrival).

Checked: the direction of each (ours > 1×) on the Mixed workload, the one where
length grouping has something to group; the figure beside it is the paper's
smallest ratio over the same baseline (1.31× offline, 1.37× online), which our
run is not held to: the paper's baselines are other systems (DistServe's
disaggregated prefill and decode, UELLM) on a padding batcher, ours is the same
engine with a length-blind queue, where vLLM's paged cache does not pad.

Where the paper gives no number the scenario chooses, and says so here:
Alpaca-like requests are lognormal with mean prompt 20 and output 65 tokens,
LongBench-like ones mean prompt 2,000 and output 150 tokens (the prompts cut to
the model's 4,096-token context), both with a coefficient of variation of 0.5;
Mixed is half of each, Poisson arrivals; the SLO is TTFT ≤ 2 s and TPOT ≤ 0.1 s
(DistServe's TPOT target for a 13B chatbot, with a TTFT loose enough for the long
prompts); the model is Llama-2-7B (the simulator has no 13B table).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from tuned import config as config_mod
from tuned.bench.metrics import Slo, capacity_search, summarize
from tuned.bench.papers.pang import lognormal
from tuned.bench.runner import results_from_sim
from tuned.sim.hardware import gpu_hardware
from tuned.workloads import RequestSpec, parse_workload

HARDWARE = "a100-llama2-7b"
MAX_MODEL_LEN = 4096
#: (prompt mean, output mean) tokens of the two datasets' stand-ins
ALPACA = (20.0, 65.0)
LONGBENCH = (2000.0, 150.0)
SLO = Slo(ttft_s=2.0, tpot_s=0.1)
ATTAINMENT_TARGET = 0.8

#: Fig. 5: BucketServe over its baselines
PAPER = {"offline_throughput_vs_distserve": 1.31, "offline_throughput_vs_uellm": 3.58,
         "online_rps_at_80_alpaca": 1.37, "online_rps_at_80_mixed": 1.93}

QUICK = {"offline_requests": 300, "online_requests": 400}
FULL = {"offline_requests": 1000, "online_requests": 1500}

CONTENDERS = {"fcfs": ("fcfs", {}),
              "bucket-offline": ("bucket", {"mode": "offline_ljf"}),
              "bucket-online": ("bucket", {"mode": "online"})}


def mixed_requests(n: int, seed: int, rate: float = 1.0) -> list[RequestSpec]:
    """Half Alpaca-like, half LongBench-like requests (alternating draws), Poisson at
    ``rate`` overall, ids in arrival order."""
    parts = []
    for k, (p, o) in enumerate((ALPACA, LONGBENCH)):
        spec = (f"poisson:rate={rate / 2:g},prompt={lognormal(p)},output={lognormal(o)},"
                f"n={(n + 1 - k) // 2}")
        parts.extend(parse_workload(spec, seed * 2 + k, max_model_len=MAX_MODEL_LEN).requests)
    parts.sort(key=lambda r: (r.arrival_s, r.prompt_tokens))
    return [dataclasses.replace(r, request_id=f"r{i:06d}") for i, r in enumerate(parts)]


def _config(hw, policy: str, options: dict) -> config_mod.Config:
    return config_mod.validate({
        "max_num_seqs": hw.vllm_default_max_num_seqs,
        "max_num_batched_tokens": hw.vllm_default_max_num_batched_tokens,
        "max_model_len": MAX_MODEL_LEN, "log_level": "warning", "batch_policy": "static",
        "token_budget_policy": "max", "b_max": 0, "fallback_cap": 4,
        "queue_policy": policy, "queue_options": dict(options)})


def offline_part(seed: int, n: int, data_dir: Path | None = None) -> dict:
    """(a): every request at t = 0; generated tokens per second over the makespan."""
    from tuned.engines.sim import simulate

    hw = gpu_hardware(HARDWARE, data_dir)
    reqs = [dataclasses.replace(r, arrival_s=0.0) for r in mixed_requests(n, seed)]
    runs = {}
    for name in ("fcfs", "bucket-offline"):
        policy, opts = CONTENDERS[name]
        s = summarize(results_from_sim(simulate(_config(hw, policy, opts), hw, reqs)), SLO)
        runs[name] = {k: s.get(k) for k in ("output_tok_s", "duration_s", "completed",
                                            "preemptions", "ttft_mean_s", "e2el_mean_s")}
    base = runs["fcfs"]["output_tok_s"]
    return {"runs": runs, "ratio": runs["bucket-offline"]["output_tok_s"] / base
            if base else None, "requests": n}


def online_part(seed: int, n: int, data_dir: Path | None = None) -> dict:
    """(b): the highest Poisson rate with ≥ 80 % of requests within the SLO."""
    from tuned.engines.sim import simulate

    hw = gpu_hardware(HARDWARE, data_dir)
    reqs = mixed_requests(n, seed)
    last = reqs[-1].arrival_s or 1.0
    base_rate = (len(reqs) - 1) / last
    runs = {}
    for name in ("fcfs", "bucket-online"):
        policy, opts = CONTENDERS[name]
        cfg = _config(hw, policy, opts)

        def attainment(rate: float, cfg=cfg) -> float:
            scaled = [dataclasses.replace(r, arrival_s=r.arrival_s * base_rate / rate)
                      for r in reqs]
            s = summarize(results_from_sim(simulate(cfg, hw, scaled, record_steps=False)), SLO)
            return float(s["attainment"] or 0.0)

        runs[name] = capacity_search(attainment, 0.5, 4.0, target=ATTAINMENT_TARGET,
                                     tol_rel=0.03).as_dict()
    base = runs["fcfs"]["capacity_rps"]
    return {"runs": runs, "ratio": runs["bucket-online"]["capacity_rps"] / base
            if base else None, "requests": n, "slo": str(SLO), "target": ATTAINMENT_TARGET}


def run(seed: int = 0, *, quick: bool = False, data_dir: Path | None = None,
        cpu_clock: Callable[[], float] = time.process_time) -> dict:
    """Both parts on the Mixed workload; ``quick`` runs fewer requests."""
    plan = QUICK if quick else FULL
    began = cpu_clock()
    out = {"scenario": "bucketserve", "seed": seed, "quick": quick, "hardware": HARDWARE,
           "offline": offline_part(seed, plan["offline_requests"], data_dir),
           "online": online_part(seed, plan["online_requests"], data_dir), "paper": PAPER}
    out["checks"] = checks(out)
    out["cpu_s"] = cpu_clock() - began
    return out


def checks(result: dict) -> list[dict]:
    """The paper's direction: the bucket policy ahead of the length-blind queue. The
    paper reports single runs without a spread, so the direction is all a tolerance
    can be derived from."""
    out = []
    for part, figure, paper in (
            ("offline", "(a) offline throughput, bucket / fcfs",
             f"{PAPER['offline_throughput_vs_distserve']:g}x over DistServe"),
            ("online", "(b) load at 80% attainment, bucket / fcfs",
             f"{PAPER['online_rps_at_80_mixed']:g}x over DistServe")):
        r = result[part]["ratio"]
        out.append({"figure": f"{figure} (paper's direction)", "ours": r,
                    "target": f"> 1 (paper {paper})", "ok": r is not None and r > 1.0})
    return out


def _num(x, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def format_table(result: dict) -> str:
    from tuned.bench.papers import format_checks

    off, on = result["offline"], result["online"]
    lines = [f"bucketserve (seed 004, Fig. 5) on {result['hardware']}, Mixed workload, seed "
             f"{result['seed']}" + (" (quick)" if result["quick"] else ""),
             "figure | ours | paper"]
    for name, r in off["runs"].items():
        lines.append(f"(a) {name} output tok/s, {off['requests']} requests at t=0 | "
                     f"{_num(r['output_tok_s'])} ({r['preemptions']} preemptions) | —")
    lines.append(f"(a) throughput bucket / fcfs | {_num(off['ratio'], 3)} | "
                 f"{PAPER['offline_throughput_vs_distserve']:g} (vs DistServe), "
                 f"{PAPER['offline_throughput_vs_uellm']:g} (vs UELLM)")
    for name, r in on["runs"].items():
        lines.append(f"(b) {name} RPS at {on['target']:.0%} attainment ({on['slo']}) | "
                     f"{_num(r['capacity_rps'], 2)} | —")
    lines.append(f"(b) load bucket / fcfs | {_num(on['ratio'], 3)} | "
                 f"{PAPER['online_rps_at_80_mixed']:g} (Mixed), "
                 f"{PAPER['online_rps_at_80_alpaca']:g} (Alpaca), vs DistServe")
    lines.append(format_checks(result["checks"]))
    f, b = off["runs"]["fcfs"], off["runs"]["bucket-offline"]
    lines.append(f"note: ours is far below the paper's ratios because the baseline differs: "
                 f"the paper's are other systems on a padding batcher, where grouping lengths "
                 f"saves padded tokens; here both contenders run the same paged engine, "
                 f"which pads nothing, so the bucket policy wins only by ordering (offline: "
                 f"{f['preemptions']} preemptions under fcfs against {b['preemptions']}).")
    lines.append(f"CPU {result['cpu_s']:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":   # pragma: no cover
    print(format_table(run(quick=True)))
