"""Side-by-side: scheduler CPU time per step, vLLM's ``Scheduler`` vs tuned's subclass.

``tools/bench_overhead.py`` times whole engine steps, where the model's forward pass
dominates and run-to-run noise (several percent on a shared 2-core host) hides
anything under about 1%. This script isolates what tuned adds: both schedulers are
built from the same vLLM config objects with a fake KV-cache config (as the contract
tests do), the same request set is driven through ``schedule()`` and
``update_from_output()`` with fake model outputs, and the wall time of those two
calls is summed per step. tuned's controller thread ticks and its metrics endpoint
is up, as in production; its cap is pinned at the ceiling so both schedulers make
the same steps. Rounds alternate which scheduler goes first.

    .venv/bin/python tools/bench_hook.py [--batch 32] [--rounds 7] [--step-ms 14.1]

It prints the per-step scheduler time of each, the difference (tuned's added cost
per step), and that difference as a share of a model step of ``--step-ms``
milliseconds (default: the small demo model's measured decode step at batch 1 on
this kind of host, the smallest step and therefore the worst case).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = 16


def build(model: str, tuned: bool, n: int, num_blocks: int, max_tokens: int):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec)
    from vllm.v1.structured_output import StructuredOutputManager

    from tuned import config
    from tuned.serve import additional_config

    extra = {}
    kw = {}
    if tuned:
        cfg = config.validate({"max_num_seqs": n, "max_num_batched_tokens": 2048,
                               "max_model_len": max_tokens, "b_min": n, "b_max": n,
                               "fallback_cap": n, "metrics_port": 0, "interval_s": 0.5})
        extra = additional_config(cfg)
        kw["scheduler_cls"] = "tuned.engines.vllm.TunedScheduler"
    sc = SchedulerConfig(max_num_seqs=n, max_num_batched_tokens=2048, max_model_len=max_tokens,
                         enable_chunked_prefill=True, is_encoder_decoder=False, **kw)
    vc = VllmConfig(scheduler_config=sc,
                    model_config=ModelConfig(model=model, dtype="float32", seed=0,
                                             skip_tokenizer_init=True),
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False),
                    additional_config=extra)
    vc.cache_config.num_gpu_blocks = num_blocks
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=32, dtype=torch.float32))])
    cls = vc.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=vc, kv_cache_config=kv,
               structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)


def run_round(s, tag: str, n: int, prompt: int, out_tokens: int) -> tuple[float, int]:
    """Drive n requests to completion; return (scheduler seconds, steps)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    for i in range(n):
        s.add_request(Request(request_id=f"{tag}-{i}", prompt_token_ids=[10 + i % 50] * prompt,
                              sampling_params=SamplingParams(max_tokens=out_tokens,
                                                             ignore_eos=True),
                              pooling_params=None))
    spent = 0.0
    steps = 0
    pc = time.perf_counter
    while s.has_requests():
        t0 = pc()
        so = s.schedule()
        t1 = pc()
        ids = list(so.num_scheduled_tokens)
        reqs = s.requests
        out = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[] if reqs[r].is_prefill_chunk else [7] for r in ids])
        t2 = pc()
        s.update_from_output(so, out)
        spent += (t1 - t0) + (pc() - t2)
        steps += 1
    return spent, steps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo:tiny",
                    help="model folder or demo:<size>; only its config is read")
    ap.add_argument("--model-cache", default=str(Path.home() / ".cache" / "tuned" / "models"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--step-ms", type=float, default=14.1,
                    help="model step time the added cost is compared with (ms)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from tuned.demo_model import resolve_model

    model = str(resolve_model(args.model, Path(args.model_cache), log=print))
    n = args.batch
    per_req = -(-(args.prompt_tokens + args.output_tokens) // BLOCK)
    blocks = n * per_req + 8
    max_len = args.prompt_tokens + args.output_tokens
    scheds = {"vllm": build(model, False, n, blocks, max_len),
              "tuned": build(model, True, n, blocks, max_len)}
    for name, s in scheds.items():  # warm-up
        run_round(s, f"warm-{name}", n, args.prompt_tokens, 8)

    per_step = {"vllm": [], "tuned": []}
    print(f"{n} requests x ({args.prompt_tokens} prompt + {args.output_tokens} output) "
          f"tokens per round, {args.rounds} rounds")
    print(f"{'round':>5s} {'vLLM us/step':>13s} {'tuned us/step':>14s} {'added us':>9s}")
    for r in range(args.rounds):
        order = ["vllm", "tuned"] if r % 2 == 0 else ["tuned", "vllm"]
        for name in order:
            gc.collect()
            spent, steps = run_round(scheds[name], f"{name}-{r}", n, args.prompt_tokens,
                                     args.output_tokens)
            per_step[name].append(spent / steps * 1e6)
        print(f"{r:5d} {per_step['vllm'][-1]:13.1f} {per_step['tuned'][-1]:14.1f} "
              f"{per_step['tuned'][-1] - per_step['vllm'][-1]:9.1f}", flush=True)
    steps_seen = scheds["tuned"].steps.next_seq
    scheds["tuned"].shutdown()

    base = statistics.median(per_step["vllm"])
    tun = statistics.median(per_step["tuned"])
    added = statistics.median(t - b for t, b in zip(per_step["tuned"], per_step["vllm"]))
    print(f"\nscheduler time per step (median): vLLM {base:.1f} us, tuned {tun:.1f} us")
    print(f"tuned's added cost per step: {added:.1f} us "
          f"({100 * added / base:+.1f}% of the scheduler's own time)")
    print(f"as a share of a {args.step_ms:g} ms model step: "
          f"{100 * added / (args.step_ms * 1e3):.3f}%")
    fb, ft = min(per_step["vllm"]), min(per_step["tuned"])
    print(f"fastest round: vLLM {fb:.1f} us, tuned {ft:.1f} us, added {ft - fb:.1f} us "
          f"= {100 * (ft - fb) / (args.step_ms * 1e3):.3f}% of a {args.step_ms:g} ms step")
    print(f"(tuned recorded {steps_seen} steps in its ring)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
