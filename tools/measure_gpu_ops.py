"""Measure a GPU's per-operator times for the simulator's step model (tuned.sim.gpu).

Run on a machine with a CUDA GPU and PyTorch (vLLM not needed):

    python3 tools/measure_gpu_ops.py --out DIR [--models llama2-7b,qwen2.5-coder-3b]

It writes, for each model shape (random bf16 weights, nothing downloaded):

* ``ops.csv``: per-layer operator medians in Vidur's ``mlp.csv`` columns
  (tuned.sim.gpu.PROFILE_COLUMNS) by token count, one row per (model, tokens);
* ``attention.csv``: decode attention per layer, ms, by (requests, context per
  request), and causal prefill attention per layer by prompt tokens;
* ``steps.csv``: whole decode steps of the full model (every layer, final norm,
  lm_head and greedy sampling) by (requests, context), to check that the sum of the
  operators (the simulator's composition) gives the step;
* ``meta.json``: GPU, clocks, library versions, method.

Method: each timing captures ``REPS`` calls of the operator in one CUDA graph (as vLLM
runs decode steps) and replays it; the figure is the median over ``REPLAYS`` replays,
divided by ``REPS``. Each call in a graph reads its own copy of the weights (and of the
KV cache), so that replays do not find them in L2, as no layer of a real step does.
Operators are PyTorch's own (``F.linear``, ``F.rms_norm``,
``F.scaled_dot_product_attention`` on a contiguous cache), not vLLM's fused and paged
kernels: the GEMMs are the same cuBLAS calls; norms, rotary and activation are unfused.

Without CUDA (``--device cpu``) it runs the same code with wall-clock timing and tiny
grids: a check of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

#: model shapes: hidden, layers, heads, KV heads, MLP width, vocabulary (config.json of each)
MODELS = {
    # meta-llama/Llama-2-7b-hf; vocab as Vidur's tables (32768, padded)
    "llama2-7b": dict(n_embd=4096, num_layers=32, n_head=32, n_kv_head=32, inter=11008,
                      vocab_size=32768, tied=False),
    # Qwen/Qwen2.5-Coder-3B (3.09B parameters, tied embeddings)
    "qwen2.5-coder-3b": dict(n_embd=2048, num_layers=36, n_head=16, n_kv_head=2, inter=11008,
                             vocab_size=151936, tied=True),
    # Qwen/Qwen2.5-Coder-1.5B (1.54B parameters, tied embeddings)
    "qwen2.5-coder-1.5b": dict(n_embd=1536, num_layers=28, n_head=12, n_kv_head=2, inter=8960,
                               vocab_size=151936, tied=True),
}
OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
       "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
TOKENS = ([1, 2, 4] + list(range(8, 257, 8)) + list(range(288, 1025, 32))
          + list(range(1152, 4097, 128)))
DECODE_REQUESTS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
DECODE_CONTEXTS = (32, 128, 256, 512, 1024, 2048, 4096)
DECODE_MAX_KV_TOKENS = 256 * 2048
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096)
STEP_REQUESTS = (1, 4, 16, 32, 64, 128)
STEP_CONTEXTS = (256, 1024, 4096)
STEP_MAX_KV_TOKENS = 128 * 1024
REPS = 20
REPLAYS = 7
L2_FLUSH_BYTES = 256 * 2**20
DT = torch.bfloat16


class Timer:
    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, calls) -> float:
        """Median ms of one call; ``calls`` is a list of zero-argument callables run in order."""
        if not self.cuda:
            for c in calls:
                c()
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                for c in calls:
                    c()
                times.append((time.perf_counter() - t0) * 1e3 / len(calls))
            return statistics.median(times)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for c in calls:
                c()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for c in calls:
                c()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPLAYS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            g.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / len(calls))
        del g
        return statistics.median(times)


def copies(nbytes: int, reps: int) -> int:
    """How many copies of a tensor of ``nbytes`` keep ``reps`` calls out of L2."""
    return max(1, min(reps, math.ceil(L2_FLUSH_BYTES / max(1, nbytes))))


def rand(*shape, device):
    return torch.randn(*shape, device=device, dtype=DT) * 0.02


def rope(t, cos, sin):
    half = t.shape[-1] // 2
    rot = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos + rot * sin


def measure_ops(name, m, tokens, timer, device, reps, log):
    h, nh, nkv, inter, vocab = m["n_embd"], m["n_head"], m["n_kv_head"], m["inter"], m["vocab_size"]
    hd = h // nh
    qkv_out = (nh + 2 * nkv) * hd
    weights = {
        "attn_pre_proj": (qkv_out, h), "attn_post_proj": (h, nh * hd),
        "mlp_up_proj": (2 * inter, h), "mlp_down_proj": (h, inter),
    }
    w = {op: [rand(*shape, device=device) for _ in range(copies(2 * shape[0] * shape[1], reps))]
         for op, shape in weights.items()}
    emb = rand(vocab, h, device=device)
    norm_w = torch.ones(h, device=device, dtype=DT)
    rows = []
    for n in tokens:
        x = rand(n, h, device=device)
        y = rand(n, h, device=device)
        ids = torch.randint(0, vocab, (n,), device=device)
        q = rand(n, nh, hd, device=device)
        k = rand(n, nkv, hd, device=device)
        cos = rand(n, 1, hd, device=device)
        sin = rand(n, 1, hd, device=device)
        a = rand(n, nh * hd, device=device)
        gu = rand(n, 2 * inter, device=device)
        act = rand(n, inter, device=device)

        def lin(op, inp):
            ws = w[op]
            return [lambda i=i: F.linear(inp, ws[i % len(ws)]) for i in range(reps)]

        calls = {
            "emb": [lambda: F.embedding(ids, emb)] * reps,
            "input_layernorm": [lambda: F.rms_norm(x, (h,), norm_w, 1e-6)] * reps,
            "attn_pre_proj": lin("attn_pre_proj", x),
            "attn_rope": [lambda: (rope(q, cos, sin), rope(k, cos, sin))] * reps,
            "attn_post_proj": lin("attn_post_proj", a),
            "post_attention_layernorm": [lambda: F.rms_norm(y, (h,), norm_w, 1e-6)] * reps,
            "mlp_up_proj": lin("mlp_up_proj", x),
            "mlp_act": [lambda: F.silu(gu[:, :inter]) * gu[:, inter:]] * reps,
            "mlp_down_proj": lin("mlp_down_proj", act),
            "add": [lambda: x + y] * reps,
        }
        row = {"model": name, "num_tensor_parallel_workers": 1, "num_tokens": n, "n_head": nh,
               "n_kv_head": nkv, "n_embd": h, "vocab_size": vocab}
        for op in OPS:
            row[f"time_stats.{op}.median"] = round(timer(calls[op]), 5)
        rows.append(row)
    log(f"{name}: ops at {len(tokens)} token counts; 1 token "
        f"{sum(rows[0][f'time_stats.{op}.median'] for op in OPS[1:]):.4f} ms/layer, "
        f"{tokens[-1]} tokens {sum(rows[-1][f'time_stats.{op}.median'] for op in OPS[1:]):.4f}")
    return rows


def measure_attention(name, m, requests, contexts, max_kv, prefill, timer, device, reps, log):
    h, nh, nkv = m["n_embd"], m["n_head"], m["n_kv_head"]
    hd, g = h // nh, nh // nkv
    rows = []
    for b in requests:
        for ctx in contexts:
            if b * ctx > max_kv:
                continue
            q = rand(b, nkv, g, hd, device=device)
            nbytes = 2 * b * nkv * ctx * hd * 2
            kvs = [(rand(b, nkv, ctx, hd, device=device), rand(b, nkv, ctx, hd, device=device))
                   for _ in range(copies(nbytes, reps))]
            calls = [lambda i=i: F.scaled_dot_product_attention(q, *kvs[i % len(kvs)])
                     for i in range(reps)]
            rows.append({"model": name, "kind": "decode", "num_decode": b, "context": ctx,
                         "prefill_tokens": 0, "ms_per_layer": round(timer(calls), 5)})
            del kvs
    for n in prefill:
        q = rand(1, nh, n, hd, device=device)
        k = rand(1, nkv, n, hd, device=device)
        v = rand(1, nkv, n, hd, device=device)
        calls = [lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                        enable_gqa=True)] * reps
        rows.append({"model": name, "kind": "prefill", "num_decode": 0, "context": 0,
                     "prefill_tokens": n, "ms_per_layer": round(timer(calls), 5)})
    log(f"{name}: {len(rows)} attention timings")
    return rows


def measure_steps(name, m, requests, contexts, max_kv, timer, device, log):
    """Whole decode steps: every layer with its own weights and KV cache."""
    h, L, nh, nkv = m["n_embd"], m["num_layers"], m["n_head"], m["n_kv_head"]
    inter, vocab = m["inter"], m["vocab_size"]
    hd, g = h // nh, nh // nkv
    layers = [dict(ln1=torch.ones(h, device=device, dtype=DT),
                   ln2=torch.ones(h, device=device, dtype=DT),
                   qkv=rand((nh + 2 * nkv) * hd, h, device=device),
                   o=rand(h, nh * hd, device=device),
                   gu=rand(2 * inter, h, device=device),
                   down=rand(h, inter, device=device)) for _ in range(L)]
    emb = rand(vocab, h, device=device)
    head = emb if m["tied"] else rand(vocab, h, device=device)
    final_norm = torch.ones(h, device=device, dtype=DT)
    rows = []
    for ctx in contexts:
        for b in requests:
            if b * ctx > max_kv:
                continue
            kv_bytes = 2 * L * b * nkv * ctx * hd * 2
            if device == "cuda" and kv_bytes > 0.7 * torch.cuda.mem_get_info()[0]:
                log(f"{name}: decode step b={b} ctx={ctx}: skipped, its KV cache "
                    f"({kv_bytes / 2**30:.1f} GiB) does not fit beside the weights")
                continue
            ids = torch.randint(0, vocab, (b,), device=device)
            cos = rand(b, 1, hd, device=device)
            sin = rand(b, 1, hd, device=device)
            cache = [(rand(b, nkv, ctx, hd, device=device), rand(b, nkv, ctx, hd, device=device))
                     for _ in range(L)]

            def step():
                x = F.embedding(ids, emb)
                for lw, (kc, vc) in zip(layers, cache):
                    r = x
                    x = F.rms_norm(x, (h,), lw["ln1"], 1e-6)
                    qkv = F.linear(x, lw["qkv"])
                    q = qkv[:, :nh * hd].view(b, nh, hd)
                    k = qkv[:, nh * hd:(nh + nkv) * hd].view(b, nkv, hd)
                    q, k = rope(q, cos, sin), rope(k, cos, sin)
                    kc[:, :, -1] = k
                    vc[:, :, -1] = qkv[:, (nh + nkv) * hd:].view(b, nkv, hd)
                    att = F.scaled_dot_product_attention(q.view(b, nkv, g, hd), kc, vc)
                    x = r + F.linear(att.reshape(b, nh * hd), lw["o"])
                    r = x
                    x = F.rms_norm(x, (h,), lw["ln2"], 1e-6)
                    gu = F.linear(x, lw["gu"])
                    x = r + F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], lw["down"])
                x = F.rms_norm(x, (h,), final_norm, 1e-6)
                return torch.argmax(F.linear(x, head), dim=-1)

            ms = timer([step])
            rows.append({"model": name, "num_decode": b, "context": ctx, "ms": round(ms, 4)})
            log(f"{name}: decode step b={b} ctx={ctx}: {ms:.3f} ms")
            del cache
    del layers
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--skip-steps", action="store_true")
    args = ap.parse_args(argv)
    names = [s for s in args.models.split(",") if s]
    for n in names:
        if n not in MODELS:
            ap.error(f"--models: unknown {n!r}; known: {', '.join(MODELS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    device = args.device
    started = time.time()

    def log(msg):
        print(f"[{time.time() - started:7.1f} s] {msg}", flush=True)

    shapes = {n: MODELS[n] for n in names}
    if device == "cuda":
        grid = dict(tokens=TOKENS, requests=DECODE_REQUESTS, contexts=DECODE_CONTEXTS,
                    max_kv=DECODE_MAX_KV_TOKENS, prefill=PREFILL_TOKENS, reps=REPS,
                    step_requests=STEP_REQUESTS, step_contexts=STEP_CONTEXTS,
                    step_max_kv=STEP_MAX_KV_TOKENS)
        props = torch.cuda.get_device_properties(0)
        gpu = {"name": props.name, "multiprocessors": props.multi_processor_count,
               "memory_bytes": props.total_memory, "cuda": torch.version.cuda}
    else:  # a check of the script only
        shapes = {n: dict(m, num_layers=2) for n, m in shapes.items()}
        grid = dict(tokens=[1, 8, 64], requests=(1, 4), contexts=(32, 64), max_kv=256,
                    prefill=(64,), reps=2, step_requests=(1, 4), step_contexts=(32,),
                    step_max_kv=256)
        gpu = {"name": "cpu (script check, not a measurement)"}
    timer = Timer(device)
    meta = {"gpu": gpu, "torch": torch.__version__, "python": platform.python_version(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "method": __doc__.split("\n\n", 3)[2:4], "reps_per_graph": grid["reps"],
            "replays": REPLAYS, "l2_flush_bytes": L2_FLUSH_BYTES,
            "models": shapes, "grid": {k: list(v) if isinstance(
                v, (list, tuple)) else v for k, v in grid.items()}}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2))
    ops, att, steps = [], [], []
    for name, m in shapes.items():
        ops += measure_ops(name, m, grid["tokens"], timer, device, grid["reps"], log)
        write_csv(args.out / "ops.csv", ops)
        att += measure_attention(name, m, grid["requests"], grid["contexts"], grid["max_kv"],
                                 grid["prefill"], timer, device, grid["reps"], log)
        write_csv(args.out / "attention.csv", att)
        if device == "cuda":
            torch.cuda.empty_cache()
    if not args.skip_steps:
        for name, m in shapes.items():
            steps += measure_steps(name, m, grid["step_requests"],
                                   grid["step_contexts"], grid["step_max_kv"], timer, device, log)
            write_csv(args.out / "steps.csv", steps)
            if device == "cuda":
                torch.cuda.empty_cache()
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
