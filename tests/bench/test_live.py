"""The real-engine side of ``tuned bench``: config files, the open-loop send
schedule, stream accounting, start failures, and one end-to-end run of a static and
a tuned contender against the real vLLM server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import sys
import threading
import tomllib
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuned import config as config_mod
from tuned.launch import launcher
from tuned.bench import live
from tuned.bench.live import (Contender, LiveStartError, _Client, config_to_toml,
                              drive_open_loop, run_live)
from tuned.config import Config, validate
from tuned.base.workloads import RequestSpec, parse_workload

DATA = Path(__file__).resolve().parents[1] / "data"


# --- config -> TOML --------------------------------------------------------------------------

def _roundtrip(cfg: Config, tmp_path: Path) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(config_to_toml(cfg))
    return config_mod.load(path)


def test_default_config_writes_no_keys_and_loads_back_equal(tmp_path):
    text = config_to_toml(Config())
    assert tomllib.loads(text) == {}
    assert _roundtrip(Config(), tmp_path) == Config()


def test_embedded_default_round_trips(tmp_path):
    cfg = config_mod.default()
    non_default = {k: v for k, v in config_mod.EMBEDDED_DEFAULT.items()
                   if v != config_mod.FIELDS[k].metadata["default"]}
    assert tomllib.loads(config_to_toml(cfg)) == non_default
    assert _roundtrip(cfg, tmp_path) == cfg


def test_every_kind_of_field_round_trips(tmp_path):
    profile = str((DATA / "profile_v1.json").resolve())
    cfg = validate({
        "model": "/models/llama \"8b\"\\v1", "max_num_seqs": 48, "num_gpu_blocks": 32,
        "port": 8123, "metrics_port": 9999, "reload_token": "s3cr\u00e9t\x7f\ttab",
        "vllm_args": ["--dtype", "float32", "--chat-template", "{{ '\\n' }}\u00e9\U0001F600",
                      ""],
        "interval_s": 0.25, "eps_m": 1e-6, "tbt_sla_s": 0.025, "eps_d_s": 0.002,
        "b_min": 2, "b_max": 40, "fallback_cap": 8, "sla_mode": "paper",
        "queue_policy": "mcsf", "queue_options": {"reserve_fraction": 0.05},
        "class_deadlines_s": {"qna": 1.0, "code gen": 8, "x.y": 2.5},
        "profile": profile, "log_level": "debug", "batch_policy": "trtllm"})
    back = _roundtrip(cfg, tmp_path)
    # the reload secret is never written to a file (a bench server listens on loopback)
    assert back == dataclasses.replace(cfg, reload_token="")
    assert back.vllm_args[3].endswith("\U0001F600")
    assert back.class_deadlines_s == {"qna": 1.0, "code gen": 8, "x.y": 2.5}


def test_relative_profile_is_written_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(DATA.parent)
    cfg = Config(profile="data/profile_v1.json")
    back = _roundtrip(cfg, tmp_path)  # the file lives elsewhere: a relative path would break
    assert back == dataclasses.replace(cfg, profile=str((DATA / "profile_v1.json").resolve()))


def test_values_toml_cannot_hold_are_refused():
    with pytest.raises(ValueError, match="finite"):
        config_to_toml(Config(interval_s=float("nan")))


# --- the open-loop schedule on a fake clock --------------------------------------------------

class FakeClock:
    """A clock that only moves when slept on; ``oversleep`` s are added to the next
    sleep (a busy event loop wakes late)."""

    def __init__(self, start: float = 100.0):
        self.now = start
        self.sleeps: list[float] = []
        self.oversleep = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, d: float) -> None:
        self.sleeps.append(d)
        await asyncio.sleep(0)  # tasks already due run now, before time moves
        self.now += d + self.oversleep
        self.oversleep = 0.0


def _spec(i: int, arrival: float) -> RequestSpec:
    return RequestSpec(f"r{i:06d}", arrival, 8, 4, 4)


def test_sends_start_at_their_arrival_times_without_waiting_for_completions():
    clock = FakeClock()
    specs = [_spec(i, a) for i, a in enumerate([0.0, 0.25, 0.25, 1.0, 3.5])]
    sent: list[tuple[int, float]] = []
    all_sent = asyncio.Event()

    async def send(i, spec):
        sent.append((i, clock() - 100.0))
        if len(sent) == len(specs):
            all_sent.set()
        await all_sent.wait()  # nobody finishes before the last one is sent
        return spec.request_id

    results, lags = asyncio.run(drive_open_loop(specs, send, clock=clock, sleep=clock.sleep))
    assert sent == [(0, 0.0), (1, 0.25), (2, 0.25), (3, 1.0), (4, 3.5)]
    assert results == [s.request_id for s in specs]
    assert lags == [0.0] * 5
    assert clock.sleeps == [0.25, 0.75, 2.5]


def test_a_late_loop_sends_at_once_and_reports_its_lag():
    clock = FakeClock()
    clock.oversleep = 0.3  # the first wake-up comes 0.3 s late
    specs = [_spec(0, 0.0), _spec(1, 0.1), _spec(2, 0.2), _spec(3, 2.0)]
    sent = []

    async def send(i, spec):
        sent.append(round(clock() - 100.0, 9))
        return i

    results, lags = asyncio.run(drive_open_loop(specs, send, clock=clock, sleep=clock.sleep))
    assert results == [0, 1, 2, 3]
    assert sent == [0.0, 0.4, 0.4, 2.0]  # 1 and 2 go out together, 3 on time again
    assert lags == pytest.approx([0.0, 0.3, 0.2, 0.0])
    assert clock.sleeps == [pytest.approx(0.1), pytest.approx(1.6)]


# --- stream accounting: the real openai client against a fake server ---------------------------

def _chunk(completion_tokens=None, prompt_tokens=8, finish=None, choices=True) -> dict:
    ev = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": finish,
                       "stop_reason": None}] if choices else []}
    if completion_tokens is not None:
        ev["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                       "total_tokens": prompt_tokens + completion_tokens}
    return ev


class FakeServer:
    """Answers POST /v1/completions with the given server-sent events, moving the
    fake clock by ``gaps[i]`` before event i; records the request bodies. GET
    /metrics answers the next of ``metrics`` (Prometheus text), 404 without them."""

    def __init__(self, clock, events, gaps, status=200, metrics=None):
        self.clock, self.events, self.gaps, self.status = clock, events, gaps, status
        self.metrics = list(metrics) if metrics is not None else None
        self.bodies: list[dict] = []
        self.sent = 0

    async def _body(self):
        gaps = self.gaps   # one list for every request, or a list per request
        if gaps and isinstance(gaps[0], list):
            gaps = gaps[min(len(self.bodies), len(gaps)) - 1]
        for ev, gap in zip(self.events, gaps):
            self.clock.now += gap
            self.sent += 1
            yield f"data: {ev if isinstance(ev, str) else json.dumps(ev)}\n\n".encode()

    def handler(self, request):
        httpx = live._http()
        if request.url.path == "/metrics":
            if not self.metrics:
                return httpx.Response(404)
            return httpx.Response(200, text=self.metrics.pop(0))
        self.bodies.append(json.loads(request.content))
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "bad prompt",
                                                                "type": "BadRequestError"}})
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=self._body())

    def send(self, spec: RequestSpec, prompt: list[int]):
        return self.run(lambda c: c.send(spec, prompt))

    def run(self, use):
        """``use(client)``'s result on a client of this server, and the client."""
        from openai import AsyncOpenAI

        httpx = live._http()
        http = httpx.AsyncClient(transport=httpx.MockTransport(self.handler))
        oa = AsyncOpenAI(base_url="http://x/v1", api_key="e", max_retries=0, http_client=http)
        c = _Client("http://x", "m", None, openai=oa, http=http, clock=self.clock)
        c.t0 = 100.0

        async def go():
            try:
                return await use(c)
            finally:
                await http.aclose()

        return asyncio.run(go()), c


