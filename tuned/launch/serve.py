"""``tuned serve``: vLLM's OpenAI-compatible server with tuned's scheduler embedded.

The command is a small supervisor. It validates the config, resolves the model
(building the demo model when asked), and runs
``python -m vllm.entrypoints.openai.api_server --scheduler-cls
tuned.engines.vllm.TunedScheduler --additional-config {...}`` as its child, so the
controller runs inside vLLM's EngineCore process. It then:

* on SIGHUP asks every engine rank's endpoint to reload the config (``POST
  /reload``); the engine validates it and keeps the old one when it is bad.
  ``systemctl reload`` does not signal: the unit's ExecReload runs ``tuned reload``
  (:func:`tuned.commands.reload.reload`), which posts the same request and exits with the
  outcome, so the reload fails when the config is refused;
* on SIGTERM / SIGINT stops the server and waits for it;
* exits with the server's exit code.

READY=1 and WATCHDOG=1 for systemd come from the controller inside the engine
(``NotifyAccess=all``), once the first decision is made and the server answers.
"""

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
from pathlib import Path

import structlog

from tuned import config as config_mod
from tuned.launch import launcher
from tuned.base import log as log_mod
from tuned.config import Config, ConfigError
from tuned.config.checks import service_problems
from tuned.config.vllm_args import vllm_args_problems
from tuned.base.inputs import UserError, clip_path

log = structlog.get_logger("tuned.serve")

STOP_TIMEOUT_S = 60.0
DEFAULT_MODEL_CACHE = Path.home() / ".cache" / "tuned" / "models"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="run vLLM's OpenAI server with tuned embedded",
        usage="%(prog)s [-h] [--config FILE] [--model-cache DIR] [--print-command [FILE]] "
              "[-- VLLM_ARGS ...]",
        description="Start vLLM's OpenAI-compatible server with tuned's scheduler. "
                    "Arguments after -- go to vLLM unchanged (anything else is refused).")
    p.add_argument("--config", help="TOML config (default: the embedded demo: the "
                   "small demo model on CPU)")
    p.add_argument("--model-cache", default=str(DEFAULT_MODEL_CACHE),
                   help="where demo:tiny / demo:small are built (default: %(default)s)")
    p.add_argument("--print-command", nargs="?", const="", default=None, metavar="CONFIG",
                   help="print the vLLM command line (with its environment) that runs "
                        "tuned from CONFIG (or --config), for your own unit or container, "
                        "then exit; the engine reads the config file at start")
    # `tuned serve ... -- --dtype float32`: tuned's CLI puts what follows `--` here; a
    # bare argument before it is refused (it would silently reach vLLM's command line)
    p.set_defaults(func=cmd_serve, vllm_args=[])


def load_config(path: str | None) -> Config:
    return config_mod.load(path) if path else config_mod.default()


def resolve_model(cfg: Config, cache_dir: Path) -> str:
    from tuned.base.demo_model import resolve_model as _resolve

    return _resolve(cfg.model, cache_dir, log=lambda msg: log.info("demo_model", step=msg))


#: vLLM with tuned's scheduler embedded, on the config's host and port (see tuned.launch.launcher)
server_command = launcher.scheduler_command



_connect_host = launcher.connect_host  # one definition: tuned.base.netutil


def endpoint_url(cfg: Config, rank: int = 0) -> str:
    return f"http://{_connect_host(cfg.metrics_host)}:{cfg.metrics_port + rank}"


def _dp_size(args: list[str]) -> int:
    for i, a in enumerate(args):
        if a in ("--data-parallel-size", "-dp") and i + 1 < len(args):
            return int(args[i + 1])
        if a.startswith("--data-parallel-size="):
            return int(a.split("=", 1)[1])
    return 1


