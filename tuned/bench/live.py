"""The real-engine side of ``tuned bench --engine vllm``: one open-loop workload
against a freshly started server per contender.

One module, past the usual size, because starting a contender's server, driving it
and timing its requests follow one set of timing rules (below) that the pieces
share.

:func:`run_live` starts the contender's server on free local ports -- a plain vLLM
OpenAI server with a fixed ``--max-num-seqs`` for a ``static`` contender, ``tuned
serve`` with the contender's config for ``tuned`` and ``peer`` -- waits until it
answers (and, for tuned, until its controller has decided), sends one warm-up
request, then the pace probe where asked (below), then replays the workload
open-loop: request i is sent ``arrival_s`` seconds after the run starts whether or
not earlier ones have finished (the probe goes again once every request is done).
Everything runs on one asyncio event loop with the official ``openai`` client, so
the client stays light beside an engine that shares the host's cores. The server is
stopped at the end and its log kept as ``log_dir/<contender>.log``.

How each request is timed (all times in seconds since the run start, on
``time.monotonic``):

- ``arrival_s`` is the scheduled send time (the workload's), not the moment the
  client got round to sending, so client lag counts against the engine's latency as
  it would for a real user; each send's lag is reported (``LiveRun.send_lags_s``).
- Requests stream with ``stream_options = {include_usage, continuous_usage_stats}``:
  vLLM then puts the cumulative ``completion_tokens`` on every chunk, so the number
  of tokens a chunk carries is exact. A chunk carries several tokens when the API
  server fell behind the engine (vLLM merges the pending outputs of a request into
  one chunk); each of its tokens gets the chunk's arrival time. Counting text is
  not reliable: a chunk may carry a token whose text is still held back by the
  detokenizer (an incomplete UTF-8 sequence), i.e. empty text. Without per-chunk
  usage (another server), each chunk counts one token and the tokens the final
  usage reports beyond that get the last chunk's time. The times are when the
  client read the chunk: a busy API server delivers several chunks at once.
- The ``openai`` client sends the request and maps HTTP errors, but the events are
  read as raw server-sent-event lines with ``json.loads``: a typed chunk object per
  token costs many times the CPU, and the client shares the engine's cores.
- ``first_token_s`` is the first chunk with a token, ``finish_s`` the chunk with the
  last token (as ``vllm bench serve`` measures E2EL); ``output_tokens`` is the
  final usage count.
- Exact lengths: ``ignore_eos`` (the random-weight demo model emits EOS at random)
  and ``min_tokens = output_tokens``. When a request's ``max_tokens`` exceeds its
  ``output_tokens`` (the workload's ``max_tokens=M``), the engine sees ``max_tokens``
  and the client closes the stream after ``output_tokens`` tokens, which aborts the
  request in vLLM -- as an EOS would end it; the engine may have computed a token
  or two more by the time the abort lands.
- The pace probe (:data:`PACE_PROBE`, where asked: ``tuned bench`` and ``tuned
  demo`` do) is one request alone on the server, just before the run and just
  after it: the median time between its tokens is this host's decode step at batch
  1 at that moment (``LiveRun.pace_s``), so that runs minutes apart on a host whose
  speed drifts can be set side by side at the speed each ran at. A probe whose
  tokens came in bunches (a host stall: :func:`probe_step_s`) is sent again, up to
  :data:`PACE_TRIES` in all; one bunched every time is read from vLLM's own
  per-token stamps instead (:func:`_pace`); one that fails gives None; the run
  stands without it.
- A request answered HTTP 429 or 503, or whose stream ends before any token with
  finish reason ``abort`` or with only the usage chunk and ``[DONE]`` (how tuned's
  wait bound refuses a request in vLLM: aborted before its first token, whose
  stream vLLM sends without a choice), is *refused* (``refused_s``: when the answer
  came back), not failed: the clean refusal of an overloaded server. Any other
  request that raises, or ends with a different number of tokens than asked for,
  is ``failed`` with its error; the run goes on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from tuned.launch import launcher
from tuned.bench.metrics import RequestResult
from tuned.bench.runner import Contender
from tuned.bench.throttle import Throttle, run_throttles
from tuned.config import FIELDS, Config
from tuned.control.sla import sla_from_step
from tuned.core.refusal import REFUSAL_STATUSES, client_refusal  # noqa: F401  (re-exported)
from tuned.launch.launcher import EngineError, log_tail, server_info, stop_process, wait_ready
from tuned.base.netutil import free_port
from tuned.launch.prompts import PromptFactory
from tuned.base.workloads import RequestSpec, Workload

__all__ = ["Contender", "LiveRun", "LiveServer", "LiveStartError", "run_live", "config_to_toml",
           "drive_open_loop", "KINDS"]

KINDS = ("static", "peer", "tuned", "ablation")
POLL_INTERVAL_S = 0.5
REQUEST_TIMEOUT_S = 3600.0
# `tuned serve` gives vLLM 60 s to stop before it kills it; give the supervisor
# longer than that, or a SIGKILL to it would orphan the engine's own session.
TUNED_STOP_GRACE_S = 90.0
STATIC_STOP_GRACE_S = 30.0
WARMUP = RequestSpec("warmup", 0.0, 8, 4, 4)
#: one request alone before and after each run: its TPOT is the host's batch-1 decode
#: step then (32 steps after the first token; about a second on a CPU host)
PACE_PROBE = RequestSpec("pace", 0.0, 8, 33, 33)
#: a probe whose tokens came in bunches is sent again, this many times in all
PACE_TRIES = 3
#: vLLM's own histogram of the time between a request's tokens, each token stamped in
#: the engine core when its step's outputs were made (vllm/v1/engine/__init__.py,
#: ``EngineCoreOutputs.timestamp``; vllm/v1/metrics/stats.py), so a stall of the API
#: server or of this client, which bunches the stream, does not move it
ENGINE_ITL_METRIC = "vllm:inter_token_latency_seconds"


@dataclass
class LiveRun:
    """What one contender did with the workload. Times are seconds since the run
    start (the moment request 0 was due)."""

    results: list[RequestResult]           # one per RequestSpec, in the workload's order
    cap_timeline: list[tuple[float, int]]  # (s since start, applied cap)
    decisions: list[dict]                  # tuned's decisions by seq, each with run_s
    duration_s: float                      # start -> last request done
    server_log: Path
    client_cpu_s: float = 0.0              # this process's CPU over the run
    send_lags_s: list[float] = field(default_factory=list)  # per request: sent - arrival
    server_returncode: int | None = None   # None: still serving at the end, as it should
    config_path: Path | None = None        # the TOML `tuned serve` ran (tuned, peer)
    stream_chunks: int = 0                 # streamed chunks that carried tokens
    t0_monotonic_s: float | None = None    # the run start on time.monotonic(), the clock
                                           # of the engine's step records (``/steps``)
    steps: list[dict] = field(default_factory=list)  # tuned serve's step records of the
                                           # run (``t`` on the run's clock); empty for
                                           # plain vLLM, which has no /steps
    pace_s: tuple[float | None, float | None] = (None, None)  # the pace probe's step
                                           # just before the run and just after it

    @property
    def send_lag_max_s(self) -> float:
        """How far behind its arrival the latest send began (0 when none was late)."""
        return max([0.0, *self.send_lags_s])


class LiveStartError(EngineError):
    """A contender's server did not start or did not answer its warm-up request;
    the message names the contender and ends with the server log's tail."""


