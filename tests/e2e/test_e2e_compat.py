"""vLLM 0.32 serving features with tuned inside, on the real CPU engine: each one
gives the same answers as the same vLLM without tuned (docs/compatibility.md lists
them with these tests).

One module-scoped pair of servers with the same engine arguments, started one after
the other (only one engine runs at a time): plain vLLM's OpenAI server, then
``tuned serve`` with the same settings (tuned's scheduler inside, cap held at
``max_num_seqs`` by ``b_min = b_max = fallback_cap`` so that vLLM's own preemption is
exercised). Both run with prefix caching, LoRA (a tiny random adapter built here,
without peft) and ngram speculative decoding (vLLM refuses ngram with
``--async-scheduling``; async scheduling is in test_e2e_priority). Every feature's requests are sent to each server and the answers
compared: alone, one at a time, wherever the output must be identical (then both
engines compute the very same batches); under concurrency (preemption, aborts) the
batches depend on timing, so what is compared is the outcome: counts, lengths,
finish reasons, every request answered, the engine idle and its KV cache empty after.

The engine dtype is float32 (``TUNED_TEST_DTYPE``) for both servers.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from serve_harness import DTYPE_ENV, dtype_args, get_json, get_text, tuned_serve
from serve_harness import parse_metric_values, wait_for
from tuned.launch import launcher
from tuned.base.netutil import free_port

pytestmark = [pytest.mark.slow, pytest.mark.parallel, pytest.mark.timeout(1500)]

MAX_NUM_SEQS = 4
BUDGET = 40             # tokens per step: a 2000-token prompt prefills over 50 steps or more
MAX_MODEL_LEN = 2048
BLOCKS = 24             # CPU blocks of 128 tokens: 23 usable (2944 tokens)
LONG_PROMPT = 2000      # the mid-prefill abort's prompt
PREEMPT_TOKENS = 1400   # 200 + 1400 tokens: 13 blocks of 128
FILL_TOKENS = 600       # a filler's 20 + 600 tokens hold 5 blocks: four fit (20 of 23)
WAITING_TRIES = 3       # a try whose abort crossed to the engine after the runner went on
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
         "prompt_lookup_min": 2}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def build_tiny_lora(model: Path, out: Path, rank: int = 8) -> Path:
    """A peft-format LoRA adapter for the demo model (q_proj and v_proj of every
    layer), random and seeded, large enough to change the greedy output."""
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model / "config.json").read_text())
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads) * cfg.get("head_dim", h // heads)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for proj, out_dim in (("q_proj", h), ("v_proj", kv)):
            pre = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{pre}.lora_A.weight"] = torch.randn(rank, h, generator=g) * 0.5
            tensors[f"{pre}.lora_B.weight"] = torch.randn(out_dim, rank, generator=g) * 0.5
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": ["q_proj", "v_proj"], "modules_to_save": None,
        "base_model_name_or_path": str(model)}))
    return out


def engine_args(lora: Path) -> list[str]:
    return ["--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--enable-lora", "--lora-modules", f"tiny-lora={lora}", "--max-lora-rank", "8",
            "--max-loras", "1", "--speculative-config", json.dumps(NGRAM),
            "--enable-log-requests"]


# ---------------------------------------------------------------- servers
@dataclass
class Target:
    name: str
    base: str
    model: str
    steps: object = None       # tuned's /steps reader (tuned only)
    root_pid: int = 0          # the server's process: vLLM's worker is under it
    telemetry: object = None   # tuned's (running, waiting) reader (tuned only)
    log: Path | None = None

    def vllm_metrics(self) -> dict:
        return parse_metric_values(get_text(f"{self.base}/metrics"))

    def vllm_gauge(self, name: str) -> float:
        return sum(v for (n, _), v in self.vllm_metrics().items() if n == name)


def post(url: str, body: dict, timeout: float = 300.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def complete(t: Target, **body) -> tuple[int, dict]:
    body.setdefault("model", t.model)
    return post(f"{t.base}/v1/completions", body)


def chat(t: Target, **body) -> tuple[int, dict]:
    body.setdefault("model", t.model)
    return post(f"{t.base}/v1/chat/completions", body)


def prompt_ids(seed: int, n: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(10, 2000) for _ in range(n)]


# ---------------------------------------------------------------- what each feature sends
def run_sequential(t: Target) -> dict:
    """Every feature whose answer must be identical, each request alone."""
    out: dict = {}
    shared = prompt_ids(1, 300)
    # prefix caching: the same 300-token prefix twice, then with a different tail
    out["prefix"] = [complete(t, prompt=shared + prompt_ids(s, 8), max_tokens=12,
                              temperature=0) for s in (2, 2, 3)]
    # structured output: a regex through structured_outputs, a JSON schema and a
    # JSON object through the chat API's response_format
    out["regex"] = complete(t, prompt=prompt_ids(6, 12), max_tokens=20, temperature=0,
                            structured_outputs={"regex": REGEX})
    out["json_schema"] = chat(t, messages=[{"role": "user", "content": "a number"}],
                              max_tokens=40, temperature=0, response_format={
                                  "type": "json_schema",
                                  "json_schema": {"name": "n", "schema": SCHEMA}})
    out["json_object"] = chat(t, messages=[{"role": "user", "content": "json"}],
                              max_tokens=40, temperature=0,
                              response_format={"type": "json_object"})
    # ignore_eos / min_tokens
    out["ignore_eos"] = complete(t, prompt=prompt_ids(8, 16), max_tokens=40, temperature=0,
                                 ignore_eos=True)
    out["min_tokens"] = complete(t, prompt=prompt_ids(9, 16), max_tokens=40, temperature=0,
                                 min_tokens=25, stop_token_ids=list(range(10, 2000, 7)))
    # LoRA: the adapter, then the base model on the same prompt
    out["lora"] = [complete(t, model=m, prompt=prompt_ids(10, 24), max_tokens=16,
                            temperature=0) for m in ("tiny-lora", t.model)]
    # speculative decoding (ngram): a repetitive prompt that the drafts match
    step0 = t.steps()["next"] if t.steps else None
    out["spec"] = complete(t, prompt=[11, 12, 13, 14] * 30, max_tokens=48, temperature=0,
                           ignore_eos=True)
    out["spec_steps"] = t.steps(step0)["samples"] if t.steps else None
    return out


def run_sampling(t: Target) -> dict:
    """n > 1 (seeded sampling) and best_of; last, on their own. The n samples' prompts
    (3 x 8 tokens) fit one step: vLLM's CPU model runner cannot rewind a seeded
    request's generator after a partial prefill chunk ("CPU Generator does not use
    offset") and its engine dies, with or without tuned."""
    out = {}
    out["n"] = complete(t, prompt=prompt_ids(4, 8), max_tokens=10, n=3, temperature=1.0,
                        ignore_eos=True, seed=7)
    out["best_of"] = complete(t, prompt=prompt_ids(5, 20), max_tokens=10, best_of=3,
                              temperature=0)
    out["alive"] = complete(t, prompt=prompt_ids(6, 20), max_tokens=4, temperature=0)
    return out


