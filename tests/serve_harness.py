"""Runs the real ``tuned serve`` (vLLM's OpenAI server with tuned embedded) for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tuned.base.netutil import free_port

ROOT = Path(__file__).resolve().parents[1]
#: the environment variable that forces the dtype of every engine the slow tests start
DTYPE_ENV = "TUNED_TEST_DTYPE"


def engine_dtype() -> str:
    """The dtype the slow tests run the demo models in: ``TUNED_TEST_DTYPE`` when set
    (e.g. ``bfloat16``, the slow one on a CPU without AVX-512 BF16), else what `tuned
    serve` picks for a demo model on this CPU (:func:`tuned.base.hostinfo.preferred_cpu_dtype`).
    The tests pass model folders, not ``demo:*`` names, so `tuned serve` would
    otherwise leave vLLM at the folder's own dtype (bfloat16) whatever the CPU."""
    from tuned.base.hostinfo import preferred_cpu_dtype

    return os.environ.get(DTYPE_ENV, "").strip() or preferred_cpu_dtype()


def dtype_args() -> list[str]:
    """vLLM arguments forcing :func:`engine_dtype`."""
    return ["--dtype", engine_dtype()]


#: set to 1 to run the slow tests' engines compiled, as vLLM runs by default
COMPILE_ENV = "TUNED_TEST_COMPILE"


def engine_args() -> list[str]:
    """vLLM arguments for every engine the slow tests start: :func:`dtype_args` and
    ``--enforce-eager`` (unless ``TUNED_TEST_COMPILE=1``). vLLM 0.32's CPU build
    compiles the model at every start (20-40 s here: its compile cache fails to load,
    "'function' object has no attribute 'finalize_loading'"), and nothing tuned does
    depends on it; the demo and the README's commands run compiled."""
    eager = [] if os.environ.get(COMPILE_ENV, "").strip() == "1" else ["--enforce-eager"]
    return dtype_args() + eager


def _get(url: str, timeout: float) -> bytes:
    """GET ``url``; a connection dropped without an answer is retried once, as a
    scraper does (said on stderr): a read-only GET, and tuned's endpoint answers its
    own errors with a status (500), so a drop is the host's, not a wrong answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()
    except ConnectionError as e:
        print(f"serve_harness: GET {url} dropped ({type(e).__name__}: {e}); retrying once",
              file=sys.stderr)
        time.sleep(0.2)
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read()


def get_json(url: str, timeout: float = 5.0):
    return json.loads(_get(url, timeout))


def get_text(url: str, timeout: float = 5.0) -> str:
    return _get(url, timeout).decode()


class Server:
    def __init__(self, proc, port, metrics_port, log_path, config_path):
        self.proc = proc
        self.api = f"http://127.0.0.1:{port}/v1"
        self.base = f"http://127.0.0.1:{port}"
        self.endpoint = f"http://127.0.0.1:{metrics_port}"
        self.log_path = log_path
        self.config_path = config_path

    def decisions(self, limit: int = 50) -> dict:
        return self._read(get_json, f"/decisions?limit={limit}")

    def metrics(self) -> str:
        return self._read(get_text, "/metrics")

    def _read(self, get, path: str):
        """``get(endpoint + path)``; a failure carries the server's log tail."""
        try:
            return get(f"{self.endpoint}{path}")
        except (OSError, ValueError) as e:
            raise AssertionError(f"GET {path}: {type(e).__name__}: {e}; server log:\n"
                                 f"{self.log_tail()}") from e

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-n:])

    def model_id(self) -> str:
        return get_json(f"{self.api}/models")["data"][0]["id"]


def one_at_a_time_refusing(model, bound_s: float) -> str:
    """A config that runs one request at a time (cap 1, static) and refuses at a wait
    bound of ``bound_s`` (TTFT target 1 s, no TPOT SLA: no step model, so a request
    is refused when it has waited the bound): a burst is refused whatever the host's
    speed."""
    return (f'model = "{model}"\nmax_num_seqs = 4\nmax_num_batched_tokens = 512\n'
            f"max_model_len = 512\nnum_gpu_blocks = 64\ninterval_s = 0.25\n"
            f"b_min = 1\nb_max = 1\nfallback_cap = 1\nbatch_policy = \"static\"\n"
            f"token_budget_policy = \"max\"\nadmission_guard = \"off\"\n"
            f"ttft_sla_s = 1.0\nmax_wait_s = {bound_s}\non_max_wait = \"refuse\"\n"
            f'log_level = "warning"\n')


