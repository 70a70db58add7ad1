"""Load shedding at vLLM's OpenAI server: HTTP 429 with ``Retry-After`` for a new
request whose first token tuned predicts past its wait bound.

tuned's waiting queue refuses a request once its first token cannot come within the
wait bound (:mod:`tuned.core.refusal`); vLLM then finishes it as aborted, and its
client reads finish reason ``abort``. This ASGI middleware, loaded into vLLM's API
server with ``--middleware tuned.engines.gateway.RefuseWhenOverloaded`` (`tuned serve`
adds it), turns such a request away before it reaches the engine: it answers a new
request for the engine (completions, chat, responses and the other generation and
pooling routes: :data:`PATHS`) with 429 and ``Retry-After`` while tuned's endpoint
(``GET /admission``) says a new request's first token would come past the bound (the
queue's own prediction; without a step model, while the queue has refused within the
last bound and the engine has no room), as an overloaded gateway does, so the client
or a proxy in front can retry elsewhere.
The 429 is the whole answer, sent before the app runs: a streaming request is refused
before any byte of its stream, so a proxy can still pass it to another server
(docs/kubernetes.md, "Behind a proxy"). It reads the state at most every
:data:`POLL_S` seconds, and lets every request through when the endpoint has not
answered (it never refuses on a guess). A request never waits for the endpoint: a
stale answer is refreshed in the background, so the first request after a change
still sees the old state. A read that fails (an engine process too busy to answer
within :data:`READ_TIMEOUT_S`, as under the overload the door is for) keeps the last
answer, but never past the time it said the queue stays refusing (its
``refusing_for_s``). Whether to refuse and the text are :mod:`tuned.core.refusal`'s
(:func:`~tuned.core.refusal.at_the_door`); the 429 itself is this module's answer
(:meth:`RefuseWhenOverloaded.answer_refusals`).

A request the door lets in may still be refused in the queue (its first token turned
out late); vLLM then ends it without a token, which a streaming client would read as
an empty answer. On completions and chat completions (:data:`HELD_PATHS`) the
middleware therefore holds each answer's start until its first token
(:class:`HeldStart`) and answers such a request 429 too, with ``Retry-After`` and
vLLM's error body naming the refusal and how long the request waited.

Where the endpoint is: ``TUNED_ADMISSION_URL``, else the config tuned's scheduler
runs (vLLM's ``--additional-config`` on this process's command line, or
``TUNED_CONFIG``: :func:`tuned.config.engine_setup`), its ``metrics_host`` and
``metrics_port`` (rank 0's endpoint).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from tuned.core.refusal import REASON_MAX_WAIT, Refusal, at_the_door
from tuned.engines.vllm_surface import QUEUED_ROUTES

#: how long one answer of the endpoint is used
POLL_S = 0.5
#: how long one read of the endpoint may take (in the background: no request waits)
READ_TIMEOUT_S = 2.0
#: the requests it may refuse (POST only): every route of vLLM's API server whose
#: request queues in the engine, in any supported vLLM release (the list of vLLM's
#: routes, sorted, is :mod:`tuned.engines.vllm_surface`'s; tools/vllm_surface.py
#: reports a route a new release adds). Not here: render, tokenize and token
#: counting, LoRA and admin routes (no engine request).
PATHS = QUEUED_ROUTES
URL_ENV = "TUNED_ADMISSION_URL"
#: the counter of 429s, on vLLM's own ``/metrics`` (this process's registry)
REFUSED_METRIC = "tuned_gateway_refused_total"
#: the histogram of the time from a request's arrival at the API server to its 429
REFUSAL_WAIT_METRIC = "tuned_gateway_refusal_wait_seconds"
#: its buckets: around the TTFT targets a refusal should come within
REFUSAL_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0,
                          5.0, 10.0, 30.0, 60.0)
#: the collectors above, made once per process (:func:`_registered`)
_collectors: dict[str, Any] = {}
#: every series the gateway adds to vLLM's /metrics, by type
EXPORTED = {REFUSED_METRIC: "counter", REFUSAL_WAIT_METRIC: "histogram"}


def _registered(name: str, make: Callable[[], Any]) -> Any:
    """The process's collector ``name`` (made once: vLLM's server may build its
    middleware stack more than once), in vLLM's default registry, so that its API
    server's ``/metrics`` exports it beside vLLM's series; with several API servers
    vLLM sets up prometheus_client's multiprocess mode before starting them, and
    their values add up there."""
    got = _collectors.get(name)
    if got is None:
        from prometheus_client import REGISTRY

        try:
            got = make()
        except ValueError:      # registered already, by an earlier import of this module
            got = REGISTRY._names_to_collectors[name]
        _collectors[name] = got
    return got


def refused_counter():
    """The process's counter of requests answered 429."""
    from prometheus_client import Counter

    return _registered(REFUSED_METRIC, lambda: Counter(
        REFUSED_METRIC.removesuffix("_total"), "Requests vLLM's API server answered HTTP "
        "429 because tuned's queue was refusing at its wait bound (tuned's gateway "
        "middleware)"))


