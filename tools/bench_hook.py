"""Side-by-side: scheduler CPU time per step, vLLM's ``Scheduler`` vs tuned's subclass.

``tools/bench_overhead.py`` times whole engine steps, where the model's forward pass
dominates and run-to-run noise on a shared host hides an overhead as small as
tuned's. This script isolates what tuned adds: both schedulers are
built from the same vLLM config objects with a fake KV-cache config (as the contract
tests do), the same request set is driven through ``schedule()`` and
``update_from_output()`` with fake model outputs, and the wall time of those two
calls is summed per step. tuned's controller thread ticks and its metrics endpoint
is up, as in production; its cap is pinned at the ceiling so both schedulers make
the same steps. Rounds alternate which scheduler goes first.

    .venv/bin/python tools/bench_hook.py [--batch 32] [--rounds 7] [--step-ms 14.1]

It prints the per-step scheduler time of each, the difference (tuned's added cost
per step), and that difference as a share of a model step of ``--step-ms``
milliseconds (default: about the small demo model's decode step at batch 1 on a
CPU host, the smallest step and therefore the worst case).

    .venv/bin/python tools/bench_hook.py --queue-waiting 10000 100000 [--queue-steps 200]

measures tuned's waiting queue alone (no vLLM, no model) with that many requests
waiting, as under a sustained overload: fcfs with a TTFT target (``late_after_s``),
with and without the admission guard's step model, each step one request arriving,
one admitted and one finishing, so the waiting count holds and a request turns late
every step (the order is recomputed every step). Per step it times what the
scheduler's thread spends in the queue (``begin_step``, the gate, ``pop_request``,
``add_request``, ``request_finished``), with the tiers kept incrementally (now) and
with the full re-sort (``policy.order`` over every waiting request, as before),
side by side.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
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
    from tuned.launch.serve import additional_config

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
                                             max_model_len=max_tokens,
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


@dataclass
class QueuedReq:
    """What tuned's queue reads of a request (tuned.core.queue.QueuedRequest)."""

    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    num_output_tokens: int = 0
    priority: int = 0


def queue_scale(waiting: int, steps: int, incremental: bool, model, seed: int = 0,
                step_s: float = 0.05, ttft_s: float = 2.0) -> list[float]:
    """Seconds per step spent in tuned's queue with ``waiting`` requests waiting."""
    import random

    from tuned.core.queue import QueueCore
    from tuned.policies.fcfs import FCFSPolicy
    from tuned.core.queue_policy import AdmitContext

    rng = random.Random(seed)
    q = QueueCore(FCFSPolicy(late_after_s=ttft_s), clock=lambda: 0.0)
    if not incremental:
        q._live = None          # the full re-sort of every waiting request, as before
    now = 1000.0
    n = 0

    def arrive(t: float) -> None:
        nonlocal n
        q.add_request(QueuedReq(f"q{n}", t, rng.randint(16, 1024), 256))
        n += 1

    # the backlog: one arrival every step_s, most of it long past its TTFT
    for i in range(waiting):
        arrive(now - (waiting - i) * step_s)
    running: list[QueuedReq] = []
    out: list[float] = []
    pc = time.perf_counter
    for k in range(steps + 20):
        now += step_s
        ctx = AdmitContext(now_s=now, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 19,
                           cap=64, step_model=model, token_budget=2048)
        t0 = pc()
        q.begin_step(ctx, running)
        if q:
            q.peek_request()
            running.append(q.pop_request())
        arrive(now)
        if len(running) > 32:
            done = running.pop(0)
            done.num_output_tokens = 100
            q.request_finished(done, learn=True)
        if k >= 20:              # after a warm-up
            out.append(pc() - t0)
    return out


def queue_main(sizes: list[int], steps: int) -> int:
    sys.path.insert(0, str(ROOT))
    from tuned.curves.online import LinearStepModel

    # a GPU-shaped T(b, c) (seconds): its size does not change the cost measured
    model = LinearStepModel(a=0.015, beta=0.0002, gamma=0.00005)
    print(f"tuned's waiting queue, fcfs with late_after_s = 2 s: one arrival, one "
          f"admission, one finish per step; {steps} steps after 20 of warm-up")
    print(f"{'waiting':>8s} {'step model':>10s} {'full sort us/step':>18s} "
          f"{'incremental us/step':>20s} {'ratio':>7s} {'incr. p99 us':>13s}")
    for size in sizes:
        for label, m in (("none", None), ("linear", model)):
            gc.collect()
            full = queue_scale(size, steps, False, m)
            gc.collect()
            inc = queue_scale(size, steps, True, m)
            fm, im = statistics.median(full) * 1e6, statistics.median(inc) * 1e6
            p99 = sorted(inc)[int(0.99 * (len(inc) - 1))] * 1e6
            print(f"{size:8d} {label:>10s} {fm:18.1f} {im:20.1f} {fm / im:7.1f} "
                  f"{p99:13.1f}", flush=True)
    return 0


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
    ap.add_argument("--queue-waiting", type=int, nargs="+", default=None, metavar="N",
                    help="measure tuned's waiting queue alone at these waiting counts "
                         "(no vLLM) instead of the scheduler comparison")
    ap.add_argument("--queue-steps", type=int, default=200,
                    help="steps measured per waiting count with --queue-waiting")
    args = ap.parse_args()
    if args.queue_waiting:
        bad = [n for n in args.queue_waiting if n < 1]
        if bad or args.queue_steps < 1:
            ap.error(f"--queue-waiting and --queue-steps must be >= 1, got "
                     f"{bad or args.queue_steps}")
        return queue_main(args.queue_waiting, args.queue_steps)
    sys.path.insert(0, str(ROOT))
    from tuned.base.demo_model import resolve_model

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
