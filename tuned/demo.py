"""``tuned demo``: the embedded default end to end, in a couple of minutes on a CPU.

Builds the demo model, starts ``tuned serve`` (the embedded default config unless
``--config`` is given), drives a light phase then a heavy phase of completions
through the official ``openai`` client with N requests in flight, prints each
decision as it changes, then a summary, and stops the server cleanly.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tuned import config as config_mod
from tuned.config import ConfigError
from tuned.serve import DEFAULT_MODEL_CACHE, endpoint_url


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run tuned serve on the embedded default and "
                              "drive a light then a heavy load through it")
    p.add_argument("--config", help="TOML config (default: the embedded demo)")
    p.add_argument("--model-cache", default=str(DEFAULT_MODEL_CACHE))
    p.add_argument("--light", default="2x20", metavar="CONCxSECONDS",
                   help="light phase: requests in flight x seconds (default %(default)s)")
    p.add_argument("--heavy", default="32x40", metavar="CONCxSECONDS",
                   help="heavy phase (default %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--log", default="runs/demo-serve.log",
                   help="where the server's own output goes (default %(default)s)")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    p.set_defaults(func=cmd_demo)


def _phase(spec: str, name: str) -> tuple[int, float]:
    try:
        conc, secs = spec.lower().split("x")
        c, s = int(conc), float(secs)
    except ValueError:
        raise SystemExit(f"--{name}: expected CONCURRENCYxSECONDS like 4x20, got {spec!r}")
    if c < 1 or s <= 0:
        raise SystemExit(f"--{name}: concurrency must be >= 1 and seconds > 0, got {spec!r}")
    return c, s


@dataclass
class PhaseResult:
    name: str
    concurrency: int
    seconds: float
    sent: int = 0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    latencies: list = field(default_factory=list)
    caps: list = field(default_factory=list)
    tbts: list = field(default_factory=list)


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _wait_ready(cfg, proc, timeout_s: float) -> None:
    health = f"http://127.0.0.1:{cfg.port}/health"
    t0 = time.monotonic()
    last_print = 0.0
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"tuned serve exited with code {proc.returncode} before it "
                               "was ready")
        try:
            with urllib.request.urlopen(health, timeout=1) as r:
                if r.status == 200:
                    cur = _get_json(endpoint_url(cfg) + "/decisions?limit=0").get("current")
                    if cur:
                        return
        except (OSError, ValueError):
            pass
        if time.monotonic() - last_print > 10:
            print(f"  waiting for the engine ... {time.monotonic() - t0:.0f}s", flush=True)
            last_print = time.monotonic()
        time.sleep(0.5)
    raise RuntimeError(f"engine not ready after {timeout_s:.0f}s")


class DecisionWatcher(threading.Thread):
    """Prints each decision that changes the applied cap or token budget."""

    def __init__(self, url: str, t0: float):
        super().__init__(daemon=True, name="decision-watcher")
        self.url = url
        self.t0 = t0
        self.phase: PhaseResult | None = None
        self.stop_flag = threading.Event()
        self.last_seq = 0
        self.last_key = None
        self.reasons: dict[str, int] = {}

    def run(self) -> None:
        while not self.stop_flag.wait(0.5):
            try:
                d = _get_json(self.url + "/decisions?limit=50")
            except (OSError, ValueError):
                continue
            tel = d["telemetry"]
            if self.phase is not None:
                self.phase.caps.append(d["applied"]["cap"])
                if tel["tbt_mean_s"]:
                    self.phase.tbts.append(tel["tbt_mean_s"])
            for dec in d["recent"]:
                if dec["seq"] <= self.last_seq:
                    continue
                self.last_seq = dec["seq"]
                self.reasons[dec["reason"]] = self.reasons.get(dec["reason"], 0) + 1
                key = (dec["cap"], dec["token_budget"])
                if key != self.last_key:
                    self.last_key = key
                    tbt = dec["inputs"].get("tbt_mean_s")
                    print(f"  [{time.monotonic() - self.t0:6.1f}s] "
                          f"{self.phase.name if self.phase else '-':5s} cap={dec['cap']:3d} "
                          f"budget={dec['token_budget']:5d} reason={dec['reason']:14s} "
                          f"b_mem={dec['b_mem']} b_sla={dec['b_sla']} "
                          f"tbt={'%.1fms' % (tbt * 1e3) if tbt else '-':>8s} "
                          f"running={dec['inputs']['running']} "
                          f"waiting={dec['inputs']['waiting']}", flush=True)


def _drive(client, model: str, phase: PhaseResult, prompt_tokens: int, max_tokens: int,
           seed: int) -> None:
    deadline = time.monotonic() + phase.seconds
    lock = threading.Lock()

    def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline:
            prompt = [rng.randrange(10, 1000) for _ in range(prompt_tokens)]
            out_len = rng.randint(max_tokens // 2, max_tokens)
            with lock:
                phase.sent += 1
            t = time.monotonic()
            try:
                r = client.completions.create(model=model, prompt=prompt, max_tokens=out_len,
                                              temperature=0.0, extra_body={"ignore_eos": True})
                n = r.usage.completion_tokens
                with lock:
                    phase.completed += 1
                    phase.tokens += n
                    phase.latencies.append(time.monotonic() - t)
            except Exception as e:  # count, report, keep driving
                with lock:
                    phase.failed += 1
                print(f"  request failed: {type(e).__name__}: {e}", file=sys.stderr)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(phase.concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()


def cmd_demo(args) -> int:
    light = _phase(args.light, "light")
    heavy = _phase(args.heavy, "heavy")
    try:
        cfg = config_mod.load(args.config) if args.config else config_mod.default()
    except ConfigError as e:
        for p in e.problems:
            print(f"{e.source or 'config'}: {p}", file=sys.stderr)
        return 2
    from openai import OpenAI

    from tuned.demo_model import resolve_model

    print(f"[1/4] demo model ({cfg.model})", flush=True)
    resolve_model(cfg.model, Path(args.model_cache), log=lambda m: print("  " + m, flush=True))
    log_path = Path(args.log)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "tuned", "serve", "--model-cache", args.model_cache]
    if args.config:
        cmd += ["--config", args.config]
    print(f"[2/4] starting tuned serve (server output: {log_path})", flush=True)
    with open(log_path, "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    results: list[PhaseResult] = []
    watcher = DecisionWatcher(endpoint_url(cfg), t0)
    try:
        _wait_ready(cfg, proc, args.startup_timeout_s)
        print(f"  ready after {time.monotonic() - t0:.0f}s: API http://127.0.0.1:{cfg.port}/v1, "
              f"metrics {endpoint_url(cfg)}/metrics", flush=True)
        client = OpenAI(base_url=f"http://127.0.0.1:{cfg.port}/v1", api_key="none",
                        max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        print("[3/4] load: light then heavy; decisions as they change:", flush=True)
        watcher.start()
        for i, (name, (conc, secs)) in enumerate((("light", light), ("heavy", heavy))):
            ph = PhaseResult(name, conc, secs)
            watcher.phase = ph
            print(f"  --- {name}: {conc} requests in flight for {secs:.0f}s", flush=True)
            t = time.monotonic()
            _drive(client, model, ph, args.prompt_tokens, args.max_tokens, seed=i)
            ph.seconds = time.monotonic() - t
            results.append(ph)
        time.sleep(1.0)
        watcher.stop_flag.set()
        final = _get_json(endpoint_url(cfg) + "/decisions?limit=0")
        metrics = urllib.request.urlopen(endpoint_url(cfg) + "/metrics", timeout=5).read().decode()
    finally:
        watcher.stop_flag.set()
        print("[4/4] stopping tuned serve", flush=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    _summary(results, final, metrics, watcher.reasons, rc)
    lost = sum(r.sent - r.completed for r in results)
    return 0 if lost == 0 and rc == 0 else 1


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _summary(results, final, metrics, reasons, rc) -> None:
    print("\nsummary")
    print(f"  {'phase':6s} {'in flight':>9s} {'done/sent':>10s} {'tok/s':>8s} "
          f"{'p50 lat s':>9s} {'mean cap':>8s} {'mean TBT':>9s}")
    for r in results:
        lat = sorted(r.latencies)
        p50 = lat[len(lat) // 2] if lat else float("nan")
        cap = sum(r.caps) / len(r.caps) if r.caps else float("nan")
        tbt = sum(r.tbts) / len(r.tbts) * 1e3 if r.tbts else float("nan")
        print(f"  {r.name:6s} {r.concurrency:9d} {r.completed:>4d}/{r.sent:<5d} "
              f"{r.tokens / r.seconds:8.1f} {p50:9.2f} {cap:8.1f} {tbt:7.1f}ms")
    cfg = final["config"]
    print(f"  decisions by reason: {json.dumps(reasons, sort_keys=True)}")
    print(f"  SLA: {cfg['tbt_sla_s'] * 1e3:.0f} ms TBT" if cfg["tbt_sla_s"] else "  SLA: none")
    print(f"  fallbacks: {_metric(metrics, 'tuned_fallbacks_total'):.0f}, controller errors: "
          f"{_metric(metrics, 'tuned_controller_errors_total'):.0f}, preemptions: "
          f"{_metric(metrics, 'tuned_preemptions_total'):.0f}")
    lost = sum(r.sent - r.completed for r in results)
    print(f"  requests lost: {lost}; server exit code: {rc}")
