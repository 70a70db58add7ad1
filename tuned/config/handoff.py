"""The config tuned's scheduler starts from inside vLLM's EngineCore: the one `tuned
serve` validated and shipped in the engine's environment (:func:`handoff_env`), or
one layered from the sources of your own vLLM command line
(:class:`~tuned.config.sources.Sources`), held to the engine's own settings
(:func:`engine_setup`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuned.base.inputs import clip, clip_path, clip_text
from tuned.config.checks import engine_problems, model_problems
from tuned.config.schema import FIELDS, Config, ConfigError, did_you_mean, validate
from tuned.config.sources import CONFIG_ENV, ENV_PREFIX, HANDOFF_ENV, OTHER_ENV, Sources

#: what ``additional_config["tuned"]`` may hold besides config keys
_HANDOFF_KEYS = ("config", "config_path", "serving_url", "reload_token_sha256")


@dataclass(frozen=True)
class EngineSetup:
    """What tuned's scheduler starts from: the validated config, the URL that says
    the OpenAI server answers (None: not known, taken as answering), the reload
    token's sha256 digest ('' = none) and one line per key that two sources gave
    different values for (the higher one is used)."""

    cfg: Config
    serving_url: str | None
    reload_token_sha256: str
    overridden: tuple[str, ...] = ()


def engine_handoff(cfg: Config, serving_url: str | None = None) -> dict:
    """The entry that carries a validated config into the EngineCore process (`tuned
    serve` -> engine), shaped as vLLM's ``additional_config``; :func:`handoff_env`
    puts it in the engine's environment, :func:`from_engine_handoff` reads it."""
    d = cfg.to_dict()
    d.pop("source_path", None)
    # vLLM logs its non-default arguments: the reload secret travels as a digest
    # (the engine compares digests), never in clear.
    token = d.pop("reload_token", "")
    digest = hashlib.sha256(token.encode()).hexdigest() if token else ""
    return {"tuned": {"config": d, "config_path": cfg.source_path,
                      "serving_url": serving_url, "reload_token_sha256": digest}}


def handoff_env(cfg: Config, serving_url: str | None = None) -> dict[str, str]:
    """The engine's environment entry (:data:`HANDOFF_ENV`) carrying
    :func:`engine_handoff`. Not ``--additional-config``: vLLM hashes that into the key of
    its compile cache, so each new port or tuned key would compile the model afresh."""
    return {HANDOFF_ENV: json.dumps(engine_handoff(cfg, serving_url)["tuned"])}


def _with_env_handoff(additional: Any, environ: Mapping[str, str]) -> Any:
    """``additional`` with the hand-off of :data:`HANDOFF_ENV` as its ``tuned`` entry,
    when the environment carries one and ``additional`` has no ``tuned`` entry."""
    text = environ.get(HANDOFF_ENV, "")
    if not text or (isinstance(additional, Mapping) and "tuned" in additional):
        return additional
    try:
        entry = json.loads(text)
    except ValueError:
        raise ConfigError([f"{HANDOFF_ENV}: must be the JSON object `tuned serve` writes, "
                           f"got {clip(text)}"]) from None
    return {**(additional if isinstance(additional, Mapping) else {}), "tuned": entry}


def from_engine_handoff(additional: dict | None) -> tuple[Config, str | None]:
    """The config the supervisor validated and shipped (never a re-read of the file,
    which may have changed since), and the URL that says the server answers.
    ``config_path`` is kept as the source that a reload re-reads."""
    extra = (additional or {}).get("tuned") or {}
    cfg = validate(dict(extra.get("config") or {}), source=extra.get("config_path") or "")
    return cfg, extra.get("serving_url")


