"""fcfs with a TTFT target keeps its tiers incrementally (tuned.policies.fcfs.TieredOrder)
and the result is the full re-sort's, on random inputs: the order, the demotion
count, the next lateness time; and a QueueCore driven with and without it makes the
same pops. Arrival times are drawn from a coarse grid so that ties are common."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuned.core import queue as queue_mod
from fakes import QueuedReq
from tuned.core.queue import QueueCore
from tuned.curves.online import LinearStepModel
from tuned.policies.fcfs import FCFSPolicy, TieredOrder
from tuned.core.queue_policy import AdmitContext, ReqInfo

MODELS = (None, LinearStepModel(a=0.02, beta=0.005, gamma=0.001),
          LinearStepModel(a=0.01, beta=0.002, gamma=0.004, eta=1e-6))
LATE_AFTER_S = 2.0
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def ctx(now_s: float, model, budget: int = 256, running: int = 2,
        backlog: int = 0) -> AdmitContext:
    return AdmitContext(now_s=now_s, kv_capacity_tokens=1 << 16, kv_free_tokens=1 << 15,
                        cap=32, step_model=model, token_budget=budget, num_running=running,
                        prefill_backlog_tokens=backlog)


# one operation: ("add", arrival, prompt) | ("drop", index, forget) | ("order", dt, model,
# budget, running, backlog)
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40).map(lambda k: k * 0.25),
              st.integers(1, 900)),
    st.tuples(st.just("drop"), st.integers(0, 1000), st.booleans()),
    st.tuples(st.just("order"), st.sampled_from([0.0, 0.05, 0.3, 1.0, 2.5]),
              st.integers(0, len(MODELS) - 1), st.sampled_from([0, 64, 256, 2048]),
              st.integers(0, 8), st.integers(0, 3000)),
), min_size=1, max_size=80)


def state(p: FCFSPolicy) -> tuple:
    return p.stats.demoted, p._next_late_s, sorted(p._late)


@SETTINGS
@given(ops)
def test_tiered_order_equals_the_full_sort(script):
    ref, pol = FCFSPolicy(late_after_s=LATE_AFTER_S), FCFSPolicy(late_after_s=LATE_AFTER_S)
    live = pol.live_order()
    assert isinstance(live, TieredOrder)
    members: dict[str, ReqInfo] = {}      # join order, as QueueCore's dict keeps it
    now, n = 0.0, 0
    got = want = None                     # the last order, while no request has joined
    for op in script:
        if op[0] == "add":
            info = ReqInfo(f"r{n}", now - op[1], op[2], 16, 16)
            n += 1
            members[info.request_id] = info
            for p in (ref, pol):
                p.observe_arrival(info)
            live.add(info)
            got = want = None
        elif op[0] == "drop" and members:
            rid = list(members)[op[1] % len(members)]
            del members[rid]
            live.discard(rid)
            if got is not None:           # the list handed out loses it, as a cache would
                want = [r for r in want if r != rid]
                assert [r.request_id for r in got] == want
            if op[2]:                     # removed (aborted), else popped and kept
                ref.forget(rid)
                pol.forget(rid)
        elif op[0] == "order":
            now += op[1]
            c = ctx(now, MODELS[op[2]], op[3], op[4], op[5])
            want = ref.order(list(members.values()), now, c)
            got = live.order(now, c)
            want = [r.request_id for r in want]
            assert [r.request_id for r in got] == want
            assert state(pol) == state(ref)
    assert len(live) == len(members)


Req = QueuedReq


queue_ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40).map(lambda k: k * 0.25),
              st.integers(1, 900)),
    st.tuples(st.just("pop"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("remove"), st.integers(0, 1000)),
    st.tuples(st.just("preempt"), st.integers(0, 1000)),
    st.tuples(st.just("switch"), st.sampled_from([0.0, LATE_AFTER_S, 1.0])),
    st.tuples(st.just("step"), st.sampled_from([0.0, 0.1, 0.7, 2.5]),
              st.integers(0, len(MODELS) - 1)),
), min_size=1, max_size=60)


def drive(script, live: bool, monkeypatch) -> list:
    """Run ``script`` on a QueueCore over fcfs with a TTFT target; returns what it
    popped, in order, and its order after each step."""
    if not live:
        monkeypatch.setattr(queue_mod, "live_order_of", lambda policy: None)
    q = QueueCore(FCFSPolicy(late_after_s=LATE_AFTER_S))
    assert (q._live is not None) == live
    monkeypatch.undo()
    running: list[Req] = []
    log: list = []
    now, n = 0.0, 0
    reqs: dict[str, Req] = {}
    for op in script:
        if op[0] == "add":
            r = reqs[f"r{n}"] = Req(f"r{n}", now - op[1], op[2])
            n += 1
            q.add_request(r)
        elif op[0] == "pop":          # pop a few, hand some back (vLLM's skipped ones)
            popped = [q.pop_request() for _ in range(min(op[1], len(q)))]
            back = popped[:op[2]]
            q.prepend_requests(back)
            running.extend(r for r in popped if r not in back)
            log.append(("pop", [r.request_id for r in popped], [r.request_id for r in back]))
        elif op[0] == "remove" and len(q):
            victim = list(q)[op[1] % len(q)]
            q.remove_requests([victim])
        elif op[0] == "preempt" and running:
            r = running.pop(op[1] % len(running))
            q.prepend_request(r)
        elif op[0] == "switch":       # a live reload: fcfs again, maybe another target
            if not live:
                monkeypatch.setattr(queue_mod, "live_order_of", lambda policy: None)
            q.switch_policy(FCFSPolicy(late_after_s=op[1]))
            assert (q._live is not None) == (live and op[1] > 0)
            monkeypatch.undo()
        elif op[0] == "step":
            now += op[1]
            q.begin_step(ctx(now, MODELS[op[2]], 512, len(running)), running)
            log.append(("order", [r.request_id for r in q], q.policy.stats.demoted))
    return log


@SETTINGS
@given(queue_ops)
def test_queue_core_makes_the_same_pops_with_and_without_the_tiered_order(script):
    import pytest
    with pytest.MonkeyPatch.context() as mp:
        assert drive(script, True, mp) == drive(script, False, mp)


def test_tiers_move_once_and_a_new_model_rebuilds():
    p = FCFSPolicy(late_after_s=2.0)
    live = p.live_order()
    for i, t in enumerate((0.0, 1.0, 2.5, 3.0)):
        live.add(ReqInfo(f"r{i}", t, 10, 10, 10))
    assert [r.request_id for r in live.order(3.2)] == ["r2", "r3", "r0", "r1"]
    assert (p.stats.demoted, p._next_late_s) == (2, 4.5)
    assert [r.request_id for r in live.order(4.6)] == ["r3", "r0", "r1", "r2"]
    assert p.stats.demoted == 3
    live.discard("r0")
    assert [r.request_id for r in live.order(4.7)] == ["r3", "r1", "r2"]
    # with a step model each turns late a prefill earlier: T(0, 10) = 0.03 s
    m = LinearStepModel(a=0.02, beta=0.0, gamma=0.001)
    assert [r.request_id for r in live.order(4.97, ctx(4.97, m, budget=0))] == \
        ["r1", "r2", "r3"]
    assert math.isclose(p._next_late_s, math.inf) and p.stats.demoted == 4
    assert p.live_order() is not live and FCFSPolicy().live_order() is None


def test_a_doomed_request_goes_before_a_late_one_of_the_same_arrival():
    """sorted(doomed + late) is stable: on equal arrival times the doomed come first."""
    m = LinearStepModel(a=0.0, beta=0.0, gamma=0.001)     # lead = p ms
    late = ReqInfo("late", 8.5, 600, 16, 16)     # turns late at 8.5 + 2 - 0.6 = 9.9
    doomed = ReqInfo("doomed", 8.5, 400, 16, 16)  # 10.1, but 0.2 s of backlog first
    c = ctx(10.0, m, budget=10, running=0, backlog=200)
    for joined in ((late, doomed), (doomed, late)):
        ref, pol = FCFSPolicy(late_after_s=2.0), FCFSPolicy(late_after_s=2.0)
        live = pol.live_order()
        for r in joined:
            live.add(r)
        want = ref.order(list(joined), 10.0, c)
        assert [r.request_id for r in want] == ["doomed", "late"]
        assert [r.request_id for r in live.order(10.0, c)] == ["doomed", "late"]
        assert state(pol) == state(ref) and ref.stats.demoted == 2
