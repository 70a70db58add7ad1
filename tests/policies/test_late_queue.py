"""``late_queue``: once the longest-waiting request has waited past ``lift_after_s``
(half of ``ttft_sla_s`` by default),
the SLA bound steps aside (the cap goes to the memory bound, or with ``lift_tpot``
to the largest batch the step model puts within the TPOT SLO) and its search is held
until the TBT window has turned over."""

from __future__ import annotations

import dataclasses

import pytest

from tuned import config as config_mod
from tuned.core.types import Observation
from tuned.policies import registry
from tuned.curves.online import LinearStepModel
from tuned.policies.batch import BatchPolicy
from tuned.policies.sla_bound import lift_target

SLA = 0.050


def _inner(**raw) -> BatchPolicy:
    cfg = config_mod.validate({"tbt_sla_s": SLA, "ttft_sla_s": 3.0,
                               "late_queue": "lift_tpot", **raw})
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
    pol = _inner(late_queue="lift")
    # half the 3 s TTFT target; the search held for one 2 s window of 0.5 s ticks
    assert (pol.late_after_s, pol.late_hold_ticks) == (1.5, 4)
    pol.sla.low, pol.sla.high = 1, 32
    # the head waited 1.4 s, within half its TTFT target: the search's cap
    assert pol.decide(_obs(1.4, tbt=SLA)).cap == 16
    interval = (pol.sla.low, pol.sla.high)
    assert interval == (15, 17)        # the hold branch narrowed it around 16
    # 3.5 s: late; the cap is the memory bound's. The steps the lifted cap runs (16
    # decodes over the SLA) prove nothing upward, and a window over the SLA is left to
    # the search once the hold ends: the interval stays
    for _ in range(3):
        d = pol.decide(_obs(3.5, tbt=0.200))
        assert (d.reason, d.cap, d.b_mem, d.b_sla) == ("ttft_late", 32, 32, 16)
        assert d.lower <= d.target <= d.upper == 32
        assert (pol.sla.low, pol.sla.high) == interval
    # nothing late any more: the search is held for four ticks (its window still holds
    # the lifted cap's steps), then answers the violation
    got = [pol.decide(_obs(None, tbt=0.200)) for _ in range(5)]
    assert [(d.reason, d.cap) for d in got] == [("ttft_late_settling", 16)] * 4 + [("sla_over", 15)]


def test_a_lifted_window_within_the_slo_raises_the_search():
    """The cycle this breaks, seen on the simulator with workload W8 (46-141 of 158
    chat requests good against a static cap of 16's 157-158): the search sat at [3, 7]
    after a long-prompt phase; the chat phase's queue went late, the cap lifted
    to 30, 20 decodes ran within the SLA, and the search came back to [3, 7], cap 5,
    where the queue was late again within a second. The lifted window proves 20
    decodes hold the SLA: the low end rises to 20, the high end to 20 + alpha, and
    the drain after the lift (b-bar falling back toward 5, within) does not lower it."""
    pol = _inner()
    pol.sla.low, pol.sla.high = 3, 7
    within = dataclasses.replace(_obs(3.5, tbt=0.040), decode_batch_mean=20.0)
    d = pol.decide(within)
    assert (d.reason, d.cap) == ("ttft_late", 32)
    assert (pol.sla.low, pol.sla.high) == (20, 22)
    for bbar in (12.0, 6.0):      # the drain: within, at smaller batches
        d = pol.decide(dataclasses.replace(within, oldest_wait_s=None, decode_batch_mean=bbar))
        assert (d.reason, d.cap) == ("ttft_late_settling", 21)
    # in the band (|T - SLA| <= eps_D) at b-bar 26: the paper's hold interval [25, 27]
    pol.decide(dataclasses.replace(within, decode_batch_mean=26.0, tbt_mean_s=SLA + 0.001,
                                   tbt_p90_s=SLA + 0.001))
    assert (pol.sla.low, pol.sla.high) == (25, 27)
    # over at 40: left to the search once the hold ends (a fall to b-bar from a lifted
    # window would halve the cap while the queue is late)
    pol.sla.low, pol.sla.high = 3, 30
    pol.decide(dataclasses.replace(within, decode_batch_mean=40.0, tbt_mean_s=0.080,
                                   tbt_p90_s=0.080))
    assert (pol.sla.low, pol.sla.high) == (3, 30)