def test_tokens_of_a_chunk_get_its_time_and_the_request_is_sent_as_specified():
    # 5 tokens: 1, then 3 in one chunk (the API server fell behind), then 1 with the
    # finish reason, then the usage-only chunk
    srv = FakeServer(FakeClock(100.0),
                     [_chunk(1), _chunk(4), _chunk(5, finish="length"),
                      _chunk(5, choices=False), "[DONE]"],
                     [0.5, 0.25, 0.25, 0.0, 0.0])
    r, c = srv.send(RequestSpec("r1", 0.0, 8, 5, 5), [7] * 8)
    assert not r.failed, r.error
    assert r.token_times_s == [0.5, 0.75, 0.75, 0.75, 1.0]
    assert (r.first_token_s, r.finish_s, r.output_tokens) == (0.5, 1.0, 5)
    assert c.chunks == 3
    body = srv.bodies[0]
    assert body["prompt"] == [7] * 8 and body["max_tokens"] == 5 and body["stream"] is True
    assert body["ignore_eos"] is True and body["min_tokens"] == 5
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["temperature"] == 0 and body["model"] == "m"


def test_without_per_chunk_usage_missing_tokens_get_the_last_chunk_time():
    srv = FakeServer(FakeClock(100.0),
                     [_chunk(None), _chunk(None, finish="length"), _chunk(4, choices=False)],
                     [0.5, 0.5, 0.0])
    r, _ = srv.send(RequestSpec("r1", 0.0, 8, 4, 4), [1] * 8)
    assert not r.failed, r.error
    assert r.token_times_s == [0.5, 1.0, 1.0, 1.0]


