"""The 429 gateway (tuned.engines.gateway) against a real HTTP endpoint, and the
controller's /admission state it reads."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tuned import config as config_mod
from tuned.engines import gateway, vllm_surface


class _Admission(BaseHTTPRequestHandler):
    state: dict = {}

    def do_GET(self):
        body = json.dumps(type(self).state).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    srv = HTTPServer(("127.0.0.1", 0), _Admission)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/admission"
    srv.shutdown()
    srv.server_close()


def warm(mw):
    """The middleware after its first background refresh (a request never waits for
    one: the first request after a change sees the old state)."""
    asyncio.run(mw._refresh())
    mw._at = time.monotonic()
    return mw


def call(mw, method="POST", path="/v1/completions") -> tuple[int, dict, bytes]:
    """One request through the middleware; the app behind it answers 200."""
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(msg):
        sent.append(msg)

    mw.app = app
    asyncio.run(mw({"type": "http", "method": method, "path": path}, receive, send))
    headers = {k.decode(): v.decode() for k, v in sent[0].get("headers", [])}
    return sent[0]["status"], headers, sent[1]["body"]


def test_refusing_answers_429_with_retry_after(endpoint):
    _Admission.state = {"refusing": True, "retry_after_s": 4, "max_wait_s": 30.0}
    mw = gateway.RefuseWhenOverloaded(None, url=endpoint)
    assert call(mw)[0] == 200          # no answer yet: let through, refresh started
    status, headers, body = call(warm(mw))
    assert (status, headers["retry-after"]) == (429, "4")
    assert json.loads(body)["error"]["code"] == 429
    # chat too; a GET (models, health) and other paths always pass
    assert call(mw, path="/v1/chat/completions")[0] == 429
    assert call(mw, method="GET", path="/v1/models")[0] == 200
    assert call(mw, path="/tokenize")[0] == 200
    assert mw.refused == 2


def test_each_429_is_counted_in_the_process_registry(endpoint):
    """What vLLM's /metrics exports (its default registry, in one API server)."""
    from prometheus_client import REGISTRY, generate_latest

    def count() -> float:
        return REGISTRY.get_sample_value(gateway.REFUSED_METRIC) or 0.0

    _Admission.state = {"refusing": True, "retry_after_s": 2}
    before = count()
    mw = warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    assert [call(mw)[0], call(mw, path="/v1/responses")[0], call(mw, "GET", "/v1/models")[0]] \
        == [429, 429, 200]
    assert count() == before + 2
    # one counter per process, however many middleware objects vLLM builds
    warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    assert call(mw)[0] == 429 and count() == before + 3
    assert f"\n{gateway.REFUSED_METRIC} {before + 3}\n" in generate_latest(REGISTRY).decode()


def test_each_429_is_timed_from_the_request_s_arrival(endpoint):
    """The door's 429s go into the refusal-wait histogram under where="door", within
    its first bucket (on arrival)."""
    from prometheus_client import REGISTRY

    def door(suffix: str, **labels) -> float:
        return REGISTRY.get_sample_value(gateway.REFUSAL_WAIT_METRIC + suffix,
                                         {"where": "door", **labels}) or 0.0

    _Admission.state = {"refusing": True, "retry_after_s": 2}
    before, fast = door("_count"), door("_bucket", le="0.01")
    mw = warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    assert [call(mw)[0], call(mw)[0]] == [429, 429]
    assert door("_count") == before + 2 and door("_bucket", le="0.01") == fast + 2


def test_not_refusing_or_no_endpoint_lets_requests_through(endpoint):
    _Admission.state = {"refusing": False}
    assert call(warm(gateway.RefuseWhenOverloaded(None, url=endpoint)))[:1] == (200,)
    # an endpoint that does not answer: never refuse on a guess
    dead = gateway.RefuseWhenOverloaded(None, url="http://127.0.0.1:9/admission")
    assert call(warm(dead))[0] == 200


def test_a_failed_read_keeps_the_answer_for_the_window_it_gave(endpoint):
    """An engine too busy to answer (the overload the door is for) does not open it:
    the last answer holds for its refusing_for_s, then the door opens (no guess)."""
    _Admission.state = {"refusing": True, "retry_after_s": 2, "max_wait_s": 4.0,
                        "refusing_for_s": 3.0}
    mw = warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    read = mw._read
    mw.url = "http://127.0.0.1:9/admission"      # the endpoint stops answering
    asyncio.run(mw._refresh())
    assert (mw._read, mw._state["refusing"], call(mw)[0]) == (read, True, 429)
    mw._read -= 3.0                              # the window it gave has passed
    assert call(mw)[0] == 200
    # an answer replaces it, and an older read's answer never replaces a newer one
    mw.url = endpoint
    _Admission.state = {"refusing": False, "refusing_for_s": 0.0}
    asyncio.run(mw._refresh())
    assert call(mw)[0] == 200 and mw._read > read
    newer = mw._read
    mw._read += 60.0                             # a newer read answered first
    _Admission.state = {"refusing": True, "refusing_for_s": 3.0}
    asyncio.run(mw._refresh())
    assert mw._state == {"refusing": False, "refusing_for_s": 0.0} and mw._read == newer + 60.0