def test_lift_tpot_stops_where_the_model_puts_the_mean_step_at_the_slo():
    """``late_queue = "lift_tpot"``: T(b) = 10 ms + 2 ms per decode: 16 decodes take
    42 ms on the model and 46 ms measured, so 4 ms of each step is prefill or a slower
    host; the SLA less that leaves 36 ms of decodes: 18, not the memory bound's 32
    (``lift``'s, below)."""
    pol = _inner(late_queue="lift_tpot")
    pol.sla.low = pol.sla.high = 16
    model = LinearStepModel(a=0.010, beta=0.002, gamma=0.0, eta=0.0, r2=1.0, n_samples=100,
                            source="test")
    d = pol.decide(dataclasses.replace(_obs(3.5, tbt=0.046), step_model=model))
    assert (d.reason, d.cap, d.b_mem, d.b_sla, d.upper) == ("ttft_late", 18, 32, 16, 18)
    assert lift_target(_obs(3.5, tbt=0.046), model, SLA, 32) == 18
    # 60 ms measured: 18 ms over the model, room for 11 decodes, under the search's 16:
    # no lift; the search stays held for the window the lifted cap ran in
    d = pol.decide(dataclasses.replace(_obs(3.5, tbt=0.060), step_model=model))
    assert (d.reason, d.cap) == ("ttft_late_settling", 16)
    # no model, or no measured window: the memory bound, as with lift
    assert lift_target(_obs(3.5, tbt=0.046), None, SLA, 32) == 32
    assert lift_target(dataclasses.replace(_obs(3.5), tbt_mean_s=None), model, SLA, 32) == 32
    # lift: the memory bound whatever the model says
    pol = _inner(late_queue="lift")
    pol.sla.low = pol.sla.high = 16
    d = pol.decide(dataclasses.replace(_obs(3.5, tbt=0.046), step_model=model))
    assert (d.reason, d.cap, d.upper) == ("ttft_late", 32, 32)


def test_a_late_queue_that_lifts_nothing_leaves_the_search_answering():
    """The search is held while a late queue lifts the cap, not whenever the queue is
    late: where the lift would not raise the cap (``lift_tpot``'s batch not above the
    search's, or the memory bound not above it), a window over the SLA makes the
    search fall as it would without a queue. Held, the steps ran over the SLA at the
    search's cap for as long as the queue stayed late."""
    model = LinearStepModel(a=0.010, beta=0.002, gamma=0.0, eta=0.0, r2=1.0, n_samples=100,
                            source="test")
    late_over = dataclasses.replace(_obs(3.5, tbt=0.060), step_model=model)
    pol = _inner(late_queue="lift_tpot")
    pol.sla.low, pol.sla.high = 8, 24
    # 60 ms measured at 16 decodes: room for 11 on the model, under the search's 16
    assert lift_target(late_over, model, SLA, 32) == 11
    got = [pol.decide(late_over) for _ in range(2)]
    assert [(d.reason, d.cap) for d in got] == [("sla_over", 11), ("sla_over_settling", 11)]
    assert (pol.sla.low, pol.sla.high) == (7, 16)
    # lift: the memory bound (32) is not above the search's cap (32): nothing to lift
    pol = _inner(late_queue="lift")
    pol.sla.low = pol.sla.high = 32
    d = pol.decide(_obs(3.5, tbt=0.060))
    assert (d.reason, d.cap) == ("sla_over", 31)


@pytest.mark.parametrize("raw", [{"late_queue": "hold"}, {"sla_mode": "paper"},
                                 {"ttft_sla_s": 0.0}])
def test_hold_the_paper_or_no_ttft_slo_keep_the_sla_bound(raw):
    pol = _inner(**raw)
    assert pol.late_after_s == 0.0
    pol.sla.low = pol.sla.high = 16
    assert pol.decide(_obs(100.0)).reason == "sla_over"


def test_late_queue_is_validated_by_name():
    with pytest.raises(config_mod.ConfigError,
                       match=r"late_queue: must be one of auto, lift, lift_tpot, hold"):
        config_mod.validate({"late_queue": "drop"})
    assert config_mod.validate({}).late_queue == "auto"
    # auto holds while the wait bound refuses (the queue refuses what cannot meet its
    # TTFT), and lifts to the TPOT batch otherwise
    assert config_mod.validate({"ttft_sla_s": 3.0}).late_queue_mode == "hold"
    assert config_mod.validate({"ttft_sla_s": 3.0, "on_max_wait": "serve"}
                               ).late_queue_mode == "lift_tpot"
    assert config_mod.validate({"ttft_sla_s": 3.0, "late_queue": "lift"}
                               ).late_queue_mode == "lift"
    # the observation carries how long the oldest waiting request has waited
    assert "oldest_wait_s" in {f.name for f in dataclasses.fields(Observation)}


def test_lift_after_s_sets_the_wait_that_lifts_the_cap():
    """The default lifts at half the 3 s TTFT target (a head that waited 2 s lifts the
    cap); ``lift_after_s = 3`` holds the search's cap until the head has missed it."""
    pol = _inner()
    pol.sla.low = pol.sla.high = 16
    d = pol.decide(_obs(2.0, tbt=SLA))
    assert (d.reason, d.cap) == ("ttft_late", 32)
    pol = _inner(lift_after_s=3.0)
    assert pol.late_after_s == 3.0
    pol.sla.low = pol.sla.high = 16
    assert pol.decide(_obs(2.9, tbt=SLA)).cap == 16
    d = pol.decide(_obs(3.1, tbt=SLA))
    assert (d.reason, d.cap) == ("ttft_late", 32)
    # it moves the lift only: with hold there is none
    assert _inner(lift_after_s=1.5, late_queue="hold").late_after_s == 0.0


def test_lift_after_s_is_validated_with_its_range():
    with pytest.raises(config_mod.ConfigError,
                       match=r"lift_after_s: must be in \[0, 86400\], got -1"):
        config_mod.validate({"lift_after_s": -1.0})
    assert config_mod.validate({}).lift_after_s == 0.0