def test_a_larger_max_tokens_is_cut_by_the_client_at_output_tokens():
    srv = FakeServer(FakeClock(100.0),
                     [_chunk(2), _chunk(5), _chunk(6), _chunk(16, finish="length")],
                     [0.1, 0.1, 0.1, 0.1])
    r, _ = srv.send(RequestSpec("r1", 0.0, 8, 4, 16), [1] * 8)
    assert not r.failed, r.error
    assert srv.bodies[0]["max_tokens"] == 16 and srv.bodies[0]["min_tokens"] == 4
    assert r.output_tokens == 4 and r.token_times_s == pytest.approx([0.1, 0.1, 0.2, 0.2])
    assert srv.sent == 2  # it stopped reading as soon as it had 4 tokens


@pytest.mark.parametrize("events, status, error", [
    ([_chunk(1), _chunk(2, finish="stop"), _chunk(2, choices=False)], 200,
     "EngineError: generated 2 tokens (2 timed), asked for 4"),
    ([_chunk(4, prompt_tokens=9, finish="length"), _chunk(4, 9, choices=False)], 200,
     "EngineError: the server counted 9 prompt tokens, sent 8"),
    ([_chunk(1), {"error": {"message": "engine dead", "code": 500}}], 200,
     "EngineError: engine dead"),
    ([_chunk(1), _chunk(2)], 200, "EngineError: the stream ended without a finish reason"),
    ([], 400, "BadRequestError"),
])
def test_a_bad_answer_fails_the_request_with_its_reason(events, status, error):
    srv = FakeServer(FakeClock(100.0), events, [0.1] * len(events), status=status)
    r, _ = srv.send(RequestSpec("r1", 0.0, 8, 4, 4), [1] * 8)
    assert r.failed and r.error.startswith(error), r.error
    assert r.first_token_s is None and r.finish_s is None


def test_the_pace_probe_is_a_lone_requests_tpot_and_none_when_it_fails():
    """The pace probe asks for 33 tokens alone; its TPOT (the 32 steps after the first
    token) is the host's batch-1 step then. A probe that fails is no figure, and no
    error: the run stands without it."""
    n = live.PACE_PROBE.output_tokens
    assert (n, live.PACE_PROBE.max_tokens) == (33, 33)
    events = [_chunk(k) for k in range(1, n)] + [_chunk(n, finish="length"), "[DONE]"]
    srv = FakeServer(FakeClock(100.0), events, [0.2] + [0.025] * (n - 1) + [0.0])
    pace, _ = srv.run(lambda c: live._pace(c, [1] * 8))
    assert pace == pytest.approx(0.025)
    assert srv.bodies[0]["max_tokens"] == 33 and srv.bodies[0]["min_tokens"] == 33
    srv = FakeServer(FakeClock(100.0), [], [], status=503)     # refused
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] is None
    assert len(srv.bodies) == 1                                  # and not sent again
    srv = FakeServer(FakeClock(100.0), [_chunk(1), _chunk(2)], [0.1, 0.1])   # cut short
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] is None


