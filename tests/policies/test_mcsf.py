"""MC-SF (Jaillet et al., Algorithm 1, inequality 5) on hand-built request sets."""

import random

import pytest

from tuned.policies.mcsf import MCSFPolicy, lookahead_peak, lookahead_peak_blocks
from tuned.core.queue_policy import AdmitContext, ReqInfo


def R(rid, s, pred, out=0, t=0.0, max_tokens=1000):
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=s, max_tokens=max_tokens,
                   predicted_output=pred, output_tokens=out)


def ctx(m, now=0.0):
    return AdmitContext(now_s=now, kv_capacity_tokens=m, kv_free_tokens=m, cap=64)


def admit_round(policy, waiting, running, c):
    """One MC-SF round the way the engine adapter drives it: select, admit, repeat."""
    ordered = policy.order(waiting, c.now_s, c)
    admitted, verdicts = [], []
    while ordered:
        sel = policy.select(ordered, running, admitted, c)
        verdicts.append(sel.verdict)
        if sel.chosen is None:
            break
        admitted.append(sel.chosen)
        ordered = [r for r in ordered if r is not sel.chosen]
    return [r.request_id for r in admitted], verdicts


def test_inequality_5_zero_slack_admits_and_one_more_token_refuses():
    # Running A: s=10, 2 tokens generated (t - p_A = 2), õ=5 -> 3 steps left.
    # Candidate B: s=4, õ=6. Completion times t' = t+3 (A) and t+6 (B).
    # t' = t+3: A (10 + 5)·1[5 >= 5] = 15, B (4 + 3)·1[6 >= 3] = 7  -> 22
    # t' = t+6: A 1[5 >= 8] = 0,          B (4 + 6)                 -> 10
    # peak 22: M = 22 fits with zero slack.
    a = R("A", 10, 5, out=2)
    p = MCSFPolicy()
    v = p.admit(R("B", 4, 6), [a], [], ctx(22))
    assert v.admit and "peak 22 <= M=22 tokens at +3 steps" in v.reason
    # one more prompt token -> 23 > 22 at t+3
    v = p.admit(R("B", 5, 6), [a], [], ctx(22))
    assert not v.admit and "23 > M=22 tokens at +3 steps" in v.reason
    # same set, one token less of memory
    assert not p.admit(R("B", 4, 6), [a], [], ctx(21)).admit


def test_shortest_predicted_first_and_stop_at_first_that_does_not_fit():
    # Nothing running. Order by õ: X(õ=2, s=10), Y(õ=3, s=50), Z(õ=8, s=1), W(õ=9, s=0).
    # {X}:       d=2: 12                                   -> 12
    # {X,Y}:     d=3: 53;  d=2: 12 + 52 = 64                -> 64
    # {X,Y,Z}:   d=8: 9;   d=3: 53 + 4 = 57; d=2: 12+52+3 = 67 -> 67 > 66
    # Z is refused and the round stops, although {X,Y,W} would fit
    # (d=9: 9; d=3: 53 + 3 = 56; d=2: 12 + 52 + 2 = 66 <= 66): no skipping.
    waiting = [R("Z", 1, 8, t=0), R("W", 0, 9, t=1), R("Y", 50, 3, t=2), R("X", 10, 2, t=3)]
    p = MCSFPolicy()
    ids, verdicts = admit_round(p, waiting, [], ctx(66))
    assert ids == ["X", "Y"]
    assert "67 > M=66 tokens at +2 steps" in verdicts[-1].reason
    # M=67: Z fits with zero slack; then {X,Y,Z,W} peaks at d=2: 67 + 2 = 69 > 67
    ids, _ = admit_round(p, waiting, [], ctx(67))
    assert ids == ["X", "Y", "Z"]


def test_order_ties_broken_by_arrival():
    p = MCSFPolicy()
    out = p.order([R("late", 1, 5, t=2.0), R("early", 1, 5, t=1.0), R("short", 1, 4, t=3.0)],
                  0.0)
    assert [r.request_id for r in out] == ["short", "early", "late"]


def test_running_request_past_its_prediction_still_holds_memory():
    # A: s=10, 7 generated, õ=5 (already outran it) -> planned to finish in 1 step,
    # holding 10 + 7 + 1 = 18 then. Candidate C: s=2, õ=1 -> 3 at d=1. Peak 21.
    a = R("A", 10, 5, out=7)
    p = MCSFPolicy()
    assert p.admit(R("C", 2, 1), [a], [], ctx(21)).admit
    assert not p.admit(R("C", 2, 1), [a], [], ctx(20)).admit