def engine_setup(additional: Any, environ: Mapping[str, str],
                 engine: Mapping[str, Any] | None = None) -> EngineSetup:
    """The config tuned's scheduler runs, from vLLM's ``additional_config``, the
    engine's environment and (``engine``) the engine's own settings, under the config's
    key names (:data:`ENGINE_KEYS`; ``given``: the keys the operator passed, when
    known):

    1. ``{"tuned": {"config": {...}}}``: the config `tuned serve` validated and shipped
       (:func:`engine_handoff`, in :data:`HANDOFF_ENV`), never a re-read of the file; with ``engine``, it is
       held to the engine's arguments (:func:`engine_problems`);
    2. otherwise tuned was dropped into your own vLLM command line, and its keys come
       from, highest first: config keys beside ``config_path`` in
       ``--additional-config '{"tuned": {...}}'``, ``TUNED_<KEY>`` variables, the TOML
       file named by ``config_path`` or :data:`CONFIG_ENV`, the defaults. A key two
       sources give takes the higher one's value (listed in ``overridden``). The
       engine's settings (:data:`ENGINE_KEYS`) come from ``engine``; a source that
       repeats one must say what the engine runs, or the config is refused. With no
       source at all, tuned runs its defaults.

    :class:`ConfigError` (one line per problem) for a bad config, a contradiction, an
    ``additional_config`` entry of the wrong shape, or a path and :data:`CONFIG_ENV`
    naming two different files."""
    if additional is not None and not isinstance(additional, Mapping):
        raise ConfigError([f"additional_config: must be a JSON object, got "
                           f"{clip(additional)}"])
    additional = _with_env_handoff(additional, environ)
    extra = (additional or {}).get("tuned")
    if extra is None:
        extra = {}
    if not isinstance(extra, Mapping):
        raise ConfigError([f"additional_config.tuned: must be a JSON object such as "
                           f"{{\"config_path\": \"/etc/tuned/tuned.toml\"}}, got {clip(extra)}"])
    unknown = sorted(set(extra) - set(_HANDOFF_KEYS) - set(FIELDS))
    if unknown:
        raise ConfigError([f"additional_config.tuned: unknown key {clip_text(unknown[0])}"
                           f"{did_you_mean(unknown[0], [*FIELDS, 'config_path', 'serving_url'])}"
                           f" (known: config_path, serving_url and the config's keys, see "
                           f"`tuned check-config --explain`)"])
    serving_url = extra.get("serving_url") or None
    if serving_url is not None and not isinstance(serving_url, str):
        raise ConfigError([f"additional_config.tuned.serving_url: must be a URL string, "
                           f"got {clip(serving_url)}"])
    if "config" in extra:
        cfg, _ = from_engine_handoff(additional)
        if engine is not None:
            problems = model_problems(cfg) + engine_problems(cfg, engine)
            if problems:
                raise ConfigError(problems, cfg.source_path)
        return EngineSetup(cfg, serving_url, reload_token_digest(additional))
    path = extra.get("config_path") or ""
    if not isinstance(path, str):
        raise ConfigError([f"additional_config.tuned.config_path: must be a file path "
                           f"string, got {clip(path)}"])
    env_path = environ.get(CONFIG_ENV, "")
    if path and env_path and Path(path).resolve() != Path(env_path).resolve():
        raise ConfigError([f"config_path: additional_config names {clip_path(path)} and "
                           f"{CONFIG_ENV} names {clip_path(env_path)}; give one"])
    src = Sources(path=path or env_path,
                  env={k: v for k, v in environ.items()
                       if k.startswith(ENV_PREFIX) and k not in OTHER_ENV},
                  inline={k: v for k, v in extra.items() if k not in _HANDOFF_KEYS},
                  engine=None if engine is None else dict(engine))
    cfg, overridden = src.build()
    digest = hashlib.sha256(cfg.reload_token.encode()).hexdigest() if cfg.reload_token else ""
    return EngineSetup(cfg, serving_url, digest, overridden)


def reload_token_digest(additional: dict | None) -> str:
    """The sha256 hex digest of the reload token shipped by :func:`engine_handoff`
    ('' when none is set)."""
    return str(((additional or {}).get("tuned") or {}).get("reload_token_sha256") or "")