def test_the_pace_probe_reads_the_median_step_and_no_figure_from_a_bunched_stream():
    """A host stall that keeps the server or the client off the cores while the
    engine steps delivers the probe's tokens in one bunch: its TPOT would read near
    zero (a demo printed a pace of 0.0 ms and a spread of 634x). With at least half
    of its tokens in bunches the probe gives no figure; a stall in the middle of an
    otherwise steady stream moves the median by nothing, where it moves the TPOT."""
    n = live.PACE_PROBE.output_tokens
    events = [_chunk(k) for k in range(1, n)] + [_chunk(n, finish="length"), "[DONE]"]
    # the first token after 0.2 s, then every token read at once 1.0 s later
    bunched = [0.2, 1.0] + [0.0] * (n - 1)
    srv = FakeServer(FakeClock(100.0), events, bunched)
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] is None
    assert len(srv.bodies) == live.PACE_TRIES == 3     # sent again, then given up
    # bunched once, steady the second time: the second try's step
    steady = [0.2] + [0.025] * (n - 1) + [0.0]
    srv = FakeServer(FakeClock(100.0), events, [bunched, steady])
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] == pytest.approx(0.025)
    assert len(srv.bodies) == 2
    # a steady 25 ms stream with one stall of 1 s after token 10: 31 of 32 gaps at 25 ms
    stalled = [0.2] + [0.025] * 9 + [1.0] + [0.025] * (n - 11) + [0.0]
    srv = FakeServer(FakeClock(100.0), events, stalled)
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] == pytest.approx(0.025)
    assert live.probe_step_s([0.025] * 8) == pytest.approx(0.025)
    assert live.probe_step_s([]) is None        # one token or none: no gap to read
    # exactly half of the gaps bunched: no figure
    assert live.probe_step_s([0.0, 0.0, 0.02, 0.02]) is None


def _vllm_metrics(*engines):
    """vLLM's /metrics text with ``vllm:inter_token_latency_seconds`` at (sum, count)
    for each engine (as vLLM labels them), beside another histogram."""
    lines = ["# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency "
             "in seconds.", "# TYPE vllm:inter_token_latency_seconds histogram"]
    for i, (total, count) in enumerate(engines):
        lab = f'engine="{i}",model_name="m"'
        lines += [f'vllm:inter_token_latency_seconds_bucket{{{lab},le="0.01"}} {count}',
                  f'vllm:inter_token_latency_seconds_bucket{{{lab},le="+Inf"}} {count}',
                  f"vllm:inter_token_latency_seconds_count{{{lab}}} {count}",
                  f"vllm:inter_token_latency_seconds_sum{{{lab}}} {total}"]
    lines += ["# HELP vllm:time_to_first_token_seconds TTFT.",
              "# TYPE vllm:time_to_first_token_seconds histogram",
              'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 99',
              'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 99.0']
    return "\n".join(lines) + "\n"


def test_a_probe_bunched_every_time_reads_the_engines_own_token_stamps():
    """Steps so short (the test model's 2 ms) that the engine makes the whole stream
    before the API server or the client reads it: every try comes bunched, and the
    step is the engine core's own stamps, the mean time between the probe's tokens
    by vLLM's histogram before and after each try (the median over the tries)."""
    n = live.PACE_PROBE.output_tokens
    events = [_chunk(k) for k in range(1, n)] + [_chunk(n, finish="length"), "[DONE]"]
    bunched = [0.2, 1.0] + [0.0] * (n - 1)
    # engine 1 served the three tries: 32 gaps of 2, 3 and 2.5 ms; engine 0 did nothing
    # (/metrics is read before the first try and after each)
    stamps = [(1.0, 10), (0.5, 100)], [(1.0, 10), (0.564, 132)], \
        [(1.0, 10), (0.66, 164)], [(1.0, 10), (0.74, 196)]
    srv = FakeServer(FakeClock(100.0), events, bunched,
                     metrics=[_vllm_metrics(*m) for m in stamps])
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] == pytest.approx(0.0025)
    assert len(srv.bodies) == 3 and srv.metrics == []
    # a try whose stats missed more than half its steps gives no figure from them
    srv = FakeServer(FakeClock(100.0), events, bunched,
                     metrics=[_vllm_metrics(*m) for m in (
                         [(0.0, 0)], [(0.3, 15)], [(0.364, 47)], [(0.564, 57)])])
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] == pytest.approx(0.002)
    # no /metrics either: no figure
    srv = FakeServer(FakeClock(100.0), events, bunched)
    assert srv.run(lambda c: live._pace(c, [1] * 8))[0] is None


# --- start failures ----------------------------------------------------------------------------

def test_a_server_that_dies_at_start_names_the_contender_and_shows_its_log(tmp_path,
                                                                        monkeypatch):
    def dying(cfg, model_path, *, port, max_num_seqs=None, extra=(), python=sys.executable):
        return [python, "-c", "import sys; print('no such model: ' + sys.argv[1]); "
                "raise SystemExit(3)", model_path]

    monkeypatch.setattr(launcher, "static_command", dying)
    wl = parse_workload("poisson:rate=4,prompt=8,output=4,n=2", seed=0)
    with pytest.raises(LiveStartError) as e:
        run_live(Contender("static-8", "static", Config(), cap=8), wl, model_path="/nope",
                 log_dir=tmp_path, startup_timeout_s=60)
    msg = str(e.value)
    assert "contender 'static-8' (static) did not start" in msg
    assert "exited with code 3" in msg and "no such model: /nope" in msg
    assert (tmp_path / "static-8.log").is_file()


