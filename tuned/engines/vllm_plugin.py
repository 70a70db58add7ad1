"""tuned's vLLM general plugin: a config that contradicts vLLM's own arguments is
refused before the model loads.

vLLM loads every installed general plugin (entry-point group
``vllm.general_plugins``) in every one of its processes, with or without tuned's
scheduler, so :func:`register` imports nothing and does nothing but this: where vLLM's
engine arguments are in use (the process that parses ``vllm serve``'s arguments, or
builds ``LLM(...)``), it wraps ``EngineArgs.create_engine_config`` once. The wrapper
returns vLLM's config untouched unless its ``scheduler_cls`` is tuned's; then it
builds tuned's config from the same sources the scheduler will
(:func:`tuned.config.engine_setup`) with the engine's settings, so a config that
repeats ``--max-num-seqs`` with another value, a bad ``TUNED_<KEY>`` variable or a
bad TOML is refused there, with one line per problem on stderr, before the
EngineCore starts and loads the model. The API server then exits with status 1;
``LLM(...)`` raises :class:`tuned.config.ConfigError`. Anything else that goes wrong
here is tuned's fault and is swallowed: the scheduler makes the same check again at
start.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

#: the module whose classes are tuned's scheduler (``--scheduler-cls``)
SCHEDULER_MODULE = "tuned.engines.vllm"
_MARK = "_tuned_checks_config"


def register() -> None:
    """vLLM's plugin entry point. Never raises."""
    try:
        arg_utils = sys.modules.get("vllm.engine.arg_utils")
        if arg_utils is None:     # a process that builds no engine arguments
            return
        cls = arg_utils.EngineArgs
        original = cls.create_engine_config
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)
        def create_engine_config(self, *args, **kwargs):
            vllm_config = original(self, *args, **kwargs)
            check(self, vllm_config, kwargs.get("usage_context", args[0] if args else None))
            return vllm_config

        setattr(create_engine_config, _MARK, True)
        cls.create_engine_config = create_engine_config
    except Exception:
        return


def names_tuned(scheduler_cls: Any) -> bool:
    """Whether vLLM's ``scheduler_cls`` (a dotted name or a class) is tuned's."""
    if isinstance(scheduler_cls, str):
        return scheduler_cls.rpartition(".")[0] == SCHEDULER_MODULE
    return getattr(scheduler_cls, "__module__", None) == SCHEDULER_MODULE


def engine_settings(vllm_config: Any, engine_args: Any = None) -> dict[str, Any]:
    """What the engine runs with, under tuned's config keys
    (:data:`tuned.config.vllm_args.ENGINE_KEYS`); with ``engine_args``, also ``given``: the keys
    the operator set (vLLM leaves the others None and picks them itself)."""
    sc, mc = vllm_config.scheduler_config, vllm_config.model_config
    settings: dict[str, Any] = {
        "max_num_seqs": sc.max_num_seqs,
        "max_num_batched_tokens": sc.max_num_batched_tokens,
        "max_model_len": mc.max_model_len if mc is not None else None,
        "num_gpu_blocks": vllm_config.cache_config.num_gpu_blocks_override,
        "model": mc.model if mc is not None else None}
    if engine_args is not None:
        args = {"max_num_seqs": "max_num_seqs",
                "max_num_batched_tokens": "max_num_batched_tokens",
                "max_model_len": "max_model_len", "num_gpu_blocks": "num_gpu_blocks_override",
                "model": "model"}
        settings["given"] = frozenset(k for k, a in args.items()
                                      if getattr(engine_args, a, None) is not None)
    return settings


def check(engine_args: Any, vllm_config: Any, usage_context: Any = None) -> None:
    """Refuse ``vllm_config`` when it runs tuned's scheduler and tuned's config does not
    fit it; nothing otherwise. The refusal is the only exception that leaves."""
    try:
        if not names_tuned(vllm_config.scheduler_config.scheduler_cls):
            return
        from tuned import config as config_mod

        settings = engine_settings(vllm_config, engine_args)
    except Exception:
        return
    try:
        # the entry point vLLM calls: the one place here that reads the environment
        config_mod.engine_setup(vllm_config.additional_config, os.environ, settings)
    except config_mod.ConfigError as e:
        for line in config_mod.refusal_lines(e):
            print(line, file=sys.stderr, flush=True)
        if getattr(usage_context, "name", "") == "OPENAI_API_SERVER":
            # the lines above say it all: no traceback from the server's start-up
            raise SystemExit(1) from None
        raise
    except Exception:
        return
