"""A config file: read (TOML, bounded in size) and validated; the embedded default a
command runs without one."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from tuned.base.inputs import CLIP_CHARS, UserError, clip_path, clip_text, read_text
from tuned.config.schema import Config, ConfigError, validate

def load(path: str | Path, base: dict[str, Any] | None = None) -> Config:
    """Read and validate a TOML config file; raise :class:`ConfigError` on any problem.
    ``base``: values the file's keys are applied over (``tuned demo --config`` passes
    :data:`EMBEDDED_DEFAULT`); without it, the keys the file leaves out take
    :class:`Config`'s defaults."""
    p = Path(path)
    raw = {**(base or {}), **read_toml(p)}
    return validate(raw, source=str(p.resolve()), base_dir=p.resolve().parent)


#: a config file larger than this is not a config file
MAX_CONFIG_BYTES = 1 << 20


def read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML table of a config file; :class:`ConfigError` (one problem)
    when it is unreadable, not a regular file, too large or not TOML."""
    p = Path(path)
    try:
        text = read_text(p, "config file", MAX_CONFIG_BYTES)
    except UserError as e:
        problem = (f"{e.problem}: a TOML file must be UTF-8" if e.problem.startswith("not UTF-8")
                   else f"cannot read config file: {e.problem}")
        raise ConfigError([problem], clip_path(p)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"not valid TOML: {clip_text(str(e), 2 * CLIP_CHARS)}"],
                          clip_path(p)) from None
    except RecursionError:
        raise ConfigError(["not valid TOML: nested too deeply"], clip_path(p)) from None


# The embedded default (`tuned serve` / `tuned demo` with no --config): the small demo
# model on a CPU host. CPU hosts differ several-fold in decode speed (AVX-512 or not,
# core count), so the TBT SLA is not a number but a multiple of the decode step this
# host measures at batch 1 (tbt_sla_auto), chosen to fall between the step at batch 1
# and at the cap's ceiling on any such host. With a TTFT target, requests that
# already missed it wait behind those that can still make it. The KV cache is sized
# to hold fewer demo requests than the cap's ceiling, so both of Pang et al.'s bounds
# have something to do.
EMBEDDED_DEFAULT = {"model": "demo:small", "max_num_seqs": 32, "max_num_batched_tokens": 2048,
                    "max_model_len": 1024, "num_gpu_blocks": 48, "tbt_sla_auto": 2.5,
                    "eps_d_s": 0.002, "ttft_sla_s": 3.0, "token_budget_granule": 0}


def default() -> Config:
    """The embedded default: the small demo model on CPU, its TBT SLA derived on this
    host (see above)."""
    return validate(dict(EMBEDDED_DEFAULT))