def test_an_unknown_kind_is_refused(tmp_path):
    wl = parse_workload("poisson:rate=4,prompt=8,output=4,n=2", seed=0)
    with pytest.raises(ValueError, match="kind must be one of static, peer, tuned, ablation"):
        run_live(Contender("x", "fixed", Config()), wl, model_path="/m", log_dir=tmp_path)


# --- end to end on the real engine -------------------------------------------------------------

def _check_results(run, workload):
    assert [r.request_id for r in run.results] == [s.request_id for s in workload]
    for r, s in zip(run.results, workload):
        assert not r.failed, (r.request_id, r.error)
        assert r.output_tokens == s.output_tokens
        assert r.arrival_s == s.arrival_s
        assert r.arrival_s <= r.first_token_s <= r.finish_s <= run.duration_s
        t = r.token_times_s
        assert len(t) == s.output_tokens
        assert all(a <= b for a, b in zip(t, t[1:]))
        assert (t[0], t[-1]) == (r.first_token_s, r.finish_s)
    assert run.server_returncode is None  # it served until we stopped it
    assert run.client_cpu_s > 0
    assert run.stream_chunks >= 1
    assert len(run.send_lags_s) == len(workload) and run.send_lag_max_s >= 0
    assert run.server_log.stat().st_size > 0


@pytest.mark.slow
def test_static_and_tuned_contenders_run_the_same_workload(tiny_model, tmp_path):
    spec = "poisson:rate=4,prompt=U(8,32),output=U(4,12),n=12"
    workload = parse_workload(spec, seed=0)
    # The same requests with max_tokens 16: the engine sees 16, the client cuts at
    # output_tokens (as an EOS would end them).
    cut_workload = parse_workload(spec + ",max_tokens=16", seed=0)
    assert [(r.arrival_s, r.output_tokens) for r in cut_workload] == \
        [(r.arrival_s, r.output_tokens) for r in workload]
    cfg = validate({"num_gpu_blocks": 32})
    model = str(tiny_model)
    from serve_harness import engine_args  # this CPU's dtype, eager

    args = engine_args()

    progress: list[tuple[int, int]] = []
    static = run_live(Contender("static-4", "static", cfg, cap=4), cut_workload,
                      model_path=model, log_dir=tmp_path, extra_vllm_args=args,
                      progress=lambda d, n: progress.append((d, n)))
    _check_results(static, cut_workload)
    assert static.cap_timeline == [(0.0, 4), (static.duration_s, 4)]
    assert static.decisions == [] and static.config_path is None
    assert progress[0] == (0, 12) and progress[-1] == (12, 12)
    assert [d for d, _ in progress] == list(range(13))
    assert "--max-num-seqs 4" in static.server_log.read_text(errors="replace").splitlines()[0]

    assert static.pace_s == (None, None)                 # no probe unless asked
    tuned = run_live(Contender("tuned", "tuned", cfg), workload, model_path=model,
                     log_dir=tmp_path, extra_vllm_args=args, pace=True)
    _check_results(tuned, workload)
    # the pace probe alone before and after the run: a batch-1 step each, whose own
    # steps are not the run's (None where a host stall bunched that probe's tokens in
    # each of its three tries: not expected of both probes of one run)
    assert all(p is None or (isinstance(p, float) and p > 0) for p in tuned.pace_s), \
        tuned.pace_s
    assert any(isinstance(p, float) for p in tuned.pace_s), tuned.pace_s
    assert tuned.steps and max(s["t"] for s in tuned.steps) <= tuned.duration_s
    assert tuned.server_log == tmp_path / "tuned.log"
    ran = config_mod.load(tuned.config_path)
    assert ran.model == model and ran.num_gpu_blocks == 32
    assert tuned.cap_timeline
    times = [t for t, _ in tuned.cap_timeline]
    assert times == sorted(times)
    assert all(1 <= cap <= cfg.max_num_seqs for _, cap in tuned.cap_timeline)
    assert tuned.decisions
    seqs = [d["seq"] for d in tuned.decisions]
    assert seqs == sorted(set(seqs))
    assert all(1 <= d["cap"] <= cfg.max_num_seqs and "reason" in d for d in tuned.decisions)


# --- tuned's decisions ---------------------------------------------------------------------------

