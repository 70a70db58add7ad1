"""tuned.core.refusal: the decision to refuse, its reason and events, and the one
protocol each engine answers through; and that no other module of tuned decides or
words a refusal (the room is one module)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from fakes import QueuedReq
from tuned import config as config_mod
from tuned.core import refusal
from tuned.core.queue import QueueCore
from tuned.core.queue_policy import AdmitContext
from tuned.core.refusal import (REASON_MAX_WAIT, REASON_OVERLOADED, QueueRefusals, Refusal,
                                RefusalWatch, at_the_door, bound_spec, client_refusal)
from tuned.policies.registry import make_policy

TUNED = Path(__file__).resolve().parents[2] / "tuned"


def ctx(now_s: float) -> AdmitContext:
    return AdmitContext(now_s=now_s, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                        cap=64, token_budget=1024, num_running=0)


@pytest.mark.parametrize("mode, max_wait, ttft, age, spec", [
    ("refuse", 0.0, 2.0, 0.0, (2.0, True, 1.0)),       # refused at the TTFT target
    ("serve", 0.0, 2.0, 0.0, (20.0, False, 4.0)),      # served: 10x and 2x the target
    ("refuse", 7.5, 0.0, 0.0, (7.5, True, 3.75)),      # no target: aging at half
    ("refuse", 6.0, 5.0, 0.0, (6.0, True, 3.0)),       # aging at most half the bound
    ("refuse", 6.0, 0.0, 9.0, (6.0, True, 6.0)),       # an explicit aging point, capped
    ("off", 7.5, 2.0, 0.0, None),
    ("refuse", 0.0, 0.0, 0.0, None),                    # no bound and no target
])
def test_bound_spec_is_what_the_config_reads(mode, max_wait, ttft, age, spec):
    assert bound_spec(mode, max_wait, ttft, age) == spec
    cfg = config_mod.validate({"on_max_wait": mode, "max_wait_s": max_wait,
                               "ttft_sla_s": ttft, "age_after_s": age})
    assert cfg.wait_bound_spec() == spec
    assert refusal.refuses(spec) is (spec is not None and mode == "refuse")


def test_a_refused_request_is_an_event_with_its_reason_and_wait():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    q.set_wait_bound((5.0, True, 2.0))
    q.add_request(QueuedReq("a", 1.0, 10))
    q.begin_step(ctx(5.9), [])
    assert q.refusals.take() == []
    q.begin_step(ctx(6.25), [])
    [(req, event)] = q.refusals.take()
    assert req.request_id == "a" and len(q) == 0
    assert event == Refusal(REASON_MAX_WAIT, 6.25, "a", 5.25)
    assert event.message == ("refused (max_wait) after waiting 5.2 s: its first token "
                             "could not come within the wait bound (max_wait_s, by "
                             "default the TTFT target)")
    assert q.refusals.take() == []                # handed over once
    assert q.snapshot()["refused"] == 1


class Recorder:
    """An engine's answer: what it was handed."""

    def __init__(self) -> None:
        self.calls: list[list] = []

    def answer_refusals(self, refused) -> None:
        self.calls.append([(r.request_id, e.reason) for r, e in refused])


def test_answer_hands_the_engine_its_refusals_once_and_only_when_there_are_some():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    q.set_wait_bound((1.0, True, 0.5))
    for rid, t in (("a", 0.0), ("b", 0.1), ("c", 5.0)):
        q.add_request(QueuedReq(rid, t, 10))
    eng = Recorder()
    q.begin_step(ctx(0.5), [])
    assert refusal.answer(q.refusals, eng) == 0 and eng.calls == []
    q.begin_step(ctx(1.2), [])
    assert refusal.answer(q.refusals, eng) == 2
    assert eng.calls == [[("a", "max_wait"), ("b", "max_wait")]]
    assert refusal.answer(q.refusals, eng) == 0 and len(eng.calls) == 1
    assert [r.request_id for r in q] == ["c"]