@contextmanager
def tuned_serve(tmp_path: Path, config_text: str, env_extra: dict | None = None,
                ready_timeout_s: float = 300.0):
    """Start ``python -m tuned serve --config`` with ``config_text`` (ports are added,
    and :func:`engine_args`), wait until the API answers and the
    controller has decided, yield a Server, then stop it with SIGTERM and check it
    exits.

    If another process took the metrics port between picking and binding it (the
    engine logs ``endpoint_failed`` and keeps serving without metrics), the server
    is stopped and started once more on fresh ports."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(env_extra or {})
    for attempt in (1, 2):
        srv = _start(tmp_path, config_text, env)
        try:
            if _wait_ready(srv, ready_timeout_s, last_try=attempt == 2):
                break
        except BaseException:
            _stop(srv.proc)
            raise
        _stop(srv.proc)
    try:
        yield srv
    finally:
        _stop(srv.proc)


@contextmanager
def tuned_serve_all(setups: list[tuple[Path, str]], env_extra: dict | None = None,
                    ready_timeout_s: float = 300.0):
    """Several ``tuned serve`` at once, one per (folder, config text) in ``setups``:
    all are started before any is waited for (their start-ups overlap); yields the
    Servers in order, then stops them all. A server whose metrics port was taken is
    restarted once on fresh ports, as :func:`tuned_serve` does."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(env_extra or {})
    servers: list[Server] = []
    try:
        for folder, text in setups:
            Path(folder).mkdir(parents=True, exist_ok=True)
            servers.append(_start(Path(folder), text, env))
        for i, (folder, text) in enumerate(setups):
            if not _wait_ready(servers[i], ready_timeout_s, last_try=False):
                _stop(servers[i].proc)
                servers[i] = _start(Path(folder), text, env)
                _wait_ready(servers[i], ready_timeout_s, last_try=True)
        yield servers
    finally:
        for srv in servers:
            _stop(srv.proc)


def start_server(tmp_path: Path, config_text: str, env: dict, *, port: int | None = None,
                 metrics_port: int | None = None) -> Server:
    """Start ``tuned serve`` (not waiting for it) on ``port`` / ``metrics_port`` (free
    ones when None); the caller stops it with :func:`stop`."""
    port = port or free_port()
    mport = metrics_port or free_port(avoid=(port,))
    cfg = tmp_path / "tuned.toml"
    cfg.write_text(f"port = {port}\nmetrics_port = {mport}\n" + config_text)
    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "tuned", "serve", "--config", str(cfg),
                                 "--", *engine_args()],
                                stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return Server(proc, port, mport, log_path, cfg)


_start = start_server


def _wait_ready(srv: Server, timeout_s: float, last_try: bool) -> bool:
    """True once serving with a decision; False if the metrics port was taken."""
    t0 = time.monotonic()
    while True:
        if srv.proc.poll() is not None:
            raise AssertionError(f"tuned serve exited with {srv.proc.returncode}:\n"
                                 + srv.log_tail())
        try:
            urllib.request.urlopen(srv.base + "/health", timeout=1).close()
            if get_json(f"{srv.endpoint}/decisions?limit=0")["current"]:
                return True
        except (OSError, ValueError):
            pass
        if '"event": "endpoint_failed"' in Path(srv.log_path).read_text(errors="replace"):
            if last_try:
                raise AssertionError("tuned's endpoint could not bind:\n" + srv.log_tail())
            return False
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError("tuned serve not ready in time:\n" + srv.log_tail())
        time.sleep(0.5)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_stop = stop


