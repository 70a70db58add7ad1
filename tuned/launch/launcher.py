"""The one way tuned starts vLLM: the command line, the child's environment, the
process, the wait until it answers, and the stop.

``tuned serve`` (the supervisor), ``tuned profile``, ``tuned bench --engine vllm``
and ``tuned demo`` all build their command here:

- :func:`static_command`: a plain vLLM OpenAI server with a fixed ``--max-num-seqs``
  and the config's other engine settings (a static contender);
- :func:`scheduler_command`: the same server with tuned's scheduler embedded
  (``--scheduler-cls tuned.engines.vllm.TunedScheduler``), what ``tuned serve`` runs
  as its child, in the environment of :func:`scheduler_env` (which carries the config);
- :func:`own_command`: the same with the config named by its path, for an operator's
  own unit or container (``tuned serve --print-command`` prints it with
  :func:`shell_command`);
- :func:`serve_command`: ``python -m tuned serve --config FILE``, for a tuned run
  started by another command (the supervisor then builds :func:`scheduler_command`).

:func:`spawn` starts one in its own session (so a signal to its process group
reaches the engine's workers too, and a terminal's Ctrl-C reaches it only through
its parent) with :func:`child_env`; :func:`wait_ready` polls until the API answers,
:func:`wait_decided` until tuned's controller has decided, :func:`server_info`
reads what it serves and :func:`stop_process` stops it. A start that fails raises
:class:`EngineError` whose message ends with the log's tail.

HTTP here is the standard library's: the supervisor's path carries no HTTP client
package.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from tuned.config import Config, handoff_env
from tuned.config.vllm_args import ENGINE_FLAGS
from tuned.core.refusal import refuses
from tuned.base.netutil import connect_host

#: The CPU build sizes its KV cache in GiB from this variable (a legacy override of
#: ``--kv-cache-memory-bytes``); without it vLLM sizes the cache from the host's
#: free memory, which several engines on one host would fight over.
KV_CACHE_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: 1 GiB: ample for the demo models and a short context, small enough for several
#: engines side by side; every test and tool already ran with it, and a config's
#: ``num_gpu_blocks`` (``--num-gpu-blocks-override``) fixes the block count within it.
#: An operator's own value always wins. Harmless on GPUs, which ignore it.
DEFAULT_KV_CACHE_SPACE_GIB = 1

SCHEDULER_CLS = "tuned.engines.vllm.TunedScheduler"
LOG_TAIL_LINES = 30

#: ``opener(url, timeout) -> response`` (a context manager with ``.status`` and
#: ``.read()``), raising OSError when nothing answers: ``urllib.request.urlopen``.
Opener = Callable[..., Any]


class EngineError(RuntimeError):
    """The engine could not be started or answered wrongly; when it comes from a
    start, the message ends with the last lines of the engine's log."""


# --- command lines ---------------------------------------------------------------------------

def vllm_command(model_path: str, *, host: str, port: int, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int | None,
                 num_gpu_blocks: int = 0, args: Sequence[str] = (),
                 python: str = sys.executable) -> list[str]:
    """``python -m vllm.entrypoints.openai.api_server`` with these engine settings,
    then ``args`` unchanged; no ``--max-model-len`` when ``max_model_len`` is None or
    0 (vLLM reads the model's own)."""
    settings = {"model": model_path, "host": host, "port": port,
                "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens,
                "max_model_len": max_model_len or None, "num_gpu_blocks": num_gpu_blocks or None}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server"]
    for key, flag in ENGINE_FLAGS.items():
        if settings[key] is not None:
            cmd += [flag, str(settings[key])]
    return cmd + list(args)


def _with_dtype(cfg: Config, args: list[str]) -> list[str]:
    from tuned.base.hostinfo import demo_dtype_args

    # the demo model's dtype follows this CPU (bfloat16 only where it is fast)
    return args + demo_dtype_args(cfg.model, args)


