"""`tuned bench --paper pang`: seed 000's Tables I and II, the published algorithm
(Algorithms 1+2 with the paper's PD-fusion chunk sizing) and tuned as shipped."""

import pytest
import structlog

from tuned.bench.papers import pang
from tuned.core.ring import StepSample

pytestmark = pytest.mark.usefixtures("quiet_logs")


def test_pang_lognormal_has_the_papers_mean_and_cv_half():
    assert pang.lognormal(61.5) == "LN(61.5,55.01)"
    assert pang.workload_spec(256.6, 61.5, 3000) == (
        "poisson:rate=1,prompt=LN(256.6,229.5),output=LN(61.5,55.01),n=3000")


def test_pang_published_algorithm_includes_the_papers_chunk_sizing():
    hw = pang.gpu_hardware(pang.HARDWARE)
    cfg = pang._config(hw, **pang.PAPER_ALGORITHM, tbt_sla_s=0.05)
    assert (cfg.sla_mode, cfg.token_budget_policy, cfg.admission_guard) == (
        "paper", "sla", "off")
    assert cfg.batch_policy == "tuned" and cfg.max_num_seqs == 256
    fixed = pang._config(hw, **pang.PAPER_FIXED_BUDGET, tbt_sla_s=0.05)
    assert (fixed.sla_mode, fixed.token_budget_policy) == ("paper", "max")
    assert pang.CAPACITY_ROWS["pd-fusion"]["output_mean"] == 447.5
    assert [r["dynamic_qps"] / r["static_qps"] - 1 for r in pang.CAPACITY_ROWS.values()] == \
        pytest.approx([0.2222, 0.2667], abs=1e-4)


def test_quick_runs_every_checked_run_of_the_full_plan():
    """Quick differs from full only in unchecked diagnostics: same requests, rows, seeds."""
    for key in ("throughput_requests", "capacity_rows"):
        assert pang.QUICK[key] == pang.FULL[key]
    assert all(r["requests"] == 3000 for r in pang.CAPACITY_ROWS.values())
    assert (pang.QUICK["diagnostics"], pang.FULL["diagnostics"]) == (False, True)


def _step(step_s, n_dec, n_pre=0, pre_tok=0, waiting=0):
    return StepSample(0, 0.0, step_s, n_dec, n_pre, pre_tok, n_dec + pre_tok, n_dec, 0.0,
                      0, 0, 0, waiting, 0)


def test_stall_counts_come_from_the_step_records():
    steps = [_step(0.030, 10), _step(0.070, 10, 1, 256, 4), _step(0.060, 20, waiting=2),
             _step(0.045, 20, 1, 100), _step(0.020, 0, 2, 512, 6)]
    st = pang.stall_counts(steps, 0.05)
    assert (st["decode_steps"], st["over_sla"], st["over_sla_with_prefill"],
            st["over_sla_decode_only"]) == (4, 2, 1, 1)
    assert st["decode_tokens_over_sla_share"] == pytest.approx(30 / 60)
    assert st["step_ms_with_prefill"] == pytest.approx(57.5)
    assert st["step_ms_decode_only"] == pytest.approx(45.0)
    assert st["prefill_tokens_per_step"] == pytest.approx(868 / 3)
    assert st["mean_decode_batch"] == pytest.approx(15.0)
    assert st["prefill_step_share"] == pytest.approx(3 / 5)
    assert st["mean_waiting"] == pytest.approx((4 * 0.070 + 2 * 0.060 + 6 * 0.020) / 0.225)
    assert st["max_waiting"] == 6


def _row(paper_gain, tuned_gain):
    stalls = {"attainment": 0.8, "over_sla": 120, "decode_steps": 1000,
              "over_sla_with_prefill": 110, "decode_tokens_over_sla_share": 0.15,
              "step_ms_with_prefill": 61.0, "prefill_tokens_per_step": 300.0,
              "step_ms_decode_only": 40.0, "mean_decode_batch": 90.0,
              "prefill_step_share": 0.95, "mean_waiting": 40.0, "max_waiting": 120, "tpot_miss": 500,
              "ttft_miss": 20, "unfinished": 0, "requests": 3000}
    return {"row": {"label": "Table II row 3 (PD fusion)"}, "paper_gain_vs_default": paper_gain,
            "gain_vs_default": tuned_gain, "stall_rate_rps": 3.63,
            "contenders": {"tuned-paper": {"capacity_rps": 3.2}},
            "stalls": {"tuned-paper": stalls}}


def test_checks_hold_each_row_to_table_2s_spread_and_the_note_cites_measured_stalls():
    res = {"throughput": [], "capacity": {"row2": {**_row(0.17, 0.26), "row": {
        "label": "Table II row 2"}}, "pd-fusion": _row(-0.03, 0.057)}}
    checks = pang.checks(res)
    assert [(c["figure"], c["ok"]) for c in checks] == [
        ("paper's: (b) Table II row 2, published algorithm over vLLM default capacity gain",
         True),
        ("paper's: (b) Table II row 3 (PD fusion), published algorithm over vLLM default "
         "capacity gain", False),
        ("tuned's: (b) Table II row 2, tuned as shipped over vLLM default capacity gain", True),
        ("tuned's: (b) Table II row 3 (PD fusion), tuned as shipped over vLLM default "
         "capacity gain", False)]
    notes = pang._notes(res)
    assert len(notes) == 1
    assert notes[0].startswith(
        "note: Table II row 3 (PD fusion): the published algorithm gains -3.0%, tuned as "
        "shipped gains +5.7%, below Table II's lowest (+10%). Measured at 3.63 qps")
    assert ("tuned-paper (3.20 qps capacity): attainment 0.800, 120/1000 decode steps over "
            "50 ms (110 carrying a prefill), 15.0% of decode tokens in them") in notes[0]
    assert notes[0].endswith(
        "So: tuned-paper misses on TPOT (500 against 20 on TTFT): its steps with a prefill "
        "take 61.0 ms carrying 300 prompt tokens, and 15.0% of the decode tokens come out of "
        "a step over 50 ms.")