def run_preemption(t: Target) -> dict:
    """Four requests of 200 + PREEMPT_TOKENS tokens, all four in the engine before any
    is scheduled: 13 blocks each at the end, so the four running together want 52 of
    the 23 usable and vLLM preempts. The engine is paused (vLLM's dev-mode
    ``/pause``, mode keep) while they are sent, and resumed once its log has added
    all four: sent at once without the pause, the front end can hand them over
    spread out, and on a fast host one may finish before the next arrives (a CI run
    here saw no preemption with them sent at once)."""
    results: list = [None] * MAX_NUM_SEQS
    before = t.vllm_gauge("vllm:num_preemptions_total")
    step0 = t.steps()["next"] if t.steps else None
    added0 = added_requests(t)
    status, body = post(f"{t.base}/pause?mode=keep&clear_cache=false", {})
    assert status == 200 and get_json(f"{t.base}/is_paused")["is_paused"] is True, body

    def one(i):
        results[i] = complete(t, prompt=prompt_ids(100 + i, 200),
                              max_tokens=PREEMPT_TOKENS,
                              temperature=0, ignore_eos=True)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(MAX_NUM_SEQS)]
    try:
        for th in threads:
            th.start()
        wait_for("the four requests added to the paused engine",
                 lambda: added_requests(t) >= added0 + MAX_NUM_SEQS, 60)
    finally:
        post(f"{t.base}/resume", {})
    for th in threads:
        th.join(600)
    return {"results": results,
            "preemptions": t.vllm_gauge("vllm:num_preemptions_total") - before,
            "ring_preempted": (sum(s["preempted"] for s in t.steps(step0)["samples"])
                               if t.steps else None)}