def test_serve_mode_never_refuses_and_the_counts_survive_a_new_bound():
    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    q.set_wait_bound((1.0, False, 0.5))
    q.add_request(QueuedReq("a", 0.0, 10))
    q.begin_step(ctx(50.0), [])
    assert q.refusals.take() == [] and len(q) == 1
    q.set_wait_bound((1.0, True, 0.5))
    q.begin_step(ctx(50.1), [])
    assert [r.request_id for r, _ in q.refusals.take()] == ["a"]
    q.set_wait_bound((2.0, True, 0.5))             # another bound: the count stays
    assert q.refusals.counts() == {"aged": 0, "refused": 1, "newest_first": 0,
                                   "door_wait_s": None}


def test_no_bound_no_refusal_and_zero_counts():
    r: QueueRefusals = QueueRefusals()
    assert r.due(ctx(1e9), {}) == [] and r.aged_head(1e9) is None
    assert r.counts() == {"aged": 0, "refused": 0, "newest_first": 0,
                          "door_wait_s": None}


def test_the_door_refuses_a_new_request_only_while_its_own_first_token_is_late():
    """The door reads the queue's prediction for a new request, not its past
    refusals: refusing while that prediction is past the bound, by how much, and open
    the moment it is not, however many the queue refused just before."""
    w = RefusalWatch()
    spec = (3.0, True, 1.5)
    assert w.state(spec, 100.0) == {"refusing": False, "max_wait_s": 3.0,
                                    "retry_after_s": 2, "refused": 0,
                                    "first_token_s": None, "room": False,
                                    "refusing_for_s": 0.0, "window_s": 0.0}
    w.note({"refused": 40, "door_wait_s": 7.25}, 100.0)
    assert w.state(spec, 100.0) == {"refusing": True, "max_wait_s": 3.0,
                                    "retry_after_s": 5, "refused": 40,
                                    "first_token_s": 7.25, "refusing_for_s": 4.25}
    w.note({"refused": 55, "door_wait_s": 2.9}, 100.5)    # the queue refused 15 more
    assert [w.state(spec, 100.5)[k] for k in ("refusing", "refusing_for_s")] == [False, 0.0]
    w.note({"refused": 55, "door_wait_s": 9.0}, 101.0, 0, 0, 4)   # idle: stale
    assert w.state(spec, 101.0)["refusing"] is False
    w.note({"refused": 55}, 101.5, 0, 0, 4)               # no step model: room decides
    assert w.state(spec, 101.5)["refusing"] is False
    w.note({"refused": 55, "door_wait_s": 9.0}, 102.0)
    assert w.state((3.0, False, 1.5), 102.0)["refusing"] is False   # serve mode
    assert w.state(None, 102.0) == {"refusing": False, "max_wait_s": None,
                                    "retry_after_s": None, "refusing_for_s": 0.0}


def test_the_watch_says_refusing_for_one_bound_after_a_refusal():
    w = RefusalWatch()
    spec = (10.0, True, 2.5)
    assert w.state(spec, 100.0) == {"refusing": False, "max_wait_s": 10.0,
                                    "retry_after_s": 3, "refused": 0, "first_token_s": None,
                                    "room": False,
                                    "refusing_for_s": 0.0, "window_s": 0.0}
    w.note({"refused": 2}, 100.0)
    assert [w.state(spec, 102.5)[k] for k in ("refusing", "refusing_for_s")] == [True, 7.5]
    assert w.state(spec, 109.9)["refusing"] is True
    assert [w.state(spec, 110.0)[k] for k in ("refusing", "refusing_for_s")] == [False, 0.0]
    w.note({"refused": 2}, 120.0)                  # no new refusal: the time stays
    assert w.last_t == 100.0 and w.seen == 2
    assert w.state((10.0, False, 2.5), 100.5)["refusing"] is False
    assert w.state(None, 100.5) == {"refusing": False, "max_wait_s": None,
                                    "retry_after_s": None, "refusing_for_s": 0.0}
    assert RefusalWatch().last_t == -math.inf


