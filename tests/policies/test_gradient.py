"""batch_policy = "gradient": Netflix's Gradient2Limit on the decode step time, its
decisions in numbers, and its run in `tuned bench --engine sim` beside the others."""

from __future__ import annotations

import json

import pytest

from tuned import config as config_mod
from tuned.core.types import Observation
from tuned.policies import catalog, registry
from tuned.policies.gradient import GradientLimit


def _limit(**kw) -> GradientLimit:
    args = dict(min_limit=1, max_limit=200, ceiling=256, max_num_batched_tokens=2048,
                initial_limit=20)
    return GradientLimit(**{**args, **kw})


def _obs(tbt: float | None, running: int, waiting: int = 0, p90: float | None = None):
    return Observation(num_running=running, num_waiting=waiting, kv_capacity_blocks=1000,
                       demand_mean=None, demand_std=None, demand_samples=0, tbt_mean_s=tbt,
                       decode_batch_mean=None, tbt_p90_s=p90)


def test_the_source_update_without_an_slo():
    """Gradient2Limit's defaults (smoothing 0.2, queue 4, tolerance 1.5), limit 20:
    at the long-term average the gradient is 1 and the limit grows by 4 x 0.2; at three
    times the running average it is 1.5 x 0.0333 / 0.06."""
    g = _limit()
    assert g.update(0.01, 20)[:2] == (pytest.approx(20.8), "gradient_up")  # 0.8*20 + 0.2*24
    assert g.update(0.03, 20)[:2] == (pytest.approx(21.6), "gradient_up")  # long 0.02: 1.5x
    limit, reason, seen = g.update(0.06, 20)
    assert seen["long_s"] == pytest.approx(0.1 / 3)
    assert seen["gradient"] == pytest.approx(1.5 * (0.1 / 3) / 0.06, abs=1e-6)
    want = 21.6 * 0.8 + (21.6 * 1.5 * (0.1 / 3) / 0.06 + 4) * 0.2
    assert (limit, reason) == (pytest.approx(want), "gradient_down")


def test_the_slo_is_the_reference_and_the_gradient_is_clamped_to_half():
    g = _limit(initial_limit=100, reference_s=0.05)
    # 0.05 / 0.1 = 0.5: 100 x 0.8 + (100 x 0.5 + 4) x 0.2
    assert g.update(0.1, 100)[:2] == (pytest.approx(90.8), "gradient_down")
    # 0.05 / 0.4 = 0.125, clamped to 0.5
    assert g.update(0.4, 100)[0] == pytest.approx(90.8 * 0.8 + (90.8 * 0.5 + 4) * 0.2)
    # within the SLO: gradient 1, the limit grows by queue_size x smoothing
    before = g.limit
    assert g.update(0.04, 100)[:2] == (pytest.approx(before + 0.8), "gradient_up")


def test_app_limited_holds_a_rise_but_not_a_fall():
    g = _limit(initial_limit=100, reference_s=0.05)
    assert g.update(0.04, 49)[:2] == (100.0, "gradient_app_limited")
    assert g.update(0.1, 49)[:2] == (pytest.approx(90.8), "gradient_down")
    assert g.update(None, 49)[:2] == (pytest.approx(90.8), "gradient_no_data")


def test_the_long_term_average_warms_up_then_decays_like_the_source():
    g = _limit(long_window=600)
    for _ in range(10):
        g.update(0.04, 20)
    assert g.long_s == pytest.approx(0.04)
    g.update(0.01, 20)           # EMA 2/601, then long/short > 2: times 0.95
    assert g.long_s == pytest.approx((0.04 * (1 - 2 / 601) + 0.01 * 2 / 601) * 0.95)


def test_the_decision_is_an_int_cap_within_b_min_and_the_ceiling_with_its_reason():
    g = _limit(min_limit=4, max_limit=64, ceiling=64, initial_limit=64, reference_s=0.05,
               statistic="p90")
    for _ in range(80):   # p90 at twice the SLO: L = 0.8 L + 0.2 (0.5 L + 4) settles at 8
        dec = g.decide(_obs(0.02, 64, 10, p90=0.1))
    assert (dec.cap, dec.lower, dec.upper, dec.reason) == (8, 4, 64, "gradient_down")
    assert type(dec.cap) is int and dec.batch == 64 and dec.token_budget == 2048
    assert dec.inputs["gradient"] == 0.5 and dec.inputs["reference_s"] == 0.05
    assert set(catalog.find("batch", "gradient").reasons) == {
        "gradient_down", "gradient_up", "gradient_app_limited", "gradient_no_data"}


def test_config_registry_and_bench_see_it_from_its_declaration():
    assert "gradient" in config_mod.BATCH_POLICIES
    cfg = config_mod.validate({"batch_policy": "gradient", "tbt_sla_s": 0.05, "b_min": 2,
                               "max_num_seqs": 64,
                               "batch_options": {"queue_size": 8, "smoothing": 0.5}})
    pol, _ = registry.build_batch_policy(cfg, ceiling=64, max_num_batched_tokens=2048,
                                         block_size=16)
    inner = pol.inner.inner.inner
    assert [type(p).__name__ for p in (pol, pol.inner, pol.inner.inner, inner)] == [
        "GpuMemoryGuard", "CapDamper", "TokenBudget", "GradientLimit"]
    assert (inner.queue_size, inner.smoothing, inner.min_limit, inner.max_limit,
            inner.reference_s, inner.limit) == (8, 0.5, 2, 64, 0.05, 64.0)
    with pytest.raises(config_mod.ConfigError) as e:
        config_mod.validate({"batch_policy": "gradient", "batch_options": {"smoothing": 0}})
    assert e.value.problems == ["batch_options.smoothing: must be a number in (0, 1], got 0"]
    assert "batch_options.tolerance (float, default 1.5, a number in [1, 100])" \
        in config_mod.explain()


def test_the_simulated_bench_runs_it_beside_the_other_contenders(tmp_path):
    """`tuned bench --engine sim`: gradient2 runs as a peer; on a phase shift whose
    bursts push the decode step past the 50 ms TPOT SLO at vLLM's default cap, it
    lowers the cap and its TPOT p99 is below vLLM's default's."""
    from tests.fakes import run_main

    out = tmp_path / "bench"
    code = run_main(["bench", "--engine", "sim", "--hardware", "a100-llama2-7b",
                     "--workload", "phase-shift:rate=12,n=300", "--quick",
                     "--capacity", "off", "--jobs", "1", "--out", str(out),
                     "--contenders", "vllm-default,trtllm,gradient2,sglang"])[0]
    assert code == 0
    runs = {r["name"]: r for r in json.loads((out / "report.json").read_text())["runs"]}
    assert list(runs) == ["vllm-default", "trtllm", "gradient2", "sglang"]
    g, default = runs["gradient2"], runs["vllm-default"]
    assert g["kind"] == "peer" and g["completed"] == g["submitted"] == 900
    assert g["cap_moves"] > 0 and g["cap_min"] < default["cap_max"] == 256
    assert g["tpot_p99_s"] < default["tpot_p99_s"]
