"""Pang et al.'s Algorithms 1 and 2 against values worked out by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tuned.policies.batch import BatchPolicy, Observation

from tuned.policies.memory_bound import MemoryBound, clt_theta, memory_batch_limit

from tuned.policies.sla_bound import SlaBound
from tuned.policies.budget import token_budget


def obs(running=4, waiting=4, n=1000, mean=100.0, std=0.0, samples=32, tbt=None, bbar=None):
    return Observation(num_running=running, num_waiting=waiting, kv_capacity_blocks=n,
                       demand_mean=mean, demand_std=std, demand_samples=samples,
                       tbt_mean_s=tbt, decode_batch_mean=bbar)


# ---------------------------------------------------------------- Algorithm 1
def test_theta_is_the_normal_quantile():
    assert clt_theta(0.05) == pytest.approx(1.6448536, abs=1e-6)
    assert clt_theta(0.5) == pytest.approx(0.0, abs=1e-12)


def test_memory_limit_without_variance_is_capacity_over_mean():
    # sigma = 0: b*mu <= n  ->  b = 1000 / 100 = 10, no safety buffer
    assert memory_batch_limit(1000, 100.0, 0.0, clt_theta(0.05)) == (10, 0.0)


def test_memory_limit_with_clt_buffer_by_hand():
    # theta = 1.644854, sigma = 20, mu = 100, n = 1000:
    # sqrt(b) = (-32.897 + sqrt(32.897^2 + 4*100*1000)) / 200 = 3.00207 -> b = 9.012
    # L0 = theta * sigma * sqrt(b) = 98.76;  (n - L0) / mu = 9.012 -> 9
    # check: 9*100 + 1.6449*20*3 = 998.7 <= 1000, while b = 10 gives 1104 > 1000
    b, l0 = memory_batch_limit(1000, 100.0, 20.0, clt_theta(0.05))
    assert b == 9
    assert l0 == pytest.approx(98.76, abs=0.01)


def test_memory_limit_boundary_exact_fit():
    # theta*sigma = 10, mu = 10, n = 130: b = 9 gives 90 + 10*3 = 120; b = 10 gives
    # 100 + 10*3.162 = 131.6 > 130; sqrt(b) solves 10 b + 10 sqrt(b) = 130 -> sqrt(b)=3.140
    theta = 1.0
    b, _ = memory_batch_limit(130, 10.0, 10.0, theta)
    assert b == 9
    # exact fit: n = 120 -> sqrt(b) = 3 exactly, b = 9 (no float floor slip to 8)
    assert memory_batch_limit(120, 10.0, 10.0, theta)[0] == 9


def test_algorithm1_adjusts_only_with_waiting_and_running():
    m = MemoryBound(eps_m=0.05, b_max=32, min_samples=8)
    assert m.update(obs(running=4, waiting=0)) == (32, "hold_no_queue")   # b_{t-1} = B_max
    assert m.update(obs(running=0, waiting=5)) == (32, "hold_no_queue")
    assert m.update(obs(running=4, waiting=5, std=20.0)) == (9, "memory")
    assert m.update(obs(running=4, waiting=0)) == (9, "hold_no_queue")     # keeps b_{t-1}


def test_algorithm1_bound_is_capped_at_bmax_and_not_floored():
    m = MemoryBound(eps_m=0.05, b_max=32, min_samples=8)
    # b_mem = 10 with 12 running: the bound stays 10 (the floor is the batch's, below)
    assert m.update(obs(running=12, waiting=3)) == (10, "memory")
    assert m.update(obs(running=2, waiting=3, n=100000)) == (32, "memory")  # 1000 -> B_max


def test_algorithm1_waits_for_demand_samples():
    m = MemoryBound(eps_m=0.05, b_max=16, min_samples=8)
    assert m.update(obs(samples=7)) == (16, "memory_no_data")
    assert m.update(obs(samples=8)) == (10, "memory")


# ---------------------------------------------------------------- Algorithm 2
def sla(**kw):
    args = dict(sla_s=0.050, eps_s=0.005, alpha=2, delta=1, b_min=1, b_max=32)
    args.update(kw)
    return SlaBound(**args)


def test_algorithm2_binary_search_by_hand():
    s = sla()
    assert (s.low, s.high) == (1, 32)
    # T = 80 ms > 55: high = max(b_bar=20, low+alpha=3) = 20; low = max(1-1, 1) = 1 -> mid 10
    assert s.update(obs(running=4, tbt=0.080, bbar=20.0)) == (10, "sla_over")
    assert (s.low, s.high) == (1, 20)
    # T = 30 ms < 45: low = min(b_bar=10, high-alpha=18) = 10; high = min(20+1, 32) = 21 -> 15
    assert s.update(obs(running=4, tbt=0.030, bbar=10.0)) == (15, "sla_under")
    assert (s.low, s.high) == (10, 21)
    # T = 50 ms within +-5: high = min(15+1, 32) = 16; low = max(15-1, 1) = 14 -> 15
    assert s.update(obs(running=4, tbt=0.050, bbar=15.0)) == (15, "sla_hold")
    assert (s.low, s.high) == (14, 16)
    # b_bar rounds to the nearest integer: 14.6 -> 15
    assert s.update(obs(running=4, tbt=0.052, bbar=14.6)) == (15, "sla_hold")


def test_algorithm2_boundaries_of_the_tolerance_band():
    # binary-exact numbers so D +- eps are exact: band [0.25, 0.75]
    s = sla(sla_s=0.5, eps_s=0.25)
    # exactly D_SLA + eps_D is not "over" (strict >): the interval narrows instead
    assert s.update(obs(running=1, tbt=0.75, bbar=8.0))[1] == "sla_hold"
    assert s.update(obs(running=1, tbt=0.7501, bbar=8.0))[1] == "sla_over"
    assert s.update(obs(running=1, tbt=0.25, bbar=8.0))[1] == "sla_hold"
    assert s.update(obs(running=1, tbt=0.2499, bbar=8.0))[1] == "sla_under"


def test_algorithm2_interval_stays_within_bounds():
    s = sla()
    s.update(obs(running=4, tbt=0.080, bbar=20.0))            # -> [1, 20], mid 10
    # 18 running do not move the midpoint: the floor applies to the batch size
    assert s.update(obs(running=18, tbt=0.080, bbar=18.0)) == (9, "sla_over")
    t = sla(b_max=8)
    for _ in range(20):                                       # light load keeps rising
        b, _ = t.update(obs(running=1, tbt=0.010, bbar=1.0))
    assert b <= 8 and t.high == 8 and t.low >= 1


def test_algorithm2_keeps_interval_without_decode_data():
    s = sla()
    assert s.update(obs(running=0, waiting=0, tbt=None, bbar=None)) == (16, "initial")
    assert (s.low, s.high) == (1, 32)


def test_algorithm2_converges_to_bmin_when_sla_unreachable():
    s = sla(b_min=2)
    for _ in range(40):
        b, r = s.update(obs(running=0, tbt=0.500, bbar=4.0))
    # high = max(b_bar, low + alpha) = max(4, 4); low decays by delta to B_min = 2
    assert (s.low, s.high, b, r) == (2, 4, 3, "sla_over")


# ---------------------------------------------------------------- combined
def policy(sla_bound=None, **kw):
    args = dict(ceiling=32, b_min=1, b_max=32, memory=MemoryBound(0.05, 32, 8),
                sla=sla_bound, max_num_batched_tokens=2048, min_chunk_tokens=32)
    args.update(kw)
    return BatchPolicy(**args)


def test_memory_alone_decides_without_sla():
    d = policy().decide(obs(running=4, waiting=4, std=20.0))
    assert (d.target, d.cap, d.batch, d.reason, d.b_mem, d.b_sla) == (9, 9, 9, "memory", 9, None)
    assert (d.lower, d.upper, d.token_budget) == (1, 9, 2048)


def test_min_of_memory_and_sla():
    p = policy(sla_bound=sla())
    d = p.decide(obs(running=2, waiting=4, tbt=0.080, bbar=20.0))
    # b_mem = 10 (sigma 0), b_SLA = 10 -> tie goes to memory; cap 10
    assert (d.b_mem, d.b_sla, d.cap) == (10, 10, 10)
    d = p.decide(obs(running=2, waiting=4, tbt=0.080, bbar=6.0))
    # SLA: high = max(6, low+2=2) = 6, low = 1 -> 3; memory 10 -> min = 3 by SLA
    assert (d.b_mem, d.b_sla, d.cap, d.reason) == (10, 3, 3, "sla_over")
    assert (d.lower, d.upper) == (1, 6)


def test_batch_never_below_running_gate_never_above_ceiling():
    p = policy(ceiling=8, b_max=8, memory=MemoryBound(0.05, 8, 8))
    d = p.decide(obs(running=2, waiting=1, n=100000))
    assert (d.cap, d.batch) == (8, 8)                  # never above the ceiling
    p2 = policy()
    d = p2.decide(obs(running=20, waiting=3))           # b_mem 10 < 20 running
    # the batch size b_t = max(b*, N^d) = 20 (Alg. 1 line 6); the admission gate is
    # b* = 10, so the 20 drain to 10 as they finish and none is preempted
    assert (d.target, d.cap, d.batch, d.reason) == (10, 10, 20, "memory")
    assert d.inputs["draining"] is True
    # the token budget is sized for the 20 decodes that keep running
    assert d.token_budget == 2048


def test_gate_respects_bmin():
    p = policy(b_min=4, sla_bound=sla(b_min=4))
    for _ in range(30):
        d = p.decide(obs(running=0, waiting=5, tbt=0.5, bbar=4.0))
    assert (d.b_sla, d.cap, d.batch) == (5, 5, 5)


def test_no_waiting_no_running_holds_bmax():
    d = policy().decide(obs(running=0, waiting=0))
    assert (d.cap, d.reason) == (32, "hold_no_queue")


class LinearStep:
    """T(b, c) = 10 ms + 1 ms * b + 0.1 ms * c."""

    def largest_chunk_within(self, b, tbt_s, lo, hi, kv_tokens=0.0):
        c = math.floor((tbt_s - 0.010 - 0.001 * b) / 0.0001 + 1e-9)
        return min(max(c, lo), hi)


def test_token_budget_from_step_model_by_hand():
    # at cap 10 and D = 50 ms: c <= (0.050 - 0.010 - 0.010) / 0.0001 = 300 -> 10 + 300
    assert token_budget(10, 2048, 32, 0.050, LinearStep()) == 310
    # the budget never drops below cap + min chunk, never above the ceiling
    assert token_budget(10, 2048, 32, 0.015, LinearStep()) == 42
    assert token_budget(10, 200, 32, 0.050, LinearStep()) == 200
    assert token_budget(10, 2048, 32, 0.0, LinearStep()) == 2048   # no SLA
    assert token_budget(10, 2048, 32, 0.050, None) == 2048          # no model


def test_token_budget_rounds_down_to_its_granule():
    # 310 at granule 256 -> 256 (it still holds 10 decodes + a 32-token chunk); at
    # granule 128 -> 256; a granule whose multiple would not hold them keeps 310 (a
    # floor of 42 > 0 * 512); the full budget is never rounded
    assert token_budget(10, 2048, 32, 0.050, LinearStep(), granule=256) == 256
    assert token_budget(10, 2048, 32, 0.050, LinearStep(), granule=128) == 256
    assert token_budget(10, 2048, 32, 0.050, LinearStep(), granule=512) == 310
    assert token_budget(10, 300, 32, 0.050, LinearStep(), granule=256) == 300
    assert token_budget(10, 2048, 32, 0.050, LinearStep(), granule=0) == 310


# ---------------------------------------------------------------- the token budget wrapper
class LinearStepModelish(LinearStep):
    def predict_step_s(self, b, c, kv=0.0):
        return 0.010 + 0.001 * b + 0.0001 * c


def test_token_budget_wraps_any_policy():
    """The budget is a wrapper: around a static cap it sizes the chunk for the SLA
    from the decodes running (T(4, c) <= 50 ms - 2 ms margin -> c = 340), keeps the
    inner cap and reason, and says its learnt bias and what bound it; without an SLA
    the budget is the full one."""
    from tuned.policies.budget import TokenBudget
    from tuned.policies.registry import StaticPolicy

    wrapped = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                          min_chunk_tokens=32, sla_s=0.050, step_model=LinearStepModelish(),
                          margin_s=0.002)
    d = wrapped.decide(obs(running=4, waiting=0))
    assert (d.cap, d.reason, d.token_budget) == (16, "static", 4 + 340)
    assert d.inputs["budget_bias_s"] == 0.0
    assert d.inputs["budget_bound"] == "tpot"
    full = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                       min_chunk_tokens=32, sla_s=0.0, step_model=LinearStepModelish())
    assert full.decide(obs(running=4, waiting=8)).token_budget == 2048


def test_requests_waiting_behind_the_budget_get_chunks_sized_to_the_sla_itself():
    """Requests wait and the cap is not what holds them (full on no step of the
    window): the budget is, so the chunk is sized to the SLA itself, not 2 ms under it
    (T(4, c) <= 50 ms -> c = 360), and the closed-loop bias learnt while nothing
    waited is dropped. Once the cap binds, or nothing waits, the TPOT sizes it again
    (50 - 2 ms, less the bias)."""
    from tuned.policies.budget import TokenBudget
    from tuned.policies.registry import StaticPolicy

    wrapped = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                          min_chunk_tokens=32, sla_s=0.050, step_model=LinearStepModelish(),
                          margin_s=0.002)
    slow = Observation(num_running=4, num_waiting=0, kv_capacity_blocks=1000,
                       demand_mean=100.0, demand_std=0.0, demand_samples=32,
                       tbt_mean_s=0.050, decode_batch_mean=4.0)
    d = wrapped.decide(slow)                  # mean 50 ms over 46: bias 0.5 * 4 ms
    assert (d.inputs["budget_bound"], d.inputs["budget_bias_s"]) == ("tpot", 0.002)
    assert d.token_budget == 4 + 320
    d = wrapped.decide(dataclasses.replace(slow, num_waiting=8))
    assert (d.inputs["budget_bound"], d.inputs["budget_bias_s"]) == ("ttft", 0.0)
    assert d.token_budget == 4 + 360
    d = wrapped.decide(dataclasses.replace(slow, num_running=16, num_waiting=8, binding=1.0))
    assert d.inputs["budget_bound"] == "tpot"          # the cap binds: the TPOT sizes it
    assert d.token_budget == 16 + 200                   # 48 ms less the new 2 ms bias
    none = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                       min_chunk_tokens=32, sla_s=0.0, step_model=LinearStepModelish())
    assert none.decide(obs(running=4, waiting=8)).inputs["budget_bound"] == "none"


def test_ttft_step_target_spends_the_windows_room_on_prefilling_steps():
    """Mean 40 ms of decode-only 30 ms and prefilling 60 ms steps: a third of the steps
    prefilled, f = (40 - 30) / (60 - 30). With the SLA at 50 ms they may take
    60 + (50 - 40) * 3 = 90 ms before the mean reaches it. No room (the mean at the SLA
    or over it), no prefilling step, or prefilling steps no slower: the SLA itself."""
    from tuned.policies.budget import ttft_step_target

    assert ttft_step_target(0.050, 0.040, 0.030, 0.060) == pytest.approx(0.090)
    assert ttft_step_target(0.050, 0.050, 0.030, 0.060) == 0.050
    assert ttft_step_target(0.050, 0.055, 0.030, 0.080) == 0.050
    assert ttft_step_target(0.050, 0.040, 0.030, None) == 0.050
    assert ttft_step_target(0.050, None, 0.030, 0.060) == 0.050
    assert ttft_step_target(0.050, 0.040, 0.040, 0.040) == 0.050
    # prefilling steps well under the SLA and rare: never below the SLA
    assert ttft_step_target(0.050, 0.0201, 0.020, 0.021) == pytest.approx(0.320)
    assert ttft_step_target(0.050, 0.030, 0.010, 0.012) == 0.050


def test_waiting_requests_get_the_windows_room_in_their_chunks():
    """The same wrapper as above with the window's mean 40 ms of 30 ms decode-only and
    60 ms prefilling steps: the prefilling step may take 90 ms, so
    T(4, c) = 14 ms + 0.1 ms c <= 90 ms -> c = 760 (bound ``ttft``); the same window
    with nothing waiting keeps the TPOT sizing (48 ms, c = 340)."""
    from tuned.policies.budget import TokenBudget
    from tuned.policies.registry import StaticPolicy

    wrapped = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                          min_chunk_tokens=32, sla_s=0.050, step_model=LinearStepModelish(),
                          margin_s=0.002)
    roomy = Observation(num_running=4, num_waiting=8, kv_capacity_blocks=1000,
                        demand_mean=100.0, demand_std=0.0, demand_samples=32,
                        tbt_mean_s=0.040, decode_batch_mean=4.0, decode_only_tbt_s=0.030,
                        mixed_tbt_s=0.060)
    d = wrapped.decide(roomy)
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 760)
    d = wrapped.decide(dataclasses.replace(roomy, num_waiting=0))
    assert (d.inputs["budget_bound"], d.token_budget) == ("tpot", 4 + 340)


def test_a_prompt_part_computed_gets_the_windows_room_in_its_chunks():
    """A long prompt admitted alone is running, not waiting, and still has no first
    token: with one such request and nothing in the queue the chunk is sized as for a
    waiting one (bound ``ttft``, the window's room: c = 760); once its prompt is all
    computed the TPOT sizes the chunk again (c = 340). With a ``granule`` (a GPU's
    stepped step time) a part-computed prompt does not, a queued one does."""
    from tuned.policies.budget import TokenBudget
    from tuned.policies.registry import StaticPolicy

    wrapped = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                          min_chunk_tokens=32, sla_s=0.050, step_model=LinearStepModelish(),
                          margin_s=0.002)
    mid = Observation(num_running=4, num_waiting=0, kv_capacity_blocks=1000,
                      demand_mean=100.0, demand_std=0.0, demand_samples=32,
                      tbt_mean_s=0.040, decode_batch_mean=4.0, decode_only_tbt_s=0.030,
                      mixed_tbt_s=0.060, prefilling=1)
    d = wrapped.decide(mid)
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 760)
    assert d.inputs["prefilling"] == 1
    d = wrapped.decide(dataclasses.replace(mid, prefilling=0))
    assert (d.inputs["budget_bound"], d.token_budget) == ("tpot", 4 + 340)
    # the cap binds: the TPOT sizes the chunks whatever is prefilling
    d = wrapped.decide(dataclasses.replace(mid, num_running=16, binding=1.0))
    assert d.inputs["budget_bound"] == "tpot"
    # a GPU's stepped step time (granule): only a queued request sizes for the TTFT
    wrapped.granule = 256
    d = wrapped.decide(mid)
    assert d.inputs["budget_bound"] == "tpot"
    d = wrapped.decide(dataclasses.replace(mid, num_waiting=2))
    assert d.inputs["budget_bound"] == "ttft"


def test_policy_told_whether_the_budget_can_act():
    """An inner policy with ``budget_acts`` learns each tick whether the budget can
    act: not where even one decode beside the smallest chunk misses the SLA."""
    from tuned.policies.budget import TokenBudget

    slow = LinearStepModelish()
    inner = policy(sla_bound=sla())
    wrapped = TokenBudget(inner, max_num_batched_tokens=2048, min_chunk_tokens=32,
                          sla_s=0.012, step_model=slow)       # T(1, 32) = 14.2 ms > 12
    wrapped.decide(obs(running=2, waiting=4))
    assert inner.budget_acts is False
    wrapped.sla_s = 0.050
    wrapped.decide(obs(running=2, waiting=4))
    assert inner.budget_acts is True


def test_a_cap_that_does_not_bind_yields_to_the_budget():
    """vLLM's budget must hold the cap's decodes plus a token. A cap above the
    SLA-sized budget (static 512 with 4 running and 8 waiting that the cap does not
    hold: the chunk sized to the SLA itself, 4 + 360 = 364) yields to the
    budget less one chunk (364 - 32 = 332) rather than holding the budget at
    cap + 1 = 513; the decision says so and keeps the inner cap in its inputs. Never
    below the requests running: with 100 running no chunk holds the SLA, the budget
    is 100 + the 32-token floor and the cap the 100 running."""
    from tuned.policies.budget import TokenBudget
    from tuned.policies.registry import StaticPolicy

    wrapped = TokenBudget(StaticPolicy(512, 2048), max_num_batched_tokens=2048,
                          min_chunk_tokens=32, sla_s=0.050, step_model=LinearStepModelish(),
                          margin_s=0.002)
    d = wrapped.decide(obs(running=4, waiting=8))
    assert (d.cap, d.token_budget, d.reason) == (332, 364, "budget_room")
    assert d.inputs["cap_before_budget"] == 512
    d = wrapped.decide(obs(running=100, waiting=8))
    assert (d.cap, d.token_budget, d.batch) == (100, 132, 100)
    # a cap already within the budget is the inner policy's, reason and all
    small = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                        min_chunk_tokens=32, sla_s=0.050, step_model=LinearStepModelish(),
                        margin_s=0.002)
    d = small.decide(obs(running=4, waiting=8))
    assert (d.cap, d.reason) == (16, "static")


def test_waiting_requests_chunks_follow_what_the_prefilling_steps_measure():
    """The online fit says T(4, c) = 14 ms + 0.1 ms c, and the window's room lets a
    prefilling step take 90 ms (above: c = 760). Where the window's prefilling steps
    ran 10 ms faster than the fit predicts for them, the chunk is sized for 100 ms
    (c = 860); 20 ms slower, for 70 ms (c = 560). A profile's model (not the fit the
    residual was measured against) is left as it is."""
    from tuned.policies.budget import TokenBudget
    from tuned.policies.registry import StaticPolicy

    fit = LinearStepModelish()
    wrapped = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                          min_chunk_tokens=32, sla_s=0.050, margin_s=0.002)
    roomy = Observation(num_running=4, num_waiting=8, kv_capacity_blocks=1000,
                        demand_mean=100.0, demand_std=0.0, demand_samples=32,
                        tbt_mean_s=0.040, decode_batch_mean=4.0, decode_only_tbt_s=0.030,
                        mixed_tbt_s=0.060, step_model=fit)
    d = wrapped.decide(dataclasses.replace(roomy, prefill_residual_s=-0.010))
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 860)
    assert d.inputs["prefill_residual_s"] == -0.010
    d = wrapped.decide(dataclasses.replace(roomy, prefill_residual_s=0.020))
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 560)
    assert wrapped.decide(roomy).token_budget == 4 + 760
    d = wrapped.decide(dataclasses.replace(roomy, prefill_residual_s=0.5))
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 32)   # the floor
    profiled = TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                           min_chunk_tokens=32, sla_s=0.050, step_model=fit, margin_s=0.002)
    d = profiled.decide(dataclasses.replace(roomy, step_model=None,
                                            prefill_residual_s=-0.010))
    assert d.token_budget == 4 + 760