def test_decisions_are_polled_deduplicated_by_seq_and_a_gap_asks_for_more():
    httpx = live._http()
    clock = FakeClock(100.0)
    answers = {200: list(range(1, 4)), 16: list(range(3, 6))}
    asked: list[int] = []

    def handler(request):
        limit = int(request.url.params["limit"])
        asked.append(limit)
        seqs = answers[limit]
        return httpx.Response(200, json={
            "applied": {"cap": 4 + len(asked)},
            "recent": [{"t": 1000.0 + s, "seq": s, "cap": s, "reason": "r"} for s in seqs]})

    async def go():
        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        c = _Client("http://x", "m", "http://e", openai=object(), http=http, clock=clock)
        c.t0 = 100.0
        c._wall_offset = 900.0  # wall time = clock + 900: seq s was decided at run_s = s
        out = [await c.poll_decisions(200)]
        clock.now += 0.5
        out.append(await c.poll_decisions(16))
        answers[16] = list(range(30, 46))  # 16 newer ones: 6..29 were missed
        out.append(await c.poll_decisions(16))
        await http.aclose()
        return c, out

    c, out = asyncio.run(go())
    assert out == [True, True, False]
    assert asked == [200, 16, 16]
    assert sorted(c.decisions) == [1, 2, 3, 4, 5] + list(range(30, 46))
    assert c.decisions[2]["run_s"] == pytest.approx(2.0)
    assert c.cap_timeline == [(0.0, 5), (0.5, 6), (0.5, 7)]


@pytest.mark.parametrize("status", [429, 503])
def test_a_429_or_503_is_a_refusal_timed_when_it_came_back(status):
    srv = FakeServer(FakeClock(100.0), [], [], status=status)
    srv.clock.now = 100.75        # the answer comes back 0.75 s into the run
    r, _ = srv.send(RequestSpec("r1", 0.5, 8, 4, 4), [1] * 8)
    assert not r.failed and r.refused
    assert r.refused_s == pytest.approx(0.75) and r.first_response_s == pytest.approx(0.25)
    assert r.error == f"refused: HTTP {status}: bad prompt"     # what the server said
    assert r.first_token_s is None and r.finish_s is None


@pytest.mark.parametrize("events", [
    # vLLM 0.32 skips the choice of an output without tokens: usage and [DONE] alone
    [_chunk(0, choices=False), "[DONE]"],
    [_chunk(0, finish="abort"), _chunk(0, choices=False), "[DONE]"],
])
def test_a_stream_aborted_before_any_token_is_a_refusal(events):
    """tuned's wait bound refuses a request in vLLM by finishing it as aborted
    before its first token."""
    srv = FakeServer(FakeClock(100.0), events, [10.5] + [0.0] * (len(events) - 1))
    r, _ = srv.send(RequestSpec("r1", 0.5, 8, 4, 4), [1] * 8)
    assert not r.failed and r.refused, r.error
    assert (r.refused_s, r.first_response_s, r.error) == (
        10.5, 10.0, "refused: aborted before any token")



def test_a_stream_cut_before_any_token_and_before_done_is_a_failure():
    srv = FakeServer(FakeClock(100.0), [_chunk(0, choices=False)], [0.1])
    r, _ = srv.send(RequestSpec("r1", 0.0, 8, 4, 4), [1] * 8)
    assert r.failed and not r.refused
    assert r.error == "EngineError: the stream ended without a finish reason"
    # an abort after tokens came is a failure, not a refusal
    srv = FakeServer(FakeClock(100.0), [_chunk(1), _chunk(1, finish="abort"), "[DONE]"],
                     [0.1, 0.1, 0.0])
    r, _ = srv.send(RequestSpec("r1", 0.0, 8, 4, 4), [1] * 8)
    assert r.failed and not r.refused
    assert r.error == "EngineError: generated 1 tokens (1 timed), asked for 4"


@pytest.mark.slow
def test_the_batch1_step_is_measured_as_the_demo_derives_its_sla(tiny_model, tmp_path):
    """`tuned bench --slo tpot=2.5x` on the real engine: once the controller has derived
    its SLA under the calibration load, the step is the lone probes' median, the SLA
    the factor asked for times it (states only: the step's value is this host's)."""
    from serve_harness import engine_args

    from tuned.bench.live import measure_batch1_step

    cfg = validate({"num_gpu_blocks": 32, "tbt_sla_s": 0.05})   # the file's SLA is set aside
    d = measure_batch1_step(cfg, model_path=str(tiny_model), log_dir=tmp_path, factor=3.0,
                            extra_vllm_args=engine_args())
    assert d["factor"] == 3.0 and d["step_s_batch1"] > 0
    assert d["sla_s"] == round(3.0 * d["step_s_batch1"], 4)
    # the step is the lone requests' median where one gave a figure, the fit's beside it
    assert len(d["probe_steps_s"]) == live.CALIBRATION_PROBES == 3
    got = [s for s in d["probe_steps_s"] if s is not None]
    assert d["step_source"] == ("probe" if got else "fit")
    if got:
        assert d["step_s_batch1"] == statistics.median(got)
    assert d["fit_step_s_batch1"] > 0
    assert (tmp_path / "calibration.log").stat().st_size > 0