def test_the_door_opens_while_the_engine_has_room_for_a_new_request():
    # a refusal shut the door for the whole bound: on the real engine the queue
    # drained and the engine ran out of work while the door turned requests away
    w = RefusalWatch()
    spec = (6.0, True, 6.0)
    w.note({"refused": 4}, 20.0, running=16, waiting=18, cap=16)
    assert [w.state(spec, 21.0)[k] for k in ("refusing", "room")] == [True, False]
    w.note({"refused": 4}, 22.0, running=16, waiting=0, cap=16)   # drained, full
    assert [w.state(spec, 22.0)[k] for k in ("refusing", "refusing_for_s")] == [True, 4.0]
    w.note({"refused": 4}, 22.5, running=15, waiting=0, cap=16)   # a slot is free
    assert w.state(spec, 22.5) == {"refusing": False, "max_wait_s": 6.0,
                                   "retry_after_s": 6, "refused": 4, "first_token_s": None,
                                   "room": True,
                                   "refusing_for_s": 0.0, "window_s": 3.5}
    w.note({"refused": 4}, 23.0, running=15, waiting=2, cap=16)   # requests wait again
    assert [w.state(spec, 23.0)[k] for k in ("refusing", "refusing_for_s")] == [True, 3.0]
    w.note({"refused": 4}, 23.5, running=3, waiting=0, cap=2)     # the cap came down
    assert w.state(spec, 23.5)["refusing"] is True
    w.note({"refused": 4}, 24.0, running=0, waiting=0)            # no cap: no guess
    assert w.state(spec, 24.0)["refusing"] is True
    assert w.state(spec, 26.0)["refusing"] is False               # the bound has passed


def test_at_the_door_refuses_only_on_an_answer_that_says_refusing():
    assert at_the_door(None, 1.0) is None                      # no answer: no guess
    assert at_the_door({"refusing": False}, 1.0) is None
    ref = at_the_door({"refusing": True, "max_wait_s": 10.0, "retry_after_s": 2}, 1.0)
    assert ref == Refusal(REASON_OVERLOADED, 1.0, bound_s=10.0, retry_after_s=2)
    assert ref.message == ("overloaded: a new request's first token would come past "
                           "the wait bound (10.0 s)")
    assert at_the_door({"refusing": True, "retry_after_s": 0}, 1.0).retry_after_s == 1
    # an answer read at 5.0 that said refusing for 2 s more: refused until 7.0
    said = {"refusing": True, "retry_after_s": 2, "refusing_for_s": 2.0}
    assert at_the_door(said, 6.9, read_s=5.0) is not None
    assert at_the_door(said, 7.0, read_s=5.0) is None


@pytest.mark.parametrize("status, kw, text", [
    (429, {}, "refused: HTTP 429"),
    (503, {}, "refused: HTTP 503"),
    (500, {}, None),
    (None, {"finish": "abort"}, "refused: aborted before any token"),
    (None, {"stream_done": True}, "refused: aborted before any token"),
    (None, {"tokens": 1, "finish": "abort"}, None),     # a token came: not a refusal
    (None, {"finish": "stop", "stream_done": True}, None),
    (None, {}, None),                                   # the stream broke off: not one
])
def test_what_a_client_reads_as_a_refusal(status, kw, text):
    assert client_refusal(status, **kw) == text


#: the words of a refusal's decision and answer: they appear in tuned/core/refusal.py
#: and nowhere else under tuned/ (the engines answer through the protocol)
ONE_ROOM = (r'"max_wait"', r"refused: HTTP", r"aborted before any token",
            r"overloaded: a new request", r"\(429, 503\)", r"on_max_wait == ",
            r"10\.0 \* (self\.)?ttft_sla_s")


def test_the_decision_and_its_words_live_in_the_refusal_module_only():
    hits = {}
    for f in TUNED.rglob("*.py"):
        if f.name == "refusal.py" and f.parent.name == "core":
            continue
        text = f.read_text()
        found = [p for p in ONE_ROOM if re.search(p, text)]
        if found:
            hits[str(f.relative_to(TUNED))] = found
    assert hits == {}
    text = (TUNED / "core" / "refusal.py").read_text()
    assert all(re.search(p, text) for p in ONE_ROOM)


def _leads_ctx():
    """T(b, c) = 0.01 b + 0.001 c, two running requests filling a cap of 2 (10 and 30
    decode steps left at T(2, 0) = 20 ms: slots free at 0.2 and 0.6 s), a token
    budget of 1002: prompt tokens clear at T(2, 1000) / 1000 = 1.02 ms a token."""
    from tuned.curves.online import LinearStepModel

    return AdmitContext(now_s=5.0, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                        cap=2, step_model=LinearStepModel(a=0.0, beta=0.01, gamma=0.001),
                        token_budget=1002, num_running=2)


