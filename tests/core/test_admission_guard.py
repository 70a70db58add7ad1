"""The admission guard around the queue policy's choice: its TPOT half
(tuned.core.admission.AdmissionGuard.tpot_room), its TTFT half (``ttft_room``) and
fcfs' predicted lateness.

Step model here: T(b, c) = 20 ms + 5 ms * b + 1 ms * c. In the TPOT tests one request
runs; it was admitted with a hint of 11 output tokens (n = 11, so TPOT = decode time
/ 10)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tuned.core.queue import QueueCore
from tuned.curves.online import LinearStepModel
from tuned.core.queue_policy import AdmitContext
from tuned.policies.registry import make_policy

MODEL = LinearStepModel(a=0.020, beta=0.005, gamma=0.001)
SLA = 0.050


@dataclass
class Req:
    request_id: str
    arrival_time: float
    num_prompt_tokens: int
    max_tokens: int
    num_output_tokens: int = 0
    priority: int = 0
    extra_args: dict = field(default_factory=dict)


def ctx(now: float, model=MODEL, sla: float = SLA, ttft: float = 0.0) -> AdmitContext:
    return AdmitContext(now_s=now, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                        cap=64, step_model=model, tpot_sla_s=sla, ttft_sla_s=ttft)


def queue_with_one_running(now_first: float = 0.0, arrival: float = 0.0
                           ) -> tuple[QueueCore, list, Req]:
    """A queue whose request r0 (11 tokens, arrived at ``arrival``) was admitted and
    got its first token at ``now_first``; returns (queue, running list, r0)."""
    q = QueueCore(make_policy("fcfs"))
    running: list = []
    r0 = Req("r0", arrival, 10, 11, extra_args={"tuned_output_tokens": 11})
    q.add_request(r0)
    q.begin_step(ctx(now_first), running)
    assert q.pop_request() is r0
    running.append(r0)
    r0.num_output_tokens = 1
    q.begin_step(ctx(now_first), running)   # the admission commits; r0 has 1 token out
    return q, running, r0


def test_a_prompt_whose_prefill_would_break_a_running_request_waits():
    # r0: 1 of 11 tokens out, first token at t = 0; now t = 0: 10 steps left at
    # T(1) = 25 ms -> projected TPOT 25 ms. A 300-token prompt adds 0.3 s + 10 * 5 ms
    # over 10 tokens: 25 + 35 = 60 ms > 50 ms: it waits. A 100-token one adds
    # (0.1 + 0.05) / 10 = 15 ms: 40 ms, admitted.
    q, running, r0 = queue_with_one_running()
    q.add_request(Req("big", 0.0, 300, 8))
    assert not q and len(q) == 1
    assert q.last_verdict.reason == "tpot_guard"
    assert q.guard.holds == 1 and q.stats.deferred == 1 and q.stats.last_reason == "tpot_guard"
    assert q.guard.held == {"tpot_guard": 1, "ttft_guard": 0}
    assert q.snapshot()["guard_held"] == {"tpot_guard": 1, "ttft_guard": 0}
    q.remove_requests([next(iter(q))])
    q.add_request(Req("small", 0.0, 100, 8))
    assert q and q.peek_request().request_id == "small"


def test_the_guard_projects_the_remaining_steps_with_the_resident_kv():
    """Every decode step also reads the KV cache: with eta = 0.1 us a token and
    120,000 tokens resident, r0's 10 remaining steps take 25 + 12 = 37 ms each, and
    the 100-token prompt that fits an empty cache (25 + 15 = 40 ms) now pushes r0 to
    37 + 15 = 52 ms: it waits."""
    q, running, r0 = queue_with_one_running()
    kv_model = LinearStepModel(a=0.020, beta=0.005, gamma=0.001, eta=1e-7)

    def kv_ctx(resident: int) -> AdmitContext:
        return AdmitContext(now_s=0.0, kv_capacity_tokens=1 << 20,
                            kv_free_tokens=(1 << 20) - resident, cap=64,
                            step_model=kv_model, tpot_sla_s=SLA)

    q.begin_step(kv_ctx(0), running)
    q.add_request(Req("small", 0.0, 100, 8))
    assert q and q.guard.holds == 0
    q.begin_step(kv_ctx(120_000), running)
    assert not q and q.last_verdict.reason == "tpot_guard" and q.guard.holds == 1


def test_a_request_already_past_the_sla_is_not_protected():
    # r0's first token came 1 s ago with 2 tokens out: projected (1 + 9 * 25 ms) / 10
    # = 122.5 ms > 50 ms, lost either way: the 300-token prompt is admitted
    q, running, r0 = queue_with_one_running(now_first=0.0)
    r0.num_output_tokens = 2
    q.begin_step(ctx(1.0), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert q and q.peek_request().request_id == "big"
    assert q.guard.holds == 0


def test_the_held_prompt_is_admitted_once_the_running_request_finishes():
    q, running, r0 = queue_with_one_running()
    q.add_request(Req("big", 0.0, 300, 8))
    assert not q
    running.remove(r0)
    r0.num_output_tokens = 11
    q.request_finished(r0, learn=True)
    q.begin_step(ctx(0.3), running)
    assert q and q.pop_request().request_id == "big"


def test_the_guard_holds_a_prompt_at_most_twice_its_own_prefill():
    """r0 (31 tokens; its first token at t = -0.6, then a 0.6 s stall) decodes a token
    every 25 ms from t = 0, so its projected TPOT stays (0.6 + 30 * 25 ms) / 30 = 45 ms;
    the 300-token prompt would add 10-15 ms, so the TPOT check holds it throughout.
    T(0, 300) = 20 + 300 ms, so the guard holds it at most 0.64 s from its first hold
    (t = 0), then admits it though the check still says no."""
    q = QueueCore(make_policy("fcfs"))
    running: list = []
    r0 = Req("r0", -0.7, 10, 31, extra_args={"tuned_output_tokens": 31})
    q.add_request(r0)
    q.begin_step(ctx(-0.6), running)
    assert q.pop_request() is r0
    running.append(r0)
    r0.num_output_tokens = 1
    q.begin_step(ctx(-0.6), running)
    assert q.guard.hold_bound_s(q._infos["r0"], ctx(0.0)) == pytest.approx(0.06)
    q.begin_step(ctx(0.0), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert not q and q.last_verdict.reason == "tpot_guard"
    assert q.guard.hold_bound_s(q._infos["big"], ctx(0.0)) == pytest.approx(0.64)
    for now in (0.3, 0.63):
        r0.num_output_tokens = 1 + round(now / 0.025)
        q.begin_step(ctx(now), running)
        assert not q and q.last_verdict.reason == "tpot_guard", now
    r0.num_output_tokens = 1 + 26
    assert not q.guard.tpot_room(q._infos["big"], ctx(0.65), running, q._infos)
    q.begin_step(ctx(0.65), running)
    assert q and q.pop_request().request_id == "big"
    assert q.guard.held["tpot_guard"] == 3 and "big" in q.guard.held_since
    q.request_finished(Req("big", 0.0, 300, 8), learn=False)
    assert "big" not in q.guard.held_since


def test_with_a_ttft_target_the_guard_holds_a_prompt_while_it_can_still_meet_it():
    """r0 (201 tokens; first token at t = -4.5, a 4.5 s stall) decodes a token every
    25 ms from t = 0: projected TPOT (4.5 + 200 * 25 ms) / 200 = 47.5 ms, which the
    300-token prompt would push past 50 ms until t = 4. With a TTFT target of 3 s the
    prompt (arrived at t = 0) is held past twice its prefill alone (0.64 s), until
    that much before its TTFT deadline: 3 - 0.64 = 2.36 s, then admitted though the
    check still says no."""
    q = QueueCore(make_policy("fcfs"))
    running: list = []
    r0 = Req("r0", -4.6, 10, 201, extra_args={"tuned_output_tokens": 201})
    q.add_request(r0)
    q.begin_step(ctx(-4.5, ttft=3.0), running)
    assert q.pop_request() is r0
    running.append(r0)
    r0.num_output_tokens = 1
    q.begin_step(ctx(-4.5, ttft=3.0), running)
    q.begin_step(ctx(0.0, ttft=3.0), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert not q and q.last_verdict.reason == "tpot_guard"
    assert q.guard.hold_bound_s(q._infos["big"], ctx(0.0), 0.0) == pytest.approx(0.64)
    assert q.guard.hold_bound_s(q._infos["big"], ctx(0.0, ttft=3.0), 0.0) == \
        pytest.approx(2.36)
    for now in (0.7, 1.5, 2.35):
        r0.num_output_tokens = 1 + round(now / 0.025)
        q.begin_step(ctx(now, ttft=3.0), running)
        assert not q and q.last_verdict.reason == "tpot_guard", now
    r0.num_output_tokens = 1 + round(2.37 / 0.025)
    assert not q.guard.tpot_room(q._infos["big"], ctx(2.37, ttft=3.0), running, q._infos)
    q.begin_step(ctx(2.37, ttft=3.0), running)
    assert q and q.pop_request().request_id == "big"


def test_prompts_admitted_but_not_yet_prefilled_count_against_the_running():
    """r0 projects 25 ms. A 100-token prompt p is admitted (25 + 15 = 40 ms); its
    prefill still to run lengthens r0's coming steps by 0.1 s over 10 tokens, so r0's
    projection without the next newcomer is 35 ms, and a 150-token one (+20 ms) now
    waits. Once p's prompt is computed, the same newcomer goes (25 + 20 = 45 ms)."""
    q, running, r0 = queue_with_one_running()
    p = PReq("p", 0.0, 100, 8)
    q.add_request(p)
    assert q.pop_request() is p
    running.append(p)
    q.add_request(Req("c", 0.0, 150, 8))
    assert not q and q.last_verdict.reason == "tpot_guard"
    p.num_computed_tokens = 100
    q.begin_step(ctx(0.0), running)
    assert q and q.pop_request().request_id == "c"