def test_admission_url_from_the_command_line_or_the_environment(tmp_path):
    cfg = config_mod.validate({"metrics_port": 9555, "metrics_host": "0.0.0.0"})
    argv = ["api_server", "--additional-config",
            json.dumps(config_mod.engine_handoff(cfg, None))]
    assert gateway.admission_url(argv, {}) == "http://127.0.0.1:9555/admission"
    assert gateway.admission_url([], {"TUNED_ADMISSION_URL": "http://h:1/admission"}) == \
        "http://h:1/admission"
    f = tmp_path / "tuned.toml"
    f.write_text("metrics_port = 9600\n")
    assert gateway.admission_url([], {"TUNED_CONFIG": str(f)}) == \
        "http://127.0.0.1:9600/admission"
    # no config: tuned's scheduler runs its defaults, the endpoint on its default port
    assert gateway.admission_url([], {}) == "http://127.0.0.1:9464/admission"


def test_the_controller_answers_the_queues_prediction_for_a_new_request():
    """Each tick hands the watch the queue's snapshot: /admission says refusing while
    the queue predicts a new request's first token past the bound (the TTFT target),
    and stops the tick the prediction comes back under it, refusals or not; an idle
    engine never refuses; serve mode never does."""
    from fakes import FakeEngine
    from tuned.control.controller import Controller
    from tuned.control.metrics import Metrics

    t = [100.0]
    eng = FakeEngine(running=4, waiting=3)
    snap = {"refused": 2, "door_wait_s": 2.6}
    eng.queue_snapshot = lambda: dict(snap)
    cfg = config_mod.validate({"ttft_sla_s": 1.0, "interval_s": 0.1})
    ctrl = Controller(cfg, eng, Metrics(), clock=lambda: t[0])
    ctrl.run_once()
    assert ctrl.admission_json() == {"refusing": True, "max_wait_s": 1.0,
                                     "retry_after_s": 2, "refused": 2,
                                     "first_token_s": 2.6, "refusing_for_s": 1.6}
    t[0] += 0.1
    snap.update(refused=9, door_wait_s=0.4)          # 7 refused, and room again
    ctrl.run_once()
    assert [ctrl.admission_json()[k] for k in ("refusing", "refused")] == [False, 9]
    t[0] += 0.1
    snap.update(door_wait_s=5.0)
    eng.running, eng.waiting = 0, 0                  # idle: the prediction is stale
    ctrl.run_once()
    assert ctrl.admission_json()["refusing"] is False
    off = Controller(config_mod.validate({"ttft_sla_s": 1.0, "on_max_wait": "serve"}),
                     FakeEngine(running=4, waiting=3), Metrics(), clock=lambda: t[0])
    off.engine.queue_snapshot = lambda: {"refused": 0, "door_wait_s": 50.0}
    off.run_once()
    assert off.admission_json()["refusing"] is False


def test_controller_says_refusing_for_one_bound_after_a_refusal():
    from fakes import FakeEngine
    from tuned.control.controller import Controller
    from tuned.control.metrics import Metrics

    t = [100.0]
    cfg = config_mod.validate({"ttft_sla_s": 1.0, "interval_s": 0.1, "max_wait_s": 10.0})
    ctrl = Controller(cfg, FakeEngine(), Metrics(), clock=lambda: t[0])
    assert ctrl.admission_json() == {"refusing": False, "max_wait_s": 10.0,
                                     "retry_after_s": 2, "refused": 0, "first_token_s": None,
                                     "room": False, "refusing_for_s": 0.0, "window_s": 0.0}
    ctrl.refusals.note({"refused": 3}, t[0])
    t[0] += 9.9
    assert ctrl.admission_json()["refusing"] is True
    assert ctrl.admission_json()["refusing_for_s"] == pytest.approx(0.1)
    t[0] += 0.2
    assert ctrl.admission_json()["refusing"] is False
    off = Controller(config_mod.validate({"ttft_sla_s": 1.0, "on_max_wait": "serve"}),
                     FakeEngine(), Metrics(), clock=lambda: t[0])
    off.refusals.note({"refused": 3}, t[0])
    assert off.admission_json()["refusing"] is False