def test_first_token_leads_schedule_the_queue_over_the_caps_slots_and_the_prefill_pace():
    """On :func:`_leads_ctx`, prompts of 100 tokens, and a first token comes out of a
    step carrying the 300 prompt tokens pending, T(2, 300) = 0.32 s. Oldest first, A
    (waited 1 s) takes the slot at 0.2 s: 0.2 + 0.102 + 0.32 = 0.622 s; B (waited
    0.5 s) the one at 0.6 s: 1.022 s; C (arrived now) the slot A frees (0.622 + 19
    decodes = 1.002 s): 1.424 s. A request is refused once its wait, its lead and the
    step now (its refusal's answer comes as the step ends, and the next check a step
    later) reach the bound: under 2.1 s none is (A 1.942, B 1.842, C 1.744 s), and a
    request arriving now waits for B's slot (1.402 s) and one such step: 1.722 s,
    which fits -- the queue is not full."""
    from tuned.core.queue_policy import ReqInfo
    from tuned.core.refusal import first_token_leads

    c = _leads_ctx()
    waiting = [ReqInfo(rid, t, 100, 64, 20) for rid, t in (("A", 4.0), ("B", 4.5),
                                                           ("C", 5.0))]
    leads, door, answer, full = first_token_leads(c, waiting, [10, 30], 5.0, 2.1)
    assert leads == pytest.approx({"A": 0.622, "B": 1.022, "C": 1.424})
    assert door == pytest.approx(1.722) and answer == pytest.approx(0.32)
    assert full is False
    # 2.0 s: all three still fit, a request arriving now would not (1.722 + 0.32 s)
    leads, door, _, full = first_token_leads(c, waiting, [10, 30], 5.0, 2.0)
    assert leads == pytest.approx({"A": 0.622, "B": 1.022, "C": 1.424})
    assert door == pytest.approx(1.722) and full is True
    # 1.9 s: A is late (1.942 s) and refused; it leaves its slot to B (0.622 s) and B's
    # to C (1.022 s)
    leads, door, _, full = first_token_leads(c, waiting, [10, 30], 5.0, 1.9)
    assert leads == pytest.approx({"A": 0.622, "B": 0.622, "C": 1.022})
    assert door == pytest.approx(1.322) and full is True
    # no step model, or no token budget beyond the running requests: no prediction
    import dataclasses
    assert first_token_leads(dataclasses.replace(c, step_model=None), waiting, [10, 30],
                             5.0, 1.6) == (None, None, 0.0, False)
    assert first_token_leads(dataclasses.replace(c, token_budget=2), waiting, [10, 30],
                             5.0, 1.6) == (None, None, 0.0, False)


def test_newest_first_after_the_overload_began():
    """The same queue once it serves newest first from 4.2 s: A, there before, goes
    first (0.622 s); then C, the newest, at B's slot (0.6 + 0.102 + 0.32 = 1.022 s);
    B last, at the slot A frees (1.424 s); a request arriving now goes right after A,
    at the slot of 0.6 s: 0.92 s. Under 1.9 s, A is refused and C takes its slot."""
    from tuned.core.queue_policy import ReqInfo
    from tuned.core.refusal import first_token_leads

    c = _leads_ctx()
    waiting = [ReqInfo(rid, t, 100, 64, 20) for rid, t in (("A", 4.0), ("B", 4.5),
                                                           ("C", 5.0))]
    leads, door, _, full = first_token_leads(c, waiting, [10, 30], 5.0, 2.5, 4.2)
    assert leads == pytest.approx({"A": 0.622, "C": 1.022, "B": 1.424})
    assert door == pytest.approx(0.92) and full is True
    leads, door, _, _ = first_token_leads(c, waiting, [10, 30], 5.0, 1.9, 4.2)
    assert leads == pytest.approx({"A": 0.622, "C": 0.622, "B": 1.022})
    assert door == pytest.approx(0.52)


