"""Step-time models built from tuned's own H200 measurements (tuned/data/measured,
tools/measure_gpu_ops.py): the tables are read as measured, the decode-attention fit is
the GPU's own, and the sum of the operators is checked against whole decode steps timed
on the same card."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from tuned.data import measured_dir
from tuned.sim import gpu
from tuned.sim.gpu import LINEAR_OPS, MEASURED_HARDWARE, VIDUR_HARDWARE, load_hardware
from tuned.sim.hardware import gpu_hardware
from tuned.sim.stepmodel import StepShape

H200 = measured_dir() / "h200"
FOLDERS = {"llama2-7b": "Llama-2-7b-hf", "qwen2.5-coder-3b": "Qwen2.5-Coder-3B",
           "qwen2.5-coder-1.5b": "Qwen2.5-Coder-1.5B"}


def decode(b: int, ctx: int) -> StepShape:
    return StepShape(b, b * ctx, 0, 0, 0.0, b * (ctx + 1))


def measured_steps(model: str) -> list[tuple[int, int, float]]:
    with open(H200 / "steps.csv", newline="") as f:
        return [(int(r["num_decode"]), int(r["context"]), float(r["ms"]))
                for r in csv.DictReader(f) if r["model"] == model]


def test_measured_hardware_is_known_and_read_from_the_measured_folder():
    assert set(MEASURED_HARDWARE).isdisjoint(VIDUR_HARDWARE)
    assert set(MEASURED_HARDWARE) <= set(gpu.HARDWARE)
    for name in MEASURED_HARDWARE:
        assert gpu.default_data_dir(name) == measured_dir()
        assert (measured_dir() / gpu.profile_relpath(name)).is_file()
    assert gpu.default_data_dir("a100-llama2-7b") == gpu.default_data_dir()


@pytest.mark.parametrize("name", MEASURED_HARDWARE)
def test_linear_time_is_the_measured_sum_at_every_profiled_count(name):
    model = load_hardware(name)
    path = gpu.default_data_dir(name) / gpu.profile_relpath(name)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 83
    for r in rows:
        want = sum(float(r[f"time_stats.{op}.median"]) for op in LINEAR_OPS)
        assert model.linear_ms_per_layer(int(r["num_tokens"])) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("name,rows,r2", [("h200-llama2-7b", 61, 0.999),
                                          ("h200-qwen2.5-coder-3b", 26, 0.985),
                                          ("h200-qwen2.5-coder-1.5b", 26, 0.983)])
def test_decode_attention_is_fitted_on_the_rows_that_fill_the_gpu(name, rows, r2):
    """Only rows with num_decode x n_kv_head >= 132 (the H200's multiprocessors): with
    Qwen's 2 KV heads that is 66 requests and more; Llama-2-7B's 32 heads, 5 and more."""
    d = load_hardware(name).describe()
    att = d["decode_attention"]
    assert att["fit_rows"] == rows
    assert att["fit_r2"] == pytest.approx(r2, abs=1e-3)
    assert att["fit_source"].startswith("attention.csv")
    assert att["scaling"].startswith("none")
    assert d["gpu"] == "h200"
    assert gpu.GPUS["h200"].multiprocessors == 132


@pytest.mark.parametrize("name,lo,hi", [("h200-llama2-7b", 0.83, 1.0),
                                        ("h200-qwen2.5-coder-3b", 0.64, 0.89),
                                        ("h200-qwen2.5-coder-1.5b", 0.60, 0.89)])
def test_sum_of_operators_against_whole_steps_timed_on_the_card(name, lo, hi):
    """The simulator's composition (linear x layers + emb + decode attention + lm_head,
    no CPU overhead) never exceeds a whole decode step timed on the same H200 in a CUDA
    graph: the step has kernels the operator list lacks (the second residual add and
    the KV-cache writes of every layer, the final norm, sampling). Measured ratios:
    Llama-2-7B 0.836..0.993, Qwen2.5-Coder-3B 0.651..0.888, 1.5B 0.605..0.880; the
    lowest are one to four requests of 4096 tokens, where the timed step's PyTorch
    attention (no split of the context) runs one block per request and KV head."""
    model = dataclasses.replace(load_hardware(name), cpu_overhead_ms=0.0)
    steps = measured_steps(model.model)
    assert len(steps) == 16
    ratios = [model.step_s(decode(b, ctx)) * 1e3 / ms for b, ctx, ms in steps]
    assert lo <= min(ratios) and max(ratios) <= hi
    # where the attention kernel fills the card the composition is within 13%
    full = [r for (b, _, _), r in zip(steps, ratios) if b * model.profile.n_kv_head >= 132]
    assert full and min(full) >= 0.86


def test_h200_cache_is_its_memory_less_weights():
    m = load_hardware("h200-llama2-7b")
    assert m.gpu_memory_bytes == 143771 * 2**20
    per_token = 2 * 32 * 32 * 128 * 2
    want = int((143771 * 2**20 * 0.9 - 6.74e9 * 2 - 2 * 2**30) // per_token)
    assert m.kv_capacity_tokens() == want
    q = load_hardware("h200-qwen2.5-coder-3b")
    assert q.kv_bytes_per_token == 2 * 36 * 2 * 128 * 2     # GQA: 2 KV heads
    hw = gpu_hardware("h200-qwen2.5-coder-3b")
    assert (hw.vllm_default_max_num_seqs, hw.vllm_default_max_num_batched_tokens) == (1024, 8192)


def test_meta_names_the_card_and_the_method():
    meta = json.loads((H200 / "meta.json").read_text())
    assert meta["gpu"]["name"] == "NVIDIA H200"
    assert meta["gpu"]["multiprocessors"] == 132
    assert meta["reps_per_graph"] == 20 and meta["replays"] == 7
    assert set(meta["models"]) == set(FOLDERS)


def test_measure_script_runs_without_a_gpu_and_writes_tables_the_model_reads(tmp_path):
    """The tool's own check mode (CPU, two layers, tiny grid): its ops.csv carries the
    columns read_operator_profile reads, so a new card's tables drop in as they are."""
    from fakes import load_tool

    module = load_tool("measure_gpu_ops")
    assert module.main(["--out", str(tmp_path), "--device", "cpu", "--skip-steps",
                        "--models", "qwen2.5-coder-1.5b"]) == 0
    with open(tmp_path / "ops.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header[0] == "model" and tuple(header[1:]) == gpu.PROFILE_COLUMNS
    folder = tmp_path / "h200" / "Qwen2.5-Coder-1.5B"
    folder.mkdir(parents=True)
    with open(tmp_path / "ops.csv", newline="") as f, open(folder / "mlp.csv", "w") as out:
        rows = list(csv.reader(f))
        out.writelines(",".join(r[1:]) + "\n" for r in rows)
    prof = gpu.read_operator_profile(folder / "mlp.csv", 1)
    assert prof.num_tokens == (1, 8, 64) and prof.n_kv_head == 2 and prof.n_embd == 1536
    with open(tmp_path / "attention.csv", newline="") as f:
        kinds = {r["kind"] for r in csv.DictReader(f)}
    assert kinds == {"decode", "prefill"}
