"""The wait bound end to end: on the real vLLM CPU engine behind the real OpenAI
server, a backlog that cannot all start within ``max_wait_s`` gets a prompt answer for
every request -- served, or refused, never before the bound (no TPOT SLA here, so no
step model and nothing predicted) -- and tuned counts each refusal. vLLM finishes a
refused request without a token; the gateway middleware `tuned serve` puts in the API
server holds each answer's start until its first token, so the client reads HTTP 429
with ``Retry-After`` and vLLM's error body naming the refusal and the wait (the OpenAI
client raises ``RateLimitError``), not an empty answer. While the queue is refusing
(tuned's ``/admission``), a new request is answered 429 at the door; once the engine
has room (none waits, fewer run than the cap) the door opens again.

One request runs at a time (cap 1: ``b_min = b_max = fallback_cap = 1``). The backlog
is a stream paced from a request timed in the test: three arrivals for each request
served, for five bounds, whatever this host's speed, so requests wait behind every
refusal while it lasts (a sustained overload, what the door is for).
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from serve_harness import (get_json, metric_values, mval, one_at_a_time_refusing, tuned_serve,
                           wait_for)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BOUND_S = 3.0
MAX_TOKENS = 48


def config(model) -> str:
    return one_at_a_time_refusing(model, BOUND_S)


def test_a_backlog_past_the_bound_is_answered_served_or_refused(tmp_path, small_model):
    from openai import OpenAI

    import httpx2

    with tuned_serve(tmp_path, config(small_model)) as srv:
        client = OpenAI(base_url=srv.api, api_key="none", max_retries=0, timeout=600,
                        http_client=httpx2.Client(timeout=600, limits=httpx2.Limits(
                            max_keepalive_connections=0)))
        model = srv.model_id()

        def complete(i: int):
            import openai

            t0 = time.monotonic()
            try:
                r = client.completions.create(model=model, prompt=[10 + i] * 24,
                                              max_tokens=MAX_TOKENS,
                                              extra_body={"ignore_eos": True})
            except openai.RateLimitError as e:     # the gateway's 429: queue or door
                message = e.response.json()["error"]["message"]
                kind = "refused" if message.startswith("refused (max_wait)") else "429"
                return (time.monotonic() - t0, kind,
                        (e.response.headers.get("retry-after"), message))
            return time.monotonic() - t0, r.choices[0].finish_reason, r.usage.completion_tokens

        probes: list = []
        stop = threading.Event()

        def probe() -> None:
            """While /admission says the queue is refusing, send a request now and then;
            after the backlog is answered, for one bound more at most (the state lasts
            a bound after the last refusal, while the engine has no room), until a probe
            was answered 429. The gateway reads /admission in the background, so the
            first probe after the queue starts refusing may still get through."""
            until: list[float] = []
            while len(probes) < 5:
                if stop.is_set():
                    until = until or [time.monotonic() + BOUND_S]
                    if any(p[1] == "429" for p in probes) or time.monotonic() > until[0]:
                        break
                try:
                    state = get_json(f"{srv.endpoint}/admission")
                except OSError:
                    state = {}
                if state.get("refusing"):
                    probes.append(complete(1000 + len(probes)))
                time.sleep(0.2)

        # one request alone: how long one takes on this host now (the second, warm)
        complete(0)
        one_s, reason, tokens = complete(1)
        assert (reason, tokens) == ("length", MAX_TOKENS)
        gap_s = one_s / 3
        n = min(max(math.ceil(5 * BOUND_S / gap_s), 6), 200)
        print(f"\none request {one_s:.2f} s alone: a backlog of {n}, one each {gap_s:.2f} s")
        results: list = [None] * n
        start = time.monotonic()

        def run(i: int) -> None:
            time.sleep(max(start + i * gap_s - time.monotonic(), 0.0))
            results[i] = complete(100 + i)

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
        prober = threading.Thread(target=probe, daemon=True)
        for t in threads:
            t.start()
        prober.start()
        for t in threads:
            t.join(600)
        stop.set()
        prober.join(120)
        # the refusals reach /metrics from the queue's counts at the controller's next
        # tick (interval_s), which may come after their answers did: wait for it, a
        # few ticks at most, before reading the count the assertions compare
        answered = sum(1 for r in results + probes if r is not None and r[1] == "refused")
        try:
            wait_for("the refusals counted", lambda: mval(
                metric_values(srv), "tuned_requests_refused_total",
                reason="max_wait") >= answered, timeout_s=5.0)
        except AssertionError:
            pass        # the assertion below names the two counts
        values = metric_values(srv)
        # every request answered, the engine idle: the door is open, within the bound
        # after the last refusal or not (one tick for the controller to see it)
        time.sleep(1.0)
        admission = get_json(f"{srv.endpoint}/admission")

    assert all(r is not None for r in results), "a request got no answer"
    served = [r for r in results if r[1] == "length"]
    refused = [r for r in results if r[1] == "refused"]   # in the queue, read as 429
    shed = [r for r in results if r[1] == "429"]       # reached the gateway while refusing
    print(f"probes while refusing: {[(round(p[0], 2), p[1], p[2]) for p in probes]}; "
          f"/admission: {admission}")
    print(f"served {len(served)}, refused {len(refused)}; refused after "
          f"{min(r[0] for r in refused):.2f}-{max(r[0] for r in refused):.2f} s" if refused
          else f"served {len(served)}, none refused")
    assert len(served) + len(refused) + len(shed) == n, sorted({r[1] for r in results})
    assert all(tokens == MAX_TOKENS for _, _, tokens in served)
    assert refused, "a backlog four bounds deep must refuse"
    # never refused before the bound (the client's clock starts before the server's),
    # each with when to retry and the wait in vLLM's error body
    assert min(r[0] for r in refused) >= BOUND_S
    assert all(int(retry) >= 1 and "after waiting " in message
               for _, _, (retry, message) in refused), refused[:3]
    # a probe the gateway let through (it reads /admission in the background) waits
    # in the queue like the backlog and can be refused there too: counted alike
    refused_probes = [p for p in probes if p[1] == "refused"]
    assert all(t >= BOUND_S for t, _, _ in refused_probes)
    assert mval(values, "tuned_requests_refused_total", reason="max_wait") == (
        len(refused) + len(refused_probes)), (refused, probes)
    assert probes, "the queue refused, so /admission said so"
    # the door answered 429 while the queue refused: a probe, or the stream itself
    assert any(p[1] == "429" for p in probes + shed), (probes, len(shed))
    assert (admission["refusing"], admission["room"]) == (False, True), admission
    # a 429 at the door comes with Retry-After: the aging point, 2 x ttft_sla_s
    assert all(p[2][0] == "2" and p[2][1].startswith("overloaded: ")
               for p in probes + shed if p[1] == "429")
