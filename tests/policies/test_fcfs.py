"""FCFS, and its demotion of requests that already missed the TTFT target."""

from __future__ import annotations

import pytest

from tuned import config
from tuned.policies.fcfs import FCFSPolicy
from tuned.core.queue_policy import AdmitContext, ReqInfo


def R(rid, t):
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=10, max_tokens=10,
                   predicted_output=10)


def ctx(now):
    return AdmitContext(now_s=now, kv_capacity_tokens=1000, kv_free_tokens=1000, cap=8)


def test_plain_fcfs_is_arrival_order():
    p = FCFSPolicy()
    w = [R("c", 3.0), R("a", 1.0), R("b", 2.0)]
    assert [r.request_id for r in p.order(w, 100.0)] == ["a", "b", "c"]
    assert p.order_key(w[0]) == 3.0 and not p.refresh(w, ctx(100.0))


def test_late_requests_wait_behind_those_that_can_still_make_it():
    p = FCFSPolicy(late_after_s=2.0)
    w = [R("a", 0.0), R("b", 1.0), R("c", 2.5), R("d", 3.0)]
    for r in w:
        p.observe_arrival(r)
    # at t = 3.2: a (waited 3.2 s) and b (2.2 s) are late; c, d first, in arrival order
    assert [r.request_id for r in p.order(w, 3.2)] == ["c", "d", "a", "b"]
    assert p.stats.demoted == 2
    # the order is recomputed when the next on-time request turns late (c at 4.5)
    assert not p.refresh(w, ctx(4.4)) and p.refresh(w, ctx(4.5))
    assert [r.request_id for r in p.order(w, 4.6)] == ["d", "a", "b", "c"]
    assert p.stats.demoted == 3           # each request counted once
    assert p.order_key(w[0]) is None      # time-dependent order: no per-request key
    assert p.select(p.order(w, 4.6), [], [], ctx(4.6)).chosen.request_id == "d"


def test_ttft_sla_turns_on_the_demotion_for_fcfs_only():
    cfg = config.validate({"ttft_sla_s": 2.5})
    assert cfg.queue_spec() == ("fcfs", {"late_after_s": 2.5}) and not cfg.native_queue
    assert config.validate({}).native_queue
    own = config.validate({"ttft_sla_s": 2.5, "queue_options": {"late_after_s": 0.0}})
    assert own.queue_spec() == ("fcfs", {"late_after_s": 0.0})
    assert config.validate({"ttft_sla_s": 2.5, "queue_policy": "mcsf"}).queue_spec() == \
        ("mcsf", {})
    with pytest.raises(ValueError, match="late_after_s must be a number of seconds >= 0"):
        FCFSPolicy(late_after_s=-1)
