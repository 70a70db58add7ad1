"""The example configs the README points at are valid, and say what the README says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuned import config as config_mod

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "systemd" / "examples").glob("*.toml"))


def test_there_are_examples():
    assert [p.name for p in EXAMPLES] == ["llama2-7b-a100.toml"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_is_valid(path):
    cfg = config_mod.load(path)
    assert cfg.model.startswith("/")          # serve needs a local model folder


def test_llama2_7b_example_values():
    cfg = config_mod.load(ROOT / "systemd" / "examples" / "llama2-7b-a100.toml")
    assert (cfg.model, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len) == (
        "/models/Llama-2-7b-hf", 256, 8192, 4096)
    assert (cfg.tbt_sla_s, cfg.ttft_sla_s, cfg.queue_policy) == (0.05, 2.0, "fcfs")