# A reload asks a local daemon: never route it through an HTTP proxy from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_reload(url: str, timeout: float = 10.0, token: str = "") -> dict:
    """POST ``url/reload``; the engine answers once the new config is applied (200) or
    refused (422), so the answer is the outcome. ``OSError`` when nothing answers,
    ``ValueError`` when the answer is not JSON."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(url + "/reload", data=b"", method="POST", headers=headers)
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # 422 refused / 403 forbidden, with the reason
        return json.loads(e.read() or b"{}")


class Supervisor:
    def __init__(self, cfg: Config, cmd: list[str], env: dict[str, str]):
        self.cfg = cfg
        self.cmd = cmd
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.dp = _dp_size(cmd)
        self._stopping = False
        self._stop_began = 0.0
        self._served = threading.Event()

    def _on_hup(self, signum, frame) -> None:
        threading.Thread(target=self.reload, name="tuned-reload", daemon=True).start()

    def reload(self) -> list[dict]:
        """Ask each engine rank to reload (a SIGHUP sent by hand). Under systemd the
        unit shows "reloading" from RELOADING=1 until READY=1, which is sent once every
        rank has answered, with the outcome in STATUS= (`systemctl status`). READY=1
        only says the service serves again (on the new config or the kept one);
        `systemctl reload` itself runs `tuned reload`, whose exit status is the
        outcome."""
        from tuned.control import sdnotify

        notifier = sdnotify.from_environ(self.env) if self._served.is_set() else None
        if notifier is not None:
            notifier.reloading()
        results = []
        for rank in range(self.dp):
            url = endpoint_url(self.cfg, rank)
            try:
                res = post_reload(url, token=self.cfg.reload_token)
            except (OSError, ValueError) as e:
                res = {"outcome": "unreachable", "error": str(e)}
            res["rank"] = rank
            log.info("reload_result", **res)
            results.append(res)
        if notifier is not None:
            outcomes = ",".join(str(r.get("outcome")) for r in results)
            notifier.ready(f"reload {outcomes}")
        return results

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _on_term(self, signum, frame) -> None:
        if self.proc is not None and self.proc.poll() is None and not self._stopping:
            self._stopping = True
            self._stop_began = time.monotonic()
            from tuned.control import sdnotify

            sdnotify.from_environ(self.env).stopping()
            log.info("stopping", signal=signal.Signals(signum).name)
            self._signal_group(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        log.info("starting_engine", cmd=" ".join(self.cmd[:4]) + " ...",
                 api=f"http://{self.cfg.host}:{self.cfg.port}/v1",
                 metrics=endpoint_url(self.cfg) + "/metrics")
        # A new session keeps a terminal's Ctrl-C from reaching vLLM twice: it
        # arrives here and is forwarded once as SIGTERM.
        self.proc = launcher.spawn(self.cmd, env=self.env)
        threading.Thread(target=self._announce, daemon=True).start()
        last_term = 0.0
        while True:
            try:
                rc = self.proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if not self._stopping:
                    continue
                waited = time.monotonic() - self._stop_began
                if waited > STOP_TIMEOUT_S:
                    log.warning("engine_did_not_stop", action="SIGKILL", waited_s=round(waited))
                    self._signal_group(signal.SIGKILL)
                elif time.monotonic() - last_term > 5:
                    # vLLM ignores SIGTERM while it is still starting up: repeat it.
                    last_term = time.monotonic()
                    self._signal_group(signal.SIGTERM)
        # The engine's own children (EngineCore, workers) share the session: make
        # sure none outlives the server.
        self._signal_group(signal.SIGKILL)
        log.info("engine_exited", returncode=rc)
        return 0 if (self._stopping and rc in (0, -signal.SIGTERM)) else rc

    def _announce(self) -> None:
        """Log once when the API answers and the controller has decided."""
        health = f"http://{_connect_host(self.cfg.host)}:{self.cfg.port}/health"
        dec = endpoint_url(self.cfg) + "/decisions?limit=0"
        while self.proc is not None and self.proc.poll() is None:
            try:
                with urllib.request.urlopen(health, timeout=1) as r:
                    ok = r.status == 200
                with urllib.request.urlopen(dec, timeout=1) as r:
                    cur = json.loads(r.read()).get("current")
                if ok and cur:
                    log.info("serving", api=f"http://{self.cfg.host}:{self.cfg.port}/v1",
                             metrics=endpoint_url(self.cfg) + "/metrics",
                             cap=cur["cap"], reason=cur["reason"])
                    self._served.set()
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.5)


#: the engine's environment (tuned.launch.launcher.scheduler_env: the config's hand-off
#: and the KV-cache space default)
build_env = launcher.scheduler_env


def _config_path(args) -> str | None:
    """--config, or the file --print-command names; a usage error when they differ."""
    named = args.print_command or None
    if named and args.config and Path(named).resolve() != Path(args.config).resolve():
        raise UserError(f"--print-command: names {clip_path(named)} and --config names "
                        f"{clip_path(args.config)}; give one")
    return named or args.config


def no_config_line(cfg: Config) -> str:
    """What `tuned serve` without --config serves, said before it starts."""
    return (f"tuned serve: no --config given: serving the embedded demo ({cfg.model}, a "
            f"random-weight model built locally, no download) at "
            f"http://{cfg.host}:{cfg.port}/v1; give --config FILE to serve your model")


def cmd_serve(args) -> int:
    extra = list(args.vllm_args or [])
    printing = args.print_command is not None
    try:
        cfg = load_config(_config_path(args))
    except ConfigError as e:
        for p in e.problems:
            print(f"{e.source or 'config'}: {p}", file=sys.stderr)
        return 2
    if printing and not cfg.source_path:
        print("tuned serve: --print-command: give a config file (--print-command FILE): "
              "the engine reads it by path", file=sys.stderr)
        return 2
    if not cfg.source_path:
        print(no_config_line(cfg), file=sys.stderr)
    from tuned.control.sdnotify import watchdog_s

    # what would otherwise fail only after the model loaded (or be silently overridden)
    problems = (service_problems(cfg, watchdog_s(os.environ))
                + vllm_args_problems(extra, "arguments after --"))
    if problems:
        for p in problems:
            print(f"{cfg.source_path or 'config'}: {p}", file=sys.stderr)
        return 2
    log_mod.configure(cfg.log_level)
    try:
        model_path = resolve_model(cfg, Path(args.model_cache))
    except (FileNotFoundError, ValueError) as e:
        print(f"model: {e}", file=sys.stderr)
        return 2
    from tuned.engines.vllm_version import UnsupportedVllmError, check_vllm_version, installed_vllm

    try:
        check_vllm_version(installed_vllm())
    except UnsupportedVllmError as e:
        print(str(e), file=sys.stderr)
        return 2
    if printing:
        print(launcher.shell_command(launcher.own_command(cfg, model_path, extra)))
        return 0
    sup = Supervisor(cfg, server_command(cfg, model_path, extra), build_env(cfg))
    return sup.run()
