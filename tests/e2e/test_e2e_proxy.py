"""Behind a proxy, as fleets run it: nginx in front of two `tuned serve`
engines retries on the overloaded one's 429 and the other serves the request; none
lost, none served twice.

Engine A runs one request at a time (cap 1) with a short wait bound that refuses
(``on_max_wait = "refuse"``); engine B has room. A backlog sent to A directly (clients
the proxy does not see) outlasts A's bound, so A's queue refuses and its gateway
answers new requests 429 with ``Retry-After``. While it does, a burst goes through
nginx, configured with the settings docs/kubernetes.md gives (read from it:
``proxy_next_upstream error timeout http_429 non_idempotent``,
``proxy_next_upstream_tries 2``, ...): the burst's requests that
nginx sends to A first come back 429 and are retried on B, before any byte reaches
the client, streaming ones included. Counted three ways: the client (one 200 with the
full completion per request), nginx's access log (``$upstream_addr`` /
``$upstream_status``: ``A, B`` / ``429, 200`` chains) and each engine's vLLM
(``vllm:request_success_total``: A's engine never saw a burst request its door
answered 429, B's saw each of those once). A control location without ``http_429``
passes A's 429 and its ``Retry-After`` to the client. A's door opens while A has
room (none waiting, a free slot) and lets in whoever comes until its next count; a
burst that met it open (nginx logs ``A`` / ``200``: served by A, or refused at A's
bound) is not conclusive and is sent again after the next 429, at most three bursts;
the counts take in every burst.

The backlog keeps coming until the burst is answered: rounds every half bound, the
first sized from a request timed in the test, each doubled while A has not refused
yet, so that A stays overloaded whatever this host's speed.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from serve_harness import (get_json, get_text, msum, mval, parse_metric_values,
                           tuned_serve_all, wait_for)
from tuned.engines.gateway import REFUSED_METRIC
from tuned.base.netutil import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BOUND_S = 4.0          # A's wait bound (max_wait_s)
LONG_TOKENS = 256      # each backlog request's length
BURST = 16             # requests through the retrying proxy (every other one streams)
CONTROL = 4            # requests through the control location (no retry on 429)
BURST_TOKENS = 8
MAX_ROUND = 32         # backlog requests sent to A at once, at most
MAX_BACKLOG = 400      # backlog requests in all, at most
ATTEMPTS = 3           # bursts, at most: one that met A's door open is tried again

ENGINE = ('model = "{model}"\nmax_num_seqs = {seqs}\nmax_num_batched_tokens = 512\n'
          'max_model_len = 512\nnum_gpu_blocks = 128\ninterval_s = 0.25\n'
          'b_min = {cap}\nb_max = {cap}\nfallback_cap = {cap}\nbatch_policy = "static"\n'
          'token_budget_policy = "max"\nadmission_guard = "off"\nttft_sla_s = 1.0\n'
          'max_wait_s = {bound}\non_max_wait = "refuse"\nlog_level = "warning"\n'
          'vllm_args = ["--enforce-eager"]\n')   # no compile: two engines start on a small host

NGINX = """\
worker_processes 1;
pid {d}/nginx.pid;
{user}
events {{ worker_connections 512; }}
http {{
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    log_format chains '$http_x_tag $status "$upstream_addr" "$upstream_status"';
    access_log {d}/access.log chains;
    # max_fails=0: every request takes its own round-robin pick (no passive
    # health check taking A out after its first 429), so half the burst meets A
    upstream engines {{
        server 127.0.0.1:{a} max_fails=0;
        server 127.0.0.1:{b} max_fails=0;
    }}
    # the same two engines with a round robin of their own: the streaming requests
    # and the control requests each meet A first in turn
    upstream engines_stream {{
        server 127.0.0.1:{a} max_fails=0;
        server 127.0.0.1:{b} max_fails=0;
    }}
    upstream engines_control {{
        server 127.0.0.1:{a} max_fails=0;
        server 127.0.0.1:{b} max_fails=0;
    }}
    server {{
        listen 127.0.0.1:{port};
{documented}
        location / {{
            proxy_pass http://engines;
        }}
        location /stream/ {{
            proxy_pass http://engines_stream/;
        }}
        location /control/ {{
            proxy_pass http://engines_control/;
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


DOC = Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md"


def documented_settings() -> list[str]:
    """The proxy_* lines (but proxy_pass) of docs/kubernetes.md's nginx example: the
    test runs what the docs say."""
    text = DOC.read_text()
    block = re.search(r"```nginx\n(.*?)```", text[text.index("## Behind a proxy"):], re.S)
    lines = [ln.strip() for ln in block.group(1).splitlines()]
    return [ln for ln in lines if ln.startswith("proxy_") and not ln.startswith("proxy_pass")]


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK)
                                      else None)
    if not found:
        pytest.fail("nginx not found: tools/test.sh installs Debian's nginx package "
                    "(apt-get install nginx)")
    return found


class Nginx:
    def __init__(self, folder: Path, a: str, b: str) -> None:
        """nginx on a free port in front of engines on ports ``a`` and ``b``."""
        self.dir = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port(avoid=(int(a), int(b)))
        self.base = f"http://127.0.0.1:{self.port}"
        # as root, nginx's workers would run as nobody, who cannot enter pytest's tmp
        user = "user root;" if os.geteuid() == 0 else ""
        self.conf = folder / "nginx.conf"
        settings = documented_settings()
        assert "proxy_next_upstream error timeout http_429 non_idempotent;" in settings
        self.conf.write_text(NGINX.format(d=folder, user=user, a=a, b=b, port=self.port,
                                          documented="\n".join(" " * 8 + ln
                                                               for ln in settings)))
        self.bin = nginx_binary()
        self.args = [self.bin, "-p", str(folder), "-c", str(self.conf),
                     "-e", str(folder / "error.log")]

    def __enter__(self) -> "Nginx":
        check = subprocess.run([*self.args, "-t"], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr     # http_429 needs nginx >= 1.11.13
        self.proc = subprocess.Popen([*self.args, "-g", "daemon off;"])
        wait_for("nginx to listen", lambda: _answers(self.base + "/v1/models"), 30)
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(30)

    def chains(self) -> dict[str, tuple[str, list[str], list[str]]]:
        """{tag: (final status, upstream addresses, upstream statuses)} of the
        access log; a tag logged twice fails."""
        out: dict = {}
        for line in (self.dir / "access.log").read_text().splitlines():
            head, addrs, _, statuses, _ = line.split('"')
            tag, status = head.split()
            if tag == "-":          # not one of the test's requests
                continue
            assert tag not in out, f"{tag} logged twice"
            out[tag] = (status, addrs.split(", "), statuses.split(", "))
        return out


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def complete(url: str, model: str, prompt: list[int], max_tokens: int, *, tag: str = "",
             stream: bool = False, timeout: float = 300.0) -> dict:
    """One completion: {status, retry_after, finish, tokens}; a stream is read to its
    end (its usage from the last chunk)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Tag": tag})
    out = {"tag": tag, "stream": stream, "status": None, "retry_after": None,
           "finish": None, "tokens": None, "message": None}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out["status"] = r.status
            if not stream:
                doc = json.loads(r.read())
                out["finish"] = doc["choices"][0]["finish_reason"]
                out["tokens"] = doc["usage"]["completion_tokens"]
                return out
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for c in chunk.get("choices") or []:
                    out["finish"] = c.get("finish_reason") or out["finish"]
                if chunk.get("usage"):
                    out["tokens"] = chunk["usage"]["completion_tokens"]
    except urllib.error.HTTPError as e:
        out["status"], out["retry_after"] = e.code, e.headers.get("Retry-After")
        try:
            out["message"] = json.loads(e.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            pass
    return out


def queue_refused(r: dict) -> bool:
    """A 429 for a request the engine's queue refused at its bound (the gateway held
    the answer's start until the first token, which never came), not at the door."""
    return r["status"] == 429 and (r["message"] or "").startswith("refused (max_wait)")


def run_all(fn, args: list[tuple]) -> list[dict]:
    """``fn(*a)`` for every ``a`` at once, one thread each; the results in order."""
    results: list = [None] * len(args)

    def one(i: int) -> None:
        try:
            results[i] = fn(*args[i])
        except OSError as e:          # a connection error or a timeout: kept, not lost
            results[i] = {"tag": args[i][4] if len(args[i]) > 4 else "", "stream": False,
                          "status": f"error: {e!r}", "retry_after": None, "finish": None,
                          "tokens": None}

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    return results


def vllm_finished(srv) -> float:
    """Requests the server's engine finished (every finish reason: served or refused)."""
    return msum(parse_metric_values(get_text(srv.base + "/metrics")),
                "vllm:request_success_total")


def test_nginx_retries_the_overloaded_engines_429_on_the_other(tmp_path, tiny_model):
    t_start = time.monotonic()
    setups = [(tmp_path / "a", ENGINE.format(model=tiny_model, seqs=4, cap=1, bound=BOUND_S)),
              (tmp_path / "b", ENGINE.format(model=tiny_model, seqs=16, cap=16, bound=120.0))]
    with tuned_serve_all(setups, ready_timeout_s=500) as (a, b), \
            Nginx(tmp_path / "nginx", a.base.rsplit(":", 1)[1], b.base.rsplit(":", 1)[1]) as proxy:
        model = a.model_id()
        addr = {a.base.removeprefix("http://"): "A", b.base.removeprefix("http://"): "B"}
        t_ready = time.monotonic()
        direct: list[dict] = []           # every request sent to A without the proxy

        # one backlog request alone on A, twice: how long one takes now (the faster)
        times = []
        for i in range(2):
            t0 = time.monotonic()
            direct.append(complete(a.base, model, [10 + i] * 16, LONG_TOKENS))
            times.append(time.monotonic() - t0)
        one_s = min(times)
        assert (direct[-1]["finish"], direct[-1]["tokens"]) == ("length", LONG_TOKENS)
        # A kept overloaded until the burst is answered: a round of backlog requests
        # every half bound, sized from the timing so that they arrive faster than A
        # serves them at cap 1, and doubled each round while A's queue has not yet
        # refused (a host that runs faster now than when timed, or a timing taken
        # while the other engine was busy, does not leave A under its bound)
        first_round = min(max(math.ceil(2 * BOUND_S / one_s) + 2, 4), MAX_ROUND)
        backlog: list = []
        rounds: list[int] = []
        stop = threading.Event()

        def feed() -> None:
            threads, m, i = [], first_round, 0
            while not stop.is_set() and i < MAX_BACKLOG:
                m = min(m, MAX_BACKLOG - i)
                rounds.append(m)
                for _ in range(m):
                    args = (a.base, model, [20 + i % 200] * 16, LONG_TOKENS)
                    t = threading.Thread(target=lambda args=args: backlog.append(
                        run_all(complete, [args])[0]), daemon=True)
                    t.start()
                    threads.append(t)
                    i += 1
                refused = get_json(f"{a.endpoint}/admission").get("refused", 0)
                if not refused:
                    m = min(2 * m, MAX_ROUND)
                stop.wait(BOUND_S / 2)
            for t in threads:
                t.join(600)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()

        # A's queue refuses at the bound; once A's gateway answers a probe 429, the burst
        def not_refusing() -> str:
            """What A showed when its queue never refused: enough to tell why."""
            vals = parse_metric_values(a.metrics())
            return (f"A's queue to refuse: one request alone {one_s:.2f} s, backlog rounds {rounds}, "
                    f"answered so far {[(r['status'], r['finish']) for r in backlog]}; "
                    f"/admission {get_json(f'{a.endpoint}/admission')}; "
                    f"decision {get_json(f'{a.endpoint}/decisions?limit=3')}; "
                    f"refused {msum(vals, 'tuned_requests_refused_total')}, finished "
                    f"{msum(vals, 'tuned_requests_finished_total')}; A's log:\n"
                    + a.log_tail(80))

        wait_for(not_refusing, lambda: get_json(f"{a.endpoint}/admission")["refusing"],
                 timeout_s=4 * BOUND_S + 120, every_s=0.1)
        # an empty body: A's gateway answers 429 once it has read the state, vLLM 400
        # before that; either way it never reaches A's engine
        probes: list[int] = []

        def gateway_refuses() -> bool:
            req = urllib.request.Request(a.base + "/v1/completions", data=b"{}",
                                         headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=30).close()
                probes.append(200)
            except urllib.error.HTTPError as e:
                probes.append(e.code)
            return probes[-1] == 429

        def gateway_refuses_while_a_refuses() -> bool:
            """The gateway reads /admission every half second with a short timeout and
            lets requests through while it has no answer, so on a loaded host its first
            429 can come seconds after the queue's state; wait as long as A's queue is
            refusing (the backlog keeps it so for bounds), not a fixed time."""
            if gateway_refuses():
                return True
            assert get_json(f"{a.endpoint}/admission")["window_s"] > 0, \
                ("A's queue stopped refusing before its gateway answered 429", probes)
            return False

        a_addr = a.base.removeprefix("http://")

        def let_in_by_a(chains: dict, tag: str) -> bool:
            """nginx sent it to A and A answered: its door was open (it opens while A
            has room, and lets in whoever comes until the next count)."""
            return chains[tag][1:] == ([a_addr], ["200"])

        # a burst right after A's gateway answered a probe 429; A's door opens when A
        # has room, so a burst that met it open is not conclusive: tried again
        attempts: list[list[dict]] = []
        windows: list[dict] = []
        for k in range(ATTEMPTS):
            wait_for("A's gateway to answer 429", gateway_refuses_while_a_refuses,
                     timeout_s=4 * BOUND_S + 120, every_s=0.05)
            assert set(probes) <= {400, 429}, probes
            # how long until A's last refusal is a bound old as the burst goes
            # (printed: the burst must reach A within it)
            window = get_json(f"{a.endpoint}/admission")
            assert window["window_s"] > 0, window
            windows.append(window)
            burst_args = [(proxy.base + ("/stream" if i % 2 else ""), model,
                           [30 + i] * 8, BURST_TOKENS, f"burst{k}-{i}", i % 2 == 1)
                          for i in range(BURST)]
            control_args = [(proxy.base + "/control", model, [60 + i] * 8, BURST_TOKENS,
                             f"control{k}-{i}", False) for i in range(CONTROL)]
            got = run_all(lambda url, m, p, n, tag, stream: complete(
                url, m, p, n, tag=tag, stream=stream), burst_args + control_args)
            attempts.append(got)
            # nginx logs a request after its answer is complete: the client may be first
            tags = {r["tag"] for r in got}
            chains = wait_for("nginx to log every request", lambda: (
                lambda c: c if tags <= c.keys() else None)(proxy.chains()), timeout_s=30)
            if not any(let_in_by_a(chains, t) for t in tags):
                break
        stop.set()
        feeder.join(600)
        direct += backlog
        t_done = time.monotonic()
        # a direct request sent after A began to refuse is answered 429 by A's gateway
        # and never reaches A's engine; every other one was let in: served, or refused
        # in A's queue at the bound and read as 429 (the gateway holds the start)
        admitted = [r for r in direct if r["status"] == 200]
        direct_refused = [r for r in direct if queue_refused(r)]
        direct_429 = [r for r in direct if r["status"] == 429 and not queue_refused(r)]
        assert len(admitted) + len(direct_refused) + len(direct_429) == len(direct), \
            [(r["status"], r["message"]) for r in direct]
        # A's server and tuned have counted every admitted request before they are read
        counted: list = []
        deadline = time.monotonic() + 60
        while True:
            counted = [vllm_finished(a), msum(parse_metric_values(a.metrics()),
                                              "tuned_requests_finished_total")]
            if min(counted) >= len(admitted) + len(direct_refused) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert min(counted) >= len(admitted) + len(direct_refused), \
            ("A's vLLM and tuned finished", counted, "admitted", len(admitted),
             "direct statuses", [(r["status"], r["finish"]) for r in direct])
        a_engine, b_engine = vllm_finished(a), vllm_finished(b)
        a_429 = msum(parse_metric_values(get_text(a.base + "/metrics")), REFUSED_METRIC)
        a_values, b_values = parse_metric_values(a.metrics()), parse_metric_values(b.metrics())

    burst = [r for got in attempts for r in got[:BURST]]
    control = [r for got in attempts for r in got[BURST:]]
    last_burst, last_control = attempts[-1][:BURST], attempts[-1][BURST:]
    first = {r["tag"]: addr[chains[r["tag"]][1][0]] for r in burst + control}
    on_a = {r["tag"] for r in burst + control if let_in_by_a(chains, r["tag"])}
    # one A let in and then refused at its bound comes back 429 like a refusal at the
    # door (the gateway holds the start): nginx retries it on B, the control location
    # passes it on; A's queue counted it
    a_queue = mval(a_values, "tuned_requests_refused_total", reason="max_wait")
    a_queue_via_proxy = a_queue - len(direct_refused)
    a_first = [r for r in burst if first[r["tag"]] == "A" and r["tag"] not in on_a]
    control_a = [r for r in control if first[r["tag"]] == "A" and r["tag"] not in on_a]
    control_b = [r for r in control if first[r["tag"]] == "B"]
    burst_b = [r for r in burst if r["tag"] not in on_a]
    last_a_first = [r for r in a_first if r in last_burst]
    print(f"\none backlog request {one_s:.2f} s alone on A; backlog rounds {rounds}; direct to A: "
          f"{len(direct)} ({len(direct_refused)} refused at the bound, {len(direct_429)} "
          f"answered 429 by the gateway); gateway probes {probes}; "
          f"{len(attempts)} burst(s), A's window at each "
          f"{[(w.get('window_s'), w['refusing']) for w in windows]}; let in by A's open door "
          f"{len(on_a)} and served, {a_queue_via_proxy:.0f} refused at its bound; the last burst "
          f"{BURST}: {len(last_a_first)} A 429 -> B 200 "
          f"({sum(r['stream'] for r in last_a_first)} of them streaming), "
          f"{BURST - len(last_a_first)} B 200; control {CONTROL} a burst: "
          f"{len(control_a)} A 429 passed on, {len(control_b)} B 200 in all; engines "
          f"finished A {a_engine:.0f}, B {b_engine:.0f}; "
          f"A's gateway 429s {a_429:.0f}; tuned refused A {mval(a_values, 'tuned_requests_refused_total', reason='max_wait'):.0f}"
          f", B {mval(b_values, 'tuned_requests_refused_total', reason='max_wait'):.0f}; "
          f"start {t_ready - t_start:.0f} s, run {t_done - t_ready:.0f} s")

    # the last burst met A's door shut: none of it was let in by A
    assert not any(r["tag"] in on_a for r in last_burst + last_control), \
        ("A's door was open at every burst", [chains[r["tag"]] for r in burst], windows)
    # the client: every burst request answered once, 200, the whole completion (one
    # A refused at its bound was retried on B too)
    assert [(r["status"], r["finish"], r["tokens"]) for r in burst] == \
        [(200, "length", BURST_TOKENS)] * len(burst), burst
    # nginx: one line per request, final 200; A first means A 429 then B 200 (or A
    # 200 where an earlier burst met A's door open)
    assert sorted(t for t in chains if t.startswith("burst")) == \
        sorted(r["tag"] for r in burst)
    for r in burst:
        status, ups, codes = chains[r["tag"]]
        route = tuple(addr[u] for u in ups)
        assert (status, route, tuple(codes)) in {("200", ("B",), ("200",)),
                                                 ("200", ("A", "B"), ("429", "200")),
                                                 ("200", ("A",), ("200",))}, \
            (r, chains[r["tag"]], windows)
    # each round robin sends every other request to A first: streaming ones were
    # retried too (A's 429 came before any byte of a stream)
    assert len(last_a_first) >= BURST // 4, last_a_first
    assert any(r["stream"] for r in last_a_first) and \
        any(not r["stream"] for r in last_a_first)
    # the control location passes A's 429 and its Retry-After (2 x ttft_sla_s) on
    assert all((r["status"], r["retry_after"]) == (429, "2")
               for r in control_a if r in last_control)
    assert any(r in last_control for r in control_a)
    assert len(control_a) + len(control_b) + len([r for r in control if r["tag"] in on_a]) \
        == len(control)
    assert all((r["status"], r["tokens"]) == (200, BURST_TOKENS) for r in control_b)
    # A's engine saw no burst or control request but those its open door let in: it
    # finished those and the direct requests it let in (served, or refused at the
    # bound)
    assert direct[:2] == admitted[:2]        # the two timed alone
    assert a_engine == len(admitted) + len(direct_refused) + len(on_a) + a_queue_via_proxy, \
        (a_engine, len(admitted), len(direct_refused), len(on_a), a_queue_via_proxy)
    assert direct_refused, "the backlog outlasted A's bound"
    # every 429 A sent, counted once: at its door (the gateway's counter: the probes',
    # the late direct ones' and some of the bursts' and controls') or by its queue
    # (tuned's counter: the direct ones refused at the bound and the rest)
    assert a_429 + a_queue == probes.count(429) + len(a_first) + len(control_a) \
        + len(direct_429) + len(direct_refused)
    # B's engine finished each burst request A did not let in once, and the control
    # requests sent to it
    assert b_engine == len(burst_b) + len(control_b), (b_engine, len(burst_b), len(control_b))
    assert mval(b_values, "tuned_requests_refused_total", reason="max_wait") == 0
