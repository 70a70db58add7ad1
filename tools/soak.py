#!/usr/bin/env python3
"""A bounded soak of `tuned serve` over loopback: sustained open-loop load, streams
cancelled mid-way, live reloads alternating a good and a bad config, and the
server's memory watched from start to end.

    .venv/bin/python tools/soak.py                      # 3000 requests over ~20 min,
                                                        # the embedded default config
    .venv/bin/python tools/soak.py --config my.toml --requests 150 --duration-s 90 \\
        --reload-every-s 30 -- --dtype bfloat16         # after --: vLLM arguments

What it does:

* starts ``python -m tuned serve`` with the embedded default (or ``--config``) on free
  loopback ports (the config is written to ``OUT/soak.toml``; the server's log to
  ``OUT/serve.log``), waits for it to serve and decide, sends one warm-up request;
* sends ``--requests`` streamed completions at Poisson arrivals spread over
  ``--duration-s`` (open loop: each request is sent at its time whatever the others
  do, so concurrency follows the server's speed), prompts and outputs of mixed
  lengths (``--short-frac`` short prompts, the rest long; outputs uniform), exact
  lengths through ``ignore_eos``; ``--cancel-frac`` of them (drawn at random) are
  closed by the client after a random part of their output;
* every ``--reload-every-s`` rewrites the config file, alternately a good one (a
  live field changed: ``eps_m`` halved or restored) and a bad one (``b_min`` out of
  range), and asks for a reload, alternately by SIGHUP to the supervisor (what
  ``systemctl reload`` does) and by ``POST /reload``; each outcome is read back;
* samples the resident memory (RSS, ``/proc/PID/status`` VmRSS) of every process of
  the server's tree every ``--rss-every-s``: the supervisor (the process started),
  vLLM's API server, its EngineCore and anything else below them;
* once every request is done, waits for the engine to be idle and reads tuned's
  metrics; prints the figures and writes ``OUT/soak.json``.

Exit 0 only if every criterion holds:

=============================  =================================================
requests                       every request that was not cancelled completed with
                               exactly its output length; none failed
engine bookkeeping             tuned_requests_finished_total grew by exactly the
                               requests sent (cancelled ones leave the engine too)
KV once idle                   tuned_kv_usage_ratio == 0 (and /decisions agrees)
RSS                            for each of supervisor, API server and EngineCore
                               (and their sum): mean of the last quarter of the
                               samples at most 5 % above the mean of the first;
                               the model worker is reported, not judged (below)
controller tick p99            < 10 ms: at least 99 % of the ticks of the run in
                               the ``le=0.01`` bucket of
                               ``tuned_controller_tick_seconds``
reloads                        every good one ``ok``, every bad one ``refused``
fallbacks                      none (no fault is injected: a fallback here means a
                               starved or failing controller)
=============================  =================================================

The RSS quarters are taken over the samples after a warm-up (``--rss-warmup-s``,
default 10 % of the run, at least 20 s): the first samples are taken while the
first requests of the run load the processes for the first time (the EngineCore
grows at once, then a little more while tuned's fixed-size step and
finished-request rings fill, then stays flat). That start-up step is not growth
under load; the warm-up figures are still printed and written
(``rss.*.warmup_mib``).

Why the model worker (vLLM's multiproc executor process that runs the model) is
reported but not judged: its RSS climbs for many minutes, slowing down, and that
is oneDNN's primitive cache, not a leak: oneDNN keeps a compiled kernel per matmul
shape, up to ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` = 1024 entries by default, and the
shape follows the number of tokens in each engine step, which an open-loop workload
of mixed lengths keeps varying; a small ``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` in the
server's environment keeps the worker flat. The cache is bounded, lives in vLLM's
model runner, and tuned code never runs in that process (tuned lives in the EngineCore). Hence the judged sum is
supervisor + API server + EngineCore (``rss.server_total``); ``rss.total`` is
every process of the tree, worker included, for information.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tuned import config as config_mod  # noqa: E402
from tuned.base.netutil import free_port  # noqa: E402

GOOD, BAD = "good", "bad"
RSS_GROWTH_MAX = 0.05
#: the processes whose RSS growth is judged (see the docstring for the worker)
JUDGED = ("supervisor", "api_server", "engine_core")
TICK_P99_MAX_S = 0.010
STOP_GRACE_S = 120.0


# ------------------------------------------------------------------ arguments
def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="soak.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="tuned config to serve (default: the embedded default)")
    p.add_argument("--requests", type=int, default=3000, help="requests to send (%(default)s)")
    p.add_argument("--duration-s", type=float, default=1200.0,
                   help="spread the arrivals over this many seconds (%(default)s)")
    p.add_argument("--cancel-frac", type=float, default=0.10,
                   help="share of requests the client closes mid-stream (%(default)s)")
    p.add_argument("--reload-every-s", type=float, default=60.0,
                   help="a reload this often, good and bad in turn (%(default)s)")
    p.add_argument("--short-frac", type=float, default=0.75,
                   help="share of short prompts (%(default)s)")
    p.add_argument("--short-prompt", default="8,64", help="short prompt tokens lo,hi")
    p.add_argument("--long-prompt", default="96,256", help="long prompt tokens lo,hi")
    p.add_argument("--output", default="8,96", help="output tokens lo,hi")
    p.add_argument("--rss-every-s", type=float, default=2.0, help="RSS sampling period")
    p.add_argument("--rss-warmup-s", type=float, default=None,
                   help="RSS samples before this are left out of the growth criterion "
                        "(default: 10%% of --duration-s, at least 20 s)")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.add_argument("--model-cache", help="where demo models are built (tuned serve's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="folder for soak.toml, serve.log, soak.json (default: a "
                                 "new temp folder)")
    args = p.parse_args(argv)
    if args.requests < 1 or args.duration_s <= 0:
        p.error("--requests and --duration-s must be positive")
    if not 0 <= args.cancel_frac < 1:
        p.error("--cancel-frac must be in [0, 1)")
    return args, extra


def _pair(text: str) -> tuple[int, int]:
    lo, hi = (int(x) for x in text.split(","))
    return lo, hi


# ------------------------------------------------------------------ workload
@dataclasses.dataclass
class Req:
    i: int
    arrival_s: float
    prompt: list[int]
    output_tokens: int
    cancel_after: int | None        # close the stream after this many tokens
    outcome: str = "pending"        # completed | cancelled | refused | failed
    at_door: bool = False           # refused by the gateway before reaching the engine
    tokens: int = 0
    error: str = ""


def workload(args, vocab_hi: int) -> list[Req]:
    rng = random.Random(args.seed)
    rate = args.requests / args.duration_s
    short, long_, out = _pair(args.short_prompt), _pair(args.long_prompt), _pair(args.output)
    t = 0.0
    reqs = []
    cancel = set(rng.sample(range(args.requests), round(args.cancel_frac * args.requests)))
    for i in range(args.requests):
        t += rng.expovariate(rate)
        n_prompt = rng.randint(*(short if rng.random() < args.short_frac else long_))
        n_out = rng.randint(*out)
        cut = rng.randint(1, max(1, n_out // 2)) if i in cancel and n_out > 1 else None
        reqs.append(Req(i, t, [rng.randrange(10, vocab_hi) for _ in range(n_prompt)], n_out,
                        cut))
    # squeeze the arrivals into the duration (the sum of exponentials overshoots it)
    scale = args.duration_s / max(reqs[-1].arrival_s, 1e-9) * (1 - 1 / (args.requests + 1))
    for r in reqs:
        r.arrival_s *= scale
    return reqs


# ------------------------------------------------------------------ HTTP helpers
def get_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(endpoint: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def mval(values: dict, name: str, engine: str = "0", **labels) -> float:
    """One of tuned's samples (they carry ``engine``, the data-parallel rank)."""
    return values.get((name, tuple(sorted({"engine": engine, **labels}.items()))), 0.0)


