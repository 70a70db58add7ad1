"""The config's engine settings as vLLM's flags: the one map of keys to flags, the
settings vLLM's own arguments decide, and the check that ``vllm_args`` repeats none of
the flags tuned sets itself."""

from __future__ import annotations

from tuned.base.inputs import clip_text

#: The one map of the config's engine settings to vLLM's flags: the command line tuned
#: starts vLLM with (:func:`tuned.launch.launcher.vllm_command`, in this order), the flags
#: ``vllm_args`` may not repeat (:data:`VLLM_FLAGS_SET`) and the settings
#: :func:`tuned.config.checks.engine_problems` compares.
ENGINE_FLAGS = {"model": "--model", "host": "--host", "port": "--port",
                "max_num_seqs": "--max-num-seqs",
                "max_num_batched_tokens": "--max-num-batched-tokens",
                "max_model_len": "--max-model-len",
                "num_gpu_blocks": "--num-gpu-blocks-override"}

#: vLLM flags that tuned sets itself, with the config key that sets each (None: tuned's
#: own, not settable); repeating one in vllm_args would override tuned's value.
VLLM_FLAGS_SET = {**{flag: key for key, flag in ENGINE_FLAGS.items()},
                  "--scheduler-cls": None, "--additional-config": None}


def vllm_args_problems(args, field_name: str = "vllm_args") -> list[str]:
    """One line per argument that repeats a flag tuned sets itself (vLLM's last value
    wins, so it would override the config's key, or turn tuned off for
    ``--scheduler-cls``). vLLM reads ``--max_num_seqs`` as ``--max-num-seqs``."""
    problems = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if not flag.startswith("--"):
            continue
        key = VLLM_FLAGS_SET.get("--" + flag[2:].replace("_", "-"), False)
        if key is False:
            continue
        instead = (f"set {key} in the config instead" if key else
                   "tuned sets it itself and cannot run without it")
        problems.append(f"{field_name}: must not contain {clip_text(flag)} ({instead})")
    return problems


#: the settings vLLM's own arguments decide when tuned is dropped into a vLLM command
#: line: a config may leave them out (they are read from the engine) or repeat them
#: (then they must agree with the engine)
ENGINE_KEYS = ("model", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
               "num_gpu_blocks")
