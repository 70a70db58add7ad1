"""The queue-policy interface, the registry and FCFS."""

import pytest

from tuned import config as config_mod
from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict
from tuned.policies.fcfs import FCFSPolicy
from tuned.policies.registry import QUEUE_POLICIES, make_policy, policy_class


def R(rid, t, s=10, pred=10, out=0, max_tokens=100):
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=s, max_tokens=max_tokens,
                   predicted_output=pred, output_tokens=out)


CTX = AdmitContext(now_s=0.0, kv_capacity_tokens=100, kv_free_tokens=100, cap=8)


def test_registry_matches_config_and_builds_every_policy():
    assert set(QUEUE_POLICIES) == set(config_mod.QUEUE_POLICIES)
    for name in QUEUE_POLICIES:
        p = make_policy(name, {}, rng_seed=1)
        assert p.name == name and isinstance(p, QueuePolicy)
        assert policy_class(name) is type(p)


def test_unknown_policy_and_option_errors():
    with pytest.raises(ValueError, match=r"unknown queue policy 'sjf' \(known: fcfs, mcsf, "
                                         r"multibin, bucket, saber, sglang\)"):
        make_policy("sjf")
    with pytest.raises(ValueError, match=r"saber: unknown option\(s\) size \(known: window, "
                                         r"default_deadline_s, use_predicted, running_check, "
                                         r"demoted, pace_s, refused, speed_limit_tok_s, "
                                         r"expiry_check_s, load, speed_curve\)"):
        make_policy("saber", {"size": 3})
    with pytest.raises(ValueError, match="saber: window must be an integer >= 1, got 0"):
        make_policy("saber", {"window": 0})
    with pytest.raises(ValueError, match="saber: window must be an integer >= 1, got '3'"):
        make_policy("saber", {"window": "3"})


def test_fcfs_arrival_order_stable_and_always_admits():
    p = FCFSPolicy()
    out = p.order([R("b", 2.0), R("a", 1.0), R("c", 2.0)], 0.0)
    assert [r.request_id for r in out] == ["a", "b", "c"]
    running = [R(f"r{i}", 0.0, s=1000) for i in range(50)]
    sel = p.select(out, running, [], CTX)
    assert sel.chosen.request_id == "a" and sel.verdict == Verdict(True, "fcfs: always admit")


def test_remaining_predicted():
    assert R("a", 0, pred=10, out=4).remaining_predicted == 6
    assert R("a", 0, pred=10, out=12).remaining_predicted == 1     # outran its prediction
    assert R("a", 0, pred=10, out=100).remaining_predicted == 0    # at max_tokens
    assert R("a", 0, s=7, pred=10).seq_tokens == 17


def test_stats_counters():
    p = FCFSPolicy()
    p.on_admitted(R("a", 0), 0.0)
    p.on_deferred(R("b", 0), Verdict(False, "because"))
    assert p.stats.as_dict() == {"admitted": 1, "deferred": 1, "demoted": 0, "bins_in_use": 0,
                                 "buckets_in_use": 0, "last_reason": "because"}