def test_the_controller_opens_the_door_once_the_engine_has_room():
    """Each tick hands the watch the engine's counts and the applied cap: the door
    stays shut while requests wait or the cap is full, and opens once a new request
    would start at once, within the bound after a refusal."""
    from fakes import FakeEngine
    from tuned.control.controller import Controller
    from tuned.control.metrics import Metrics

    t = [100.0]
    eng = FakeEngine(running=4, waiting=3)
    eng.queue_snapshot = lambda: {"refused": 2, "waiting": eng.waiting}
    cfg = config_mod.validate({"ttft_sla_s": 1.0, "interval_s": 0.1, "max_wait_s": 10.0,
                               "b_min": 4,
                               "b_max": 4, "fallback_cap": 4, "batch_policy": "static"})
    ctrl = Controller(cfg, eng, Metrics(), clock=lambda: t[0])
    ctrl.run_once()
    assert ctrl.slot.applied.cap == 4
    assert [ctrl.admission_json()[k] for k in ("refusing", "room")] == [True, False]
    t[0] += 1.0
    eng.waiting = 0                      # drained, every slot still taken
    ctrl.run_once()
    assert [ctrl.admission_json()[k] for k in ("refusing", "room")] == [True, False]
    t[0] += 1.0
    eng.running = 3                      # a slot free, none waiting
    ctrl.run_once()
    assert [ctrl.admission_json()[k] for k in ("refusing", "room")] == [False, True]


#: vLLM's POST routes that make no engine request (the gateway lets them through)
NOT_QUEUED = vllm_surface.UNQUEUED_ROUTES


def vllm_post_routes() -> set[str]:
    """The POST routes declared in the installed vLLM's API server source."""
    import re
    from pathlib import Path

    import vllm

    root = Path(vllm.__file__).parent / "entrypoints"
    return {m.group(1) for f in root.rglob("*.py")
            for m in re.finditer(r'\.(?:post|api_route)\(\s*"(/[^"]*)"', f.read_text())}


def test_every_vllm_route_that_queues_in_the_engine_is_refused(endpoint):
    """A new vLLM route fails here until it is sorted into gateway.PATHS
    (vllm_surface.QUEUED_ROUTES: its request queues in the engine) or NOT_QUEUED; a
    route the installed vLLM lacks fails too unless a later supported release added
    it (vllm_surface.ROUTES_SINCE)."""
    import vllm

    routes = vllm_post_routes()
    installed = tuple(int(x) for x in vllm.__version__.split(".")[:2])
    later = {r for r, since in vllm_surface.ROUTES_SINCE.items() if since > installed}
    assert (gateway.PATHS | NOT_QUEUED) - routes == later
    assert not gateway.PATHS & NOT_QUEUED
    assert routes - gateway.PATHS - NOT_QUEUED == set()
    # every one of them is refused while the queue refuses; the others pass
    _Admission.state = {"refusing": True, "retry_after_s": 2}
    mw = warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    assert {p: call(mw, path=p)[0] for p in sorted(gateway.PATHS)} == \
        dict.fromkeys(sorted(gateway.PATHS), 429)
    assert {p: call(mw, path=p)[0] for p in sorted(NOT_QUEUED)} == \
        dict.fromkeys(sorted(NOT_QUEUED), 200)


# ------------------------------------------------------------------ the held start
#: what vLLM 0.32's OpenAI server streams (shapes from its serving code): a request
#: the queue refused before its first token gets no choice chunk (a choice without
#: tokens is skipped), only the usage chunk when asked for and [DONE]; chat sends its
#: role chunk with the first output, then a finish chunk with an empty delta
REFUSED_COMPLETION = (b'data: {"id":"cmpl-1","object":"text_completion","created":1,'
                      b'"model":"m","choices":[],"usage":{"prompt_tokens":8,'
                      b'"total_tokens":8,"completion_tokens":0}}\n\ndata: [DONE]\n\n')
SERVED_COMPLETION = (b'data: {"id":"cmpl-2","object":"text_completion","created":1,'
                     b'"model":"m","choices":[{"index":0,"text":" the","logprobs":null,'
                     b'"finish_reason":null,"stop_reason":null}]}\n\n')
CHAT_ROLE = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
             b'"model":"m","choices":[{"index":0,"delta":{"role":"assistant",'
             b'"content":""},"logprobs":null,"finish_reason":null}]}\n\n')
CHAT_ABORT = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
              b'"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,'
              b'"finish_reason":"abort","stop_reason":null}]}\n\ndata: [DONE]\n\n')
CHAT_TOKEN = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
              b'"model":"m","choices":[{"index":0,"delta":{"content":"Hi"},'
              b'"logprobs":null,"finish_reason":null}]}\n\n')
