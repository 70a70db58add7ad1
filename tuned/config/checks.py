"""What a valid config may still not run with: the engine it is handed to (its
arguments, its model), the Hugging Face cache, the service (`tuned serve` under
systemd); and how a refused config reads on stderr. Each check reads a validated
:class:`~tuned.config.schema.Config` and returns one line per problem."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuned.base.demo_model import model_form
from tuned.base.inputs import clip_path, clip_text
from tuned.config.schema import Config, ConfigError, did_you_mean
from tuned.config.vllm_args import ENGINE_FLAGS

#: the shipped unit's WatchdogSec (systemd/tuned.service); check-config's default
UNIT_WATCHDOG_S = 30.0


def service_problems(cfg: Config, watchdog_s: float | None) -> list[str]:
    """What only the service (`tuned serve` under systemd) cannot live with.

    ``watchdog_s`` is systemd's watchdog (WATCHDOG_USEC / 1e6, or None for none). The
    controller pings on its ticks once about ``watchdog_s / 2`` has passed
    (:class:`tuned.control.liveness.Watchdog`), so two pings are at most
    ``watchdog_s / 2 + interval_s / 2`` apart: ``interval_s <= watchdog_s / 2`` keeps
    that gap at three quarters of the watchdog, the rest is room for a late tick. The
    supervisor's reload (SIGHUP) and `tuned status` reach the endpoint at
    ``metrics_port``, which 0 (any free port) leaves unknown."""
    problems = []
    if watchdog_s is not None and watchdog_s > 0 and cfg.interval_s > watchdog_s / 2:
        problems.append(f"interval_s: must be <= {watchdog_s / 2:g} (half the systemd "
                        f"watchdog of {watchdog_s:g} s: pings ride on ticks), got "
                        f"{cfg.interval_s:g}")
    if cfg.metrics_port == 0:
        problems.append("metrics_port: must be in [1, 65535] for `tuned serve` (reloads "
                        "and `tuned status` reach the endpoint there; 0 picks an unknown "
                        "port), got 0")
    return problems


def refusal_lines(e: ConfigError) -> list[str]:
    """The lines that say, on stderr, why tuned refused to start the engine."""
    where = f"{e.source}: " if e.source else ""
    return [f"tuned: config refused: {where}{problem}" for problem in e.problems]


def model_problems(cfg: Config) -> list[str]:
    """``model`` as :func:`tuned.base.demo_model.model_form` reads it (a missing folder, an
    unknown demo size, something that is no Hugging Face id): `tuned serve`,
    `tuned check-config` and tuned's scheduler refuse the same settings."""
    try:
        model_form(cfg.model)
    except ValueError as e:
        return [f"model: {e}"]
    return []


def hf_cache_dir(environ: Mapping[str, str]) -> Path:
    """Where Hugging Face's hub keeps downloaded models (``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``XDG_CACHE_HOME/huggingface/hub``, else
    ``~/.cache/huggingface/hub``), as vLLM's downloader reads it."""
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def _offline(environ: Mapping[str, str]) -> bool:
    return any(environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hf_cache_findings(model: str, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """(problems, notes) about a Hugging Face id from the local cache alone (no
    network): not cached while ``HF_HUB_OFFLINE`` is set is a problem (vLLM cannot
    fetch it); not cached otherwise is a note (vLLM downloads it at start), with the
    closest cached id when there is one (a misspelt id)."""
    try:
        if model_form(model) != "hf_id":
            return [], []
    except ValueError:
        return [], []
    cache = hf_cache_dir(environ)
    try:
        cached = sorted(p.name.removeprefix("models--").replace("--", "/")
                        for p in cache.iterdir() if p.name.startswith("models--")
                        and (p / "snapshots").is_dir())
    except OSError:
        cached = []
    if model in cached:
        return [], []
    hint = did_you_mean(model, cached).replace("?", " (cached)?")
    where = clip_path(cache)
    if _offline(environ):
        return [f"model: {clip_text(model)} is not in the Hugging Face cache ({where}) and "
                f"HF_HUB_OFFLINE is set, so vLLM cannot fetch it{hint}"], []
    return [], [f"model: {clip_text(model)} is not in the Hugging Face cache ({where}): "
                f"vLLM downloads it at start{hint}"]


def agrees(key: str, value: Any, engine: Mapping[str, Any]) -> bool:
    """Whether a config's ``key`` says what the engine runs. 0 for max_model_len or
    num_gpu_blocks means the engine's own choice, and a demo model is whatever folder
    the engine was given: neither contradicts anything."""
    got = engine.get(key)
    if key in ("max_model_len", "num_gpu_blocks") and value == 0:
        return True
    if key == "model":
        if got is None or str(value).startswith("demo:"):
            return True
        if Path(value).expanduser().is_dir():
            return Path(value).expanduser().resolve() == Path(str(got)).expanduser().resolve()
    return value == got


def engine_problems(cfg: Config, engine: Mapping[str, Any]) -> list[str]:
    """One line per setting where the engine's own arguments contradict the config.

    ``engine`` holds what vLLM runs with, under the config's key names
    (:data:`ENGINE_FLAGS`): ``max_num_seqs``, ``max_num_batched_tokens``,
    ``max_model_len``, ``num_gpu_blocks`` (vLLM's override, None when unset) and
    ``model``. ``max_model_len`` is compared when tuned would pass it
    (:attr:`Config.effective_max_model_len`), ``num_gpu_blocks`` when the config sets
    it, ``model`` when it is a folder (same folder) or a Hugging Face id (same id); a
    demo model is whatever folder the engine was given."""
    want: dict[str, Any] = {"max_num_seqs": cfg.max_num_seqs,
                            "max_num_batched_tokens": cfg.max_num_batched_tokens}
    if cfg.effective_max_model_len:
        want["max_model_len"] = cfg.effective_max_model_len
    if cfg.num_gpu_blocks:
        want["num_gpu_blocks"] = cfg.num_gpu_blocks
    problems = []
    for key, value in want.items():
        got, flag = engine.get(key), ENGINE_FLAGS[key]
        if got is None:
            problems.append(f"{key}: the config says {value}, the engine was started "
                            f"without {flag}; pass {flag} {value} to vLLM")
        elif got != value:
            problems.append(f"{key}: the config says {value}, the engine runs {flag} {got}; "
                            f"pass {flag} {value} to vLLM or set {key} = {got} in the config")
    model = engine.get("model")
    if not agrees("model", cfg.model, engine):
        problems.append(f"model: the config says {clip_text(cfg.model)}, the engine runs "
                        f"--model {clip_path(model)}; give both the same model")
    return problems
