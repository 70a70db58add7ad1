"""A config dropped into your own vLLM command line, layered from its sources: a
TOML file, ``TUNED_<KEY>`` variables, ``--additional-config`` keys and the engine's
own settings (:class:`Sources`), and built again from them on a reload
(:func:`reread`)."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuned.base.inputs import clip, clip_path, clip_text
from tuned.config.checks import agrees
from tuned.config.files import default, load, read_toml
from tuned.config.schema import (FIELDS, Config, ConfigError, checked_values,
                                 cross_field_problems, did_you_mean, number_text,
                                 policy_problems, range_text, type_name, unknown_key)
from tuned.config.vllm_args import ENGINE_FLAGS, ENGINE_KEYS

#: the environment variable naming the config file of a vLLM command line that runs
#: tuned's scheduler (the alternative to ``--additional-config``'s ``config_path``)
CONFIG_ENV = "TUNED_CONFIG"
#: the environment variable that carries the config `tuned serve` validated into its
#: engine (JSON, :func:`tuned.config.handoff.handoff_env`): not ``--additional-config``,
#: which vLLM hashes into its compile-cache key, so that a change of a tuned key (or of
#: a port) does not cost the engine a fresh compile at its next start
HANDOFF_ENV = "TUNED_HANDOFF"
#: ``TUNED_<KEY>`` sets a config key from the engine's environment (TUNED_QUEUE_POLICY=mcsf)
ENV_PREFIX = "TUNED_"
#: TUNED_ variables that are no config key: the config file, `tuned serve`'s hand-off,
#: the 429 gateway's URL, the installer's extras (tools/setup.sh) and the test suite's own
OTHER_ENV = (CONFIG_ENV, HANDOFF_ENV, "TUNED_ADMISSION_URL", "TUNED_EXTRA",
             "TUNED_FAULT_MODE_FILE", "TUNED_TEST_DTYPE", "TUNED_TEST_STDERR_FULL_TRIGGER")


@dataclass(frozen=True)
class Sources:
    """Where a config dropped into a vLLM command line comes from, kept so that a
    reload rebuilds it the same way (:func:`reread`): the TOML file ('' = none), the
    ``TUNED_<KEY>`` variables and the ``--additional-config`` keys as they were at
    start, and the engine's settings (:func:`tuned.config.handoff.engine_setup`)."""

    path: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    inline: Mapping[str, Any] = field(default_factory=dict)
    engine: Mapping[str, Any] | None = None

    def build(self) -> tuple[Config, tuple[str, ...]]:
        """The config, and the keys one source overrode in another; :class:`ConfigError`
        (one line per problem, each naming its source) on any problem."""
        return _layered(self)


def env_name(key: str) -> str:
    """The environment variable that sets config key ``key``: TUNED_QUEUE_POLICY."""
    return ENV_PREFIX + key.upper()


def _env_value(name: str, var: str, text: str) -> tuple[Any, str | None]:
    # a string key takes the text as it is (TUNED_QUEUE_POLICY=mcsf); any other is read
    # as a TOML value, so TUNED_MAX_NUM_SEQS=16 is the integer and
    # TUNED_QUEUE_OPTIONS='{reserve_fraction = 0.05}' the table
    f = FIELDS[name]
    if str(f.type) == "str":
        return text, None
    try:
        return tomllib.loads(f"v = {text}")["v"], None
    except (tomllib.TOMLDecodeError, RecursionError):
        return None, (f"{var}: must be {type_name(str(f.type))} {range_text(f.metadata)}"
                      .rstrip() + f", got {clip(text)}")


def _checked_layer(values: Mapping[str, Any], label) -> tuple[dict[str, Any], list[str]]:
    """Each of ``values`` checked as the TOML's keys are (type, range, choices); a
    problem names the key as ``label(key)`` writes it (TUNED_X, additional_config.tuned.x)."""
    out, problems = checked_values(values, label)
    # a policy name is checked where it was given; its options once the layers are merged
    names = {k: out[k] for k in ("batch_policy", "queue_policy") if k in out}
    for problem in policy_problems(names) if names else []:
        key = problem.split(":", 1)[0]
        problems.append(label(key) + problem[len(key):])
        out.pop(key, None)
    return out, problems


