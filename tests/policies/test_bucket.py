"""BucketServe: Eqs. 1, 5, 6 and Algorithm 1 split/merge on crafted sets."""

import pytest

from tuned.policies.bucket import (BucketPolicy, adjust_buckets, kv_bytes_per_token, n_max,
                                   n_max_exact, safe_memory)
from tuned.core.queue_policy import AdmitContext, ReqInfo


def R(rid, seq, t, prompt=0):
    """A request whose BucketServe length S = prompt + predicted output = seq."""
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=prompt, max_tokens=10_000,
                   predicted_output=seq - prompt)


def ctx(free, now=0.0):
    return AdmitContext(now_s=now, kv_capacity_tokens=10_000, kv_free_tokens=free, cap=64)


# ---------------------------------------------------------------- Eqs. 1, 5, 6
def test_kv_bytes_and_n_max():
    # Eq. 1 per token, Llama-2-7B-like: 2 * 32 layers * 32 heads * 128 dim * 2 bytes
    assert kv_bytes_per_token(32, 32, 128, 2) == 524_288
    assert safe_memory(1000) == pytest.approx(900)
    # tokens (bytes per token = 1): floor(0.9 * 1000 / 45) = floor(20.0) = 20
    assert n_max(1000, 1, 45) == 20
    assert n_max(1000, 1, 46) == 19                  # 900 / 46 = 19.56
    # bytes: 10 GiB free, 1000-token sequences: 0.9*10737418240 / (524288*1000) = 18.43
    assert n_max(10 * 2**30, 524_288, 1000) == 18
    # Eq. 6 exactly: S = 100, 200, 300, 400 against 900 safe tokens -> 100+200+300 = 600
    assert n_max_exact(1000, 1, [100, 200, 300, 400]) == 3
    assert n_max_exact(1000, 1, [100, 200, 300, 300]) == 4   # 900 <= 900


# ---------------------------------------------------------------- Algorithm 1
def test_split_when_lopsided_and_large():
    # one bucket [0,100), mid 50; S < 50: 10,20,30,40 = 4/6 > 0.5 and 6 > N_max=3
    assert adjust_buckets([(0, 100)], [10, 20, 30, 40, 60, 70], 3, 100) == [(0, 50), (50, 100)]


def test_no_split_when_balanced_or_small_or_exactly_theta():
    assert adjust_buckets([(0, 100)], [10, 20, 60, 70, 80, 90], 3, 100) == [(0, 100)]   # 2/6
    assert adjust_buckets([(0, 100)], [10, 20, 30, 60, 70, 80], 3, 100) == [(0, 100)]   # 3/6
    # 4 requests, N_max = 4: total not < N_max (no merge), |b| = 4 not > 4 (no split)
    assert adjust_buckets([(0, 100)], [10, 20, 30, 60], 4, 100) == [(0, 100)]


def test_second_pass_splits_again_and_merge_when_load_falls():
    b = adjust_buckets([(0, 50), (50, 100)], [5, 10, 15, 20, 30, 60], 3, 100)
    # bucket [0,50): 5,10,15,20,30 -> mid 25, 4/5 below, 5 > 3 -> split; [50,100): 1 request
    assert b == [(0, 25), (25, 50), (50, 100)]
    # 2 requests < N_max = 3 -> everything merges into [0, L_max]
    assert adjust_buckets(b, [10, 20], 3, 100) == [(0, 100)]


def test_n_max_reads_nvml_free_memory_where_known():
    """M_remain is NVML's free memory in KV tokens where the engine knows it (at most
    the free KV), else the free KV cache; Eq. 6 admission reads the free KV."""
    reqs = [R(f"r{s}", s, float(i)) for i, s in enumerate([10, 20, 30, 40, 60, 70])]
    p = BucketPolicy(max_len_tokens=100)
    free_kv = AdmitContext(now_s=0.0, kv_capacity_tokens=10_000, kv_free_tokens=10_000,
                           cap=64)
    # mean S = 38.33: the free KV alone gives floor(0.9 * 10000 / 38.33) = 234
    assert p.compute_n_max(reqs, free_kv) == 234
    # NVML: 100 tokens' worth of device memory free -> floor(0.9 * 100 / 38.33) = 2
    nvml = AdmitContext(now_s=0.0, kv_capacity_tokens=10_000, kv_free_tokens=10_000,
                        cap=64, gpu_free_tokens=100)
    assert p.compute_n_max(reqs, nvml) == 2
    # more device memory free than KV: the KV pool is what vLLM allocates from
    more = AdmitContext(now_s=0.0, kv_capacity_tokens=10_000, kv_free_tokens=100,
                        cap=64, gpu_free_tokens=10**9)
    assert p.compute_n_max(reqs, more) == 2
    assert p.admit(R("a", 50, 0.0), [], [], nvml).admit