# --- config -> TOML ------------------------------------------------------------------------

def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        o = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif o < 0x20 or o == 0x7F:  # TOML forbids raw control characters in strings
            out.append(f"\\u{o:04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v!r} to a config (values must be finite)")
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_str(str(k))} = {_toml_value(x)}"
                               for k, x in v.items()) + "}"
    raise ValueError(f"cannot write a {type(v).__name__} to a config: {v!r}")


def config_to_toml(cfg: Config) -> str:
    """The TOML text of every field of ``cfg`` that differs from its default, so that
    ``tuned.config.load`` of it gives back an equal Config. A relative ``profile``
    is written as an absolute path (``load`` resolves it against the file's folder,
    this resolves it against the working directory). ``reload_token`` is left out
    (a bench server listens on loopback, which needs none)."""
    lines = ["# written by `tuned bench`"]
    for name, f in FIELDS.items():
        value = getattr(cfg, name)
        if value == f.metadata["default"] or f.metadata.get("secret"):
            continue  # the reload secret is never written to a file
        if name == "profile" and value:
            value = str(Path(value).resolve())
        lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


# --- servers -------------------------------------------------------------------------------

@dataclass
class _Server:
    proc: subprocess.Popen
    url: str
    endpoint: str | None      # tuned's /decisions base URL; None for plain vLLM
    log_path: Path
    config_path: Path | None
    stop_grace_s: float

    def stop(self) -> None:
        if self.proc is None:     # attached to a server someone else runs
            return
        stop_process(self.proc, grace_s=self.stop_grace_s)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "contender"


def _start_server(c: Contender, model_path: str, log_dir: Path,
                  extra: Sequence[str]) -> _Server:
    if c.kind not in KINDS:
        raise ValueError(f"contender {c.name!r}: kind must be one of {', '.join(KINDS)}, "
                         f"got {c.kind!r}")
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = _safe_name(c.name)
    log_path = log_dir / f"{stem}.log"
    port = free_port()
    config_path = None
    if c.kind == "static":
        cap = c.cap if c.cap is not None else c.config.max_num_seqs
        if cap < 1:
            raise ValueError(f"contender {c.name!r}: cap must be >= 1, got {cap}")
        cmd = launcher.static_command(c.config, model_path, port=port, max_num_seqs=cap,
                                    extra=extra)
        endpoint, grace = None, STATIC_STOP_GRACE_S
    else:
        mport = free_port(avoid=(port,))
        cfg = dataclasses.replace(c.config, model=model_path, host="127.0.0.1", port=port,
                                  metrics_host="127.0.0.1", metrics_port=mport)
        config_path = log_dir / f"{stem}.toml"
        config_path.write_text(config_to_toml(cfg))
        cmd = launcher.serve_command(config_path, extra=extra)
        endpoint, grace = f"http://127.0.0.1:{mport}", TUNED_STOP_GRACE_S
    proc = launcher.spawn(cmd, log_path=log_path,
                        header=f"# tuned bench: {c.name} ({c.kind}): {' '.join(cmd)}")
    return _Server(proc, f"http://127.0.0.1:{port}", endpoint, log_path, config_path, grace)


