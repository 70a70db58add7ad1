"""``late_queue``: once the longest-waiting request has waited past ``ttft_sla_s``,
the SLA bound steps aside (the cap goes to the memory bound) and its search is held
until the TBT window has turned over."""

from __future__ import annotations

import dataclasses

import pytest

from tuned import config as config_mod
from tuned.core.types import Observation
from tuned.policies import registry
from tuned.policies.batch import BatchPolicy

SLA = 0.050


def _inner(**raw) -> BatchPolicy:
    cfg = config_mod.validate({"tbt_sla_s": SLA, "ttft_sla_s": 3.0, **raw})
    pol = registry.build_batch_policy(cfg, ceiling=64, max_num_batched_tokens=2048,
                                      block_size=16)[0]
    while not isinstance(pol, BatchPolicy):
        pol = pol.inner
    return pol


def _obs(oldest_wait_s, tbt=0.080):
    """16 running, 30 waiting at a binding cap, the steps over the 50 ms SLA; memory
    allows the batch's upper limit b_max, 32 (10-block requests in 10 000 blocks)."""
    return Observation(num_running=16, num_waiting=30, kv_capacity_blocks=10_000,
                       demand_mean=10.0, demand_std=0.0, demand_samples=100,
                       tbt_mean_s=tbt, tbt_p90_s=tbt, decode_batch_mean=16.0,
                       binding=1.0, oldest_wait_s=oldest_wait_s)


def test_a_late_head_lifts_the_cap_to_the_memory_bound_and_holds_the_search():
    pol = _inner()
    assert (pol.late_after_s, pol.late_hold_ticks) == (3.0, 4)   # one 2 s window of 0.5 s
    pol.sla.low, pol.sla.high = 1, 32
    # the head waited 2.9 s, within the TTFT SLO: the search's cap
    assert pol.decide(_obs(2.9, tbt=SLA)).cap == 16
    interval = (pol.sla.low, pol.sla.high)
    # 3.5 s: late; the cap is the memory bound's, and the interval is not moved by the
    # steps the lifted cap runs
    for _ in range(3):
        d = pol.decide(_obs(3.5, tbt=0.200))
        assert (d.reason, d.cap, d.b_mem, d.b_sla) == ("ttft_late", 32, 32, 16)
        assert d.lower <= d.target <= d.upper == 32
        assert (pol.sla.low, pol.sla.high) == interval
    # nothing late any more: the search is held for four ticks (its window still holds
    # the lifted cap's steps), then answers the violation
    got = [pol.decide(_obs(None, tbt=0.200)) for _ in range(5)]
    assert [(d.reason, d.cap) for d in got] == [("ttft_late_settling", 16)] * 4 + [("sla_over", 15)]


@pytest.mark.parametrize("raw", [{"late_queue": "hold"}, {"sla_mode": "paper"},
                                 {"ttft_sla_s": 0.0}])
def test_hold_the_paper_or_no_ttft_slo_keep_the_sla_bound(raw):
    pol = _inner(**raw)
    assert pol.late_after_s == 0.0
    pol.sla.low = pol.sla.high = 16
    assert pol.decide(_obs(100.0)).reason == "sla_over"


def test_late_queue_is_validated_by_name():
    with pytest.raises(config_mod.ConfigError, match=r"late_queue: must be one of lift, hold"):
        config_mod.validate({"late_queue": "drop"})
    assert config_mod.validate({}).late_queue == "lift"
    assert dataclasses.fields(Observation)[-1].name == "oldest_wait_s"
