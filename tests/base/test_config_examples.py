"""The example configs the README points at are valid, and say what the README says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuned import config as config_mod
from tuned.base.demo_model import model_form
from tuned.config.checks import UNIT_WATCHDOG_S
from tuned.commands.check_config import config_problems

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "systemd" / "examples").glob("*.toml"))


def test_there_are_examples():
    assert [p.name for p in EXAMPLES] == ["llama2-7b-a100.toml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_passes_check_config(path):
    # what `tuned check-config FILE` runs: the file, the model's form, the service's
    # watchdog, plugins and profile
    assert config_problems(str(path), watchdog_s=UNIT_WATCHDOG_S, deep=True) == []
    cfg = config_mod.load(path)
    # a real model, named so that `tuned serve` takes it on any host
    assert model_form(cfg.model) == "hf_id"


def test_llama2_7b_example_values():
    cfg = config_mod.load(ROOT / "systemd" / "examples" / "llama2-7b-a100.toml")
    assert (cfg.model, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len) == (
        "meta-llama/Llama-2-7b-hf", 256, 8192, 0)
    # the model's own context length: tuned passes no --max-model-len
    assert cfg.effective_max_model_len is None
    assert (cfg.tbt_sla_s, cfg.ttft_sla_s, cfg.queue_policy) == (0.05, 2.0, "fcfs")


def test_llama2_7b_example_command_line():
    # the engine arguments `tuned serve --print-command` shows for it
    from tuned.launch import launcher

    cfg = config_mod.load(ROOT / "systemd" / "examples" / "llama2-7b-a100.toml")
    cmd = launcher.own_command(cfg, cfg.model, python="python")
    assert cmd[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                       "meta-llama/Llama-2-7b-hf"]
    assert "--max-model-len" not in cmd
    assert cmd[cmd.index("--max-num-seqs") + 1] == "256"
    assert cmd[cmd.index("--scheduler-cls") + 1] == "tuned.engines.vllm.TunedScheduler"