# --- the open loop -------------------------------------------------------------------------

async def drive_open_loop(specs: Sequence[RequestSpec],
                          send: Callable[[int, RequestSpec], Awaitable[Any]], *,
                          clock: Callable[[], float] = time.monotonic,
                          sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                          t0: float | None = None) -> tuple[list[Any], list[float]]:
    """Start ``send(i, spec)`` as its own task at ``t0 + spec.arrival_s`` (``t0``
    defaults to now), never waiting for earlier sends to finish; return their
    results in order and each send's lag (how late behind its arrival it began;
    negative: early by the sleep's resolution)."""
    t0 = clock() if t0 is None else t0
    tasks = []
    lags = []
    for i, spec in enumerate(specs):
        delay = t0 + spec.arrival_s - clock()
        if delay > 0:
            await sleep(delay)
        lags.append(clock() - t0 - spec.arrival_s)
        tasks.append(asyncio.ensure_future(send(i, spec)))
    return list(await asyncio.gather(*tasks)), lags


def _http():
    # this openai release ships httpx2; older ones use httpx (same API)
    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - depends on the openai release
        import httpx
    return httpx


class _Client:
    """The run's HTTP side: streamed completions and tuned's /decisions poller.
    ``openai`` and ``http`` are built for ``base_url`` unless given (tests pass
    fakes); ``clock`` is the run's clock."""

    def __init__(self, base_url: str, model: str, endpoint: str | None, *,
                 timeout_s: float = REQUEST_TIMEOUT_S, openai: Any = None, http: Any = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_decision: Callable[[dict], None] | None = None):
        if http is None:
            httpx = _http()
            # Open loop: no pool limit (a limit would queue requests in the client),
            # and no keep-alive (uvicorn drops idle connections after 5 s; a request
            # sent on one that is closing fails).
            http = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=0))
        if openai is None:
            from openai import AsyncOpenAI

            openai = AsyncOpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", max_retries=0,
                                 timeout=timeout_s, http_client=http)
        self.http = http
        self.openai = openai
        self.base_url = base_url
        self.on_decision = on_decision
        self.model = model
        self.endpoint = endpoint
        self.clock = clock
        self.t0 = clock()  # the run start; reset when the run starts
        self.cap_timeline: list[tuple[float, int]] = []
        self.decisions: dict[int, dict] = {}
        self.poll_errors = 0
        self.chunks = 0        # streamed chunks that carried tokens
        self._wall_offset = 0.0  # time.time() - the clock, for decisions' wall times

    def now(self) -> float:
        return self.clock() - self.t0

    async def send(self, spec: RequestSpec, prompt: list[int]) -> RequestResult:
        """Stream one request; see the module docstring for what is recorded."""
        times: list[float] = []
        usage_total: int | None = None
        usage_prompt: int | None = None
        seen = 0            # tokens counted so far
        finish = None
        finish_t = None     # when the finish reason came
        done_t = None       # when [DONE] came
        res = RequestResult(spec.request_id, spec.arrival_s, spec.prompt_tokens, 0, None, None,
                            token_times_s=times)
        cut = spec.max_tokens > spec.output_tokens
        try:
            # The official client sends the request and maps HTTP errors; the events
            # are read as raw SSE lines: building a typed chunk per token costs many
            # times the CPU of json.loads, and the client shares the engine's cores.
            async with self.openai.completions.with_streaming_response.create(
                    model=self.model, prompt=prompt, max_tokens=spec.max_tokens,
                    temperature=0, stream=True,
                    stream_options={"include_usage": True, "continuous_usage_stats": True},
                    extra_body={"ignore_eos": True, "min_tokens": spec.output_tokens}
            ) as response:
                async for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    t = self.now()
                    if data == "[DONE]":
                        done_t = t
                        break
                    event = json.loads(data)
                    if "error" in event:
                        err = event["error"]
                        raise EngineError(err.get("message", err) if isinstance(err, dict)
                                          else err)
                    u = event.get("usage")
                    if u and u.get("prompt_tokens") is not None:
                        usage_prompt = u["prompt_tokens"]
                    choices = event.get("choices")
                    if choices:
                        n = (u["completion_tokens"] - seen) if u else 1
                        if cut:
                            n = min(n, spec.output_tokens - seen)
                        if n > 0:
                            times.extend([t] * n)
                            seen += n
                            self.chunks += 1
                        if choices[0].get("finish_reason"):
                            finish, finish_t = choices[0]["finish_reason"], t
                        if cut and seen >= spec.output_tokens:
                            usage_total, finish = seen, "cut"
                            break  # closing the response aborts the request in vLLM
                    elif u:
                        usage_total = u["completion_tokens"]
            refused = client_refusal(tokens=len(times), finish=finish,
                                     stream_done=done_t is not None)
            if refused is not None:
                # tuned's wait bound refused it (client_refusal reads vLLM's answer)
                res.refused_s = finish_t if finish_t is not None else done_t
                res.error = refused
                return res
            if usage_total is not None and usage_total > len(times) and times:
                times.extend([times[-1]] * (usage_total - len(times)))  # no per-chunk usage
            res.output_tokens = usage_total if usage_total is not None else seen
            if finish is None:
                raise EngineError("the stream ended without a finish reason")
            if usage_prompt is not None and usage_prompt != spec.prompt_tokens:
                raise EngineError(f"the server counted {usage_prompt} prompt tokens, "
                                  f"sent {spec.prompt_tokens}")
            if res.output_tokens != spec.output_tokens or len(times) != spec.output_tokens:
                raise EngineError(f"generated {res.output_tokens} tokens ({len(times)} timed), "
                                  f"asked for {spec.output_tokens}")
            res.first_token_s, res.finish_s = times[0], times[-1]
        except Exception as e:  # any failure: record it, the run goes on
            refused = client_refusal(getattr(e, "status_code", None))
            if refused is not None:
                # an overloaded server's clean answer: refused, not failed; what it
                # said beside (tuned's door: "overloaded: ..."; its queue: "refused
                # (max_wait) after waiting ...")
                res.refused_s = self.now()
                said = _error_message(e)
                res.error = f"{refused}: {said}" if said else refused
            else:
                res.failed = True
                res.error = f"{type(e).__name__}: {e}"
            res.output_tokens = res.output_tokens or seen
            res.first_token_s = res.finish_s = None
        return res

    async def engine_itl(self) -> tuple[float, float] | None:
        """(sum, count) of :data:`ENGINE_ITL_METRIC` over every engine on the server's
        ``/metrics``; None where it could not be read."""
        from prometheus_client.parser import text_string_to_metric_families

        try:
            r = await self.http.get(f"{self.base_url}/metrics", timeout=5.0)
            r.raise_for_status()
            total = {"_sum": 0.0, "_count": 0.0}
            for fam in text_string_to_metric_families(r.text):
                if fam.name == ENGINE_ITL_METRIC:
                    for sample in fam.samples:
                        suffix = sample.name[len(ENGINE_ITL_METRIC):]
                        if suffix in total:
                            total[suffix] += sample.value
            return total["_sum"], total["_count"]
        except Exception:   # noqa: BLE001 - a fallback measurement only
            return None

    async def poll_decisions(self, limit: int) -> bool:
        """One GET of tuned's /decisions: the applied cap into the timeline, new
        decisions by seq. False when it failed or a gap means a longer fetch is due."""
        try:
            r = await self.http.get(f"{self.endpoint}/decisions", params={"limit": limit},
                                    timeout=5.0)
            r.raise_for_status()
            d = r.json()
        except Exception:
            self.poll_errors += 1
            return False
        t = self.now()
        applied = d.get("applied") or {}
        if applied.get("cap") is not None:
            self.cap_timeline.append((t, int(applied["cap"])))
        recent = d.get("recent") or []
        known = max(self.decisions, default=0)
        for entry in recent:
            seq = int(entry["seq"])
            if seq not in self.decisions:
                e = dict(entry)
                if isinstance(e.get("t"), (int, float)):
                    e["run_s"] = e["t"] - self._wall_offset - self.t0
                self.decisions[seq] = e
                if self.on_decision is not None:
                    self.on_decision(e)
        seqs = [int(e["seq"]) for e in recent]
        return not (seqs and known and min(seqs) > known + 1 and len(seqs) >= limit)

    async def poller(self, stop: asyncio.Event) -> None:
        # A long first fetch, then short ones (a decision per 0.5 s tick at most);
        # a gap in seq (a stall longer than the short window) fetches long again.
        limit = 200
        while not stop.is_set():
            complete = await self.poll_decisions(limit)
            limit = 16 if complete else 200
            try:
                await asyncio.wait_for(stop.wait(), POLL_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    async def aclose(self) -> None:
        await self.openai.close()
        await self.http.aclose()


async def _run_async(client: _Client, workload: Workload, prompts: list[list[int]],
                     warm_prompt: list[int], progress: Callable[[int, int], None] | None,
                     throttles: tuple[Throttle, ...] = (), server_pid: int | None = None,
                     pace: bool = False
                     ) -> tuple[list[RequestResult], float, float, list[float], int,
                                tuple[float | None, float | None]]:
    total = len(workload.requests)
    warm = await client.send(WARMUP, warm_prompt)
    if warm.failed:
        raise EngineError(f"the warm-up request failed: {warm.error}")
    pace_before = await _pace(client, warm_prompt) if pace else None
    client.chunks = 0
    stop = asyncio.Event()
    poll_task = throttle_task = None
    done = 0
    if progress is not None:
        progress(0, total)

    async def send(i: int, spec: RequestSpec) -> RequestResult:
        nonlocal done
        r = await client.send(spec, prompts[i])
        done += 1
        if progress is not None:
            progress(done, total)
        return r

    client._wall_offset = time.time() - client.clock()
    t0 = client.clock()
    client.t0 = t0
    cpu0 = time.process_time()
    if client.endpoint is not None:
        poll_task = asyncio.ensure_future(client.poller(stop))
    if throttles and server_pid is not None:
        throttle_task = asyncio.ensure_future(run_throttles(throttles, server_pid, t0,
                                                            client.clock))
    try:
        results, lags = await drive_open_loop(workload.requests, send, t0=t0,
                                              clock=client.clock)
    finally:
        duration = client.clock() - t0
        stop.set()
        if throttle_task is not None:
            throttle_task.cancel()
            await asyncio.gather(throttle_task, return_exceptions=True)
        if poll_task is not None:
            await poll_task
    if client.endpoint is not None:
        await client.poll_decisions(200)  # the state at the end
    cpu = time.process_time() - cpu0
    chunks = client.chunks
    return results, duration, cpu, lags, chunks, (
        pace_before, await _pace(client, warm_prompt) if pace else None)


#: two tokens of a stream read less than this apart came in one bunch: the client read
#: lines the server had queued while one of them was kept off the cores, not one step
BUNCHED_S = 2e-4


def probe_step_s(itls_s: Sequence[float]) -> float | None:
    """The decode step a lone request's stream shows, from the times between its
    tokens (:attr:`RequestResult.itls_s <tuned.bench.metrics.RequestResult.itls_s>`):
    their median, or None when at least half of them came in bunches (a host stall
    held the server or the client while the engine stepped, and the tokens were read
    together; their TPOT would read near zero, or the stall as a slow step).

    The median, not the TPOT (the mean): a stall of a second in a probe of 32 steps
    of 10-30 ms would move the mean by 1.5-3x and the median by a step at most."""
    if not itls_s or 2 * sum(1 for g in itls_s if g < BUNCHED_S) >= len(itls_s):
        return None
    return statistics.median(itls_s)


async def _pace(client: _Client, prompt: list[int]) -> float | None:
    """The pace probe's step: :data:`PACE_PROBE` alone on the server
    (:func:`probe_step_s` of its stream); None when it fails or is refused.

    When its tokens came in bunches (a stall of the API server or of this client, or
    steps so short that the whole stream is made before either reads it) it is sent
    again, up to :data:`PACE_TRIES` in all; when each try came bunched, the step is the
    median over the tries of the mean time between the probe's tokens as vLLM stamped
    them in the engine core (:data:`ENGINE_ITL_METRIC`, read before the first try and
    after each), None where that could not be read either. A measurement, never a reason to
    stop the run."""
    engine_steps: list[float] = []
    before = await client.engine_itl()
    for _ in range(PACE_TRIES):
        try:
            r = await client.send(PACE_PROBE, prompt)
        except Exception:   # noqa: BLE001 - the probe only measures
            return None
        if not r.completed:
            return None
        step = probe_step_s(r.itls_s)
        if step is not None:
            return step
        # read once between tries: nothing else is in flight, so one try's "after"
        # is the next one's "before"
        after = await client.engine_itl() if before is not None else None
        if after is not None:
            n = after[1] - before[1]
            # the probe's own steps: the count grew by its tokens after the first
            # (fewer where the engine's stats missed a step)
            if 2 * n >= PACE_PROBE.output_tokens - 1:
                engine_steps.append((after[0] - before[0]) / n)
        before = after
    return statistics.median(engine_steps) if engine_steps else None


class LiveServer:
    """A contender's server, started and ready (tuned: its controller has decided),
    with the model id and a prompt factory; :meth:`drive` runs workloads on it.
    Use as a context manager: the server stops on exit."""

    def __init__(self, contender: Contender, *, model_path: str, log_dir: Path,
                 startup_timeout_s: float = 600.0, extra_vllm_args: Sequence[str] = (),
                 seed: int = 0) -> None:
        from tuned.base.hostinfo import demo_dtype_args

        self.contender = contender
        # the demo model's dtype follows this CPU, for plain vLLM and tuned alike
        extra = list(extra_vllm_args)
        extra += demo_dtype_args(contender.config.model, extra + list(contender.config.vllm_args))
        self.srv = _start_server(contender, model_path, Path(log_dir), extra)
        try:
            try:
                deadline = time.monotonic() + startup_timeout_s
                wait_ready(self.srv.url, self.srv.proc, startup_timeout_s, self.srv.log_path)
                if self.srv.endpoint is not None:
                    launcher.wait_decided(self.srv.endpoint, self.srv.proc, deadline,
                                        self.srv.log_path)
                self.model_id = server_info(self.srv.url)["id"]
                self.factory = PromptFactory.from_server(self.srv.url, self.model_id,
                                                         seed=seed)
            except EngineError as e:  # its message ends with the log's tail
                raise LiveStartError(f"contender {contender.name!r} ({contender.kind}) did "
                                     f"not start: {e}") from None
            except Exception as e:  # the server answers, but not as vLLM should
                raise LiveStartError(f"contender {contender.name!r} ({contender.kind}) did "
                                     f"not start: {type(e).__name__}: {e}; last lines of "
                                     f"{self.srv.log_path}:\n{log_tail(self.srv.log_path)}"
                                     ) from None
        except BaseException:
            self.srv.stop()
            raise

    @classmethod
    def attach(cls, contender: Contender, *, url: str, endpoint: str | None,
               log_path: Path, seed: int = 0) -> "LiveServer":
        """Drive a server someone else started and stops (``stop`` leaves it running)."""
        self = cls.__new__(cls)
        self.contender = contender
        self.srv = _Server(None, url, endpoint, Path(log_path), None, 0.0)
        self.model_id = server_info(url)["id"]
        self.factory = PromptFactory.from_server(url, self.model_id, seed=seed)
        return self

    @property
    def url(self) -> str:
        return self.srv.url

    @property
    def endpoint(self) -> str | None:
        """tuned's /decisions base URL (None for plain vLLM)."""
        return self.srv.endpoint

    def __enter__(self) -> "LiveServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.srv.stop()

    def pace(self, n: int = 1) -> list[float | None]:
        """``n`` pace probes sent one after another on this server, nothing else in
        flight: each one's step (:func:`_pace`; None where it gave no figure)."""
        prompt = self.factory.make(PACE_PROBE.prompt_tokens)
        client = _Client(self.srv.url, self.model_id, self.srv.endpoint)

        async def main():
            try:
                return [await _pace(client, prompt) for _ in range(n)]
            finally:
                await client.aclose()

        return asyncio.run(main())

    def drive(self, workload: Workload, *,
              progress: Callable[[int, int], None] | None = None,
              on_decision: Callable[[dict], None] | None = None,
              throttles: tuple[Throttle, ...] = (), pace: bool = False) -> LiveRun:
        """Replay ``workload`` open-loop on this server (one warm-up request first);
        ``on_decision`` sees each new tuned decision as it is polled; ``throttles``
        slow the server at their times (:mod:`tuned.bench.throttle`); ``pace``: send
        the pace probe before and after the run (``LiveRun.pace_s``)."""
        contender, srv = self.contender, self.srv
        if throttles and srv.proc is None:
            raise ValueError("throttles: only a server this bench started can be "
                             "throttled, not an attached one")
        prompts = [self.factory.make(s.prompt_tokens) for s in workload.requests]
        warm_prompt = self.factory.make(WARMUP.prompt_tokens)
        client = _Client(srv.url, self.model_id, srv.endpoint, on_decision=on_decision)

        async def main():
            try:
                return await _run_async(client, workload, prompts, warm_prompt, progress,
                                        throttles, srv.proc.pid if throttles else None,
                                        pace=pace)
            finally:
                await client.aclose()

        try:
            results, duration, cpu, lags, chunks, paces = asyncio.run(main())
        except EngineError as e:
            raise LiveStartError(f"contender {contender.name!r} ({contender.kind}): {e}; "
                                 f"last lines of {srv.log_path}:\n"
                                 f"{log_tail(srv.log_path)}") from None
        returncode = srv.proc.poll() if srv.proc is not None else None
        t0 = client.t0 if client.clock is time.monotonic else None
        steps = (_run_steps(srv.endpoint, t0, duration)
                 if srv.endpoint and t0 is not None else [])
        if contender.kind == "static":
            cap = contender.cap if contender.cap is not None else contender.config.max_num_seqs
            timeline = [(0.0, cap), (duration, cap)]
        else:
            timeline = client.cap_timeline
        return LiveRun(results=results, cap_timeline=timeline,
                       decisions=[client.decisions[s] for s in sorted(client.decisions)],
                       duration_s=duration, server_log=srv.log_path, client_cpu_s=cpu,
                       send_lags_s=lags, server_returncode=returncode,
                       config_path=srv.config_path, stream_chunks=chunks,
                       t0_monotonic_s=t0, steps=steps, pace_s=paces)


def _run_steps(endpoint: str, t0: float, duration_s: float = math.inf) -> list[dict]:
    """The engine's step records from the run start ``t0`` (time.monotonic(), the
    engine's clock) to ``duration_s`` after it (not the pace probe's after the run),
    ``t`` made relative to it: what the run's steps took, to set beside a step model's
    prediction. Empty when the endpoint does not answer: the run stands without them."""
    import requests

    try:   # the endpoint of tuned.profiler.steps.StepsClient (a sibling layer)
        samples = requests.get(f"{endpoint}/steps", timeout=5).json()["samples"]
    except Exception:
        return []
    return [{**s, "t": s["t"] - t0} for s in samples
            if t0 <= s.get("t", -1.0) <= t0 + duration_s]


def run_live(contender: Contender, workload: Workload, *, model_path: str, log_dir: Path,
             startup_timeout_s: float = 600.0, extra_vllm_args: Sequence[str] = (),
             progress: Callable[[int, int], None] | None = None, seed: int = 0,
             throttles: tuple[Throttle, ...] = (), pace: bool = False) -> LiveRun:
    """Run ``workload`` open-loop against a fresh server for ``contender`` (see the
    module docstring) and stop it. Prompts are token ids drawn with ``seed`` from the
    server's tokenizer, so every contender gets the same prompts; ``throttles`` slow
    the server at their times in the workload; ``pace``: send the pace probe before
    and after the run.

    Raises :class:`LiveStartError` naming the contender, with the log's tail, when
    the server does not come up or the warm-up request fails."""
    with LiveServer(contender, model_path=model_path, log_dir=log_dir,
                    startup_timeout_s=startup_timeout_s, extra_vllm_args=extra_vllm_args,
                    seed=seed) as server:
        return server.drive(workload, progress=progress, throttles=throttles, pace=pace)


#: lone requests whose median step is the batch-1 decode step that a relative SLA is a
#: multiple of (:func:`calibrate`)
CALIBRATION_PROBES = 3


def calibrate(server: LiveServer, cfg: Config, timeout_s: float = 180.0) -> dict:
    """The SLA ``tbt_sla_auto`` x this host's decode step at batch 1, the step read as
    the pace probe reads it: the median of :data:`CALIBRATION_PROBES` lone requests'
    steps (:func:`probe_step_s`), sent one after another once ``server``'s controller
    has derived its own SLA (:class:`tuned.control.sla.SlaSource`) under the
    calibration load (two requests in flight) repeated until it has. The controller's
    ``derived_sla`` (``sla_s``, ``step_s_batch1``, ``factor``, ``fit``) with the probes'
    step in their place (:func:`probed_step`). RuntimeError when the controller has
    not derived one within ``timeout_s``.

    Why not the controller's own figure: it is the online fit's prediction at batch 1
    from the first few dozen steps of a server just started, and read the step 0.7x to
    2x what the pace probe read around the runs a minute later; an SLA set on a slow reading made the demo's
    load so light that vLLM's default met it too, one on a fast reading so tight that
    no chunk held it."""
    import requests

    from tuned.bench.runner import CALIBRATION_WORKLOAD
    from tuned.base.workloads import parse_workload

    t_end = time.monotonic() + timeout_s
    wl = parse_workload(CALIBRATION_WORKLOAD, 0, max_model_len=cfg.effective_max_model_len)
    while time.monotonic() < t_end:
        server.drive(wl)
        d = requests.get(f"{server.endpoint}/decisions?limit=0", timeout=5).json()
        derived = (d.get("config") or {}).get("derived_sla")
        if derived:
            return probed_step(derived, server.pace(CALIBRATION_PROBES))
    raise RuntimeError("the controller did not derive an SLA within "
                       f"{timeout_s:.0f}s of calibration load")


def probed_step(derived: dict, steps: Sequence[float | None]) -> dict:
    """``derived`` (a controller's ``derived_sla``) with ``step_s_batch1`` the median of
    the lone-request ``steps`` that gave a figure and ``sla_s`` ``factor`` x it (as
    the controller derives it, :func:`tuned.control.sla.sla_from_step`),
    ``step_source`` ``"probe"``; the
    controller's own step kept as ``fit_step_s_batch1`` and the probes as
    ``probe_steps_s``. Where none gave a figure (each one bunched, refused or failed)
    the controller's step stands, ``step_source`` ``"fit"``."""
    out = {**derived, "fit_step_s_batch1": derived["step_s_batch1"],
           "probe_steps_s": list(steps), "step_source": "fit"}
    got = [s for s in steps if s is not None]
    if got:
        step = statistics.median(got)
        out.update(step_s_batch1=step, sla_s=sla_from_step(derived["factor"], step),
                   step_source="probe")
    return out


#: the load that follows the calibration in ``tuned demo``: a burst of chat-sized
#: requests (the demo's chat phases), so the engine's steps span batches 1 to the cap
#: at the chat's context, and the step fit the demo sizes its workload from is
#: measured there rather than extrapolated from the calibration's one or two requests
#: in flight (long prompts would put their cache reads in the cost a sequence, which
#: the chat phases do not pay). Outputs of 16-112 tokens end one by one, so the decode
#: batch steps down through every size to 1; outputs all of one length end together,
#: and where the engine admitted the burst at once no three batches had decode-only
#: steps to fit.
#: Then four long prompts answered with two tokens each, one every 5 s (the first
#: after the burst has decoded, so that its chunks leave the small batches'
#: decode-only steps to the line): their chunks prefill beside few decodes or none,
#: so a step's time over the line is mostly prefill, and the cost a prompt token is
#: read there. The burst's own prefilling steps carry up to 24 decodes, where the
#: line's error is as large as the prefill.
PROBE_WORKLOAD = ("phases:poisson:rate=200,prompt=U(32,128),output=U(16,112),n=24;"
                  "gamma:rate=0.2,cv=0.1,prompt=U(500,700),output=2,n=4")


def measure_step_fit(server: LiveServer, cfg: Config) -> dict | None:
    """Drive :data:`PROBE_WORKLOAD` on ``server`` and fit its engine steps
    (:func:`burst_step_fit`). None when the server keeps no step records (plain vLLM)
    or the steps give no fit."""
    from tuned.base.workloads import parse_workload

    wl = parse_workload(PROBE_WORKLOAD, 0, max_model_len=cfg.effective_max_model_len)
    return burst_step_fit(server.drive(wl).steps)


#: a decode batch joins the burst's line with this many decode-only steps or more
MIN_STEPS_PER_BATCH = 3
#: a step reads the cost a prompt token where it prefilled this many tokens or more
#: beside at most :data:`FEW_DECODES` decodes (the probe's long prompts); with fewer
#: than :data:`MIN_PREFILL_STEPS` such steps, every step that prefilled 32 or more
PREFILL_STEP_TOKENS = 64
FEW_DECODES = 2
MIN_PREFILL_STEPS = 3


def burst_step_fit(steps: Sequence[dict]) -> dict | None:
    """T(b, c) = a + beta b + gamma c from a burst's step records, robust to the few
    steps a shared host stalls or a new shape compiles: ``a`` and ``beta`` are the
    line (the one fitter, :func:`tuned.curves.fit.fit_step_time`, slopes >= 0)
    through each decode batch's median decode-only step (batches with at least
    :data:`MIN_STEPS_PER_BATCH` of them); ``gamma`` the median, over the steps that
    prefilled :data:`PREFILL_STEP_TOKENS` or more beside at most :data:`FEW_DECODES`
    decodes (where there are :data:`MIN_PREFILL_STEPS` of them; else over the
    steps that prefilled 32 tokens or more), of what each took over that line per
    prompt token;
    ``eta`` 0 (the KV read of the burst's context is in ``beta``). Also ``r2``,
    ``n_samples`` (the decode-only steps on the line) and ``batch_max``. None with
    fewer than 3 such batches or a line with no cost per sequence (least squares on
    the raw steps, the online fit's four terms, can put everything in the intercept
    where a few steps stalled)."""
    import statistics

    from tuned.curves.fit import FitError, fit_step_time

    by_batch: dict[int, list[float]] = {}
    for s in steps:
        if s["num_decode"] and not s["prefill_tokens"]:
            by_batch.setdefault(int(s["num_decode"]), []).append(float(s["step_s"]))
    batches = sorted(b for b, v in by_batch.items() if len(v) >= MIN_STEPS_PER_BATCH)
    if len(batches) < 3:
        return None
    medians = [statistics.median(by_batch[b]) for b in batches]
    try:
        fit = fit_step_time(batches, [0] * len(batches), medians)
    except FitError:
        return None
    a, beta = fit.params["a"], fit.params["beta"]
    # no cost per sequence: a slope whose whole span is rounding next to the
    # intercept (one host's least squares returned 5e-20 s for a flat line)
    if not beta * batches[-1] > 1e-6 * abs(a):
        return None

    def excess(pick) -> list[float]:
        return [(s["step_s"] - a - beta * s["num_decode"]) / s["prefill_tokens"]
                for s in steps if pick(s)]

    per_token = excess(lambda s: s["prefill_tokens"] >= PREFILL_STEP_TOKENS
                       and s["num_decode"] <= FEW_DECODES)
    if len(per_token) < MIN_PREFILL_STEPS:
        per_token = excess(lambda s: s["prefill_tokens"] >= 32)
    gamma = max(statistics.median(per_token), 0.0) if per_token else 0.0
    return {"a": a, "beta": beta, "gamma": gamma, "eta": 0.0, "r2": fit.r2,
            "n_samples": sum(len(by_batch[b]) for b in batches), "batch_max": batches[-1]}


def sla_capacity(fit: dict, sla_s: float, prompt_mean: float, output_mean: float, *,
                 ceiling: int = 32, context_tokens: float = 160.0) -> tuple[float, float]:
    """Requests a second the engine serves within the TPOT SLA ``sla_s``, and the
    batch that holds it, from a fitted step model T(b, c) = a + beta*b + gamma*c
    (+ eta*kv; ``fit``'s keys): the SLA holds up to b_sla = (SLA - a) / (beta +
    eta*ctx) decodes (2 to ``ceiling``); a request costs prompt_mean*gamma of prefill
    plus output_mean decode steps shared with b_sla - 1 others, so
    mu = 1 / (prompt_mean*gamma + output_mean*SLA/b_sla). It counts decodes at the
    SLA's batch as if no prefill shared their steps: an upper estimate."""
    a, beta, gamma, eta = (float(fit.get(k, 0.0) or 0.0) for k in ("a", "beta", "gamma", "eta"))
    per_seq = max(beta + eta * context_tokens, 1e-6)
    b_sla = min(max((sla_s - a) / per_seq, 2.0), float(ceiling))
    return 1.0 / (prompt_mean * max(gamma, 0.0) + output_mean * sla_s / b_sla), b_sla


def measure_batch1_step(base: Config, *, model_path: str, log_dir: Path, seed: int = 0,
                        factor: float = 2.5, startup_timeout_s: float = 600.0,
                        extra_vllm_args: Sequence[str] = (), step_fit: bool = False) -> dict:
    """This host's decode step at batch 1, measured as `tuned demo` measures it: tuned
    serve on ``base`` with the SLA left to ``tbt_sla_auto`` = ``factor``, the
    calibration load, the derived SLA (:func:`calibrate`); with ``step_fit``, also the
    demo's burst and its step fit (:func:`measure_step_fit`) as ``burst_fit`` (None
    when the steps give none); the server stops after."""
    cfg = dataclasses.replace(base, tbt_sla_s=0.0, tbt_sla_auto=factor)
    with LiveServer(Contender("calibration", "tuned", cfg), model_path=model_path,
                    log_dir=log_dir, seed=seed, startup_timeout_s=startup_timeout_s,
                    extra_vllm_args=extra_vllm_args) as srv:
        derived = calibrate(srv, cfg)
        if step_fit:
            derived["burst_fit"] = measure_step_fit(srv, cfg)
        return derived


def _error_message(e: BaseException) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``)
    an HTTP error carried, on one line, at most 160 characters ('' when none)."""
    body = getattr(e, "body", None)
    msg = ""
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = str(err.get("message", "")) if isinstance(err, dict) else ""
    return " ".join(msg.split())[:160]
