"""Side-by-side: mean engine step time with vLLM's scheduler vs tuned's subclass.

Two engines live in this process, the same model and workload on each: one with
vLLM's own ``Scheduler``, one with ``tuned.engines.vllm.TunedScheduler`` (controller
ticking, metrics endpoint up, step and finished-request rings filled). tuned's cap is
pinned at the ceiling (b_min = b_max = max_num_seqs) so both engines schedule the
same steps and only tuned's own cost differs. Rounds alternate which engine goes
first; every round times one ``generate`` of the same batch on each.

    .venv/bin/python tools/bench_overhead.py [--model demo:small] [--rounds 16]
        [--first vllm|tuned] [--control]

Prints each round, the mean step time of each engine, and tuned's overhead in
percent (the median of the per-round ratios, and the ratio of the totals).

Two engines on two cores are not interchangeable: which one is built first
changes its step time on its own, by as much as the overhead looked for. ``--first`` picks the build
order, and ``--control`` replaces tuned's engine with a second plain vLLM engine
(an A/A run) to measure that bias; compare runs with both orders, or read
``tools/bench_hook.py``, which times the scheduler alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo:small")
    ap.add_argument("--model-cache", default=str(Path.home() / ".cache" / "tuned" / "models"))
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16, help="requests per generate (= max_num_seqs)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--first", choices=["vllm", "tuned"], default="vllm",
                    help="which engine to build first")
    ap.add_argument("--control", action="store_true",
                    help="A/A run: the 'tuned' engine is a second plain vLLM engine")
    args = ap.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    sys.path.insert(0, str(ROOT))
    from vllm import LLM, SamplingParams

    from tuned import config
    from tuned.base.demo_model import resolve_model
    from tuned.launch.serve import additional_config

    model = str(resolve_model(args.model, Path(args.model_cache), log=print))
    n = args.batch
    cfg = config.validate({
        "max_num_seqs": n, "max_num_batched_tokens": 2048, "max_model_len": 1024,
        "b_min": n, "b_max": n, "fallback_cap": n, "metrics_port": 0, "interval_s": 0.5})
    common = dict(max_num_seqs=n, max_num_batched_tokens=2048, max_model_len=1024,
                  enforce_eager=True, seed=0)
    tuned_kw = ({} if args.control else
                dict(scheduler_cls="tuned.engines.vllm.TunedScheduler",
                     additional_config=additional_config(cfg)))
    engines = {}
    for name in (("vllm", "tuned") if args.first == "vllm" else ("tuned", "vllm")):
        print(f"starting engine: {name}"
              + (" (control: plain vLLM)" if name == "tuned" and args.control else ""),
              flush=True)
        engines[name] = LLM(model=model, **common, **(tuned_kw if name == "tuned" else {}))
    base, tuned = engines["vllm"], engines["tuned"]

    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(10, 1000) for _ in range(args.prompt_tokens)]}
               for _ in range(n)]
    sp = SamplingParams(max_tokens=args.output_tokens, ignore_eos=True, temperature=0.0)
    # one decode step per output token after the prefill step (the batch fits one step)
    steps = args.output_tokens
    for llm in (base, tuned):  # warm-up
        llm.generate(prompts[:2], SamplingParams(max_tokens=8, ignore_eos=True),
                     use_tqdm=False)

    walls = {"vllm": [], "tuned": []}
    print(f"\n{n} requests x ({args.prompt_tokens} prompt + {args.output_tokens} output) "
          f"tokens per round, {args.rounds} rounds; built first: {args.first}"
          + ("; CONTROL (A/A): both engines are plain vLLM" if args.control else ""))
    print(f"{'round':>5s} {'vLLM s':>8s} {'tuned s':>8s} {'ratio':>7s}")
    for r in range(args.rounds):
        order = [("vllm", base), ("tuned", tuned)]
        if r % 2:
            order.reverse()
        for name, llm in order:
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            walls[name].append(time.perf_counter() - t0)
            assert sum(len(o.outputs[0].token_ids) for o in outs) == n * args.output_tokens
        print(f"{r:5d} {walls['vllm'][-1]:8.3f} {walls['tuned'][-1]:8.3f} "
              f"{walls['tuned'][-1] / walls['vllm'][-1]:7.4f}", flush=True)

    ratios = [t / b for t, b in zip(walls["tuned"], walls["vllm"])]
    mean_b = sum(walls["vllm"]) / len(walls["vllm"]) / steps * 1e3
    mean_t = sum(walls["tuned"]) / len(walls["tuned"]) / steps * 1e3
    print(f"\nmean step time  vLLM Scheduler: {mean_b:.3f} ms   tuned: {mean_t:.3f} ms")
    print(f"tuned overhead: median of round ratios {100 * (statistics.median(ratios) - 1):+.2f}%, "
          f"ratio of totals {100 * (sum(walls['tuned']) / sum(walls['vllm']) - 1):+.2f}%")
    print(f"round-to-round spread of vLLM alone: "
          f"{100 * statistics.pstdev(walls['vllm']) / statistics.mean(walls['vllm']):.2f}% (stdev/mean)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