def test_policy_refresh_uses_n_max_from_free_kv():
    reqs = [R(f"r{s}", s, float(i)) for i, s in enumerate([10, 20, 30, 40, 60, 70])]
    p = BucketPolicy(max_len_tokens=100)
    for r in reqs:
        p.observe_arrival(r)
    # mean S = 230/6 = 38.33; N_max = floor(0.9 * 100 / 38.33) = floor(2.35) = 2
    assert p.refresh(reqs, ctx(free=100)) is True
    assert p.n_max == 2
    assert p.bounds == [(0, 50), (50, 100)]
    p.order(reqs, 0.0)
    assert p.stats.buckets_in_use == 2
    # plenty of free KV: N_max = floor(0.9 * 10000 / 38.33) = 234 > 6 -> merge, but
    # only once adjust_interval_s (0.1 s) has passed
    assert p.refresh(reqs, ctx(free=10_000, now=0.05)) is False
    assert p.bounds == [(0, 50), (50, 100)]
    assert p.refresh(reqs, ctx(free=10_000, now=0.1)) is True
    assert p.bounds == [(0, 100)]


def test_l_max_defaults_to_longest_sequence_seen():
    p = BucketPolicy()
    p.observe_arrival(R("a", 70, 0.0))
    p.observe_arrival(R("b", 30, 1.0))
    assert p.l_max == 70 and p.bounds == [(0, 70)]


# ---------------------------------------------------------------- ordering
ORDER_REQS = [R("a", 60, 0.0), R("b", 10, 1.0), R("c", 20, 2.0), R("d", 55, 3.0)]


def _split_policy(mode):
    p = BucketPolicy(mode=mode, max_len_tokens=100)
    p.bounds = [(0, 50), (50, 100)]
    return p


def test_online_earliest_arrival_bucket_first_fcfs_inside():
    # bucket [50,100) holds a (t=0), the earliest arrival -> served first
    out = _split_policy("online").order(ORDER_REQS, 5.0)
    assert [r.request_id for r in out] == ["a", "d", "b", "c"]


def test_offline_sjf_and_ljf_inside_buckets():
    out = _split_policy("offline_sjf").order(ORDER_REQS, 5.0)
    assert [r.request_id for r in out] == ["d", "a", "b", "c"]
    out = _split_policy("offline_ljf").order(ORDER_REQS, 5.0)
    assert [r.request_id for r in out] == ["a", "d", "c", "b"]


# ---------------------------------------------------------------- admission
def test_eq6_gate_zero_slack_and_one_token_over():
    p = _split_policy("online")
    # free 100 -> safe 90; admitted this step S=40 (bucket 1)
    first = R("x", 40, 0.0)
    v = p.admit(R("y", 50, 1.0), [], [first], ctx(free=100))
    assert v.admit is False and "one bucket per step" in v.reason     # 50 is bucket 2
    v = p.admit(R("y", 49, 1.0), [], [R("x", 41, 0.0)], ctx(free=100))
    assert v.admit and "90 <= 90" in v.reason                          # 41 + 49 = 90
    v = p.admit(R("y", 49, 1.0), [], [R("x", 42, 0.0)], ctx(free=100))
    assert not v.admit and "91 > 0.9 x 100 free tokens" in v.reason


def test_bad_mode_rejected():
    with pytest.raises(ValueError, match="mode must be one of online, offline_sjf, offline_ljf"):
        BucketPolicy(mode="fifo")