def test_a_large_prompt_is_refused_so_that_the_small_ones_behind_it_come_in_time():
    """Moore and Hodgson's rule: X, a prompt of 600 tokens, then S1-S3 of 50, all
    arriving now, bound 3 s (a step of T(2, 750) = 0.77 s). Oldest first X would take
    the slot at 0.2 s and hold back S2 and S3 (both late): two served. Refusing X
    instead serves all three S (S3 at 2.222 s + 0.77 s < 3 s). X's lead is then the
    bound itself, so the wait bound refuses it now."""
    from tuned.core.queue_policy import ReqInfo
    from tuned.core.refusal import first_token_leads

    c = _leads_ctx()
    waiting = [ReqInfo("X", 5.0, 600, 64, 20)] + [ReqInfo(r, 5.0, 50, 64, 20)
                                                  for r in ("S1", "S2", "S3")]
    leads, _, step, _ = first_token_leads(c, waiting, [10, 30], 5.0, 3.0)
    assert step == pytest.approx(0.77)
    assert leads == pytest.approx({"S1": 1.021, "S2": 1.421, "S3": 2.222, "X": 3.0})
    # S, waiting since 2.5 s behind X, is late whether X goes or not (0.921 s from
    # now without X): X keeps its place and S is refused
    waiting = [ReqInfo("X", 5.0, 600, 64, 20), ReqInfo("S", 2.5, 50, 64, 20)]
    leads, _, _, _ = first_token_leads(c, waiting, [10, 30], 5.0, 3.0)
    assert leads == pytest.approx({"X": 1.482, "S": 1.533})


def test_newest_first_a_request_the_engine_can_keep_up_with_is_never_refused_for_another():
    """Newest first since 3 s: X (600 tokens, arrived now) goes ahead of S (50 tokens,
    waiting 1 s), which then comes late (3.203 s with the step); Moore and Hodgson
    would refuse X so that S makes it. X in ``keep`` (it arrived as the arrivals slowed
    below the engine's pace) keeps its place, and S is refused instead."""
    from tuned.core.queue_policy import ReqInfo
    from tuned.core.refusal import first_token_leads

    c = _leads_ctx()
    waiting = [ReqInfo("S", 4.0, 50, 64, 20), ReqInfo("X", 5.0, 600, 64, 20)]
    leads, _, step, _ = first_token_leads(c, waiting, [10, 30], 5.0, 3.0, 3.0)
    assert step == pytest.approx(0.67)
    assert leads == pytest.approx({"S": 0.921, "X": 3.0})
    leads, _, _, _ = first_token_leads(c, waiting, [10, 30], 5.0, 3.0, 3.0, {"X"})
    assert leads == pytest.approx({"X": 1.482, "S": 1.533})


def test_the_requests_arriving_once_the_arrivals_slow_to_the_engines_pace_are_kept():
    """The queue's keep set, newest first: two admissions over the last bound of 3 s
    make a pace of 1.5 s between admissions. c came 1.9 s after b: the arrivals had
    slowed to that pace, and c is kept (not a, which came before b's rush). Once d and
    e follow within 0.2 s, three arrivals in 0.3 s are more than the pace admits: the
    overload goes on, and none is kept. None either while the queue serves oldest
    first."""
    from tuned.core.queue_policy import ReqInfo
    from tuned.core.wait_bound import WaitBound
    from tuned.curves.online import LinearStepModel

    import tuned.core.refusal as mod

    seen = []
    real = mod.first_token_leads

    def spy(*a, **k):
        seen.append(set(a[6]) if len(a) > 6 else set(k.get("keep", ())))
        return real(*a, **k)

    r = QueueRefusals(WaitBound(3.0, True, 1.5))
    infos = {}

    def arrive(rid, t):
        infos[rid] = ReqInfo(rid, t, 10, 8, 8)
        r.join(infos[rid])

    def due(now):
        c = AdmitContext(now_s=now, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                         cap=4, step_model=LinearStepModel(a=0.0, beta=0.01, gamma=0.001),
                         token_budget=1000)
        r.due(c, infos)

    for rid, t in (("a", 10.0), ("b", 10.1), ("c", 12.0)):
        arrive(rid, t)
    r.admitted(9.5)
    r.admitted(10.5)
    mod.first_token_leads = spy
    try:
        due(12.0)
        r.newest_since = 11.0
        due(12.0)
        arrive("d", 12.1)
        arrive("e", 12.2)
        due(12.3)
    finally:
        mod.first_token_leads = real
    assert seen == [set(), {"c"}, set()]


