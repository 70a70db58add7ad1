"""tuned's configuration, one job per module, from the bottom: the vLLM flags the
engine settings map to (:mod:`~tuned.config.vllm_args`), the frozen, validated
:class:`Config` and its field table (:mod:`~tuned.config.schema`), a config file and
the embedded default (:mod:`~tuned.config.files`), what a valid config may still not
run with (:mod:`~tuned.config.checks`), the layered sources of a config dropped into a
vLLM command line (:mod:`~tuned.config.sources`), the engine's hand-off
(:mod:`~tuned.config.handoff`) and the manual (:mod:`~tuned.config.manual`).

The names most callers use are here; the rest are imported from their module.
"""

from __future__ import annotations

from typing import Any

from tuned.config import schema
from tuned.config.checks import refusal_lines
from tuned.config.files import EMBEDDED_DEFAULT, default, load, read_toml
from tuned.config.handoff import EngineSetup, engine_handoff, engine_setup, handoff_env
from tuned.config.manual import explain
from tuned.config.schema import FIELDS, Config, ConfigError, validate

__all__ = ["EMBEDDED_DEFAULT", "FIELDS", "Config", "ConfigError", "EngineSetup", "default",
           "engine_handoff", "engine_setup", "explain", "handoff_env", "load", "read_toml",
           "refusal_lines", "validate"]


def __getattr__(name: str) -> Any:
    # the policy names, from the catalog when first asked
    if name in ("BATCH_POLICIES", "QUEUE_POLICIES"):
        return getattr(schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