def test_admitted_this_step_counts_like_running():
    # U = {B} admitted this step (s=4, õ=6), candidate D (s=0, õ=6):
    # d=6: (4+6) + (0+6) = 16
    p = MCSFPolicy()
    b = R("B", 4, 6)
    assert p.admit(R("D", 0, 6), [], [b], ctx(16)).admit
    assert not p.admit(R("D", 0, 6), [], [b], ctx(15)).admit


def test_liveness_admits_oversized_head_only_when_nothing_runs():
    p = MCSFPolicy()
    big = R("big", 100, 100)                      # alone: 200 at d=100
    sel = p.select([big], [], [], ctx(150))
    assert sel.chosen is big and "liveness" in sel.verdict.reason
    sel = p.select([big], [R("run", 1, 5)], [], ctx(150))
    assert sel.chosen is None and sel.refused == (big,)


def test_reserve_fraction_shrinks_m():
    p = MCSFPolicy(reserve_fraction=0.1)
    assert p.memory_limit_blocks(ctx(100)) == 90      # block size 1: tokens
    a = R("A", 0, 10, out=0)
    # {A, B}: d=10: 10 + (80 + 10) = 100 > 90
    assert not p.admit(R("B", 80, 10), [a], [], ctx(100)).admit
    assert MCSFPolicy().admit(R("B", 80, 10), [a], [], ctx(100)).admit


def test_lookahead_peak_equals_brute_force_over_all_future_steps():
    rng = random.Random(7)
    for _ in range(200):
        items = [(rng.randint(0, 50), rng.randint(1, 40)) for _ in range(rng.randint(1, 12))]
        brute = max(sum(h + d for h, r in items if r >= d)
                    for d in range(1, max(r for _, r in items) + 1))
        assert lookahead_peak(items)[0] == brute


def test_lookahead_in_blocks_equals_brute_force():
    rng = random.Random(11)
    for _ in range(300):
        bs = rng.choice([2, 3, 16, 128])
        items = [(rng.randint(0, 400), rng.randint(1, 300)) for _ in range(rng.randint(1, 12))]
        brute = max(sum(-(-(h + d) // bs) for h, r in items if r >= d)
                    for d in range(1, max(r for _, r in items) + 1))
        assert lookahead_peak_blocks(items, bs)[0] == brute


def test_plans_in_blocks_not_tokens():
    """With 47 blocks of 128 tokens and 30 requests of prompt 100 and
    output 100 (exact predictions), planning in tokens admits all 30 (6000 <= 6016
    tokens) though they need 60 blocks; in blocks, 23 fit (2 blocks each)."""
    p = MCSFPolicy(reserve_fraction=0.0)
    c = AdmitContext(now_s=0.0, kv_capacity_tokens=47 * 128, kv_free_tokens=47 * 128,
                     cap=64, block_size=128)
    waiting = [R(f"w{i}", 100, 100, out=0) for i in range(30)]
    admitted = []
    for cand in waiting:
        if not p.admit(cand, [], admitted, c).admit:
            break
        admitted.append(cand)
    assert len(admitted) == 23
    assert "blocks" in p.admit(waiting[23], [], admitted, c).reason


def test_auto_reserve_follows_measured_under_prediction():
    p = MCSFPolicy()       # reserve_fraction = "auto"
    base = dict(now_s=0.0, kv_capacity_tokens=1000, kv_free_tokens=1000, cap=8)
    assert p.memory_limit_blocks(AdmitContext(**base)) == 1000
    assert p.memory_limit_blocks(AdmitContext(**base, under_prediction=0.2)) == 800
    assert p.memory_limit_blocks(AdmitContext(**base, under_prediction=0.9)) == 500  # capped


def test_options_validated():
    with pytest.raises(ValueError, match=r'reserve_fraction must be "auto" or in \[0, 1\)'):
        MCSFPolicy(reserve_fraction=1.0)
    with pytest.raises(ValueError, match=r"mcsf: unknown option\(s\) alpha"):
        MCSFPolicy.from_options({"alpha": 0.1})