def env_layer(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The config keys set by ``TUNED_<KEY>`` variables, typed and checked, and one
    line per problem: a bad value names the variable and the allowed values; an
    unknown TUNED_ variable names the closest one (:data:`OTHER_ENV` are not keys)."""
    by_var = {env_name(k): k for k in FIELDS}
    raw, problems = {}, []
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in OTHER_ENV:
            continue
        key = by_var.get(var)
        if key is None:
            problems.append(f"{clip_text(var)}: no such setting{did_you_mean(var, by_var)} "
                            f"(a config key as TUNED_<KEY>: see `tuned check-config --explain`)")
            continue
        value, err = _env_value(key, var, environ[var])
        if err:
            problems.append(err)
        else:
            raw[key] = value
    checked, bad = _checked_layer(raw, env_name)
    return checked, problems + bad


def _inline_label(key: str) -> str:
    return f"additional_config.tuned.{key}"


def _engine_text(key: str, engine: Mapping[str, Any]) -> str:
    got, flag = engine.get(key), ENGINE_FLAGS[key]
    if got is None:
        return f"vLLM was started without {flag}"
    shown = clip_path(got) if key == "model" else number_text(got)
    given = engine.get("given")
    if given is None or key in given:
        return f"vLLM was given {flag} {shown}"
    return f"vLLM runs {flag} {shown} (its default)"


def _from_engine(key: str, engine: Mapping[str, Any]) -> Any:
    got = engine.get(key)
    if key in ("max_model_len", "num_gpu_blocks"):
        return int(got or 0)
    return got


def _refuse(found: list[tuple[str, str]]) -> None:
    """Raise one :class:`ConfigError` for ``(source, line)`` pairs: under their source
    when they share one (a file's problems read as `tuned check-config` prints them),
    else each line under its own."""
    if not found:
        return
    sources = {src for src, _ in found}
    if len(sources) == 1:
        raise ConfigError([line for _, line in found], sources.pop())
    raise ConfigError([f"{src}: {line}" if src else line for src, line in found])


def _layered(src: Sources) -> tuple[Config, tuple[str, ...]]:
    toml: dict[str, Any] = {}
    where = ""
    if src.path:
        p = Path(src.path)
        where = str(p.resolve())
        raw = read_toml(p)
        found = [unknown_key(k) for k in raw if k not in FIELDS]
        toml, bad = _checked_layer({k: v for k, v in raw.items() if k in FIELDS},
                                   lambda k: k)
        _refuse([(where, line) for line in found + bad])
        if toml.get("profile") and not Path(toml["profile"]).is_absolute():
            toml["profile"] = str((p.resolve().parent / toml["profile"]).resolve())
    env, bad = env_layer(src.env)
    inline, bad_inline = _checked_layer(src.inline, _inline_label)
    _refuse([("", line) for line in bad + bad_inline])
    # precedence: --additional-config over TUNED_<KEY> over the TOML over the defaults;
    # each layer: (its name for key, its values, how it says key, how to drop key)
    layers = ((lambda k: where, toml, lambda k: "the config", "remove it from the config",
               where),
              (env_name, env, env_name, "unset it", ""),
              (_inline_label, inline, lambda k: "--additional-config",
               "remove it from --additional-config", ""))
    merged: dict[str, Any] = {}
    said: dict[str, tuple] = {}
    overridden = []
    for layer in layers:
        for key, value in layer[1].items():
            if key in merged and merged[key] != value:
                overridden.append(f"{key}: {layer[0](key)} ({clip(value)}) overrides "
                                  f"{said[key][0](key)} ({clip(merged[key])})")
            merged[key], said[key] = value, layer
    from_engine = set()
    if src.engine is not None:
        found = []
        for key in ENGINE_KEYS:
            if key in merged and not agrees(key, merged[key], src.engine):
                _, _, says, remove, origin = said[key]
                shown = clip(merged[key]) if key == "model" else number_text(merged[key])
                found.append((origin, f"{key}: {says(key)} says {shown}, "
                                      f"{_engine_text(key, src.engine)}; {remove} or give "
                                      "both the same value"))
                continue
            got = _from_engine(key, src.engine)
            if got is not None:
                merged[key] = got
                from_engine.add(key)
        _refuse(found)
    # checked again only for what the engine gave: vLLM's ranges may be wider than tuned's
    values, problems = _checked_layer(
        merged, lambda k: f"{k} (vLLM's {ENGINE_FLAGS[k]})" if k in from_engine else k)
    problems += policy_problems(values)
    if not problems:
        cfg = Config(**values, source_path=where, sources=src)
        problems = cross_field_problems(cfg)
    if problems:
        raise ConfigError(problems, _describe(src, where))
    return cfg, tuple(overridden)


def _describe(src: Sources, where: str) -> str:
    """The sources a merged config came from, for a problem no single one owns."""
    parts = [where] if where else []
    if src.env:
        parts.append("TUNED_* variables")
    if src.inline:
        parts.append("--additional-config")
    return " + ".join(parts)


def reread(cfg: Config) -> Config:
    """``cfg`` built again from where it came from, for a reload: a config dropped
    into a vLLM command line from its file, its variables and ``--additional-config``
    as they were at start and the engine's settings (:class:`Sources`); otherwise its
    file, or the embedded default when it had none."""
    if cfg.sources is not None:
        return cfg.sources.build()[0]
    return load(cfg.source_path) if cfg.source_path else default()