class Load:
    """N client threads, each sending completions back to back until stopped."""

    def __init__(self, srv: Server, concurrency: int, prompt_tokens=(16, 64),
                 max_tokens=(16, 48), xargs=None, seed: int = 0):
        from openai import OpenAI

        import httpx2  # the HTTP client of this openai release

        # no keep-alive: uvicorn closes idle connections after 5 s, the client keeps
        # them 5 s too, and a request on a connection closing under it fails
        self.client = OpenAI(base_url=srv.api, api_key="none", max_retries=0, timeout=300,
                             http_client=httpx2.Client(timeout=300, limits=httpx2.Limits(
                                 max_keepalive_connections=0)))
        self.model = srv.model_id()
        self.concurrency = concurrency
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.xargs = xargs
        self.seed = seed
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.sent = self.completed = 0
        self.errors: list[str] = []
        self.tokens = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(concurrency)]

    def _run(self, i: int) -> None:
        import random

        rng = random.Random(self.seed * 1000 + i)
        while not self.stop_flag.is_set():
            prompt = [rng.randrange(10, 500) for _ in range(rng.randint(*self.prompt_tokens))]
            n = rng.randint(*self.max_tokens)
            body = {"ignore_eos": True}
            if self.xargs is not None:
                body["vllm_xargs"] = self.xargs
            with self.lock:
                self.sent += 1
            try:
                r = self.client.completions.create(model=self.model, prompt=prompt,
                                                   max_tokens=n, extra_body=body)
                with self.lock:
                    self.completed += 1
                    self.tokens += r.usage.completion_tokens
                assert r.usage.completion_tokens == n
            except Exception as e:
                with self.lock:
                    self.errors.append(f"{type(e).__name__}: {e}")

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def stop(self, timeout: float = 300.0) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout)


UNIT = ROOT / "systemd" / "tuned.service"
INSTALLED_BIN = "/opt/tuned/.venv/bin/tuned"
INSTALLED_CONFIG = "/etc/tuned/tuned.toml"


def unit_command(key: str, config_path: Path) -> list[str]:
    """systemd/tuned.service's ``key`` line (ExecReload, ExecStartPre, ExecStart) as an
    argument list, run by this checkout's interpreter on ``config_path``: the unit's
    own command line, not a copy of it."""
    import configparser
    import shlex

    cp = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    cp.optionxform = str
    cp.read_string(UNIT.read_text())
    argv = shlex.split(cp["Service"][key])
    assert argv[0] == INSTALLED_BIN and argv.count(INSTALLED_CONFIG) == 1, argv
    return [sys.executable, "-m", "tuned"] + [Path(config_path).as_posix()
                                              if a == INSTALLED_CONFIG else a
                                              for a in argv[1:]]


def log_events(log_path: Path, event: str | None = None) -> list[dict]:
    """tuned's JSON log lines (supervisor and engine) from a server log, in order;
    only those whose ``event`` is ``event`` when given."""
    out = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        if not line.startswith("{") or '"event"' not in line:
            continue
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if event is None or e.get("event") == event:
            out.append(e)
    return out


def event_wall_s(e: dict) -> float:
    """A log line's ``timestamp`` (ISO 8601, UTC) as wall-clock seconds."""
    from datetime import datetime

    return datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()


def metric_values(srv: Server) -> dict:
    """{(sample name, sorted label items): value} from the endpoint's /metrics."""
    return parse_metric_values(srv.metrics())


def parse_metric_values(text: str) -> dict:
    """{(sample name, sorted label items): value} of a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def mval(values: dict, name: str, engine: str = "0", **labels) -> float:
    """One sample's value (0.0 when absent); tuned's series carry ``engine``, the
    data-parallel rank (rank 0 unless given)."""
    return values.get((name, tuple(sorted({"engine": engine, **labels}.items()))), 0.0)


def msum(values: dict, name: str, **labels) -> float:
    """The sum of ``name`` over every sample with ``labels`` (whatever its others)."""
    return sum(v for (n, lb), v in values.items()
               if n == name and labels.items() <= dict(lb).items())


def wait_for(what, fn, timeout_s: float = 120.0, every_s: float = 0.05):
    """Poll ``fn`` until it returns something true (returned); an assertion naming
    ``what`` after ``timeout_s`` (a callable ``what`` is called then, to name what was
    seen)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"gave up waiting for {what() if callable(what) else what}")
        time.sleep(every_s)
