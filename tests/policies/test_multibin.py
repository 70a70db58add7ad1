"""Multi-bin batching: Lemma 4.1 boundaries, Theorems 4.2/4.3, serving order."""

import pytest

from tuned.policies.multibin import (MultiBinPolicy, bin_of, bins_for_target, c_max,
                                     equal_mass_boundaries, expected_latency,
                                     multibin_throughput)
from tuned.core.queue_policy import AdmitContext, ReqInfo


def R(rid, pred, t, s=10):
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=s, max_tokens=1000,
                   predicted_output=pred)


def ctx(cap, now=10.0):
    return AdmitContext(now_s=now, kv_capacity_tokens=10**6, kv_free_tokens=10**6, cap=cap)


# ---------------------------------------------------------------- Lemma 4.1
def test_equal_mass_boundaries_on_known_sample():
    sample = list(range(1, 101))          # 1..100
    b = equal_mass_boundaries(sample, 4)
    # ranks floor(j*100/4) = 25, 50, 75 of the sorted sample -> values 26, 51, 76
    assert b == [26, 51, 76]
    counts = [0] * 4
    for x in sample:
        counts[bin_of(x, b)] += 1
    assert counts == [25, 25, 25, 25]
    assert equal_mass_boundaries(sample, 1) == []
    assert equal_mass_boundaries([5] * 10, 3) == []       # all equal: one bin


def test_boundaries_follow_the_paper_for_uniform_lengths():
    # Lemma 4.1 for U[l_min, l_max]: l_i = l_min + i/k (l_max - l_min); with the
    # sample 0..999 and k=4: 250, 500, 750
    assert equal_mass_boundaries(list(range(1000)), 4) == [250, 500, 750]


# ---------------------------------------------------------------- Theorem 4.2
def test_theorem_4_2_throughput():
    # B=128, l in U[1, 20]: mean 10.5, gap = 128/129*20 + 1/129 - 10.5 = 2561/129 - 10.5
    gap = 2561 / 129 - 10.5                               # 9.352713...
    assert multibin_throughput(1, 128, 1, 20) == pytest.approx(128 * 129 / 2561)  # 6.4475
    assert multibin_throughput(1, 128, 1, 20) == pytest.approx(6.44748, abs=1e-5)
    assert multibin_throughput(5, 128, 1, 20) == pytest.approx(128 / (10.5 + gap / 5))
    assert multibin_throughput(5, 128, 1, 20) == pytest.approx(10.34716, abs=1e-5)
    assert c_max(128, 1, 20) == pytest.approx(12.190476, abs=1e-6)
    tps = [multibin_throughput(k, 128, 1, 20) for k in range(1, 50)]
    assert all(a < b for a, b in zip(tps, tps[1:]))       # increasing in k
    assert tps[-1] < c_max(128, 1, 20)


def test_theorem_4_3_bins_for_target():
    # target 0.9 c_max: eps = 0.1 c_max, k >= 0.9 * gap / (0.1 * 10.5) = 8.0166 -> 9
    assert bins_for_target(0.9, 128, 1, 20) == 9
    cm = c_max(128, 1, 20)
    assert multibin_throughput(9, 128, 1, 20) >= 0.9 * cm      # 11.0926 >= 10.9714
    assert multibin_throughput(8, 128, 1, 20) < 0.9 * cm       # 10.9692 <  10.9714
    # target 0.5 c_max: k >= 0.5 * 9.3527 / (0.5 * 10.5) = 0.8907 -> 1
    assert bins_for_target(0.5, 128, 1, 20) == 1
    assert bins_for_target(0.9, 128, 7, 7) == 1              # no spread, one bin


def test_lemma_5_1_latency():
    # k=2, lambda=10: 10.5 + gap/2 + 127*2/20 = 10.5 + 4.676357 + 12.7
    assert expected_latency(2, 128, 1, 20, 10.0) == pytest.approx(27.876357, abs=1e-6)


# ---------------------------------------------------------------- serving order
def _policy_with(reqs, **kw):
    kw.setdefault("k", 2)
    p = MultiBinPolicy(**kw)
    for r in reqs:
        p.observe_arrival(r)
    return p


REQS = [R("p", 1, 0.0), R("q", 3, 1.0), R("r", 4, 2.0), R("s", 2, 5.0)]
# predictions [1, 3, 4, 2] -> sorted [1, 2, 3, 4], k=2 boundary rank 2 -> 3:
# bin 1 = {p(õ=1,t=0), s(õ=2,t=5)}, bin 2 = {q(õ=3,t=1), r(õ=4,t=2)}


def test_first_completed_batch_first_served():
    p = _policy_with(REQS, max_wait_s=0)
    # B=2: bin 2 completes its batch when r arrives (t=2), bin 1 at t=5
    out = p.order(REQS, 10.0, ctx(cap=2))
    assert p.boundaries == [3]
    assert [r.request_id for r in out] == ["q", "r", "p", "s"]
    assert p.stats.bins_in_use == 2
    # B=3: no bin is complete -> bin whose head is oldest (p, t=0) first
    out = p.order(REQS, 10.0, ctx(cap=3))
    assert [r.request_id for r in out] == ["p", "s", "q", "r"]


def test_starvation_bound_overrides_bins():
    p = _policy_with(REQS, max_wait_s=9.5)
    out = p.order(REQS, 10.0, ctx(cap=2))   # p waited 10 s >= 9.5: first
    assert [r.request_id for r in out] == ["p", "q", "r", "s"]
    # next request to starve is q (arrived t=1): at t = 10.5
    assert not p.refresh(REQS, ctx(2, now=10.4))
    assert p.refresh(REQS, ctx(2, now=10.5))


def test_one_bin_per_step():
    p = _policy_with(REQS, max_wait_s=0)
    p.order(REQS, 10.0, ctx(cap=2))
    q, r, pp = REQS[1], REQS[2], REQS[0]
    v = p.admit(pp, [], [q], ctx(2))
    assert not v.admit and "one bin per step" in v.reason and "serves bin 2" in v.reason
    assert p.admit(r, [], [q], ctx(2)).admit
    assert MultiBinPolicy(k=2, one_bin_per_step=False).admit(pp, [], [q], ctx(2)).admit


def test_k_from_theorem_4_3():
    # recent predictions 1..20 (l_min=1, l_max=20), B = cap = 128, target 0.9 -> k = 9
    reqs = [R(f"r{i}", i, float(i)) for i in range(1, 21)]
    p = _policy_with([], k=0, target_fraction=0.9, k_max=16)
    for r in reqs:
        p.observe_arrival(r)
    p.order(reqs, 30.0, ctx(cap=128))
    assert p.k == 9
    assert len(p.boundaries) == 8
