"""tools/overload_bench.py's reading of vLLM's benchmark results and of the gateway's
refusal-wait histogram (no engine: hand-made results in vLLM's detailed shape)."""

from __future__ import annotations

import math

import pytest

from fakes import load_tool
from tuned.bench.metrics import Slo

SLO = Slo(ttft_s=3.0, tpot_s=0.05)


@pytest.fixture(scope="module")
def tool():
    return load_tool("overload_bench")


def result(rows):
    """vLLM's --save-detailed fields for rows of (error, ttft, latency, output_len)."""
    return {"errors": [r[0] for r in rows], "ttfts": [r[1] for r in rows],
            "latencies": [r[2] for r in rows], "output_lens": [r[3] for r in rows],
            "duration": 10.0, "request_goodput": 0.2, "start_times": [5.0, 5.5, 6.0, 7.0, 8.0]}


def test_good_is_vllm_s_goodput_rule_and_a_429_is_a_refusal(tool):
    res = result([
        ("", 1.0, 1.0 + 10 * 0.05, 11),      # TPOT exactly 50 ms: good (inclusive)
        ("", 3.5, 4.0, 11),                  # TTFT 3.5 s: served, not good
        ("", 0.5, 0.5 + 10 * 0.06, 11),      # TPOT 60 ms: served, not good
        ("Too Many Requests", 0.0, 0.0, 0),  # the gateway's 429
        ("Never received a valid chunk", 0.0, 0.0, 0)])
    c = tool.counts(res, SLO)
    assert {k: c[k] for k in ("n", "good", "served", "refused", "failed_other")} == \
        {"n": 5, "good": 1, "served": 3, "refused": 1, "failed_other": 1}
    assert c["ttft_p99_s"] == 3.5 and c["start_s"] == 5.0


def test_a_one_token_answer_is_judged_by_its_ttft_alone(tool):
    c = tool.counts(result([("", 2.0, 2.0, 1)] * 5), SLO)
    assert (c["good"], c["served"]) == (5, 5)


def test_the_refusal_wait_histogram_reads_as_a_bound_and_a_count(tool):
    scraped = {
        ("tuned_gateway_refusal_wait_seconds_bucket", (("le", "1.0"), ("where", "door"))): 40.0,
        ("tuned_gateway_refusal_wait_seconds_bucket", (("le", "3.0"), ("where", "door"))): 40.0,
        ("tuned_gateway_refusal_wait_seconds_bucket", (("le", "+Inf"), ("where", "door"))): 40.0,
        ("tuned_gateway_refusal_wait_seconds_bucket", (("le", "1.0"), ("where", "queue"))): 10.0,
        ("tuned_gateway_refusal_wait_seconds_bucket", (("le", "3.0"), ("where", "queue"))): 59.0,
        ("tuned_gateway_refusal_wait_seconds_bucket", (("le", "+Inf"), ("where", "queue"))): 60.0,
        ("tuned_gateway_refused_total", ()): 40.0}
    b = tool.refusal_waits(scraped)
    assert b == {1.0: 50.0, 3.0: 99.0, math.inf: 100.0}
    assert tool.bucket_p99(b) == 3.0
    assert tool.within(b, 3.0) == 99.0 and tool.within(b, 2.0) == 50.0
    assert tool.within(b, 0.5) == 0.0 and tool.bucket_p99({}) is None
    assert tool.total(scraped, "tuned_gateway_refused_total") == 40.0


def test_the_random_dataset_s_mean_lengths(tool):
    # vLLM's random dataset: uniform on [floor(L (1 - r)), ceil(L (1 + r))], r = 0.9
    assert tool.lengths_mean(256) == (25 + 487) / 2
    assert tool.lengths_mean(128) == (12 + 244) / 2