#: a token that reads as empty text (a lone byte of a character, which the detokenizer
#: holds back): vLLM still sends its chunk, and ends a served answer with "length"
EMPTY_TOKEN = (b'data: {"id":"cmpl-3","object":"text_completion","created":1,'
               b'"model":"m","choices":[{"index":0,"text":"","logprobs":null,'
               b'"finish_reason":null,"stop_reason":null}]}\n\n')
CHAT_LENGTH = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,'
               b'"model":"m","choices":[{"index":0,"delta":{},"logprobs":null,'
               b'"finish_reason":"length","stop_reason":null}]}\n\ndata: [DONE]\n\n')
ERROR_EVENT = (b'data: {"error":{"message":"Internal server error","type":'
               b'"InternalServerError","param":null,"code":500}}\n\ndata: [DONE]\n\n')


@pytest.mark.parametrize("body, verdict", [
    (REFUSED_COMPLETION, False),
    (b"data: [DONE]\n\n", False),
    (SERVED_COMPLETION, True),
    (CHAT_ROLE, None),                                 # no token yet: keep reading
    (CHAT_ROLE + CHAT_ABORT, False),
    (CHAT_ROLE + CHAT_TOKEN, True),
    (EMPTY_TOKEN, True),                               # served, its token reads empty
    (CHAT_ROLE + CHAT_LENGTH, True),                   # served, every token empty text
    (ERROR_EVENT, True),                               # vLLM's own error: passed on
    (b'{"choices":[{"index":0,"text":"","finish_reason":"abort"}]}', False),
    (b'{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', True),
    (b'{"choices":[{"index":0,"message":{"role":"assistant","content":""},'
     b'"finish_reason":"abort"}]}', False),
    (b'{"choices":[{"ind', None),                      # a body not yet whole
    (b'data: {"choi', None),
])
def test_what_an_answer_carries(body, verdict):
    assert gateway.carries_output(body) is verdict


def held(mw, chunks: list[bytes], status: int = 200, path="/v1/completions"):
    """One request through the middleware whose app answers ``status`` and then
    ``chunks``, one body message each; what the client received."""
    sent: list[dict] = []

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i, c in enumerate(chunks):
            await send({"type": "http.response.body", "body": c,
                        "more_body": i < len(chunks) - 1})

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(msg):
        sent.append(msg)

    mw.app = app
    asyncio.run(mw({"type": "http", "method": "POST", "path": path}, receive, send))
    return sent


def test_a_stream_the_queue_refused_is_answered_429_before_any_byte(endpoint):
    """vLLM's empty answer to a refused request becomes the door's answer: 429, its
    Retry-After from the last /admission answer, vLLM's error body naming the
    refusal and the wait; the stream's own bytes never reach the client."""
    from prometheus_client import REGISTRY

    def timed() -> float:
        return REGISTRY.get_sample_value(gateway.REFUSAL_WAIT_METRIC + "_count",
                                         {"where": "queue"}) or 0.0

    _Admission.state = {"refusing": False, "retry_after_s": 3}
    mw = warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    before, timed_before = mw.refused, timed()
    sent = held(mw, [CHAT_ROLE, CHAT_ABORT], path="/v1/chat/completions")
    assert timed() == timed_before + 1   # timed under where="queue"
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 429
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    assert headers["retry-after"] == "3"
    err = json.loads(sent[1]["body"])["error"]
    assert (err["type"], err["code"], err["param"]) == ("RateLimitError", 429, None)
    assert err["message"].startswith("refused (max_wait) after waiting ")
    assert err["message"].endswith("; retry in 3 s")
    assert mw.refused == before          # counted once, by the queue, not the door
    # Starlette closes a stream with an empty body after the last chunk: it goes
    # nowhere (sent after the 429, the server would raise "Unexpected ASGI message
    # 'http.response.body' sent, after response already completed")
    sent = held(mw, [CHAT_ROLE, CHAT_ABORT, b""], path="/v1/chat/completions")
    assert [(m["type"], m.get("status")) for m in sent] == [
        ("http.response.start", 429), ("http.response.body", None)]
    assert sent[1].get("more_body", False) is False


def test_a_served_stream_passes_whole_and_in_order(endpoint):
    _Admission.state = {"refusing": False}
    mw = warm(gateway.RefuseWhenOverloaded(None, url=endpoint))
    chunks = [CHAT_ROLE, CHAT_TOKEN, CHAT_TOKEN, b"data: [DONE]\n\n"]
    sent = held(mw, chunks, path="/v1/chat/completions")
    assert sent[0]["status"] == 200
    assert [m["body"] for m in sent[1:]] == chunks
    # an error status and a route outside the held ones pass as they come
    assert held(mw, [b'{"error": {}}'], status=400)[0]["status"] == 400
    sent = held(mw, [b"data: [DONE]\n\n"], path="/v1/responses")
    assert (sent[0]["status"], sent[1]["body"]) == (200, b"data: [DONE]\n\n")