def added_requests(t: Target) -> int:
    """vLLM's "Added request <id>." lines in the server's log so far
    (``--enable-log-requests``): requests the front end handed to the engine."""
    return len(re.findall(r"Added request \S+\.", t.log.read_text(errors="replace")))


def stream_until(t: Target, body: dict, ready, abort_after_chunks: int | None,
                 give_up_s: float = 60.0) -> dict:
    """Stream a completion and drop the connection when ``ready()`` holds (before any
    token is read; ``closed_early`` False if it did not hold within ``give_up_s``) or
    after ``abort_after_chunks`` chunks; returns what the client saw."""
    import httpx2

    body = {"model": t.model, "stream": True, **body}
    seen = {"chunks": 0, "closed_early": False}
    with httpx2.Client(timeout=300) as client:
        with client.stream("POST", f"{t.base}/v1/completions", json=body) as r:
            if abort_after_chunks is None:
                deadline = time.monotonic() + give_up_s
                while not ready():
                    if time.monotonic() > deadline:
                        return seen
                    time.sleep(0.002)
                seen["closed_early"] = True
                return seen
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    seen["chunks"] += 1
                    if seen["chunks"] >= abort_after_chunks:
                        seen["closed_early"] = True
                        return seen
    return seen


def stream_tokens(t: Target, body: dict) -> dict:
    """Stream a completion to its end: {finish, tokens}."""
    import httpx2

    body = {"model": t.model, "stream": True, "stream_options": {"include_usage": True},
            **body}
    out = {"finish": None, "tokens": None}
    with httpx2.Client(timeout=600) as client:
        with client.stream("POST", f"{t.base}/v1/completions", json=body) as r:
            assert r.status_code == 200, r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for c in chunk.get("choices") or []:
                    out["finish"] = c.get("finish_reason") or out["finish"]
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
    return out


def idle(t: Target) -> bool:
    m = t.vllm_metrics()
    run = sum(v for (n, _), v in m.items() if n == "vllm:num_requests_running")
    wait = sum(v for (n, _), v in m.items() if n == "vllm:num_requests_waiting")
    kv = sum(v for (n, _), v in m.items() if n == "vllm:kv_cache_usage_perc")
    return run == 0 and wait == 0 and kv == 0


def engine_worker(root_pid: int):
    """vLLM's model-runner process (``VLLM::Worker``) under ``root_pid``."""
    import psutil

    for p in psutil.Process(root_pid).children(recursive=True):
        if p.name().startswith("VLLM::Worker"):
            return p
    raise AssertionError(f"no VLLM::Worker process under pid {root_pid}")


def aborted_lines(t: Target) -> int:
    """vLLM's "Aborted request(s)" log lines so far (``--enable-log-requests``)."""
    return t.log.read_text(errors="replace").count("Aborted request")


def _waiting_abort_try(t: Target, g, attempt: int) -> dict:
    """The four fillers and a fifth request arrive while vLLM's model runner is
    stopped (SIGSTOP), so the engine's first step cannot end: the fifth waits behind
    the four, whatever the host's speed. Its client leaves; once vLLM logs the abort,
    the runner goes on (SIGCONT). Conclusive when vLLM counted only the four's prompt
    tokens (the fifth never ran) and, with tuned, no step of tuned's ring held more
    than the four. Stopping the runner is how this test holds the fifth waiting: on
    two busy cores a process here went unscheduled for up to 9 s while the engine
    ran (a sleeping watcher process measured it), so the client saw the streams,
    /metrics and the step ring seconds late, and a fifth sent "once the four run"
    arrived after they had ended."""
    fill: list = [None] * MAX_NUM_SEQS
    step0 = t.steps()["next"] if t.steps else None
    worker = engine_worker(t.root_pid)
    aborted0 = aborted_lines(t)

    def one(i):
        fill[i] = stream_tokens(t, {"prompt": prompt_ids(200 + 10 * attempt + i, 20),
                                    "max_tokens": FILL_TOKENS, "temperature": 1.0,
                                    "ignore_eos": True})

    prompt0 = g("vllm:prompt_tokens_total")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(MAX_NUM_SEQS)]
    worker.suspend()
    try:
        for th in threads:
            th.start()
            time.sleep(0.05)          # in order: the four first
        time.sleep(1.0)
        sent = time.monotonic()
        w = stream_until(t, {"prompt": prompt_ids(210 + attempt, 20), "max_tokens": 50},
                         lambda: time.monotonic() - sent > 1.0, None)
        left_after_s = round(time.monotonic() - sent, 2)
        wait_for("vLLM to log the fifth's abort", lambda: aborted_lines(t) > aborted0, 60)
        abort_logged_s = round(time.monotonic() - sent, 2)
        time.sleep(1.0)               # the abort crosses to the engine's input queue
    finally:
        worker.resume()
    for th in threads:
        th.join(600)
    wait_for("idle after the waiting abort", lambda: idle(t), 60)
    samples = t.steps(step0)["samples"] if t.steps else None
    # prompt tokens prefilled, counted by vLLM once the engine is idle: the four's
    # 4 x 20 alone when the fifth never ran
    prompt_tokens = g("vllm:prompt_tokens_total") - prompt0
    most = (max((s["num_running"] + s["num_waiting"] for s in samples), default=0)
            if samples is not None else None)
    return {"seen": w, "fill": fill, "left_after_s": left_after_s,
            "abort_logged_s": abort_logged_s, "prompt_tokens": prompt_tokens,
            "steps": len(samples) if samples is not None else None, "most_in_a_step": most,
            "conclusive": prompt_tokens == 20 * MAX_NUM_SEQS and most in (None, MAX_NUM_SEQS)}


