"""tuned's Prometheus metrics on an injected registry, and its HTTP endpoint.

Names follow ``tuned_<what>_<unit>``; counters end in ``_total``. Every sample carries
``engine="<data-parallel rank>"``, the label vLLM's own series carry; what vLLM already
exports (running, waiting, tokens, preemptions) tuned leaves to vLLM. The endpoint
(started inside vLLM's EngineCore, one per data-parallel rank on port + rank) serves:

* ``GET /metrics``   Prometheus text format from tuned's private registry;
* ``GET /decisions`` recent decisions, the knobs applied, telemetry and the last
  reload, as JSON (``tuned status`` reads it);
* ``GET /steps?since=SEQ`` raw step samples (``tuned profile`` reads them);
* ``POST /reload``   re-read and apply the config file (what SIGHUP triggers);
* ``GET /healthz``   200 while the controller ticks and the engine steps, 503 once
  either has stalled (``Controller.healthy``).

The endpoint is bounded: at most ``max_handler_threads`` connections are served at
once (a connection beyond them is answered 503 at once and closed, on the accepting
thread), a connection that sends nothing or stops reading for ``conn_timeout_s`` is
closed, and a client that hangs up mid-response is counted
(``tuned_endpoint_connections_dropped_total``), not logged with a traceback. An
error in tuned's own handler code is answered 500 with the error, its traceback on
stderr.

Only ``POST /reload`` changes state, so only it is guarded: it is accepted from a
loopback peer (127.0.0.0/8, ::1), or from anywhere with ``Authorization: Bearer
<reload_token>`` when the config sets ``reload_token``; anything else gets 403 and
a JSON error saying why (:func:`reload_refusal`). The read-only paths carry numbers,
request ids and reasons, never prompt or output text: tuned never sees the text.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import parse_qs, urlparse

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from tuned.core.refusal import QUEUE_REASONS, REASONS

TBT_BUCKETS_S = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2,
                 0.3, 0.5, 1.0, 2.0, 5.0)
#: why the engine applies the fallback cap (tuned.core.knobs, tuned.control.controller)
FALLBACK_CAUSES = ("stale", "controller_error", "invalid_decision", "slow_decision",
                   "step_path_error")
TICK_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
#: why the endpoint let a connection go without a full answer (:class:`Endpoint`)
DROP_REASONS = ("busy", "timeout", "disconnect")
#: the endpoint's production bounds: a scrape, `tuned status` and `tuned profile`'s
#: polling need a handful of connections, each answered in milliseconds
MAX_HANDLER_THREADS = 8
CONN_TIMEOUT_S = 5.0


class Metrics:
    """Every series tuned exports, registered on ``registry``.

    ``engine`` is the data-parallel rank, as vLLM labels its own series
    (``vllm:num_requests_running{engine="0"}``): the exposition (:attr:`exported`)
    adds ``engine="<rank>"`` to every sample; with the ``server`` label the scrape
    config gives tuned's and vLLM's targets of one server (docs/operator-guide.md,
    Metrics), tuned's series and vLLM's join ``on (server, engine)``. The series
    themselves are registered without ``engine`` (one label set per process).
    """

    def __init__(self, registry: CollectorRegistry | None = None,
                 log_drops: Callable[[], int] | None = None, engine: str = "0"):
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self.engine = str(engine)
        #: what the endpoint serves: ``registry`` with the ``engine`` label on each sample
        self.exported = EngineLabelled(r, self.engine)
        g = lambda name, doc, labels=(): Gauge(name, doc, labels, registry=r)  # noqa: E731
        c = lambda name, doc, labels=(): Counter(name, doc, labels, registry=r)  # noqa: E731
        self.target = g("tuned_decision_target_seqs", "Batch size the controller decided")
        self.lower = g("tuned_decision_lower_seqs", "Lower bound of the decision")
        self.upper = g("tuned_decision_upper_seqs", "Upper bound of the decision")
        self.batch = g("tuned_decision_batch_seqs", "Batch size b_t of the decision: the "
                       "gate, or the running count while it drains to the gate")
        self.b_mem = g("tuned_decision_memory_bound_seqs", "Memory bound b_mem: the largest "
                       "batch whose KV demand overflows the cache with probability at "
                       "most eps_m (Pang et al.'s Algorithm 1)")
        self.b_sla = g("tuned_decision_sla_bound_seqs", "SLA bound b_SLA: the batch size "
                       "whose time between tokens the SLA search holds to tbt_sla_s "
                       "(Pang et al.'s Algorithm 2)")
        self.applied_cap = g("tuned_applied_cap_seqs",
                             "Cap on running sequences applied in the scheduler")
        self.ceiling = g("tuned_ceiling_seqs", "vLLM's max_num_seqs: the highest cap tuned may use")
        self.token_budget = g("tuned_token_budget_tokens", "Per-step token budget applied")
        self.tbt = Histogram("tuned_tbt_seconds", "Time between tokens: wall time of "
                             "engine steps that ran decodes", buckets=TBT_BUCKETS_S, registry=r)
        self.tbt_sla = g("tuned_tbt_sla_seconds", "Time-between-tokens SLA D_SLA in force, "
                         "in seconds (tbt_sla_s; 0 = none; derived on this host when "
                         "tbt_sla_auto is set)")
        self.sla_setpoint = g("tuned_sla_setpoint_seconds", "What the SLA search holds its "
                              "statistic (sla_statistic) to: tbt_sla_s, or tbt_sla_s x the "
                              "margin learnt for attainment")
        self.sla_margin = g("tuned_sla_margin_ratio", "The setpoint over tbt_sla_s: the "
                            "margin learnt with sla_statistic = attainment, else 1")
        self.sla_feasible = g("tuned_sla_feasible", "1 while the TBT SLA is reachable, 0 "
                              "when even b_min decodes (the lowest batch tuned may choose) "
                              "miss it (the SLA bound steps aside)")
        self.kv_usage = g("tuned_kv_usage_ratio", "Fraction of usable KV-cache blocks in "
                          "use, read live at the tick: the controller's input (vLLM's "
                          "vllm:kv_cache_usage_perc is the engine's figure)")
        self.kv_capacity = g("tuned_kv_capacity_tokens", "KV-cache capacity in tokens")
        self.gpu_used = g("tuned_gpu_memory_used_bytes", "GPU memory used (NVML)", ("gpu",))
        self.gpu_total = g("tuned_gpu_memory_total_bytes", "GPU memory total (NVML)", ("gpu",))
        self.decisions = c("tuned_decisions_total", "Controller decisions by reason", ("reason",))
        self.decision_changes = c("tuned_decision_changes_total", "Decisions that changed the cap")
        self.fallbacks = c("tuned_fallbacks_total", "Times the scheduler fell back to the "
                           "safe static cap", ("cause",))
        self.in_fallback = g("tuned_fallback_active", "1 while the fallback cap is applied")
        self.errors = c("tuned_controller_errors_total", "Controller ticks that raised")
        self.tick = Histogram("tuned_controller_tick_seconds", "Duration of one controller "
                              "tick", buckets=TICK_BUCKETS_S, registry=r)
        self.tick_phase = Histogram("tuned_controller_tick_phase_seconds", "Duration of one "
                                    "phase of a controller tick (observe, decide, act)",
                                    ("phase",), buckets=TICK_BUCKETS_S, registry=r)
        self.reloads = c("tuned_reloads_total", "Config reloads by outcome", ("outcome",))
        self.finished = c("tuned_requests_finished_total", "Requests whose departure tuned "
                          "recorded (aborted ones included), each once")
        self.hint_warnings = c("tuned_request_hint_warnings_total", "Request hints "
                               "(vllm_xargs) ignored as malformed", ("field",))
        self.steps = c("tuned_engine_steps_total", "Engine steps observed")
        self.q_admitted = c("tuned_queue_admitted_total", "Requests the queue policy admitted",
                            ("policy",))
        self.q_deferred = c("tuned_queue_deferred_total", "Admissions the queue policy "
                            "refused (request x step)", ("policy",))
        self.q_held = c("tuned_queue_held_total", "Admissions the admission guard held "
                        "(request x step), by check: tpot_guard, ttft_guard", ("reason",))
        self.q_demoted = c("tuned_queue_demoted_total", "Requests demoted to the low-priority "
                           "queue (saber)", ("policy",))
        self.q_aged = c("tuned_queue_aged_total", "Requests admitted before the queue "
                        "policy's choice because they had waited age_after_s")
        self.q_newest = c("tuned_queue_newest_first_total", "Requests admitted newest "
                          "first, before the queue policy's choice, while an overload made "
                          "the queue refuse (the older ones are refused as they turn late)")
        self.refused = c("tuned_requests_refused_total", "Requests refused, by reason ("
                         + ", ".join(f"{r}: {REASONS[r]}" for r in QUEUE_REASONS) + ")",
                         ("reason",))
        self.q_bins = g("tuned_queue_bins_in_use", "Length bins holding waiting requests "
                        "(multibin)")
        self.q_buckets = g("tuned_queue_buckets_in_use", "Length buckets holding waiting "
                           "requests (bucket)")
        self.pred_mae = g("tuned_predictor_abs_error_tokens", "Mean absolute error of "
                          "output-length predictions")
        self.pred_bias = g("tuned_predictor_error_tokens", "Mean signed error (predicted - "
                           "actual) of output-length predictions")
        self.pred_count = c("tuned_predictor_observations_total", "Finished requests the "
                            "output-length predictor has been scored on", ("policy",))
        self.step_path_errors = c("tuned_step_path_errors_total", "Exceptions in tuned "
                                  "code that vLLM's step path called, contained (by where: "
                                  "a queue method or a scheduler hook)", ("where",))
        if log_drops is None:
            from tuned.base.log import dropped_lines as log_drops
        r.register(_LogDrops(log_drops))
        self.queue_policy = Info("tuned_queue_policy", "Active queue policy", registry=r)
        self.endpoint_dropped = c("tuned_endpoint_connections_dropped_total", "Connections "
                                  "to tuned's endpoint let go without a full answer: busy "
                                  "(every handler thread taken: 503), timeout (idle or not "
                                  "reading), disconnect (the client hung up mid-response)",
                                  ("reason",))
        for reason in ("ok", "refused", "forbidden"):
            self.reloads.labels(reason)
        for cause in FALLBACK_CAUSES:
            self.fallbacks.labels(cause)
        for reason in DROP_REASONS:
            self.endpoint_dropped.labels(reason)

    def exposition(self) -> bytes:
        return generate_latest(self.exported)


class EngineLabelled:
    """A registry's collectors seen with one more label, ``engine``, on every sample
    (prometheus_client has no constant labels), and without the ``<name>_created``
    samples prometheus_client adds to counters and histograms (in the text format
    each becomes a family of its own, a start timestamp no panel or rule reads).
    Dropped here rather than with ``prometheus_client.disable_created_metrics()``,
    which is process-wide and would change the series of whoever else shares the
    process. Anything with ``collect()`` serves as a registry to
    :func:`generate_latest` and ``start_http_server``."""

    def __init__(self, registry: CollectorRegistry, engine: str):
        self.registry = registry
        self.engine = engine

    def collect(self):
        for fam in self.registry.collect():
            out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            created = fam.name + "_created"
            out.samples = [s._replace(labels={"engine": self.engine, **s.labels})
                           for s in fam.samples if s.name != created]
            yield out


_BUSY_BODY = json.dumps({"error": "busy: every handler thread is in use"}).encode()
_BUSY_RESPONSE = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                  b"Retry-After: 1\r\nConnection: close\r\n"
                  + f"Content-Length: {len(_BUSY_BODY)}\r\n\r\n".encode() + _BUSY_BODY)
_DISCONNECTS = (ConnectionError, TimeoutError)   # BrokenPipe, ConnectionReset/Aborted


class _BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_threads`` of them; each connection's
    socket times out after ``timeout_s``; client hang-ups are counted, not printed."""

    daemon_threads = True
    block_on_close = False
    # connections the kernel holds until accepted; the default 5 drops SYNs of a burst,
    # which clients retry only after a second
    request_queue_size = 64

    def __init__(self, address, handler, *, max_threads: int, timeout_s: float,
                 on_drop: Callable[[str], None]):
        if isinstance(max_threads, bool) or not isinstance(max_threads, int) \
                or max_threads < 1:
            raise ValueError(f"Endpoint: max_handler_threads must be an integer >= 1, got "
                             f"{max_threads!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not 0 < timeout_s < float("inf"):
            raise ValueError(f"Endpoint: conn_timeout_s must be a number of seconds > 0, got "
                             f"{timeout_s!r}")
        self.max_threads = max_threads
        self.timeout_s = float(timeout_s)
        self.on_drop = on_drop
        self._slots = threading.BoundedSemaphore(max_threads)
        self._lock = threading.Lock()
        self.active_handlers = 0
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            # answered here, on the accepting thread: the reply fits the empty send
            # buffer of a fresh socket, and the timeout bounds it if it does not
            self.on_drop("busy")
            try:
                request.settimeout(self.timeout_s)
                request.sendall(_BUSY_RESPONSE)
                # a close with the request unread would answer with a reset, which can
                # reach the client before it reads the 503: take what has come in
                request.setblocking(False)
                request.recv(65536)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        with self._lock:
            self.active_handlers += 1
        t = threading.Thread(target=self.process_request_thread,
                             args=(request, client_address),
                             name="tuned-endpoint-conn", daemon=True)
        try:
            t.start()
        except BaseException:
            self._release()
            self.shutdown_request(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release()

    def _release(self) -> None:
        with self._lock:
            self.active_handlers -= 1
        self._slots.release()

    def handle_error(self, request, client_address):
        if isinstance(sys.exc_info()[1], _DISCONNECTS):
            self.on_drop("disconnect")
            return
        super().handle_error(request, client_address)   # a bug in tuned: keep the trace


class _LogDrops:
    """``tuned_log_lines_dropped_total`` read from the log sink's own count."""

    def __init__(self, count: Callable[[], int]):
        self._count = count

    def collect(self):
        yield CounterMetricFamily("tuned_log_lines_dropped", "Log lines dropped because "
                                  "stderr could not take them (full disk, closed pipe)",
                                  value=self._count())


class Endpoint:
    """A small threaded HTTP server; handlers are injected callables.

    ``max_handler_threads`` bounds the connections served at once (more get 503);
    ``conn_timeout_s`` closes a connection idle (or not reading) that long."""

    def __init__(self, host: str, port: int, metrics: Metrics,
                 decisions: Callable[[int], dict], steps: Callable[[int], dict],
                 reload: Callable[[], dict], healthy: Callable[[], bool],
                 reload_token: str = "", reload_token_sha256: str = "", *,
                 max_handler_threads: int = MAX_HANDLER_THREADS,
                 conn_timeout_s: float = CONN_TIMEOUT_S,
                 admission: Callable[[], dict] | None = None):
        self.metrics = metrics
        # Only the digest is kept: the engine receives nothing else (tuned.config).
        digest = reload_token_sha256 or (token_sha256(reload_token) if reload_token else "")
        handler = _make_handler(metrics, decisions, steps, reload, healthy, digest, admission)
        handler.timeout = conn_timeout_s
        self.server = _BoundedHTTPServer(
            (host, port), handler, max_threads=max_handler_threads, timeout_s=conn_timeout_s,
            on_drop=lambda reason: metrics.endpoint_dropped.labels(reason).inc())
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       name="tuned-endpoint", daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def start(self) -> "Endpoint":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def is_loopback_peer(client_address) -> bool:
    """True when the peer (a socket address tuple, or an address string) is on
    127.0.0.0/8 or ::1, IPv4-mapped IPv6 (``::ffff:127.0.0.1``) included."""
    host = client_address[0] if isinstance(client_address, tuple) else client_address
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def token_sha256(token: str) -> str:
    """The hex sha256 digest a reload token is compared by."""
    return hashlib.sha256(token.encode()).hexdigest()


def reload_refusal(client_address, authorization: str | None, token: str = "", *,
                   token_digest: str = "") -> str | None:
    """Why ``POST /reload`` from this peer must be refused, or None to accept it.

    Accepted: a loopback peer, or (when a token is set: ``token`` in clear or its
    ``token_digest``) any peer whose ``Authorization`` header is ``Bearer <token>``;
    the digests are compared in constant time.
    """
    if is_loopback_peer(client_address):
        return None
    peer = client_address[0] if isinstance(client_address, tuple) else client_address
    token_digest = token_digest or (token_sha256(token) if token else "")
    if not token_digest:
        return (f"reload is accepted from loopback only (peer {peer}); set reload_token "
                "in the config to allow other peers with 'Authorization: Bearer <token>'")
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return f"reload from a non-loopback peer ({peer}) needs 'Authorization: Bearer <token>'"
    if not hmac.compare_digest(token_sha256(given.strip()), token_digest.lower()):
        return f"reload token does not match (peer {peer})"
    return None


def _make_handler(metrics, decisions, steps, reload, healthy, reload_token_digest="",
                  admission=None):
    class Handler(BaseHTTPRequestHandler):
        server_version = "tuned"

        def log_message(self, *args):  # keep the engine's stderr for the engine
            pass

        def log_error(self, format, *args):
            # the base class reports a read or write that timed out this way
            if format.startswith("Request timed out"):
                self.server.on_drop("timeout")

        def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj, headers: dict | None = None) -> None:
            self._send(code, json.dumps(obj).encode(), "application/json", headers)

        def do_GET(self):
            url = urlparse(self.path)
            q = parse_qs(url.query)
            try:
                if url.path == "/metrics":
                    self._send(200, metrics.exposition(), CONTENT_TYPE_LATEST)
                elif url.path == "/decisions":
                    self._json(200, decisions(int(q.get("limit", ["50"])[0])))
                elif url.path == "/steps":
                    self._json(200, steps(int(q.get("since", ["0"])[0])))
                elif url.path == "/admission":
                    self._json(200, admission() if admission is not None
                               else {"refusing": False})
                elif url.path == "/healthz":
                    ok = healthy()
                    self._json(200 if ok else 503, {"healthy": ok})
                elif url.path == "/reload":
                    self._json(405, {"error": "/reload accepts POST only"}, {"Allow": "POST"})
                else:
                    self._json(404, {"error": f"no such path: {url.path}",
                                     "paths": ["/metrics", "/decisions", "/steps",
                                               "/admission", "/healthz", "POST /reload"]})
            except ValueError as e:
                self._json(400, {"error": str(e)})
            except _DISCONNECTS:
                raise               # the client hung up: handle_error counts it
            except Exception as e:  # a bug in tuned: answer, and keep the trace
                traceback.print_exc(file=sys.stderr)
                self._json(500, {"error": f"{type(e).__name__}: {e}", "path": url.path})

        def do_POST(self):
            if urlparse(self.path).path != "/reload":
                self._json(404, {"error": f"no such path: {self.path}"})
                return
            why = reload_refusal(self.client_address, self.headers.get("Authorization"),
                                 token_digest=reload_token_digest)
            if why is not None:
                metrics.reloads.labels("forbidden").inc()
                self._json(403, {"outcome": "forbidden", "error": why})
                return
            try:
                result = reload()
            except Exception as e:  # never leave the caller without an answer
                self._json(500, {"outcome": "error", "error": f"{type(e).__name__}: {e}"})
                return
            self._json(200 if result.get("outcome") == "ok" else 422, result)

    return Handler
