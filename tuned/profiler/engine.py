"""The engine a sweep measures: a running server (``--url``) or one started here
through :mod:`tuned.launch.launcher` (``--model``): ``tuned serve`` with the batch cap fixed,
so that per-step samples come with it, or plain vLLM."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from tuned.launch import launcher
from tuned.config import Config, ConfigError, validate
from tuned.base.netutil import free_port
from tuned.launch.serve import DEFAULT_MODEL_CACHE


class UsageError(ValueError):
    """A bad command-line value; reported without a traceback, exit code 2."""


def say(msg: str) -> None:
    print(f"tuned: {msg}", file=sys.stderr, flush=True)


@dataclass
class Target:
    """Where the sweep sends requests: an OpenAI-compatible base URL (without /v1) and,
    for ``tuned serve``, the base URL of tuned's metrics endpoint."""

    url: str
    metrics_url: str | None = None
    kind: str = "external"  # external | tuned | vllm
    settings: dict[str, Any] = field(default_factory=dict)


def normalise_url(url: str) -> str:
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not re.match(r"https?://", url):
        url = "http://" + url
    return url


def serve_config_toml(settings: dict[str, Any]) -> str:
    """The fixed-cap ``tuned serve`` config for profiling: b_min = b_max = max_num_seqs
    so tuned does not move the batch cap while it is being measured."""
    lines = ["# written by `tuned profile`: fixed batch cap while profiling"]
    for k, v in settings.items():
        lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def profiling_settings(model: str, max_num_seqs: int, max_num_batched_tokens: int,
                       max_model_len: int, port: int, metrics_port: int,
                       vllm_args: list[str] | None = None) -> dict[str, Any]:
    s = {"model": model, "max_num_seqs": max_num_seqs,
         "max_num_batched_tokens": max_num_batched_tokens, "max_model_len": max_model_len,
         "port": port, "metrics_port": metrics_port,
         "b_min": max_num_seqs, "b_max": max_num_seqs,
         # the config requires fallback_cap <= max_num_seqs; keep the cap fixed there too
         "fallback_cap": max_num_seqs}
    if vllm_args:
        s["vllm_args"] = list(vllm_args)
    return s


def tuned_serve_available() -> bool:
    return importlib.util.find_spec("tuned.launch.serve") is not None


def _serve_config(settings: dict[str, Any]) -> Config:
    try:
        return validate(dict(settings))
    except ConfigError as e:
        raise UsageError(f"these settings make an invalid `tuned serve` config: {e}") from None


def _command(engine: str, settings: dict[str, Any], tmp: Path, model_cache: Path,
             python: str) -> tuple[list[str], str | None]:
    """The engine's command line and tuned's endpoint URL (None for plain vLLM)."""
    cfg = _serve_config(settings)
    if engine == "tuned":
        cfg_path = tmp / "profile-serve.toml"
        cfg_path.write_text(serve_config_toml(settings))
        return (launcher.serve_command(cfg_path, model_cache=model_cache, python=python),
                f"http://127.0.0.1:{cfg.metrics_port}")
    path = cfg.model
    if path.startswith("demo:"):
        from tuned.base.demo_model import resolve_model

        path = str(resolve_model(path, model_cache, log=say))
    return launcher.static_command(cfg, path, port=cfg.port, python=python), None


@contextlib.contextmanager
def start_engine(model: str, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int, engine: str = "auto", startup_timeout_s: float = 600.0,
                 model_cache: Path = DEFAULT_MODEL_CACHE, vllm_args: list[str] | None = None,
                 python: str = sys.executable, env: dict[str, str] | None = None
                 ) -> Iterator[Target]:
    """Start ``python -m tuned serve --config FILE`` (or, with ``engine="vllm"`` or when
    ``tuned serve`` is not installed, a plain vLLM OpenAI server without step samples)
    on free local ports, wait until it answers, yield its :class:`Target`, and stop it
    (:func:`tuned.launch.launcher.stop_process`) on the way out. The log is kept when the
    engine did not start or died during the sweep."""
    if engine == "auto":
        engine = "tuned" if tuned_serve_available() else "vllm"
        if engine == "vllm":
            say("`tuned serve` is not available here: starting a plain vLLM server "
                "(no per-step samples)")
    if engine not in ("tuned", "vllm"):
        raise UsageError(f"--engine must be auto, tuned or vllm, got {engine!r}")
    port = free_port()
    settings = profiling_settings(model, max_num_seqs, max_num_batched_tokens, max_model_len,
                                  port, free_port(avoid=(port,)), vllm_args)
    tmp = Path(tempfile.mkdtemp(prefix="tuned-profile-"))
    log_path = tmp / "engine.log"
    try:
        cmd, metrics_url = _command(engine, settings, tmp, model_cache, python)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"starting engine: {' '.join(cmd)} (log: {log_path})")
    proc = launcher.spawn(cmd, env=env, log_path=log_path)
    keep_log = True
    try:
        url = f"http://127.0.0.1:{port}"
        launcher.wait_ready(url, proc, startup_timeout_s, log_path)
        yield Target(url=url, metrics_url=metrics_url, kind=engine, settings=settings)
        keep_log = proc.poll() is not None  # it died on its own during the sweep
    finally:
        launcher.stop_process(proc)
        if keep_log:
            say(f"engine log kept at {log_path}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