def static_command(cfg: Config, model_path: str, *, port: int, max_num_seqs: int | None = None,
                   host: str = "127.0.0.1", extra: Sequence[str] = (),
                   python: str = sys.executable) -> list[str]:
    """Plain vLLM with ``--max-num-seqs`` ``max_num_seqs`` (default the config's) and
    the config's other engine settings -- the ones ``tuned serve`` hands vLLM,
    without tuned; then the config's ``vllm_args`` and ``extra``."""
    return vllm_command(model_path, host=host, port=port,
                        max_num_seqs=cfg.max_num_seqs if max_num_seqs is None else max_num_seqs,
                        max_num_batched_tokens=cfg.max_num_batched_tokens,
                        max_model_len=cfg.effective_max_model_len,
                        num_gpu_blocks=cfg.num_gpu_blocks,
                        args=_with_dtype(cfg, [*cfg.vllm_args, *extra]), python=python)


#: the ASGI middleware that answers 429 while the queue refuses (tuned.engines.gateway);
#: loaded where the config's wait bound refuses (``on_max_wait = "refuse"``)
GATEWAY_MIDDLEWARE = "tuned.engines.gateway.RefuseWhenOverloaded"


def _serving_url(cfg: Config) -> str:
    return f"http://{connect_host(cfg.host)}:{cfg.port}/health"


def _with_scheduler(cfg: Config, model_path: str, additional: dict | None,
                    extra: Sequence[str], python: str) -> list[str]:
    tuned_args = ["--scheduler-cls", SCHEDULER_CLS]
    if additional:
        tuned_args += ["--additional-config", json.dumps(additional)]
    if refuses(cfg.wait_bound_spec()):
        # the queue may refuse: the API server answers 429 while it does
        tuned_args += ["--middleware", GATEWAY_MIDDLEWARE]
    return vllm_command(model_path, host=cfg.host, port=cfg.port,
                        max_num_seqs=cfg.max_num_seqs,
                        max_num_batched_tokens=cfg.max_num_batched_tokens,
                        max_model_len=cfg.effective_max_model_len,
                        num_gpu_blocks=cfg.num_gpu_blocks,
                        args=tuned_args + _with_dtype(cfg, [*cfg.vllm_args, *extra]),
                        python=python)


def scheduler_command(cfg: Config, model_path: str, extra: Sequence[str] = (),
                      python: str = sys.executable) -> list[str]:
    """vLLM on the config's host and port with tuned's scheduler embedded; the config
    travels in the environment of :func:`scheduler_env`, which the command needs."""
    return _with_scheduler(cfg, model_path, None, extra, python)


def scheduler_env(cfg: Config, base: dict[str, str] | None = None) -> dict[str, str]:
    """:func:`child_env` of ``base`` carrying ``cfg`` to :func:`scheduler_command`'s
    engine (:func:`tuned.config.handoff_env`)."""
    return {**child_env(base), **handoff_env(cfg, _serving_url(cfg))}


def own_command(cfg: Config, model_path: str, extra: Sequence[str] = (),
                python: str = sys.executable) -> list[str]:
    """:func:`scheduler_command` as an operator writes it in their own unit or
    container: the same engine arguments, with the config named by its path
    (``--additional-config '{"tuned": {"config_path": FILE, "serving_url": URL}}'``)
    so the engine reads and validates the file at start and a reload re-reads it.
    The config must come from a file."""
    if not cfg.source_path:
        raise ValueError("config: the command line names the config by its path; give "
                         "one with --config FILE")
    additional = {"tuned": {"config_path": cfg.source_path, "serving_url": _serving_url(cfg)}}
    return _with_scheduler(cfg, model_path, additional, extra, python)


#: the environment variables tuned sets for the engine (:func:`child_env`)
ENGINE_ENV = (KV_CACHE_SPACE_ENV,)


def shell_command(cmd: Sequence[str], env: dict[str, str] | None = None) -> str:
    """``cmd`` as one shell line, prefixed with ``env NAME=VALUE`` for each of the
    :data:`ENGINE_ENV` variables :func:`child_env` gives the engine."""
    engine_env = child_env(env)
    pairs = [f"{name}={engine_env[name]}" for name in ENGINE_ENV if name in engine_env]
    return shlex.join((["env", *pairs] if pairs else []) + list(cmd))


def serve_command(config_path: Path | str, *, model_cache: Path | str | None = None,
                  extra: Sequence[str] = (), python: str = sys.executable) -> list[str]:
    """``python -m tuned serve --config FILE [--model-cache DIR] [-- extra...]``."""
    cmd = [python, "-m", "tuned", "serve", "--config", str(config_path)]
    if model_cache is not None:
        cmd += ["--model-cache", str(model_cache)]
    if extra:
        cmd += ["--", *extra]
    return cmd