def msum(values: dict, name: str) -> float:
    """``name`` summed over all its samples (vLLM's series: every engine and model)."""
    return sum(v for (n, _), v in values.items() if n == name)


def post_reload(endpoint: str) -> dict:
    req = urllib.request.Request(f"{endpoint}/reload", data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read() or b"{}")


# ------------------------------------------------------------------ process tree / RSS
def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, name) for every process visible in /proc."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        out[int(d)] = (ppid, cmd or comm)
    return out


def role_of(name: str, is_root: bool) -> str:
    if is_root:
        return "supervisor"
    if "vllm.entrypoints.openai.api_server" in name:
        return "api_server"
    if "EngineCore" in name:
        return "engine_core"
    if "Worker" in name:
        return "worker"
    return "other"


def tree_rss(root: int) -> dict[str, int]:
    """RSS in bytes by role over ``root`` and all its descendants."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out: dict[str, int] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, ()))
        if pid not in table:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        rss = next((int(line.split()[1]) * 1024 for line in status.splitlines()
                    if line.startswith("VmRSS:")), 0)
        role = role_of(table[pid][1], pid == root)
        out[role] = out.get(role, 0) + rss
    return out


def descendants(root: int) -> list[int]:
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], list(kids.get(root, ()))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


class RssSampler(threading.Thread):
    def __init__(self, root: int, every_s: float):
        super().__init__(daemon=True, name="rss")
        self.root = root
        self.every_s = every_s
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.samples.append((time.monotonic(), tree_rss(self.root)))
            self.stop_flag.wait(self.every_s)


def rss_growth(samples, t0: float, warmup_s: float) -> dict:
    """Per role: mean of the first and the last quarter of the samples after the
    warm-up, and the growth between them."""
    steady = [(t, s) for t, s in samples if t - t0 >= warmup_s]
    warm = [(t, s) for t, s in samples if t - t0 < warmup_s]
    roles = sorted({r for _, s in samples for r in s}) + ["server_total", "total"]
    out = {}
    q = max(len(steady) // 4, 1)
    for role in roles:
        def val(s):
            if role == "total":
                return sum(s.values())
            if role == "server_total":
                return sum(s.get(r, 0) for r in JUDGED)
            return s.get(role, 0)
        if len(steady) < 4:
            out[role] = {"first_mib": None, "last_mib": None, "growth": None}
            continue
        first = sum(val(s) for _, s in steady[:q]) / q
        last = sum(val(s) for _, s in steady[-q:]) / q
        out[role] = {"first_mib": round(first / 2 ** 20, 1), "last_mib": round(last / 2 ** 20, 1),
                     "growth": (last - first) / first if first else None,
                     "warmup_mib": [round(val(s) / 2 ** 20, 1) for _, s in warm[:1] + warm[-1:]],
                     "max_mib": round(max(val(s) for _, s in samples) / 2 ** 20, 1)}
    return out


# ------------------------------------------------------------------ tick quantile
def tick_quantile(v0: dict, v1: dict, q: float = 0.99) -> dict:
    """The q-quantile of tuned_controller_tick_seconds over the run
    (v1 - v0), from the histogram's buckets: the bucket bound it falls under, the
    share of ticks at or under 10 ms, and a linear interpolation inside the bucket."""
    def buckets(v):
        out = {}
        for (name, labels), val in v.items():
            lb = dict(labels)
            if name == "tuned_controller_tick_seconds_bucket":
                out[float(lb["le"])] = out.get(float(lb["le"]), 0.0) + val   # every rank
        return out
    b0, b1 = buckets(v0), buckets(v1)
    les = sorted(b1)
    cum = [b1[le] - b0.get(le, 0.0) for le in les]
    total = cum[-1] if cum else 0.0
    if total <= 0:
        return {"ticks": 0, "p99_bucket_le_s": None, "p99_interp_s": None, "share_le_10ms": None}
    rank = q * total
    k = next(i for i, c in enumerate(cum) if c >= rank)
    lo = les[k - 1] if k else 0.0
    below = cum[k - 1] if k else 0.0
    hi = les[k]
    interp = hi if math.isinf(hi) else lo + (hi - lo) * (rank - below) / max(cum[k] - below, 1e-9)
    share = (cum[les.index(TICK_P99_MAX_S)] / total) if TICK_P99_MAX_S in les else None
    return {"ticks": int(total), "p99_bucket_le_s": hi, "p99_interp_s": interp,
            "share_le_10ms": share}


# ------------------------------------------------------------------ the run
class Soak:
    def __init__(self, args, extra: list[str]):
        self.args = args
        self.extra = extra
        self.out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tuned-soak-"))
        self.out.mkdir(parents=True, exist_ok=True)
        base = config_mod.load(args.config) if args.config else config_mod.default()
        port = free_port()
        mport = free_port(avoid=(port,))
        self.cfg = dataclasses.replace(base, host="127.0.0.1", port=port,
                                       metrics_host="127.0.0.1", metrics_port=mport)
        self.api = f"http://127.0.0.1:{port}"
        self.endpoint = f"http://127.0.0.1:{mport}"
        self.cfg_path = self.out / "soak.toml"
        self.log_path = self.out / "serve.log"
        self.texts = self._config_texts()
        self.reloads: list[dict] = []
        self.proc: subprocess.Popen | None = None

    def _config_texts(self) -> dict[str, str]:
        from tuned.bench.live import config_to_toml

        good = config_to_toml(self.cfg).replace("# written by `tuned bench`",
                                                "# written by tools/soak.py")
        alt = config_to_toml(dataclasses.replace(self.cfg, eps_m=self.cfg.eps_m / 2)).replace(
            "# written by `tuned bench`", "# written by tools/soak.py (eps_m halved)")
        return {"good": good, "alt": alt, "bad": good + "b_min = 100000\n"}

    # -------------------------------------------------------------- server
    def start(self) -> None:
        self.cfg_path.write_text(self.texts["good"])
        cmd = [sys.executable, "-m", "tuned", "serve", "--config", str(self.cfg_path)]
        if self.args.model_cache:
            cmd += ["--model-cache", self.args.model_cache]
        if self.extra:
            cmd += ["--", *self.extra]
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=ROOT)
        deadline = time.monotonic() + self.args.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tuned serve exited with {self.proc.returncode}; see "
                                   f"{self.log_path}")
            try:
                urllib.request.urlopen(f"{self.api}/health", timeout=2).close()
                if get_json(f"{self.endpoint}/decisions?limit=0")["current"]:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"tuned serve not ready in time; see {self.log_path}")
            time.sleep(0.5)
        self.model = get_json(f"{self.api}/v1/models")["data"][0]["id"]

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kids = descendants(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                for pid in [self.proc.pid, *kids]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                self.proc.wait()
        self._log.close()

    # -------------------------------------------------------------- client
    async def send(self, http, r: Req) -> None:
        body = {"model": self.model, "prompt": r.prompt, "max_tokens": r.output_tokens,
                "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        done = False
        try:
            async with http.stream("POST", f"{self.api}/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")[:200]
                    # tuned's refusal (the wait bound: at the door, or in the queue and
                    # answered 429 by the gateway): a clean answer, not a failure
                    r.outcome = "refused" if resp.status_code == 429 else "failed"
                    r.error = f"HTTP {resp.status_code}: {text}"
                    r.at_door = resp.status_code == 429 and "overloaded" in text
                    return
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event:
                        raise RuntimeError(str(event["error"])[:200])
                    u = event.get("usage")
                    if u:
                        r.tokens = u.get("completion_tokens") or r.tokens
                    if r.cancel_after is not None and r.tokens >= r.cancel_after:
                        r.outcome = "cancelled"
                        return        # leaving the block closes the stream mid-generation
        except Exception as e:  # recorded; the run goes on
            r.outcome, r.error = "failed", f"{type(e).__name__}: {e}"[:300]
            return
        if r.cancel_after is not None and r.tokens >= r.cancel_after:
            r.outcome = "cancelled"   # the output ended before we could close it
        elif done and r.tokens == r.output_tokens:
            r.outcome = "completed"
        else:
            r.outcome, r.error = "failed", f"{r.tokens} of {r.output_tokens} tokens, done={done}"

    async def reloader(self, stop: asyncio.Event) -> None:
        n = 0
        while True:
            try:
                await asyncio.wait_for(stop.wait(), self.args.reload_every_s)
                return
            except asyncio.TimeoutError:
                pass
            kind = GOOD if n % 2 == 0 else BAD
            method = "sighup" if (n // 2) % 2 == 0 else "post"
            text = self.texts["bad"] if kind == BAD else (
                self.texts["alt"] if (n // 2) % 2 == 0 else self.texts["good"])
            n += 1
            self.reloads.append(await asyncio.to_thread(self._reload, kind, method, text))

    def _reload(self, kind: str, method: str, text: str) -> dict:
        before = get_json(f"{self.endpoint}/decisions?limit=0")["last_reload"]["t"]
        self.cfg_path.write_text(text)
        t0 = time.monotonic()
        if method == "post":
            res = post_reload(self.endpoint)
            outcome = res.get("outcome")
        else:
            self.proc.send_signal(signal.SIGHUP)
            outcome = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                lr = get_json(f"{self.endpoint}/decisions?limit=0")["last_reload"]
                if lr["t"] != before:
                    outcome = lr["outcome"]
                    break
                time.sleep(0.1)
        want = "ok" if kind == GOOD else "refused"
        return {"kind": kind, "method": method, "outcome": outcome, "expected": want,
                "took_s": round(time.monotonic() - t0, 3)}

    async def drive(self, reqs: list[Req]) -> float:
        try:
            import httpx2 as httpx
        except ImportError:  # pragma: no cover - depends on the openai release
            import httpx
        http = httpx.AsyncClient(timeout=httpx.Timeout(900.0, connect=60.0),
                                 limits=httpx.Limits(max_connections=None,
                                                     max_keepalive_connections=0))
        stop = asyncio.Event()
        reload_task = asyncio.ensure_future(self.reloader(stop))
        t0 = time.monotonic()
        tasks = []
        try:
            for r in reqs:
                delay = t0 + r.arrival_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.ensure_future(self.send(http, r)))
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            await reload_task
            await http.aclose()
        return time.monotonic() - t0

    # -------------------------------------------------------------- idle
    def wait_idle(self, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        interval = self.cfg.interval_s
        while True:
            tel = get_json(f"{self.endpoint}/decisions?limit=0")["telemetry"]
            if tel["running"] == tel["waiting"] == 0:
                break
            if time.monotonic() > deadline:
                return tel
            time.sleep(0.2)
        time.sleep(3 * interval)      # a few ticks: the gauges follow the idle engine
        return get_json(f"{self.endpoint}/decisions?limit=0")["telemetry"]

    # -------------------------------------------------------------- main
    def run(self) -> dict:
        args = self.args
        self.start()
        sampler = RssSampler(self.proc.pid, args.rss_every_s)
        try:
            vocab_hi = 1000
            reqs = workload(args, vocab_hi)
            warm = Req(-1, 0.0, list(range(20, 36)), 4, None)
            asyncio.run(self._one(warm))
            if warm.outcome != "completed":
                raise RuntimeError(f"warm-up request failed: {warm.error}")
            self.wait_idle()            # the warm-up counted before the baseline
            # tuned's endpoint, and vLLM's own /metrics (tokens, preemptions)
            v0 = metrics(self.endpoint) | metrics(self.api)
            sampler.start()
            t_start = time.monotonic()
            duration = asyncio.run(self.drive(reqs))
            idle = self.wait_idle()
            v1 = metrics(self.endpoint) | metrics(self.api)
            sampler.stop_flag.set()
            sampler.join(10)
            alive = self.proc.poll() is None
        finally:
            sampler.stop_flag.set()
            self.stop()
        warmup_s = args.rss_warmup_s if args.rss_warmup_s is not None else max(
            20.0, 0.1 * args.duration_s)
        return self.report(reqs, duration, idle, v0, v1, sampler.samples, t_start, warmup_s,
                           alive)

    async def _one(self, r: Req) -> None:
        try:
            import httpx2 as httpx
        except ImportError:  # pragma: no cover
            import httpx
        async with httpx.AsyncClient(timeout=300) as http:
            await self.send(http, r)

    def report(self, reqs, duration, idle, v0, v1, samples, t_start, warmup_s, alive) -> dict:
        count = {k: sum(1 for r in reqs if r.outcome == k)
                 for k in ("completed", "cancelled", "refused", "failed", "pending")}
        at_door = sum(1 for r in reqs if r.at_door)
        meant_cancel = sum(1 for r in reqs if r.cancel_after is not None)
        finished = mval(v1, "tuned_requests_finished_total") - \
            mval(v0, "tuned_requests_finished_total")
        causes = ("stale", "controller_error", "invalid_decision", "slow_decision")
        fallbacks = {c: mval(v1, "tuned_fallbacks_total", cause=c)
                     - mval(v0, "tuned_fallbacks_total", cause=c) for c in causes}
        rss = rss_growth(samples, t_start, warmup_s)
        tick = tick_quantile(v0, v1)
        reload_ok = sum(1 for r in self.reloads if r["outcome"] == "ok")
        reload_refused = sum(1 for r in self.reloads if r["outcome"] == "refused")
        kv_idle = mval(v1, "tuned_kv_usage_ratio")
        named = [r for r in (*JUDGED, "server_total") if r in rss]
        criteria = {
            "server_alive": alive,
            "requests": count["failed"] == 0 and count["pending"] == 0
            and count["completed"] + count["cancelled"] + count["refused"] == len(reqs),
            # every request the gateway let in finished in the engine
            "engine_finished_all": finished == len(reqs) - at_door,
            "kv_idle_zero": kv_idle == 0.0 and idle.get("kv_usage") == 0.0
            and idle.get("running") == 0,
            "rss_growth": all(rss[r]["growth"] is not None and rss[r]["growth"] < RSS_GROWTH_MAX
                              for r in named) and set(JUDGED) <= set(named),
            "tick_p99": tick["share_le_10ms"] is not None and tick["share_le_10ms"] >= 0.99,
            "reloads": all(r["outcome"] == r["expected"] for r in self.reloads),
            "no_fallbacks": sum(fallbacks.values()) == 0,
        }
        doc = {
            "config": self.args.config or "embedded default",
            "vllm_args": self.extra, "out": str(self.out),
            "requests": {"submitted": len(reqs), **count, "meant_to_cancel": meant_cancel,
                         "engine_finished": finished, "refused_at_door": at_door,
                         "failures": [r.error for r in reqs if r.outcome == "failed"][:10]},
            "duration_s": round(duration, 1),
            "rate_per_s": round(len(reqs) / self.args.duration_s, 3),
            "kv_usage_idle": kv_idle, "idle_telemetry": idle,
            "rss": rss, "rss_warmup_s": warmup_s, "rss_samples": len(samples),
            # every sample, in MiB by role (s since the load began)
            "rss_series": [[round(t - t_start, 1), {k: round(v / 2 ** 20, 1)
                                                    for k, v in sorted(s.items())}]
                           for t, s in samples],
            "controller_tick": tick,
            "reloads": {"ok": reload_ok, "refused": reload_refused, "each": self.reloads},
            "fallbacks": fallbacks,
            "tokens_generated": msum(v1, "vllm:generation_tokens_total")
            - msum(v0, "vllm:generation_tokens_total"),
            "preemptions": msum(v1, "vllm:num_preemptions_total")
            - msum(v0, "vllm:num_preemptions_total"),
            "criteria": criteria, "ok": all(criteria.values()),
        }
        (self.out / "soak.json").write_text(json.dumps(doc, indent=1, default=str))
        return doc


def print_report(doc: dict) -> None:
    r, c = doc["requests"], doc["criteria"]

    def mark(ok):
        return "ok" if ok else "FAIL"
    print(f"soak: {r['submitted']} requests over {doc['duration_s']} s "
          f"({doc['rate_per_s']}/s), config {doc['config']}, out {doc['out']}")
    print(f"requests     submitted {r['submitted']}  completed {r['completed']}  cancelled "
          f"{r['cancelled']} (of {r['meant_to_cancel']} meant)  refused {r['refused']} "
          f"({r['refused_at_door']} at the door)  failed {r['failed']}  "
          f"[{mark(c['requests'])}]")
    print(f"engine       finished {r['engine_finished']:.0f} of {r['submitted']} sent  "
          f"[{mark(c['engine_finished_all'])}]; tokens {doc['tokens_generated']:.0f}, "
          f"preemptions {doc['preemptions']:.0f}")
    print(f"kv idle      tuned_kv_usage_ratio {doc['kv_usage_idle']}  "
          f"[{mark(c['kv_idle_zero'])}]")
    print(f"rss          first -> last quarter after {doc['rss_warmup_s']:.0f} s warm-up "
          f"({doc['rss_samples']} samples)  [{mark(c['rss_growth'])}]")
    for role, g in doc["rss"].items():
        if g.get("growth") is None:
            print(f"  {role:12s} too few samples")
            continue
        judged = "judged" if role in (*JUDGED, "server_total") else "reported"
        print(f"  {role:12s} {g['first_mib']:8.1f} -> {g['last_mib']:8.1f} MiB  "
              f"{100 * g['growth']:+.2f}%  (warm-up {g['warmup_mib']}, max {g['max_mib']}; "
              f"{judged})")
    t = doc["controller_tick"]
    if t["ticks"]:
        print(f"tick         p99 <= {1000 * t['p99_bucket_le_s']:g} ms (bucket), "
              f"{1000 * t['p99_interp_s']:.2f} ms interpolated; "
              f"{100 * (t['share_le_10ms'] or 0):.2f}% of {t['ticks']} ticks <= 10 ms  "
              f"[{mark(c['tick_p99'])}]")
    rl = doc["reloads"]
    print(f"reloads      ok {rl['ok']}  refused {rl['refused']}  "
          f"(expected {sum(1 for x in rl['each'] if x['expected'] == 'ok')} / "
          f"{sum(1 for x in rl['each'] if x['expected'] == 'refused')})  [{mark(c['reloads'])}]")
    print(f"fallbacks    {sum(doc['fallbacks'].values()):.0f} {doc['fallbacks']}  "
          f"[{mark(c['no_fallbacks'])}]")
    print(f"server       {'alive' if c['server_alive'] else 'DIED'} at the end  "
          f"[{mark(c['server_alive'])}]")
    if r["failures"]:
        print("first failures:", *r["failures"], sep="\n  ")
    print("PASS" if doc["ok"] else "FAIL")


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    soak = Soak(args, extra)
    try:
        doc = soak.run()
    except RuntimeError as e:
        print(f"soak: {e}", file=sys.stderr)
        return 2
    print_report(doc)
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
