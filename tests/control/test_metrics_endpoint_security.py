"""tuned's HTTP endpoint: loopback by default, only POST /reload changes state and it is
guarded (loopback peer or bearer token), and nothing it serves or logs carries request
text."""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from dataclasses import fields
from typing import get_type_hints

import pytest

from tuned import config
from tuned.config.handoff import reload_token_digest
from tuned.base import log as log_mod
from tuned.control.controller import Controller
from tuned.control.metrics import Endpoint, Metrics, is_loopback_peer, reload_refusal, token_sha256
from tuned.core.queue_policy import ReqInfo
from tuned.launch.launcher import scheduler_env
from tuned.launch.serve import post_reload
from tuned.core.ring import FinishedRequest, StepSample

TOKEN = "s3cret-token-value"


class Calls:
    """Stub callables for the endpoint; counts reloads."""

    def __init__(self):
        self.reloads = 0

    def decisions(self, limit):
        return {"current": None, "recent": [], "limit": limit}

    def steps(self, since):
        return {"next": 0, "samples": [], "since": since}

    def reload(self):
        self.reloads += 1
        return {"outcome": "ok", "changed": []}

    def healthy(self):
        return True


def start(host="127.0.0.1", token="", **kw):
    calls = Calls()
    m = Metrics()
    ep = Endpoint(host, 0, m, decisions=calls.decisions, steps=calls.steps,
                  reload=calls.reload, healthy=calls.healthy, reload_token=token, **kw).start()
    return ep, calls, m