def refusal_wait_histogram():
    """The process's histogram of how long a request had been at the API server when
    it was answered 429, by where it was refused: ``door`` (on arrival) or ``queue``
    (tuned's queue refused it while it waited; :class:`HeldStart`)."""
    from prometheus_client import Histogram

    return _registered(REFUSAL_WAIT_METRIC, lambda: Histogram(
        REFUSAL_WAIT_METRIC, "Time from a request's arrival at vLLM's API server to its "
        "HTTP 429, by where tuned refused it: door (on arrival) or queue (while waiting)",
        ("where",), buckets=REFUSAL_WAIT_BUCKETS_S))


def _observe_refusal(where: str, waited_s: float) -> None:
    try:
        refusal_wait_histogram().labels(where=where).observe(max(waited_s, 0.0))
    except Exception:   # a metric never stands between a client and its answer
        pass


def admission_url(argv: list[str] | None = None, environ: dict | None = None) -> str | None:
    """tuned's ``/admission`` URL for this API server process, or None."""
    from tuned import config as config_mod
    from tuned.base.netutil import connect_host

    environ = dict(os.environ if environ is None else environ)
    if environ.get(URL_ENV):
        return environ[URL_ENV]
    argv = list(sys.argv if argv is None else argv)
    additional = None
    for i, a in enumerate(argv):
        if a == "--additional-config" and i + 1 < len(argv):
            additional = argv[i + 1]
        elif a.startswith("--additional-config="):
            additional = a.split("=", 1)[1]
    try:
        cfg = config_mod.engine_setup(json.loads(additional) if additional else None,
                                      environ).cfg
    except Exception:      # no config here: the middleware lets everything through
        return None
    if not cfg.metrics_port:
        return None
    return f"http://{connect_host(cfg.metrics_host)}:{cfg.metrics_port}/admission"


#: the routes whose answer is held until its first token (:class:`HeldStart`): vLLM's
#: completions and chat completions, whose streams and bodies carry the tokens in
#: ``choices``; on the others (responses, messages, pooling) a queue refusal reaches
#: the client as vLLM sends it
HELD_PATHS = frozenset(("/v1/completions", "/v1/chat/completions"))


def _has_token(choices: Any) -> bool:
    """Whether a completion or chat choice list carries output: text, tokens, a
    delta's content, reasoning or tool calls; a choice finished as served; or a
    completion chunk at all (a random model's tokens may read as empty text, and an
    answer of such tokens is served, not refused)."""
    for c in choices if isinstance(choices, list) else ():
        if not isinstance(c, dict):
            continue
        if c.get("text") or c.get("token_ids") or c.get("logprobs"):
            return True
        if c.get("finish_reason") not in (None, "abort"):
            return True          # finished as served ("length", "stop"): its tokens
                                 # may all read as empty text (a lone byte's piece)
        if "text" in c and "delta" not in c and c.get("finish_reason") is None:
            return True          # a completion chunk: vLLM sends none before the first
                                 # token, so this one carries a token, text or not
        for part in (c.get("delta"), c.get("message")):
            if isinstance(part, dict) and any(
                    part.get(k) for k in ("content", "reasoning_content", "reasoning",
                                          "tool_calls", "function_call")):
                return True
    return False


def carries_output(body: bytes) -> bool | None:
    """Whether an answer's body, as far as it has come, carries output (True), is
    vLLM's answer to a request refused before its first token (False: a stream that
    ended without a token, or a body whose choices are all empty with finish reason
    ``abort``), or cannot say yet (None: keep reading). Anything else it does not
    recognise (an error, another shape) counts as output: it is passed on as it is."""
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):          # a whole JSON body (not streamed)
        try:
            doc = json.loads(text)
        except ValueError:
            return None
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if (isinstance(choices, list) and choices and not _has_token(choices)
                and all(isinstance(c, dict) and c.get("finish_reason") == "abort"
                        for c in choices)):
            return False
        return True
    ended = False
    whole = text[:text.rfind("\n\n") + 2] if "\n\n" in text else ""   # complete events
    for line in whole.split("\n"):
        line = line.strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            ended = True
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            return True                        # not vLLM's events: pass it on
        if not isinstance(doc, dict) or "choices" not in doc:
            if isinstance(doc, dict) and doc.get("usage") is not None:
                continue                       # the usage chunk after the choices
            return True                        # an error event: vLLM's own answer
        if _has_token(doc["choices"]):
            return True
    return False if ended else None