def test_the_calibration_step_is_the_lone_requests_median_and_the_fit_without_one():
    """:func:`tuned.bench.live.probed_step`: the controller's derived SLA re-based on
    the probes' median step (those that gave a figure), the fit's step kept; with no
    figure the controller's SLA stands."""
    derived = {"sla_s": 0.0305, "step_s_batch1": 0.0122, "factor": 2.5, "fit": {"a": 1}}
    d = live.probed_step(derived, [0.0084, None, 0.0072, 0.0090])
    assert d["step_s_batch1"] == 0.0084
    assert d["sla_s"] == 0.021                          # 2.5 x 8.4 ms, to 0.1 ms
    assert (d["step_source"], d["fit_step_s_batch1"]) == ("probe", 0.0122)
    assert d["probe_steps_s"] == [0.0084, None, 0.0072, 0.0090] and d["fit"] == {"a": 1}
    d = live.probed_step(derived, [None, None, None])
    assert (d["sla_s"], d["step_s_batch1"], d["step_source"]) == (0.0305, 0.0122, "fit")
    assert derived["sla_s"] == 0.0305 and "step_source" not in derived   # not changed


class _Steps(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200 if self.path == "/steps" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(type(self).body)))
        self.end_headers()
        self.wfile.write(type(self).body)

    def log_message(self, *a):
        pass


def test_a_runs_step_records_are_those_after_its_start_on_its_clock():
    _Steps.body = json.dumps({"next": 4, "samples": [
        {"seq": 0, "t": 99.5, "step_s": 0.01},     # the warm-up, before the run
        {"seq": 1, "t": 100.25, "step_s": 0.02},
        {"seq": 2, "t": 101.0, "step_s": 0.03},
        {"seq": 3, "t": 101.5, "step_s": 0.01}]}).encode()   # the pace probe after it
    srv = HTTPServer(("127.0.0.1", 0), _Steps)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        got = live._run_steps(url, 100.0, 1.25)
        assert [(s["seq"], s["t"], s["step_s"]) for s in got] == [(1, 0.25, 0.02),
                                                                  (2, 1.0, 0.03)]
        assert [s["seq"] for s in live._run_steps(url, 100.0)] == [1, 2, 3]
        _Steps.body = b"not json"
        assert live._run_steps(url, 100.0) == []   # the run stands without them
    finally:
        srv.shutdown()
        srv.server_close()


class _BurstServer:
    """A server whose ``drive`` returns given step records: the demo's burst probe
    without an engine (what it sends is checked to be the probe workload)."""

    def __init__(self, steps):
        self.steps, self.driven = steps, []

    def drive(self, wl):
        self.driven.append(wl)
        return SimpleNamespace(steps=self.steps)


