"""A real Prometheus server for tests.

Runs Debian's ``/usr/bin/prometheus`` (package ``prometheus``) as a child process
with a generated config: listening on 127.0.0.1 on a free port, TSDB in a temp
dir, scraping the targets you pass every second.  The package's own systemd
service is never used.  When the binary is missing the harness installs the
package with apt if running as root, otherwise the test is skipped with the
command to run.  (On a booted Debian host that install also enables the
package's own service on :9090; containers and CI runners do not start it.)

    def test_x(prometheus):                        # the fixture: a factory
        prom = prometheus(["127.0.0.1:9464"])      # started and ready
        prom.wait_for_series("tuned_applied_cap_seqs", timeout_s=30)

Use it from a test module with ``from prom_harness import prometheus  # noqa: F401``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tuned.base.netutil import free_port

PROMETHEUS_BIN = "/usr/bin/prometheus"
PROMTOOL_BIN = "/usr/bin/promtool"

_install_lock = threading.Lock()
_install_errors: dict[str, str] = {}  # binary -> why it is unavailable (tried once)
# Talk to the local server directly, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PromError(RuntimeError):
    """Prometheus failed to start, or answered a query with an error."""


def ensure_prometheus(binary: str = PROMETHEUS_BIN, promtool: str = PROMTOOL_BIN) -> str | None:
    """Make the binaries available; return None when ready, else the reason they are not.

    Installs the ``prometheus`` package with apt-get when missing and running as root.
    """
    if os.access(binary, os.X_OK) and os.access(promtool, os.X_OK):
        return None
    how = "apt-get install prometheus (Debian/Ubuntu) provides " + binary
    with _install_lock:
        if os.access(binary, os.X_OK) and os.access(promtool, os.X_OK):
            return None
        if binary in _install_errors:
            return _install_errors[binary]
        if os.geteuid() != 0:
            _install_errors[binary] = f"{binary} not found and not root to install it: {how}"
            return _install_errors[binary]
        if shutil.which("apt-get") is None:
            _install_errors[binary] = (f"{binary} not found and no apt-get here: "
                                       "install Prometheus 2.x")
            return _install_errors[binary]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        install = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y",
                   "--no-install-recommends", "prometheus"]
        r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0:  # a fresh image has no package lists yet
            subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "update"],
                           capture_output=True, text=True, env=env, timeout=900)
            r = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
        if r.returncode != 0 or not os.access(binary, os.X_OK):
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            _install_errors[binary] = ("installing prometheus with apt-get failed: "
                                       + " | ".join(tail))
            return _install_errors[binary]
    return None


def _http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    try:
        with _OPENER.open(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class PromServer:
    """One Prometheus process scraping ``targets`` (``host:port`` strings)."""

    def __init__(self, targets: list[str], workdir: Path, scrape_interval_s: float = 1.0,
                 binary: str = PROMETHEUS_BIN, metrics_path: str = "/metrics",
                 scrape_configs: list[dict] | None = None):
        """``scrape_configs`` (Prometheus's own, e.g. a documented one with its
        targets substituted) replaces the one ``tuned`` job scraping ``targets``."""
        self.targets = list(targets)
        self.scrape_configs = scrape_configs
        self.workdir = Path(workdir)
        self.scrape_interval_s = scrape_interval_s
        self.binary = binary
        self.metrics_path = metrics_path
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> Path:
        # JSON is valid YAML: no YAML library needed.
        interval = f"{int(self.scrape_interval_s * 1000)}ms"
        jobs = self.scrape_configs or [{"job_name": "tuned", "metrics_path": self.metrics_path,
                                        "static_configs": [{"targets": self.targets}]}]
        jobs = [dict(j, scrape_interval=interval, scrape_timeout=interval) for j in jobs]
        cfg = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
               "scrape_configs": jobs}
        path = self.workdir / "prometheus.yml"
        path.write_text(json.dumps(cfg, indent=2))
        return path

    def start(self, timeout_s: float = 60.0, attempts: int = 3) -> "PromServer":
        """Start and wait for ``/-/ready``; retries on a port taken in the meantime."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = self._write_config()
        for attempt in range(attempts):
            self.port = free_port()
            data = self.workdir / f"data-{attempt}"
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.binary, f"--config.file={cfg}",
                     f"--web.listen-address=127.0.0.1:{self.port}",
                     f"--storage.tsdb.path={data}", "--storage.tsdb.retention.time=1h",
                     "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
            if self._wait_ready(timeout_s):
                return self
            log_text = self.log()
            self.stop()
            if "address already in use" not in log_text:
                break
        raise PromError(f"prometheus did not become ready on {self.url}:\n{self.log()[-3000:]}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                if _http_get(self.url + "/-/ready", 2.0)[0] == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        return False

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None

    def __enter__(self) -> "PromServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> dict:
        """GET ``/api/v1/<path>``; the ``data`` member, or :class:`PromError`."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        code, body = _http_get(url, 10.0)
        try:
            doc = json.loads(body)
        except ValueError:
            raise PromError(f"{url}: HTTP {code}, not JSON: {body[:200]!r}") from None
        if doc.get("status") != "success":
            raise PromError(f"{params.get('query', path)}: {doc.get('errorType')}: "
                            f"{doc.get('error')}")
        return doc["data"]

    def query(self, promql: str) -> list:
        """Instant query; the ``result`` list (for a vector: ``[{"metric", "value"}]``)."""
        return self.api("query", query=promql)["result"]

    def targets_health(self) -> list[dict]:
        return [{"scrapeUrl": t.get("scrapeUrl"), "health": t.get("health"),
                 "lastError": t.get("lastError")}
                for t in self.api("targets")["activeTargets"]]

    def wait_for_series(self, promql: str, timeout_s: float = 30.0) -> list:
        """Poll ``promql`` until it returns a non-empty result; raise with the targets'
        health on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.query(promql)
            if result:
                return result
            if time.monotonic() > deadline:
                raise PromError(f"no series for {promql!r} within {timeout_s:g} s; "
                                f"targets: {self.targets_health()}")
            time.sleep(0.25)


def promtool_check_metrics(text: str, promtool: str = PROMTOOL_BIN) -> tuple[int, str]:
    """Lint exposition text with ``promtool check metrics``; (exit code, its output).

    Exit code 0 means no problem; promtool 2.42 exits 3 for lint findings such as a
    counter without ``_total`` and 1 for text it cannot parse."""
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return r.returncode, (r.stdout + r.stderr).strip()


@pytest.fixture
def prometheus(tmp_path):
    """Factory fixture: ``prometheus(targets, scrape_interval_s=1.0) -> PromServer``
    (started and ready); every server it made is stopped at teardown."""
    reason = ensure_prometheus()
    if reason:
        pytest.skip(reason)
    servers: list[PromServer] = []

    def start(targets: list[str], scrape_interval_s: float = 1.0, **kw) -> PromServer:
        srv = PromServer(targets, tmp_path / f"prom{len(servers)}", scrape_interval_s, **kw)
        servers.append(srv)
        return srv.start()

    yield start
    for srv in servers:
        srv.stop()


@pytest.fixture
def promtool():
    """``promtool_check_metrics`` once promtool is available (installed as above)."""
    reason = ensure_prometheus()
    if reason:
        pytest.skip(reason)
    return promtool_check_metrics