class HeldStart:
    """An ASGI ``send`` that holds an answer's start until its first token.

    tuned's queue refuses a waiting request once its first token cannot come within
    the wait bound; vLLM then finishes it without a token, and a streaming client has
    already had ``200`` and an empty stream (the OpenAI client reads it as an empty
    answer, ``vllm bench serve`` as "Never received a valid chunk"). Held, the answer
    of such a request becomes what the door answers: HTTP 429 with ``Retry-After``
    and vLLM's error body, before any byte, which every client reads as a refusal.
    A served request loses nothing: its start goes out with its first token (chat's
    role chunk, sent with the first output, goes with it)."""

    def __init__(self, send: Any, gate: "RefuseWhenOverloaded") -> None:
        self._send = send
        self._gate = gate
        self._start: dict | None = None
        self._held: list[dict] = []
        self._body = b""
        self._passing = False
        self._answered = False
        self._t0 = time.monotonic()

    async def __call__(self, message: dict) -> None:
        if self._answered:
            return      # the 429 was the whole answer: what the app sends after it
                        # (the stream's closing empty body) goes nowhere
        if self._passing:
            await self._send(message)
            return
        kind = message.get("type")
        if kind == "http.response.start":
            if message.get("status") != 200:
                self._passing = True
                await self._send(message)
                return
            self._start = message
            return
        if kind != "http.response.body" or self._start is None:
            await self._send(message)
            return
        self._held.append(message)
        self._body += message.get("body", b"")
        verdict = carries_output(self._body)
        if verdict is None and not message.get("more_body", False):
            verdict = True                     # ended in a shape it cannot read
        if verdict is None:
            return
        if verdict is False:
            await self._refuse()
            return
        self._passing = True
        await self._send(self._start)
        for m in self._held:
            await self._send(m)
        self._held.clear()

    async def _refuse(self) -> None:
        """The 429 instead of the empty answer (the queue counted the refusal)."""
        self._answered = True
        self._held.clear()
        waited = time.monotonic() - self._t0
        _observe_refusal("queue", waited)
        await send_429(self._send, Refusal(REASON_MAX_WAIT, time.monotonic(),
                                           waited_s=waited,
                                           retry_after_s=self._gate.retry_after_s()))


async def send_429(send: Any, event: Refusal) -> None:
    """HTTP 429 with ``Retry-After`` and vLLM's error body (``{"error": {message,
    type, param, code}}``) on an ASGI ``send``."""
    retry = max(int(event.retry_after_s or 1), 1)
    body = json.dumps({"error": {"message": f"{event.message}; retry in {retry} s",
                                 "type": "RateLimitError", "param": None,
                                 "code": 429}}).encode()
    await send({"type": "http.response.start", "status": 429,
                "headers": [(b"content-type", b"application/json"),
                            (b"retry-after", str(retry).encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _fetch(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=READ_TIMEOUT_S) as r:
            return json.loads(r.read())
    except Exception:
        return None


class RefuseWhenOverloaded:
    """The ASGI middleware (see the module docstring). ``url``: tuned's
    ``/admission`` (default: :func:`admission_url`)."""

    def __init__(self, app: Any, url: str | None = None) -> None:
        self.app = app
        self.url = url if url is not None else admission_url()
        self._state: dict | None = None
        self._read = -1e18          # when the kept answer was asked for
        self._at = -1e18            # when a read last started
        self.refused = 0

    def _admission(self) -> dict | None:
        """The last answer of the endpoint; a stale one starts a refresh in the
        background (a request never waits for it)."""
        now = time.monotonic()
        if now - self._at >= POLL_S:
            self._at = now
            asyncio.get_running_loop().create_task(self._refresh())
        return self._state

    async def _refresh(self) -> None:
        """Read the endpoint; an answer replaces the kept one unless a newer read's
        came first, a failed read keeps it."""
        asked = time.monotonic()
        got = await asyncio.to_thread(_fetch, self.url)
        if got is not None and asked >= self._read:
            self._state, self._read = got, asked

    async def __call__(self, scope, receive, send) -> None:
        if (self.url and scope.get("type") == "http" and scope.get("method") == "POST"
                and scope.get("path") in PATHS):
            refused = at_the_door(self._admission(), time.monotonic(), self._read)
            if refused is not None:
                await self.answer_refusals([(send, refused)])
                return
            if scope.get("path") in HELD_PATHS:
                await self.app(scope, receive, HeldStart(send, self))
                return
        await self.app(scope, receive, send)

    def retry_after_s(self) -> int:
        """When to retry a request the queue refused: the door's last answer's, else 1."""
        state = self._state or {}
        return max(int(state.get("retry_after_s") or 1), 1)


    async def answer_refusals(self, refused: Sequence[tuple[Any, Refusal]]) -> None:
        """The gateway's answer (:class:`tuned.core.refusal.RefusalAnswer`): HTTP 429
        with ``Retry-After`` on each ASGI ``send``, counted."""
        for send, event in refused:
            self.refused += 1
            try:
                refused_counter().inc()
            except Exception:   # a metric never stands between a client and its answer
                pass
            _observe_refusal("door", event.waited_s or 0.0)
            await send_429(send, event)