def test_past_twice_capacity_the_queue_serves_the_newest_first():
    """A, B and C (waited 1, 0.5 and 0 s) behind two running requests the queue never
    saw (a step left each: slots free at 20 ms), bound 1.9 s: oldest first, C would
    take the slot A frees after its 64 tokens and come 2.124 + 0.32 s from now, so it
    is refused at once. One refused and none admitted over the last bound is an
    overload past twice what the engine serves, and the queue turns newest first from
    now: A and B, there before, still go first, oldest first; then E, the newest,
    before D (short ones: 4 tokens), counted once in ``newest_first`` however often
    the gate is asked. With
    nothing waiting the queue is fcfs's again."""
    from tuned.curves.online import LinearStepModel

    q: QueueCore = QueueCore(make_policy("fcfs", {}))
    q.set_wait_bound((1.9, True, 10.0))
    for rid, t in (("A", 4.0), ("B", 4.5), ("C", 5.0)):
        q.add_request(QueuedReq(rid, t, 100, max_tokens=64))
    running = [QueuedReq(rid, 0.0, 100, max_tokens=n + 1, num_output_tokens=1)
               for rid, n in (("x", 10), ("y", 30))]
    for r in running:
        r.num_computed_tokens = 100          # through its prompt

    def step(now):
        q.begin_step(AdmitContext(now_s=now, kv_capacity_tokens=1 << 20,
                                  kv_free_tokens=1 << 20, cap=2,
                                  step_model=LinearStepModel(a=0.0, beta=0.01, gamma=0.001),
                                  token_budget=1002), running)

    step(5.0)
    assert [r.request_id for r, _ in q.refusals.take()] == ["C"]
    assert q.refusals.newest_since == 5.0
    assert q.pop_request().request_id == "A"
    q.add_request(QueuedReq("D", 5.05, 100, max_tokens=4))
    q.add_request(QueuedReq("E", 5.1, 100, max_tokens=4))
    step(5.1)
    assert q.refusals.take() == []
    assert q.peek_request().request_id == "B"
    assert q.last_verdict.reason == ("overloaded: the requests waiting since before go "
                                     "first, oldest first")
    assert q.pop_request().request_id == "B"
    assert q.peek_request().request_id == "E" and bool(q)
    assert q.peek_request().request_id == "E"
    assert q.last_verdict.reason.startswith("overloaded: newest first")
    assert q.snapshot()["newest_first"] == 1
    assert [q.pop_request().request_id for _ in range(2)] == ["E", "D"]
    step(5.2)
    assert q.refusals.newest_since is None and not q.refusals.newest_first


def test_a_refusal_by_prediction_carries_the_prediction_and_what_it_read():
    """The first queue above with all three arriving now, bound 1.6 s: C (predicted
    1.424 s, and the step now 0.32 s) is refused at once;
    its event carries the predicted first token from its arrival and the cap, running
    requests, token budget, prefill backlog and KV tokens the prediction read, which
    the engine's ``requests_refused`` log line prints."""
    from tuned.core.queue_policy import ReqInfo
    from tuned.core.wait_bound import WaitBound
    from tuned.curves.online import LinearStepModel

    c = AdmitContext(now_s=5.0, kv_capacity_tokens=1000, kv_free_tokens=600, cap=2,
                     step_model=LinearStepModel(a=0.0, beta=0.01, gamma=0.001),
                     token_budget=1002, num_running=2, prefill_backlog_tokens=0)
    r = QueueRefusals(WaitBound(1.6, True, 0.8))
    infos = {rid: ReqInfo(rid, 5.0, 100, 64, 20) for rid in "ABC"}
    for info in infos.values():
        r.join(info)
    assert r.due(c, infos, [10, 30]) == ["C"]
    event = r.refused(object(), "C", 5.0, 5.0)
    assert event.waited_s == 0.0 and event.predicted_s == pytest.approx(1.424)
    assert event.seen == {"cap": 2, "running": 2, "token_budget": 1002,
                          "prefill_backlog_tokens": 0, "kv_resident_tokens": 400}
