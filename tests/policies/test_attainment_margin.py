"""The attainment setpoint (``sla_statistic = "attainment"``): the margin below the
TPOT SLO that the SLA search holds the mean decode step to, learnt from finished
requests' TPOT; what the decision says of it; what the controller feeds it."""

from __future__ import annotations

import random

import pytest

from tuned import config
from tuned.core.ring import FinishedRequest
from tuned.core.window import BindingHistory, request_tpot_s
from tuned.policies.batch import Observation
from tuned.policies.sla_bound import ATTAINMENT_STEP, AttainmentMargin, EvidenceSlaBound
from tuned.policies.registry import build_batch_policy

SLA, EPS = 0.050, 0.002


def obs(tbt, bbar=8.0, binding=1.0, tpots=(), running=8, waiting=4):
    return Observation(num_running=running, num_waiting=waiting, kv_capacity_blocks=10_000,
                       demand_mean=10.0, demand_std=0.0, demand_samples=100,
                       tbt_mean_s=tbt, decode_batch_mean=bbar, binding=binding,
                       finished_tpot_s=tuple(tpots))


def test_misses_above_the_target_share_lower_the_margin_by_the_step_times_the_excess():
    m = AttainmentMargin(SLA, 0.9)
    assert (m.margin, m.setpoint_s) == (1.0, SLA)
    # 5 over the SLO, then 5 within: each miss lowers it by step x 0.9, each request
    # within raises it by step x 0.1 (the first five starting at the top)
    m.learn([0.060] * 5 + [0.040] * 5)
    assert m.margin == pytest.approx(1.0 - 5 * 0.9 * ATTAINMENT_STEP + 5 * 0.1 * ATTAINMENT_STEP)
    assert m.margin == pytest.approx(0.96)
    assert m.setpoint_s == pytest.approx(0.048)
    assert m.inputs() == {"sla_margin": 0.96, "sla_attainment_target": 0.9,
                          "tpot_within_share": 0.5, "tpot_samples": 10}
    # exactly at the SLO is within; a non-finite TPOT is skipped
    m.learn([SLA, float("nan")])
    assert m.margin == pytest.approx(0.961) and m.learnt == 11


def test_the_margin_is_bounded_to_half_the_slo_and_the_slo():
    m = AttainmentMargin(SLA, 0.9)
    m.learn([0.2] * 1000)
    assert m.margin == 0.5
    m.learn([0.01] * 5000)
    assert m.margin == 1.0
    with pytest.raises(ValueError, match=r"target: must be in \(0, 1\), got 1.0"):
        AttainmentMargin(SLA, 1.0)


@pytest.mark.parametrize("target", [0.75, 0.9])
def test_the_margin_settles_where_the_target_share_is_within(target):
    """A plant where each request's TPOT is the setpoint times a spread of +-20 %
    (uniform): half the requests miss at the mean's setpoint; the margin settles where
    `target` of them are within, 1 / (0.8 + 0.4 target) below the SLO."""
    rng = random.Random(0)
    m = AttainmentMargin(SLA, target)
    within = []
    for i in range(6000):
        t = m.setpoint_s * rng.uniform(0.8, 1.2)
        m.learn([t])
        if i >= 3000:
            within.append(t <= SLA)
    assert sum(within) / len(within) == pytest.approx(target, abs=0.02)
    assert m.margin == pytest.approx(1 / (0.8 + 0.4 * target), abs=0.02)


def test_the_search_holds_the_mean_to_the_learnt_setpoint():
    """A mean step of 45 ms is under the mean's setpoint (50 - 2 ms): the search moves
    up. After 22 misses the setpoint is 40.1 ms, and the same step is over it."""
    mean = EvidenceSlaBound(SLA, EPS, 2, 1, 1, 64)
    att = EvidenceSlaBound(SLA, EPS, 2, 1, 1, 64, statistic="attainment",
                           attainment_target=0.9)
    assert mean.update(obs(0.045))[1] == "sla_under"
    assert att.update(obs(0.045))[1] == "sla_under"      # margin 1: the mean's setpoint
    att.update(obs(0.045, tpots=[0.055] * 22))          # 22 misses
    assert att.margin.margin == pytest.approx(1.0 - 22 * 0.9 * ATTAINMENT_STEP)   # 0.802
    assert att.setpoint_s == pytest.approx(0.0401)
    assert att.update(obs(0.045))[1] == "sla_over"


def test_the_decision_says_which_statistic_it_held_and_to_what():
    def decide(stat, **cfg):
        c = config.validate({"tbt_sla_s": SLA, "sla_statistic": stat, **cfg})
        pol, _ = build_batch_policy(c, ceiling=64, max_num_batched_tokens=2048,
                                    block_size=16)
        return pol.decide(obs(0.045, tpots=[0.055] * 20)).inputs

    d = decide("mean")
    assert (d["sla_statistic"], d["sla_setpoint_s"]) == ("mean", SLA)
    assert "sla_margin" not in d
    assert decide("p90")["sla_statistic"] == "p90"
    # auto names what it held: p90 where the token budget sizes chunks for the SLA
    # (a granule, a GPU), decode_p90 where it is the full budget (a line, a CPU host)
    assert decide("auto")["sla_statistic"] == "p90"     # granule 256 by default
    assert decide("auto", token_budget_granule=0)["sla_statistic"] == "decode_p90"
    assert decide("auto", token_budget_granule=0,
                  token_budget_policy="sla")["sla_statistic"] == "p90"
    d = decide("attainment", sla_attainment_target=0.8)
    margin = 1.0 - 20 * 0.8 * ATTAINMENT_STEP
    assert d["sla_statistic"] == "attainment"
    assert d["sla_margin"] == pytest.approx(margin)
    assert d["sla_setpoint_s"] == pytest.approx(margin * SLA)
    assert (d["sla_attainment_target"], d["tpot_within_share"], d["tpot_samples"]) == \
        (0.8, 0.0, 20)


def test_a_finished_requests_tpot_is_the_slo_definition():
    f = FinishedRequest(0, 3.0, "r", 10, 11, 11, 0.0, 0, first_token_s=1.0)
    assert request_tpot_s(f) == pytest.approx(0.2)
    assert request_tpot_s(f._replace(output_tokens=1)) is None
    assert request_tpot_s(f._replace(first_token_s=None)) is None


def test_binding_history_gives_the_share_of_a_life_at_a_binding_cap():
    h = BindingHistory(keep=4)
    assert h.share(0.0, 1.0) is None
    for i, b in enumerate([False, False, True, True, True, False]):
        h.note(float(i), b)
    assert h.share(0.0, 5.0) == pytest.approx(3 / 6)
    assert h.share(2.0, 4.0) == 1.0
    assert h.share(1.5, 2.5) == 1.0
    assert h.share(4.2, 4.8) == 1.0       # shorter than a tick: the tick before it
    assert h.share(5.2, 5.8) == 0.0
    for i in range(6, 20):                # trimmed to the newest ticks, counts kept
        h.note(float(i), i % 2 == 0)
    assert h.share(16.0, 19.0) == pytest.approx(2 / 4)
