"""GPU-shaped step-time models (tuned.sim.gpu) against Vidur's A100 / H100 profiles."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from tuned.sim import gpu
from tuned.sim.gpu import (A100_LLAMA2_7B_DECODE_ATTN_MS, HARDWARE, LINEAR_OPS, VIDUR_HARDWARE,
                           fit_decode_attention, isotonic_increasing, load_hardware)
from tuned.sim.stepmodel import StepShape

DATA = gpu.default_data_dir()  # the tables packaged with tuned
MD = DATA / "decode_step_llama2_7b.md"
# The full upstream tables, beside the repository in this workspace only.
FULL = Path(__file__).resolve().parents[3] / "shared" / "data" / "vidur-profiling"
needs_full = pytest.mark.skipif(not FULL.is_dir(),
                                reason=f"full Vidur tables not at {FULL} (checks the packaged "
                                       "copy against them)")

# A100 Llama-2-7B decode steps of decode_step_llama2_7b.md: (num_decode, context tokens
# per request, step ms). The context of each row is that of its attention row.
STEP_MS_CTX_32 = ((1, 32, 9.6), (8, 32, 9.6), (16, 32, 10.1), (32, 32, 11.1), (64, 32, 12.8))
STEP_MS_CTX_1_7K = ((1, 1728, 10.1), (8, 1728, 14.9), (16, 1728, 18.5), (32, 1728, 26.1),
                    (64, 1728, 42.2), (128, 1664, 68.3))


def decode(num_decode: int, context_per_request: int) -> StepShape:
    return StepShape(num_decode, num_decode * context_per_request, 0, 0, 0.0,
                     num_decode * (context_per_request + 1))


def prefill(chunk: int, done: int = 0) -> StepShape:
    return StepShape(0, 0, chunk, 1, chunk * (done + (chunk + 1) / 2), done + chunk)


def md_section(start: str, stop: str) -> str:
    text = MD.read_text()
    return text[text.index(start):text.index(stop)]


def test_decode_attention_rows_are_those_of_the_md_file():
    rows, kv = [], None
    section = md_section("attn_decode/layer A100:", "step A100")
    for m in re.finditer(r"kv(\d+)|b(\d+)\s+([\d.]+)", section):
        if m.group(1):
            kv = int(m.group(1))
        else:
            rows.append((int(m.group(2)), kv, float(m.group(3))))
    assert tuple(rows) == A100_LLAMA2_7B_DECODE_ATTN_MS


def test_step_rows_here_are_those_of_the_md_file():
    steps = md_section("step A100 (ms):", "fit:")
    for label, table in (("ctx~32:", STEP_MS_CTX_32), ("ctx~1.7k:", STEP_MS_CTX_1_7K)):
        line = steps[steps.index(label):].splitlines()[0]
        parsed = [(int(b), float(ms)) for b, ms in re.findall(r"b(\d+)\s+([\d.]+)", line)]
        assert parsed == [(b, ms) for b, _, ms in table]


def test_decode_attention_fit_numbers():
    fit = fit_decode_attention()
    assert fit.num_rows == 20
    assert fit.r2 == pytest.approx(0.9803, abs=1e-3)
    assert fit.fixed_ms == pytest.approx(0.00843, rel=0.01)
    assert fit.per_request_ms == pytest.approx(0.000957, rel=0.01)
    assert fit.per_kv_token_ms == pytest.approx(8.90e-6, rel=0.01)
    # 32 layers x a_kv is the .md's "~2.7e-4 ms per context token in the batch".
    assert 32 * fit.per_kv_token_ms == pytest.approx(2.7e-4, rel=0.1)
    assert fit.max_rel_error < 0.26


def test_fit_recovers_exact_coefficients():
    rows = tuple((b, kv, 0.01 + 0.002 * b + 1e-5 * b * kv)
                 for b in (1, 4, 16, 64) for kv in (10, 100, 1000))
    fit = fit_decode_attention(rows)
    coefficients = (fit.fixed_ms, fit.per_request_ms, fit.per_kv_token_ms)
    assert coefficients == pytest.approx((0.01, 0.002, 1e-5))
    assert fit.r2 == pytest.approx(1.0)


@pytest.mark.parametrize("num_decode,context,step_ms", STEP_MS_CTX_32 + STEP_MS_CTX_1_7K)
def test_a100_7b_decode_step_within_15_percent_of_md(num_decode, context, step_ms):
    model = load_hardware("a100-llama2-7b")
    assert model.step_s(decode(num_decode, context)) * 1e3 == pytest.approx(step_ms, rel=0.15)


@pytest.mark.parametrize("model_name", ["llama2-7b", "llama2-70b"])
@pytest.mark.parametrize("shape", [decode(1, 32), decode(64, 1728), decode(256, 4000),
                                   prefill(512), prefill(2048, 1024),
                                   StepShape(32, 32 * 900, 480, 1, 480 * 700.0, 0)])
def test_h100_is_faster_than_a100(model_name, shape):
    a100 = load_hardware(f"a100-{model_name}")
    h100 = load_hardware(f"h100-{model_name}")
    assert h100.step_s(shape) < a100.step_s(shape)


@pytest.mark.parametrize("gpu_name", ["a100", "h100"])
@pytest.mark.parametrize("shape", [decode(1, 32), decode(64, 32), decode(16, 1728),
                                   prefill(512), prefill(4096), prefill(8192, 4096)])
def test_70b_step_is_slower_than_7b(gpu_name, shape):
    assert (load_hardware(f"{gpu_name}-llama2-70b").step_s(shape)
            > load_hardware(f"{gpu_name}-llama2-7b").step_s(shape))


@pytest.mark.parametrize("gpu_name", ["a100", "h100"])
def test_70b_on_4_cards_reads_less_kv_than_7b_on_one(gpu_name):
    """With 110k context tokens, 7B reads 58 GB of KV on one card, 70B 9 GB per card."""
    shape = decode(64, 1728)
    assert (load_hardware(f"{gpu_name}-llama2-70b").step_s(shape)
            < load_hardware(f"{gpu_name}-llama2-7b").step_s(shape))


def read_linear_medians(path: Path, tp: int) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row["num_tensor_parallel_workers"]) == tp:
                out.setdefault(int(row["num_tokens"]), []).append(
                    sum(float(row[f"time_stats.{op}.median"]) for op in LINEAR_OPS))
    return out


@pytest.mark.parametrize("name", VIDUR_HARDWARE)
def test_linear_interpolation_equals_csv_medians_at_profiled_counts(name):
    model = load_hardware(name)
    folder = {"llama2-7b": "Llama-2-7b-hf", "llama2-70b": "Llama-2-70b-hf"}[model.model]
    medians = read_linear_medians(DATA / model.gpu / folder / "mlp.csv", model.tensor_parallel)
    assert len(medians) == 259  # 261 rows, 2048 and 4096 profiled twice
    for n, values in medians.items():
        assert model.linear_ms_per_layer(n) == pytest.approx(sum(values) / len(values), abs=1e-12)
    # Half-way between 1024 and 1040 is the mean of the two rows.
    half = (sum(medians[1024]) + sum(medians[1040])) / 2
    assert model.linear_ms_per_layer(1032) == pytest.approx(half, abs=1e-12)
    assert model.linear_ms_per_layer(8192) > model.linear_ms_per_layer(4096)
    assert model.linear_ms_per_layer(0) == 0.0


def test_linear_ms_matches_md_summary():
    md = {1: 0.290, 8: 0.283, 16: 0.287, 32: 0.298, 64: 0.303, 128: 0.3825, 256: 0.5565,
          512: 1.0425}
    model = load_hardware("a100-llama2-7b")
    assert {n: round(model.linear_ms_per_layer(n), 4) for n in md} == md


@pytest.mark.parametrize("name", HARDWARE)
def test_step_time_is_monotone_on_a_grid(name):
    model = load_hardware(name)
    for ctx in (0, 100, 2000):
        times = [model.step_s(decode(b, ctx)) for b in range(0, 1025)]
        assert all(b >= a for a, b in zip(times, times[1:]))
    times = [model.step_s(StepShape(8, 8000, p, 1, 0.0, 0)) for p in range(0, 12000, 7)]
    assert all(b >= a for a, b in zip(times, times[1:]))


try:
    from hypothesis import given, settings, strategies as st
except ImportError:  # the property test needs hypothesis (test extra); the grid test above does not
    given = None

if given is not None:
    @settings(max_examples=300, deadline=None)
    @given(name=st.sampled_from(HARDWARE),
           num_decode=st.integers(0, 2048), context=st.integers(0, 2_000_000),
           prefill_tokens=st.integers(0, 16384), prefill_reqs=st.integers(0, 8),
           pairs=st.floats(0, 1e8), field=st.sampled_from(["d", "c", "p"]),
           more=st.integers(1, 5000))
    def test_step_time_is_monotone_property(name, num_decode, context, prefill_tokens,
                                            prefill_reqs, pairs, field, more):
        model = load_hardware(name)
        shape = StepShape(num_decode, context, prefill_tokens, prefill_reqs, pairs, 0)
        bigger = shape._replace(**{"d": {"num_decode": num_decode + more},
                                   "c": {"decode_context_tokens": context + more},
                                   "p": {"prefill_tokens": prefill_tokens + more}}[field])
        assert model.step_s(bigger) >= model.step_s(shape)


def test_empty_step_takes_no_time_and_beyond_the_table_keeps_growing():
    model = load_hardware("h100-llama2-7b")
    assert model.step_s(StepShape(0, 0, 0, 0, 0.0, 0)) == 0.0
    at_table_end = model.step_s(StepShape(0, 0, 8192, 1, 0.0, 0))
    beyond = model.step_s(StepShape(0, 0, 12000, 1, 0.0, 0))
    slope_ms = model.describe()["linear_ops"]["forward_slope_ms_per_token_per_step"]
    assert (beyond - at_table_end) * 1e3 == pytest.approx(slope_ms * (12000 - 8192))
    assert slope_ms > 0


def test_step_components_of_70b_tp4_at_one_token():
    """One decode of 1 token with no context on A100 70B TP 4, summed by hand."""
    model = load_hardware("a100-llama2-70b")
    medians = read_linear_medians(DATA / "a100" / "Llama-2-70b-hf" / "mlp.csv", 4)
    emb = {}
    with open(DATA / "a100" / "Llama-2-70b-hf" / "mlp.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["num_tensor_parallel_workers"] == "4":
                emb.setdefault(int(row["num_tokens"]), []).append(
                    float(row["time_stats.emb.median"]))
    counts = sorted(medians)
    forward_ms = [80 * (np.mean(medians[n]) + 2 * (10e-6 + n * 8192 * 2 / 300e9) * 1e3)
                  + np.mean(emb[n]) for n in counts]
    # 1 token: 0.311 ms linear + 2 x 10.05 us all-reduce per layer, 0.003 ms emb; the
    # profile dips at 2 tokens (0.310 ms), so the monotone fit pools 1 and 2.
    assert forward_ms[0] == pytest.approx(80 * (0.311 + 0.0201092) + 0.003)
    forward_1_ms = isotonic_increasing(forward_ms)[0]
    assert forward_1_ms == pytest.approx((forward_ms[0] + forward_ms[1]) / 2)
    fit = fit_decode_attention()
    attn_ms = 80 * (fit.fixed_ms + fit.per_request_ms)
    lm_head_ms = 8192 * 32768 * 2 / 4 / 2.039e12 * 1e3  # weight read 0.0658 ms > FLOPs 0.0014 ms
    expected_ms = forward_1_ms + attn_ms + lm_head_ms + 1.0
    assert model.step_s(decode(1, 0)) * 1e3 == pytest.approx(expected_ms, rel=1e-9)


def test_replace_rebuilds_the_model():
    model = load_hardware("a100-llama2-70b")
    slower = dataclasses.replace(model, cpu_overhead_ms=3.0)
    shape = decode(32, 900)
    assert (slower.step_s(shape) - model.step_s(shape)) * 1e3 == pytest.approx(2.0)
    assert slower.describe()["cpu_overhead_ms"] == 3.0


def test_decode_attention_scaling_to_h100_and_70b():
    fit = fit_decode_attention()
    h100_70b = load_hardware("h100-llama2-70b")
    bandwidth = 2.039 / 3.35
    assert h100_70b.attn_decode_fixed_ms_per_layer == pytest.approx(fit.fixed_ms)
    assert h100_70b.attn_decode_ms_per_request_per_layer == pytest.approx(
        fit.per_request_ms * bandwidth)
    # 8 KV heads over 4 cards vs 7B's 32 heads on one: 1/16 of the KV bytes per card.
    assert h100_70b.attn_decode_ms_per_kv_token_per_layer == pytest.approx(
        fit.per_kv_token_ms * bandwidth / 16)


def test_prefill_attention_flops():
    model = load_hardware("a100-llama2-7b")
    pairs = 1e6
    with_pairs = model.step_s(StepShape(0, 0, 512, 1, pairs, 0))
    without = model.step_s(StepShape(0, 0, 512, 1, 0.0, 0))
    # 32 layers x 4 x 128 x 32 FLOPs per pair at 0.5 x 312 TFLOP/s.
    assert with_pairs - without == pytest.approx(32 * 4 * 128 * 32 * pairs / 156e12)


def test_kv_capacity_by_hand():
    # 7B, TP 1: 80 GiB x 0.9 = 77,309,411,328 B; - 6.74e9 x 2 B = 13,480,000,000;
    # - 2 GiB = 2,147,483,648 -> 61,681,927,680 B. KV per token 2 x 32 x 32 x 128 x 2
    # = 524,288 B -> 117,648 tokens, 7,353 blocks of 16.
    for name in ("a100-llama2-7b", "h100-llama2-7b"):
        model = load_hardware(name)
        assert model.kv_bytes_per_token == 524_288
        assert model.kv_capacity_tokens() == 117_648
        assert model.num_gpu_blocks() == 7_353
        assert model.num_gpu_blocks(block_size=32) == 3_676
    # 70B, TP 4, per card: 77,309,411,328 - 68.98e9 x 2 / 4 = 34,490,000,000 - 2 GiB
    # = 40,671,927,680 B; x 4 cards = 162,687,710,720 B. KV per token
    # 2 x 80 x 8 x 128 x 2 = 327,680 B -> 496,483 tokens, 31,030 blocks.
    model = load_hardware("a100-llama2-70b")
    assert model.kv_bytes_per_token == 327_680
    assert model.kv_capacity_tokens() == 496_483
    assert model.num_gpu_blocks() == 31_030
    # At 0.5: per card 42,949,672,960 - 34,490,000,000 - 2,147,483,648 = 6,312,189,312
    # x 4 / 327,680 = 77,053 tokens.
    assert model.kv_capacity_tokens(0.5) == 77_053


def test_kv_capacity_errors():
    model = load_hardware("a100-llama2-70b")
    with pytest.raises(ValueError, match="no memory left for the KV cache"):
        model.kv_capacity_tokens(0.4)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        model.kv_capacity_tokens(1.5)
    with pytest.raises(ValueError, match="block_size"):
        model.num_gpu_blocks(block_size=0)


def test_bad_name_names_the_known_ones():
    with pytest.raises(ValueError) as err:
        load_hardware("v100-llama2-7b")
    for name in HARDWARE:
        assert name in str(err.value)


def test_missing_data_dir_names_the_path(tmp_path):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_hardware("a100-llama2-7b", missing)


def test_missing_csv_names_the_path(tmp_path):
    (tmp_path / "a100").mkdir()
    expected = tmp_path / "a100" / "Llama-2-7b-hf"
    with pytest.raises(FileNotFoundError, match=re.escape(str(expected))):
        load_hardware("a100-llama2-7b", tmp_path)


def test_default_data_dir_is_the_package_and_cached():
    import tuned

    assert DATA == Path(tuned.__file__).resolve().parent / "data" / "vidur"
    assert load_hardware("h100-llama2-70b") is load_hardware("h100-llama2-70b", DATA)


@pytest.mark.parametrize("name", VIDUR_HARDWARE)
def test_packaged_tables_have_only_the_columns_read(name):
    with open(DATA / gpu.profile_relpath(name), newline="") as f:
        assert tuple(next(csv.reader(f))) == gpu.PROFILE_COLUMNS


@needs_full
@pytest.mark.parametrize("name", VIDUR_HARDWARE)
def test_packaged_tables_give_the_model_of_the_full_ones(name):
    packaged, full = load_hardware(name), load_hardware(name, FULL)
    assert packaged.profile == full.profile
    assert packaged.describe() == full.describe()
    shapes = [decode(64, 800), prefill(2048), prefill(512, 3000)]
    assert [packaged.step_s(s) for s in shapes] == [full.step_s(s) for s in shapes]


@needs_full
def test_packaged_data_is_what_the_tool_writes():
    from fakes import load_tool

    module = load_tool("build_package_data")
    for rel, data in module.package_files(FULL.parent).items():
        assert (DATA.parent / rel).read_bytes() == data, rel


@pytest.mark.parametrize("name", VIDUR_HARDWARE)
def test_describe_is_json_and_carries_the_numbers(name):
    model = load_hardware(name)
    d = json.loads(json.dumps(model.describe()))
    assert d["name"] == name
    assert d["tensor_parallel"] == (2 if name.startswith("a100x2") else 4 if "70b" in name
                                    else 1)
    assert d["num_layers"] == (80 if "70b" in name else 32)
    assert d["cpu_overhead_ms"] == 1.0
    assert d["prefill_attention"]["matmul_efficiency"] == 0.5
    assert d["decode_attention"]["fit_r2"] == pytest.approx(0.9803, abs=1e-3)
    assert d["kv_cache"]["kv_capacity_tokens_at_0.9"] == model.kv_capacity_tokens()
    assert d["kv_cache"]["activation_reserve_bytes_per_card"] == 2 * 2**30
    assert d["model_shape"]["head_dim"] == 128
    assert d["allreduce"]["per_layer"] == (2 if "70b" in name else 0)
    assert 0 < d["linear_ops"]["isotonic_max_gap_ms_per_step"] < 11


def test_isotonic_increasing():
    assert isotonic_increasing([1.0, 3.0, 2.0, 4.0]).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert isotonic_increasing([3.0, 2.0, 1.0]).tolist() == [2.0, 2.0, 2.0]
    y = np.array([0.29, 0.283, 0.287, 0.298])
    fit = isotonic_increasing(y)
    assert np.all(np.diff(fit) >= 0)
    assert fit.sum() == pytest.approx(y.sum())