def request(url, method="GET", headers=None, source=None):
    """(status, headers, parsed JSON body); ``source`` binds the client socket first so
    the server sees that peer address."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    s = socket.create_connection((host, int(port)), timeout=5,
                                 source_address=(source, 0) if source else None)
    try:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Content-Length: 0",
                 "Connection: close"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *hdr = head.decode("latin-1").split("\r\n")
    hdrs = dict(h.split(": ", 1) for h in hdr)
    return int(status_line.split()[1]), hdrs, json.loads(body) if body else None


def reloads(m: Metrics, outcome: str) -> float:
    return m.reloads.labels(outcome)._value.get()


def non_loopback_address() -> str | None:
    """An address of this host that is not loopback (the first of `hostname -I`)."""
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        addr = s.getsockname()[0]
        s.close()
    except OSError:
        return None
    return None if is_loopback_peer(addr) else addr


# ----------------------------------------------------------------- defaults

def test_endpoint_binds_loopback_by_default():
    cfg = config.default()
    assert cfg.metrics_host == "127.0.0.1"
    assert config.validate({}).metrics_host == "127.0.0.1"
    assert cfg.reload_token == ""
    assert config.FIELDS["reload_token"].metadata["restart"] is True


def test_reload_token_is_never_shown():
    cfg = config.validate({"reload_token": TOKEN})
    assert cfg.reload_token == TOKEN
    assert TOKEN not in repr(cfg)
    # the engine's environment carries the token's digest (the engine compares
    # digests), never the token
    env = scheduler_env(cfg, {})
    assert TOKEN not in json.dumps(env)
    assert config.engine_setup({}, env).reload_token_sha256 == token_sha256(TOKEN)
    with pytest.raises(config.ConfigError) as e:
        config.validate({"reload_token": 31337})
    assert e.value.problems == ["reload_token: must be a string (value not shown)"]


# ----------------------------------------------------------- peer check unit

@pytest.mark.parametrize("addr", [("127.0.0.1", 5), ("127.8.9.10", 5), ("::1", 5, 0, 0),
                                  ("::ffff:127.0.0.1", 5, 0, 0), "127.0.0.1"])
def test_loopback_peers(addr):
    assert is_loopback_peer(addr)
    assert reload_refusal(addr, None, "") is None


@pytest.mark.parametrize("addr", [("10.0.0.5", 1234), ("192.0.2.2", 80), ("::ffff:10.0.0.5", 1),
                                  ("fd00::2", 1, 0, 0), ("0.0.0.0", 1), ("not-an-ip", 1), ""])
def test_other_peers_are_not_loopback(addr):
    assert not is_loopback_peer(addr)


def test_reload_refusal_reasons():
    peer = ("10.0.0.5", 1234)
    assert reload_refusal(peer, None, "") == (
        "reload is accepted from loopback only (peer 10.0.0.5); set reload_token in the "
        "config to allow other peers with 'Authorization: Bearer <token>'")
    # a token sent to a server without one changes nothing
    assert reload_refusal(peer, f"Bearer {TOKEN}", "").startswith("reload is accepted from "
                                                                  "loopback only")
    need = "reload from a non-loopback peer (10.0.0.5) needs 'Authorization: Bearer <token>'"
    assert reload_refusal(peer, None, TOKEN) == need
    assert reload_refusal(peer, "Basic dXNlcjpwYXNz", TOKEN) == need
    assert reload_refusal(peer, "Bearer ", TOKEN) == need
    mismatch = "reload token does not match (peer 10.0.0.5)"
    assert reload_refusal(peer, "Bearer wrong", TOKEN) == mismatch
    assert reload_refusal(peer, f"Bearer {TOKEN}x", TOKEN) == mismatch
    assert reload_refusal(peer, f"Bearer {TOKEN}", TOKEN) is None
    assert reload_refusal(peer, f"bearer  {TOKEN} ", TOKEN) is None
    # what the engine holds is the digest only (tuned.config.engine_handoff)
    digest = token_sha256(TOKEN)
    assert reload_refusal(peer, f"Bearer {TOKEN}", token_digest=digest) is None
    assert reload_refusal(peer, f"Bearer {digest}", token_digest=digest) == mismatch
    assert reload_refusal(peer, None, token_digest=digest) == need


# ----------------------------------------------------------- over HTTP

def test_loopback_post_reload_accepted_and_get_is_405():
    ep, calls, m = start()
    try:
        base = f"http://127.0.0.1:{ep.port}"
        assert ep.server.server_address[0] == "127.0.0.1"
        code, hdrs, body = request(base + "/reload", "POST")
        assert (code, body, calls.reloads) == (200, {"outcome": "ok", "changed": []}, 1)
        code, hdrs, body = request(base + "/reload", "GET")
        assert code == 405 and hdrs["Allow"] == "POST"
        assert body == {"error": "/reload accepts POST only"}
        assert calls.reloads == 1
        # unknown paths still 404, for both methods
        assert request(base + "/nope")[0] == 404
        code, _, body = request(base + "/nope", "POST")
        assert code == 404 and body == {"error": "no such path: /nope"}
        assert calls.reloads == 1
        # read-only paths unchanged
        assert request(base + "/decisions?limit=3")[2] == {"current": None, "recent": [],
                                                           "limit": 3}
        assert request(base + "/healthz")[2] == {"healthy": True}
        # the supervisor's client, as SIGHUP uses it
        assert post_reload(base) == {"outcome": "ok", "changed": []}
        assert calls.reloads == 2 and reloads(m, "forbidden") == 0
    finally:
        ep.stop()


@pytest.fixture
def outside():
    addr = non_loopback_address()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    return addr


def test_non_loopback_peer_forbidden_without_token(outside):
    ep, calls, m = start(host=outside)
    try:
        base = f"http://{outside}:{ep.port}"
        code, _, body = request(base + "/reload", "POST", source=outside)
        assert code == 403
        assert body == {"outcome": "forbidden", "error": (
            f"reload is accepted from loopback only (peer {outside}); set reload_token in "
            "the config to allow other peers with 'Authorization: Bearer <token>'")}
        code, _, body = request(base + "/reload", "POST", {"Authorization": "Bearer x"},
                                source=outside)
        assert code == 403
        assert calls.reloads == 0 and reloads(m, "forbidden") == 2
        # reading stays open to the address the operator chose to bind
        assert request(base + "/healthz", source=outside)[0] == 200
        text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
        assert 'tuned_reloads_total{engine="0",outcome="forbidden"} 2.0' in text
    finally:
        ep.stop()


@pytest.mark.parametrize("shipped", ["clear", "digest"])
def test_non_loopback_peer_needs_the_right_token(outside, shipped):
    # the engine gets the token's digest in tuned serve's hand-off
    handoff = config.engine_handoff(config.validate({"reload_token": TOKEN}))
    assert TOKEN not in json.dumps(handoff)
    kw = ({"token": TOKEN} if shipped == "clear" else
          {"reload_token_sha256": reload_token_digest(handoff)})
    ep, calls, m = start(host=outside, **kw)
    try:
        base = f"http://{outside}:{ep.port}"
        for headers, why in [
                ({}, f"reload from a non-loopback peer ({outside}) needs 'Authorization: "
                     "Bearer <token>'"),
                ({"Authorization": "Bearer nope"}, f"reload token does not match (peer "
                                                  f"{outside})")]:
            code, _, body = request(base + "/reload", "POST", headers, source=outside)
            assert (code, body) == (403, {"outcome": "forbidden", "error": why})
        assert calls.reloads == 0
        code, _, body = request(base + "/reload", "POST", {"Authorization": f"Bearer {TOKEN}"},
                                source=outside)
        assert (code, body["outcome"], calls.reloads) == (200, "ok", 1)
        # the supervisor sends the configured token
        assert post_reload(base, token=TOKEN)["outcome"] == "ok"
        assert post_reload(base, token="bad") == {
            "outcome": "forbidden", "error": f"reload token does not match (peer {outside})"}
        assert calls.reloads == 2 and reloads(m, "forbidden") == 3
    finally:
        ep.stop()


# ----------------------------------------------------------- no request text

SECRET = "Tell me the launch code: PINEAPPLE-7731"
TEXT_KEYS = ("prompt", "text", "content", "messages", "token_ids", "output")


def walk(obj, path=""):
    """Every (path, key, leaf) of a JSON tree."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield path, k, None
            yield from walk(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from walk(v, f"{path}[{i}]")
    else:
        yield path, None, obj


def text_keys(doc) -> list[str]:
    """Keys that could hold request text; ``prompt_tokens`` / ``output_tokens`` are
    lengths and allowed."""
    bad = []
    for path, key, _ in walk(doc):
        if key is None:
            continue
        k = key.lower()
        if any(t in k for t in TEXT_KEYS) and not k.endswith(("_tokens", "_tokens_mean")):
            bad.append(f"{path}.{key}")
    return bad


def test_request_records_carry_lengths_not_text():
    """What tuned keeps about a request (rings, queue view) holds ids, numbers and
    times: there is no field where text could go."""
    for rec in (StepSample, FinishedRequest):
        hints = get_type_hints(rec)
        assert [f for f in rec._fields if hints[f] not in (int, float, float | None)] == \
            (["request_id"] if rec is FinishedRequest else [])
    hints = get_type_hints(ReqInfo)
    assert [f.name for f in fields(ReqInfo) if hints[f.name] is str] == ["request_id"]


def test_controller_json_has_no_request_text(tmp_path):
    """A controller on the fake engine (tests/control/test_controller.py's), fed finished requests
    and steps: /decisions and /steps over HTTP carry no text-bearing key and no string
    beyond ids, reasons and config names."""
    from fakes import FakeEngine

    eng = FakeEngine(running=4, waiting=2)
    for i in range(20):
        eng.add_step(0.02, 4)
        eng.add_finished(30 + i, 10)
    ctrl = Controller(config.validate({"interval_s": 0.1, "stale_after_s": 1.0,
                                       "tbt_sla_s": 0.025}), eng, Metrics())
    for _ in range(3):
        ctrl.run_once()
    m = ctrl.metrics
    ep = Endpoint("127.0.0.1", 0, m, decisions=ctrl.decisions_json,
                  steps=lambda since: {"samples": [s._asdict() for s in eng.steps.since(since)]},
                  reload=ctrl.reload, healthy=ctrl.healthy).start()
    try:
        base = f"http://127.0.0.1:{ep.port}"
        dec = request(base + "/decisions?limit=200")[2]
        steps = request(base + "/steps?since=0")[2]
    finally:
        ep.stop()
    assert dec["current"] is not None and len(steps["samples"]) == 20
    assert text_keys(dec) == [] and text_keys(steps) == []
    strings = {v for doc in (dec, steps) for _, k, v in walk(doc) if isinstance(v, str)}
    from tuned.commands.status import REASONS

    # whether the cap binds, in tuned's own words and counts (tuned.policies.explain)
    note = re.compile(r"the cap (binds|does not bind): \d+ running (at|under) cap \d+"
                      r"(, \d+ waiting|, nothing waiting| while \d+ wait, held by the token "
                      r"budget, the admission guard, the queue policy or the KV cache, not "
                      r"by the cap) \(full with requests waiting on \d+% of the window's "
                      r"steps\)")
    notes = {v for v in strings if note.fullmatch(v)}
    assert notes, "every decision carries a cap_note"
    # reasons, and the config's own names (policy, statistic, SLA source)
    names = {"fcfs", "tuned", "auto", "p90", "config", "online", "tpot", "", "none"}
    assert strings - notes <= set(REASONS) | names | {dec["current"]["reason"]}


def test_real_scheduler_never_exposes_request_text(tiny_model, capsys):
    """vLLM's EngineCore holds token ids, never text; even a request object carrying text
    (and an unrelated extra arg holding it) leaves no trace in /decisions, /steps,
    /metrics or tuned's log lines, and no run of its token ids either."""
    from fakes import make_scheduler, step
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    # tuned logs to sys.stderr as it was when the engine configured logging: capsys's
    s = make_scheduler(str(tiny_model), False, queue_policy="mcsf", log_level="debug")
    try:
        ids = [48611 + i for i in range(12)]
        for i in range(4):
            r = Request(request_id=f"req-{i}", prompt_token_ids=ids,
                        sampling_params=SamplingParams(max_tokens=4, ignore_eos=True,
                                                       extra_args={
                                                           "note": SECRET,
                                                           "tuned_deadline_s": -1}),
                        pooling_params=None)
            r.prompt = SECRET  # as if the text had come along
            s.add_request(r)
        for _ in range(40):
            if not s.has_requests():
                break
            step(s)
        s.controller.run_once()
        assert len(s.finished.since(0)) == 4
        base = f"http://127.0.0.1:{s.endpoint.port}"
        docs = {p: urllib.request.urlopen(base + p, timeout=5).read().decode()
                for p in ("/decisions?limit=200", "/steps?since=0", "/metrics")}
    finally:
        s.shutdown()
    logs = capsys.readouterr().err
    with capsys.disabled():  # leave structlog on the real stderr, not capsys's buffer
        log_mod.configure("info")
    # the capture worked: the malformed hint was logged, with the request id only
    assert '"event": "request_hint_ignored"' in logs and '"request_id": "req-3"' in logs
    run = ", ".join(map(str, ids[:3]))
    for name, text in {**docs, "log": logs}.items():
        assert SECRET not in text and "PINEAPPLE" not in text, name
        assert run not in text and run.replace(" ", "") not in text, name
    assert text_keys(json.loads(docs["/decisions?limit=200"])) == []
    assert text_keys(json.loads(docs["/steps?since=0"])) == []