# --- the process -----------------------------------------------------------------------------

def child_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: ``base`` (default this process's) with
    :data:`KV_CACHE_SPACE_ENV` set to :data:`DEFAULT_KV_CACHE_SPACE_GIB` unless set."""
    env = dict(os.environ if base is None else base)
    env.setdefault(KV_CACHE_SPACE_ENV, str(DEFAULT_KV_CACHE_SPACE_GIB))
    return env


def spawn(cmd: Sequence[str], *, env: dict[str, str] | None = None,
          log_path: Path | None = None, header: str | None = None) -> subprocess.Popen:
    """Start ``cmd`` in a new session with :func:`child_env` of ``env``; its output
    goes to ``log_path`` (after the line ``header``), or to ours when None."""
    env = child_env(env)
    if log_path is None:
        return subprocess.Popen(list(cmd), env=env, start_new_session=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
        if header:
            log_file.write(header.rstrip("\n").encode() + b"\n")
            log_file.flush()
        return subprocess.Popen(list(cmd), stdout=log_file, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    """The last ``n`` lines of a log, or ``(no log)``."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def _died(proc: subprocess.Popen, log_path: Path) -> EngineError:
    return EngineError(f"engine exited with code {proc.returncode} while starting; "
                       f"last lines of {log_path}:\n{log_tail(log_path)}")


def _status(opener: Opener, url: str, timeout_s: float) -> int | None:
    try:
        with opener(url, timeout=timeout_s) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path, *,
               opener: Opener = urllib.request.urlopen, poll_s: float = 0.5) -> None:
    """Poll ``/health`` (then ``/v1/models``) until both answer 200; raise
    :class:`EngineError` with the log's tail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise _died(proc, log_path)
        if _status(opener, f"{url}/health", 2) == 200 and \
                _status(opener, f"{url}/v1/models", 5) == 200:
            return
        time.sleep(poll_s)
    raise EngineError(f"engine not ready after {timeout_s:.0f}s; last lines of {log_path}:\n"
                      f"{log_tail(log_path)}")


def wait_decided(endpoint: str, proc: subprocess.Popen, deadline: float, log_path: Path, *,
                 opener: Opener = urllib.request.urlopen, poll_s: float = 0.5) -> None:
    """Until tuned's endpoint shows a first decision (the controller runs), by
    ``deadline`` on ``time.monotonic``; :class:`EngineError` when the engine dies,
    its endpoint could not bind, or time runs out."""
    while True:
        if proc.poll() is not None:
            raise _died(proc, log_path)
        with contextlib.suppress(OSError, ValueError):
            with opener(f"{endpoint}/decisions?limit=0", timeout=2) as r:
                if r.status == 200 and json.loads(r.read()).get("current"):
                    return
        if '"event": "endpoint_failed"' in log_tail(log_path, 400):
            raise EngineError(f"tuned's endpoint could not bind {endpoint}; last lines "
                              f"of {log_path}:\n{log_tail(log_path)}")
        if time.monotonic() > deadline:
            raise EngineError(f"tuned made no decision in time; last lines of "
                              f"{log_path}:\n{log_tail(log_path)}")
        time.sleep(poll_s)


def server_info(url: str, *, opener: Opener = urllib.request.urlopen) -> dict[str, Any]:
    """Model id, root (path), max_model_len from ``/v1/models``; version from
    ``/version`` (None when it does not answer)."""
    try:
        with opener(f"{url}/v1/models", timeout=10) as r:
            data = json.loads(r.read()).get("data") or []
    except urllib.error.HTTPError as e:
        raise EngineError(f"{url}/v1/models answered {e.code}") from None
    except (OSError, ValueError) as e:
        raise EngineError(f"{url}/v1/models: {e}") from None
    if not data:
        raise EngineError(f"{url}/v1/models lists no model")
    card = data[0]
    info = {"id": card.get("id"), "root": card.get("root"),
            "max_model_len": card.get("max_model_len"), "version": None}
    with contextlib.suppress(Exception):
        with opener(f"{url}/version", timeout=5) as r:
            info["version"] = json.loads(r.read()).get("version")
    return info


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Stop an engine :func:`spawn` started: SIGTERM to its own process group (it runs
    in a new session, so the group is exactly the engine and its workers), SIGKILL
    to the group after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