def run_aborts(t: Target) -> dict:
    """A client disconnect at each stage: waiting, mid-prefill, decoding."""
    out: dict = {}
    g = lambda name: t.vllm_gauge(name)  # noqa: E731
    # waiting: four long requests fill the engine (max_num_seqs), a fifth waits
    # behind them and its client leaves (see _waiting_abort_try). The four sample:
    # greedy output of the random model repeats itself, and ngram drafts would then
    # finish them a few tokens a step. Unseeded: a seeded request whose prompt is
    # prefilled in chunks kills the CPU build's engine (see
    # test_n_greater_than_one_and_best_of). A try that is not conclusive is tried
    # again.
    tries: list = []
    for attempt in range(WAITING_TRIES):
        tries.append(_waiting_abort_try(t, g, attempt))
        if tries[-1]["conclusive"]:
            break
    out["waiting"] = tries[-1] | {"tries": len(tries), "all": tries}
    # mid-prefill: a LONG_PROMPT-token prompt prefills BUDGET tokens a step; the client
    # leaves halfway through the time such a prompt takes to its first token (timed
    # here first; polling vLLM's running gauge missed the whole prefill on this host).
    # tuned's ring says how far the prefill got; too far or not started, the next try
    # leaves earlier or later (six tries: on a fast host the whole prefill took 0.1 s
    # and three tries, the last leaving after 13 ms, all came after it). Each prompt
    # is new (no prefix cache hit).
    t0 = time.monotonic()
    complete(t, prompt=prompt_ids(219, LONG_PROMPT), max_tokens=1, temperature=0)
    full_s, frac = time.monotonic() - t0, 0.5
    for attempt in range(6):
        step0 = t.steps()["next"] if t.steps else None
        t_send = time.monotonic()
        p = stream_until(t, {"prompt": prompt_ids(220 + attempt, LONG_PROMPT),
                             "max_tokens": 8},
                         lambda: time.monotonic() - t_send >= frac * full_s, None)
        wait_for("idle after the mid-prefill abort", lambda: idle(t), 60)
        prefilled = None
        if t.steps:
            prefilled = sum(s["prefill_tokens"] for s in t.steps(step0)["samples"])
        if prefilled is None or 0 < prefilled < LONG_PROMPT:
            break
        frac = frac / 2 if prefilled >= LONG_PROMPT else min(frac * 1.5, 0.9)
    out["prefill"] = {"seen": p, "prefilled": prefilled, "full_s": full_s, "frac": frac,
                      "attempts": attempt + 1}
    # decoding: the client leaves after 5 streamed chunks of 500 tokens
    d = stream_until(t, {"prompt": prompt_ids(230, 20), "max_tokens": 500,
                         "ignore_eos": True, "temperature": 1.0}, None, 5)
    wait_for("idle after the decoding abort", lambda: idle(t), 60)
    out["decoding"] = {"seen": d}
    # and the engine still answers the same as before the aborts
    out["after"] = complete(t, prompt=prompt_ids(240, 16), max_tokens=12, temperature=0)
    return out