def test_a_request_still_in_its_prefill_is_not_counted():
    # TPOT starts at the first token: a running request with none yet is not protected
    q, running, r0 = queue_with_one_running()
    r0.num_output_tokens = 0
    q.begin_step(ctx(0.0), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert q


@pytest.mark.parametrize("model, sla", [(None, SLA), (MODEL, 0.0)])
def test_off_without_a_step_model_or_an_sla(model, sla):
    q, running, r0 = queue_with_one_running()
    q.begin_step(ctx(0.0, model=model, sla=sla), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert q and q.guard.holds == 0


def test_the_guard_reads_the_time_since_the_first_token():
    # same request as the first test, but its first token came 0.2 s ago with 1
    # token out (one 200 ms step, e.g. a prefill beside it): base (0.2 + 10 * 25 ms) /
    # 10 = 45 ms; even the 100-token prompt (+15 ms) would now push it to 60 ms
    q, running, r0 = queue_with_one_running(now_first=0.0)
    q.begin_step(ctx(0.2), running)
    q.add_request(Req("small", 0.0, 100, 8))
    assert not q and q.last_verdict.reason == "tpot_guard"
    q.remove_requests([next(iter(q))])
    # a 20-token prompt adds (0.02 + 0.05) / 10 = 7 ms -> 52 ms: still over; a 1-token
    # prompt adds (0.001 + 0.05) / 10 = 5.1 ms -> 50.1 ms: over as well (beta counts)
    for n in (20, 1):
        q.add_request(Req(f"p{n}", 0.0, n, 8))
        assert not q
        q.remove_requests([next(iter(q))])


def test_a_request_whose_first_token_was_late_is_not_protected():
    # as the first test (the 300-token prompt would push r0 to 60 ms), but r0 arrived
    # 2 s before its first token: with a 1 s TTFT SLA it is lost either way
    q, running, r0 = queue_with_one_running(arrival=-2.0)
    q.begin_step(ctx(0.0, ttft=1.0), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert q and q.guard.holds == 0
    q.begin_step(ctx(0.0, ttft=0.0), running)     # TTFT unknown: r0 is protected
    assert not q and q.last_verdict.reason == "tpot_guard"


# ------------------------------------------------------------------ TTFT half
TTFT = 1.0


@dataclass
class PReq(Req):
    num_computed_tokens: int = 0


def queue_with_one_prefilling(arrival: float, prompt: int = 500):
    """A queue whose request ``a`` (``prompt`` tokens, arrived at ``arrival``) was
    admitted at t = 0 and has not been prefilled yet; the TPOT half is off."""
    q = QueueCore(make_policy("fcfs"))
    running: list = []
    a = PReq("a", arrival, prompt, 50)
    q.add_request(a)
    q.begin_step(ctx(0.0, sla=0.0, ttft=TTFT), running)
    assert q.pop_request() is a
    running.append(a)
    return q, running, a


def test_a_prompt_that_would_push_a_prefilling_one_past_its_ttft_waits():
    # a's first token: T(1, 500) = 0.525 s after its arrival at 0, within 1 s. A 400-
    # token prompt in the same step moves it to 0.925 s: admitted; a 600-token one to
    # 1.125 s: it waits, until a's prefill is scheduled
    q, running, a = queue_with_one_prefilling(0.0)
    q.add_request(PReq("b600", 0.0, 600, 50))
    assert not q and q.last_verdict.reason == "ttft_guard"
    assert q.guard.holds == 1 and q.stats.last_reason == "ttft_guard"
    assert q.guard.held == {"tpot_guard": 0, "ttft_guard": 1}
    q.remove_requests([next(iter(q))])
    q.add_request(PReq("b400", 0.0, 400, 50))
    assert q and q.peek_request().request_id == "b400"


def test_the_held_prompt_goes_once_the_cohort_is_prefilled():
    q, running, a = queue_with_one_prefilling(0.0)
    q.add_request(PReq("b600", 0.0, 600, 50))
    assert not q
    a.num_computed_tokens = 500          # its last prompt token is scheduled
    q.begin_step(ctx(0.53, sla=0.0, ttft=TTFT), running)
    assert q and q.pop_request().request_id == "b600"


def test_a_prefilling_request_already_late_is_not_protected():
    # a arrived 0.8 s ago: first token at 0.525 + 0.8 = 1.325 s > 1 s, lost either way;
    # b (400 tokens, just arrived) meets 1 s in the cohort (0.925 s): admitted
    q, running, a = queue_with_one_prefilling(-0.8)
    q.add_request(PReq("b", 0.0, 400, 50))
    assert q and q.guard.holds == 0


def test_a_prompt_does_not_join_a_cohort_that_would_make_it_late():
    # a is late (as above); b arrived 0.3 s ago: alone, T(0, 400) = 0.42 s -> 0.72 s,
    # in time; in a's cohort 0.3 + 0.925 = 1.225 s: it waits for a smaller cohort
    # (without this each newcomer finds the cohort late already and it snowballs)
    q, running, a = queue_with_one_prefilling(-0.8)
    q.add_request(PReq("b", -0.3, 400, 50))
    assert not q and q.last_verdict.reason == "ttft_guard"
    # c arrived 0.7 s ago: 1.12 s even alone: nothing to protect, admitted
    q.remove_requests([next(iter(q))])
    q.add_request(PReq("c", -0.7, 400, 50))
    assert q and q.guard.holds == 1


@pytest.mark.parametrize("model, ttft", [(None, TTFT), (MODEL, 0.0)])
def test_the_ttft_half_is_off_without_a_step_model_or_a_ttft_sla(model, ttft):
    q, running, a = queue_with_one_prefilling(0.0)
    q.begin_step(ctx(0.0, model=model, sla=0.0, ttft=ttft), running)
    q.add_request(PReq("b600", 0.0, 600, 50))
    assert q and q.guard.holds == 0


# ------------------------------------------------------- fcfs: predicted lateness
def _info(rid: str, arrival: float, prompt: int):
    from tuned.core.queue_policy import ReqInfo

    return ReqInfo(rid, arrival, prompt, 50, 50)


def test_fcfs_predicts_lateness_from_the_prefill_with_a_step_model():
    # late_after 1 s; at t = 0.5: x (arrived 0, 800 tokens) needs T(0, 800) = 0.82 s
    # more -> 1.32 s: late, behind y (arrived 0.1, 10 tokens: 0.43 s)
    x, y = _info("x", 0.0, 800), _info("y", 0.1, 10)
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    order = pol.order([x, y], 0.5, ctx(0.5))
    assert [r.request_id for r in order] == ["y", "x"] and pol.stats.demoted == 1
    # y turns late at 0.1 + 1 - T(0, 10) = 1.07 s: refresh asks for a new order then
    assert not pol.refresh([y], ctx(1.06)) and pol.refresh([y], ctx(1.07))
    # without the step model lateness is observed: x has waited 0.5 s < 1 s
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    order = pol.order([x, y], 0.5, ctx(0.5, model=None))
    assert [r.request_id for r in order] == ["x", "y"] and pol.stats.demoted == 0


def test_fcfs_dooms_the_largest_prefill_when_the_queue_cannot_all_make_it():
    """Moore and Hodgson's rule over the on-time queue: T(b, c) = 20 ms + 5 ms b + 1 ms c,
    4 running and a 504-token budget: a full chunk of 500 tokens takes 540 ms, 1.08 ms
    a prompt token. At t = 0, TTFT 1 s, four prompts each meet it alone (400 tokens:
    0.44 s), but in arrival order a (300: 0.324 s) and b (400: 0.756 s) fit, c (200:
    0.972 s) fits, d (100: 1.08 s) does not: the largest so far, b, is doomed, and a,
    c, d (0.648 s) all make it. FCFS makes one late too (d); dooming the largest
    leaves the most time for the requests behind. Without the token budget
    (0: unknown) nothing is doomed."""
    a, b, c, d = (_info("a", 0.0, 300), _info("b", 0.0, 400), _info("c", 0.0, 200),
                  _info("d", 0.0, 100))
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    full = AdmitContext(now_s=0.0, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                        cap=64, step_model=MODEL, tpot_sla_s=SLA, ttft_sla_s=1.0,
                        token_budget=504, num_running=4)
    order = pol.order([a, b, c, d], 0.0, full)
    assert [r.request_id for r in order] == ["a", "c", "d", "b"]
    assert pol.stats.demoted == 1
    # a queue that fits keeps its arrival order: 300 + 200 + 100 tokens, 0.648 s
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    assert [r.request_id for r in pol.order([a, c, d], 0.0, full)] == ["a", "c", "d"]
    assert pol.stats.demoted == 0
    # the token budget unknown: arrival order, as before
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    order = pol.order([a, b, c, d], 0.0, ctx(0.0, ttft=1.0))
    assert [r.request_id for r in order] == ["a", "b", "c", "d"] and pol.stats.demoted == 0


def test_fcfs_paces_prefill_with_the_resident_kv_and_the_running_prompts():
    """The job lengths of Moore and Hodgson's rule come from the whole step: a step
    also reads the KV cache already resident (eta per token), and the prompts
    already admitted but not yet through their prefill go first. The queue a (300),
    c (200), d (100) fits an empty engine (1.08 ms a token, 0.648 s); with 300,000
    tokens resident at eta = 1 us the full chunk takes 0.84 s, 1.68 ms a token, and d
    would finish at 1.008 s: a, the largest, is doomed. With 400 prompt tokens still
    to prefill ahead of the queue (0.432 s) d would finish at 1.08 s: a again. On
    the simulator's Azure trace (first 10 minutes, a100-llama2-7b, 4.6 req/s) leaving
    the KV term out cost 0.881 vs 0.940 attainment."""
    a, c, d = _info("a", 0.0, 300), _info("c", 0.0, 200), _info("d", 0.0, 100)
    model = LinearStepModel(a=0.020, beta=0.005, gamma=0.001, eta=1e-6)
    base = dict(now_s=0.0, kv_capacity_tokens=1 << 20, cap=64, step_model=model,
                tpot_sla_s=SLA, ttft_sla_s=1.0, token_budget=504, num_running=4)
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    empty = AdmitContext(kv_free_tokens=1 << 20, **base)
    assert [r.request_id for r in pol.order([a, c, d], 0.0, empty)] == ["a", "c", "d"]
    resident = AdmitContext(kv_free_tokens=(1 << 20) - 300_000, **base)
    assert [r.request_id for r in pol.order([a, c, d], 0.0, resident)] == ["c", "d", "a"]
    pol = make_policy("fcfs", {"late_after_s": 1.0})
    backlog = AdmitContext(kv_free_tokens=1 << 20, prefill_backlog_tokens=400, **base)
    assert [r.request_id for r in pol.order([a, c, d], 0.0, backlog)] == ["c", "d", "a"]
    assert pol.stats.demoted == 1


def test_holds_between_two_snapshots_name_who_held_and_how_often():
    from tuned.core.admission import holds_between

    then = {"policy": "fcfs", "deferred": 5, "guard_held": {"tpot_guard": 2, "ttft_guard": 0}}
    now = {"policy": "fcfs", "deferred": 12, "guard_held": {"tpot_guard": 6, "ttft_guard": 1}}
    # the policy's deferred count includes the guard's 5 holds: 2 are the policy's own
    assert holds_between(then, now) == (("tpot_guard", 4), ("ttft_guard", 1),
                                        ("queue_policy", 2))
    assert holds_between(now, now) == ()
    assert holds_between(None, now) == (("tpot_guard", 6), ("ttft_guard", 1),
                                        ("queue_policy", 5))
    assert holds_between(now, None) is None                # vLLM's own queue: unknown
    # a policy switch restarts the policy's counts: the new policy's count from zero
    switched = {"policy": "sjf", "deferred": 3, "guard_held": {"tpot_guard": 7, "ttft_guard": 1}}
    assert holds_between(now, switched) == (("tpot_guard", 1), ("queue_policy", 2))