def test_the_burst_probe_fits_the_steps_it_drove():
    """`tuned demo` sizes its load from the steps of a burst, not from the calibration's
    fit: T = 5 ms + 0.6 ms a sequence + 0.3 ms a prompt token is recovered from each
    batch's median decode step and the prefilling steps' excess, whatever a few
    stalled steps took; a batch seen twice, a short prefill and idle steps stay out."""
    steps = []

    def step(b, c, t, kv=0):
        steps.append({"num_decode": b, "prefill_tokens": c, "kv_tokens_resident": kv,
                      "step_s": t})

    for b in range(1, 13):
        for k in range(4):
            step(b, 0, 0.005 + 0.0006 * b, kv=100 * b + k)
    for b in (2, 5, 9):
        step(b, 0, 0.250)                               # stalls: one of five at a batch
    step(13, 0, 0.100)
    step(13, 0, 0.100)                                  # two steps: not on the line
    for b, c in ((0, 64), (3, 200), (6, 500), (1, 96)):
        step(b, c, 0.005 + 0.0006 * b + 0.0003 * c)
    step(4, 8, 0.5)                                     # a prefill under 32 tokens
    step(0, 0, 9.0)                                     # idle
    srv = _BurstServer(steps)
    fit = live.measure_step_fit(srv, validate({}))
    assert srv.driven[0].spec == live.PROBE_WORKLOAD
    sent = srv.driven[0].requests
    assert len(sent) == 28 and sum(r.prompt_tokens >= 500 for r in sent) == 4
    assert fit["n_samples"] == 51 and fit["batch_max"] == 12
    assert fit["a"] == pytest.approx(0.005, rel=1e-9)
    assert fit["beta"] == pytest.approx(0.0006, rel=1e-9)
    assert fit["gamma"] == pytest.approx(0.0003, rel=1e-9)
    assert fit["eta"] == 0.0
    # three steps or more that prefilled 64 tokens beside at most two decodes (the
    # probe's long prompts) read the cost a token alone: the burst's prefilling
    # steps at a large batch, where the line is off by a few ms, stay out
    long = [{"num_decode": b, "prefill_tokens": 128, "kv_tokens_resident": 0,
             "step_s": 0.005 + 0.0006 * b + 0.0004 * 128} for b in (0, 0, 1, 2)]
    skewed = [{**s, "step_s": s["step_s"] - 0.02} for s in steps
              if s["prefill_tokens"] >= 32 and s["num_decode"] > 2]
    assert live.burst_step_fit(steps + long + skewed * 3)["gamma"] == pytest.approx(
        0.0004, rel=1e-9)
    assert live.burst_step_fit(steps + skewed * 3)["gamma"] < 0.0003
    # plain vLLM keeps no step records, and two batches make no line: no fit, the
    # caller keeps the calibration's
    assert live.measure_step_fit(_BurstServer([]), validate({})) is None
    assert live.burst_step_fit([s for s in steps if s["num_decode"] in (1, 2)]) is None
    # a line with no cost per sequence (every batch alike) is no fit either
    flat = [{**s, "step_s": 0.01} for s in steps if not s["prefill_tokens"]]
    assert live.burst_step_fit(flat) is None


@pytest.mark.slow
def test_the_demo_burst_spans_batches_on_the_real_engine(tiny_model, tmp_path):
    """The burst after the calibration steps the decode batch down through sizes: at
    least three batches, each with enough decode-only steps to join the line, as the
    fit needs (states only: the step times, how far up the controller's cap lets the
    batch go on this host at the moment, and whether the tiny model's near-flat steps
    give a line with a cost a sequence, are this host's; a fresh-clone run saw the
    batches reach 3 only, {1: 985, 2: 239, 3: 25}, and 4 or more on the rerun). The
    engine runs compiled, as the demo runs it: eager, its steps on this tiny model are
    the Python's, and one run of the suite saw the batches this test counts fall
    short."""
    from serve_harness import dtype_args

    cfg = validate({"num_gpu_blocks": 64, "tbt_sla_auto": 2.5})
    wl = parse_workload(live.PROBE_WORKLOAD, 0, max_model_len=cfg.effective_max_model_len)
    with live.LiveServer(Contender("probe", "tuned", cfg), model_path=str(tiny_model),
                         log_dir=tmp_path, extra_vllm_args=dtype_args()) as srv:
        steps = srv.drive(wl).steps
    counts: dict[int, int] = {}
    for s in steps:
        if s["num_decode"] and not s["prefill_tokens"]:
            counts[s["num_decode"]] = counts.get(s["num_decode"], 0) + 1
    full = sorted(b for b, n in counts.items() if n >= live.MIN_STEPS_PER_BATCH)
    assert len(full) >= 3, counts
    fit = live.burst_step_fit(steps)
    if fit is not None:
        assert fit["beta"] > 0 and fit["batch_max"] == full[-1]


def test_the_capacity_within_the_tpot_sla_from_a_step_fit():
    """T(b, c) = 2 ms + 1 ms b + 0.1 ms c, SLA 10 ms: the SLA holds to b = 8 decodes; a
    request of 100 prompt and 50 output tokens costs 10 ms of prefill and 50 steps of
    10 ms shared by 8: 1 / (0.01 + 0.0625) = 13.79 req/s. The batch stays in [2, the
    ceiling]."""
    fit = {"a": 0.002, "beta": 0.001, "gamma": 0.0001}
    mu, b = live.sla_capacity(fit, 0.010, 100, 50)
    assert b == 8 and mu == pytest.approx(1 / 0.0725)
    assert live.sla_capacity(fit, 0.010, 100, 50, ceiling=4)[1] == 4
    assert live.sla_capacity(fit, 0.0025, 100, 50)[1] == 2