def run_all(t: Target) -> dict:
    """Each part's answers, or the error that stopped it (that part's test reports
    it; the other parts still run)."""
    import traceback

    out = {}
    for key, part in (("seq", run_sequential), ("preempt", run_preemption),
                      ("aborts", run_aborts), ("sampling", run_sampling)):
        try:
            out[key] = part(t)
        except Exception:
            out[key] = {"error": f"{t.name}: {traceback.format_exc()}"}
    return out


def part(runs, key) -> tuple[dict, dict]:
    """(plain, tuned) answers of one part; a part that raised fails its tests."""
    plain, tuned = (r[key] for r in runs)
    for side in (plain, tuned):
        assert "error" not in side, side.get("error")
    return plain, tuned


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("compat")
    lora = build_tiny_lora(Path(tiny_model), tmp / "lora")
    old = os.environ.get(DTYPE_ENV)
    os.environ[DTYPE_ENV] = "float32"
    # vLLM's /pause and /resume (the preemption part) for both servers
    old_dev = os.environ.get("VLLM_SERVER_DEV_MODE")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    timings = {}
    try:
        # plain vLLM
        port = free_port()
        log = tmp / "plain.log"
        cmd = launcher.vllm_command(str(tiny_model), host="127.0.0.1", port=port,
                                  max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=BUDGET,
                                  max_model_len=MAX_MODEL_LEN, num_gpu_blocks=BLOCKS,
                                  args=dtype_args() + engine_args(lora))
        t0 = time.monotonic()
        proc = launcher.spawn(cmd, log_path=log)
        try:
            base = f"http://127.0.0.1:{port}"
            launcher.wait_ready(base, proc, 600, log)
            timings["plain_start_s"] = time.monotonic() - t0
            plain = Target("plain", base, get_json(f"{base}/v1/models")["data"][0]["id"],
                           log=log, root_pid=proc.pid)
            t0 = time.monotonic()
            plain_out = run_all(plain)
            timings["plain_run_s"] = time.monotonic() - t0
        finally:
            launcher.stop_process(proc)
        # the same with tuned inside
        config = (f'model = "{tiny_model}"\nmax_num_seqs = {MAX_NUM_SEQS}\n'
                  f"max_num_batched_tokens = {BUDGET}\nmax_model_len = {MAX_MODEL_LEN}\n"
                  f"num_gpu_blocks = {BLOCKS}\ninterval_s = 0.25\nstale_after_s = 5.0\n"
                  f"b_min = {MAX_NUM_SEQS}\nb_max = {MAX_NUM_SEQS}\n"
                  f"fallback_cap = {MAX_NUM_SEQS}\n"
                  f"vllm_args = {json.dumps(engine_args(lora))}\n")
        t0 = time.monotonic()
        with tuned_serve(tmp, config, ready_timeout_s=600) as srv:
            timings["tuned_start_s"] = time.monotonic() - t0
            tuned = Target("tuned", srv.base, srv.model_id(), log=srv.log_path,
                           root_pid=srv.proc.pid,
                           steps=lambda since=0: get_json(f"{srv.endpoint}/steps?since={since}"))
            t0 = time.monotonic()
            tuned_out = run_all(tuned)
            timings["tuned_run_s"] = time.monotonic() - t0
            tuned_out["log"] = srv.log_path.read_text(errors="replace")
    finally:
        for name, value in ((DTYPE_ENV, old), ("VLLM_SERVER_DEV_MODE", old_dev)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    print("compat timings:", {k: round(v, 1) for k, v in timings.items()})
    return plain_out, tuned_out


# ---------------------------------------------------------------- the features
def texts(resp: tuple[int, dict]) -> list:
    status, body = resp
    assert status == 200, body
    return [(c.get("text", c.get("message", {}).get("content")), c["finish_reason"])
            for c in body["choices"]]


def usage(resp) -> tuple:
    u = resp[1]["usage"]
    return u["prompt_tokens"], u["completion_tokens"]


def both(runs, key):
    plain, tuned = part(runs, "seq")
    return plain[key], tuned[key]


def test_prefix_caching(runs):
    for out in both(runs, "prefix"):
        cached = [(r[1]["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                  for r in out]
        # the repeated prompt hits the cache (whole 128-token blocks of the prefix)
        assert cached[0] == 0 and cached[1] >= 256 and cached[2] >= 256, cached
    p, t = both(runs, "prefix")
    assert [texts(r) for r in p] == [texts(r) for r in t]
    assert [r[1]["usage"] for r in p] == [r[1]["usage"] for r in t]
    assert texts(p[0]) == texts(p[1])          # a cache hit changes nothing


def test_n_greater_than_one_and_best_of(runs):
    plain, tuned = part(runs, "sampling")
    p, t = plain["n"], tuned["n"]
    assert len(texts(p)) == 3 and texts(p) == texts(t) and usage(p) == usage(t)
    assert usage(p)[1] == 30
    p, t = plain["best_of"], tuned["best_of"]
    assert len(texts(p)) == 1 and texts(p) == texts(t)
    assert texts(plain["alive"]) == texts(tuned["alive"])


def test_structured_output(runs):
    p, t = both(runs, "regex")
    assert texts(p) == texts(t)
    assert re.fullmatch(REGEX, texts(t)[0][0]), texts(t)
    for key in ("json_schema", "json_object"):
        p, t = both(runs, key)
        assert texts(p) == texts(t), key
        text, reason = texts(t)[0]
        if reason == "stop":
            assert isinstance(json.loads(text), dict)
    text, reason = texts(both(runs, "json_schema")[1])[0]
    if reason == "stop":
        assert isinstance(json.loads(text)["n"], int)


def test_ignore_eos_and_min_tokens(runs):
    p, t = both(runs, "ignore_eos")
    assert texts(p) == texts(t) and usage(t)[1] == 40 and texts(t)[0][1] == "length"
    p, t = both(runs, "min_tokens")
    assert texts(p) == texts(t) and usage(p) == usage(t)
    assert 25 <= usage(t)[1] <= 40


def test_lora_adapter(runs):
    p, t = both(runs, "lora")
    assert [texts(r) for r in p] == [texts(r) for r in t]
    assert texts(t[0]) != texts(t[1])          # the adapter changes the output
    assert t[0][1]["model"] == "tiny-lora"


def test_ngram_speculative_decoding(runs):
    p, t = both(runs, "spec")
    assert texts(p) == texts(t) and usage(t)[1] == 48
    # tuned's step ring saw decodes verifying drafts: steps with decodes and more
    # scheduled tokens than decodes + prompt tokens
    steps = part(runs, "seq")[1]["spec_steps"]
    assert any(s["num_decode"] and s["scheduled_tokens"] > s["num_decode"] + s["prefill_tokens"]
               for s in steps)


def test_preemption_and_recompute(runs):
    plain, tuned = part(runs, "preempt")
    for side in (plain, tuned):
        assert side["preemptions"] > 0
        assert [usage(r)[1] for r in side["results"]] == [PREEMPT_TOKENS] * MAX_NUM_SEQS
        assert {texts(r)[0][1] for r in side["results"]} == {"length"}
    assert tuned["ring_preempted"] > 0        # tuned's step ring saw them too


def test_aborts_at_every_stage(runs):
    plain, tuned = part(runs, "aborts")
    for name, side in (("plain", plain), ("tuned", tuned)):
        print(name, "waiting-abort tries:", [{k: w.get(k) for k in (
            "conclusive", "left_after_s", "abort_logged_s", "prompt_tokens", "steps",
            "most_in_a_step")} for w in
            side.get("waiting", {}).get("all", [])])
    for name, side in (("plain", plain), ("tuned", tuned)):
        w = side["waiting"]
        # the fifth's client left before any token; the four ran to their length
        assert (w["seen"]["closed_early"], w["seen"]["chunks"]) == (True, 0), (name, w)
        assert [(r["finish"], r["tokens"]) for r in w["fill"]] == \
            [("length", FILL_TOKENS)] * MAX_NUM_SEQS, (name, w["fill"])
        # the fifth never ran (vLLM counted only the four's prompt tokens) and, with
        # tuned, no step of its ring held more than the four
        assert w["conclusive"], (name, "no conclusive try", w["all"])
        assert side["prefill"]["seen"]["closed_early"], (name, side["prefill"])
        assert side["decoding"]["seen"]["chunks"] == 5, (name, side["decoding"])
    # tuned's ring: the long prompt was left partway through its prefill
    assert 0 < tuned["prefill"]["prefilled"] < LONG_PROMPT, tuned["prefill"]
    assert texts(plain["after"]) == texts(tuned["after"])
