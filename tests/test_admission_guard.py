"""The per-request TPOT admission guard of the waiting queue (QueueCore._tpot_room).

Step model here: T(b, c) = 20 ms + 5 ms * b + 1 ms * c. One request runs; it was
admitted with a hint of 11 output tokens (n = 11, so TPOT = decode time / 10)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tuned.core.queue import QueueCore
from tuned.curves.online import LinearStepModel
from tuned.policies.queues import AdmitContext, make_policy

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


def ctx(now: float, model=MODEL, sla: float = SLA) -> AdmitContext:
    return AdmitContext(now_s=now, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                        cap=64, step_model=model, tpot_sla_s=sla)


def queue_with_one_running(now_first: float = 0.0) -> tuple[QueueCore, list, Req]:
    """A queue whose request r0 (11 tokens) was admitted and got its first token at
    ``now_first``; returns (queue, running list, r0)."""
    q = QueueCore(make_policy("fcfs"))
    running: list = []
    r0 = Req("r0", 0.0, 10, 11, extra_args={"tuned_output_tokens": 11})
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
    assert q.guard_holds == 1 and q.stats.deferred == 1 and q.stats.last_reason == "tpot_guard"
    q.remove_requests([next(iter(q))])
    q.add_request(Req("small", 0.0, 100, 8))
    assert q and q.peek_request().request_id == "small"


def test_a_request_already_past_the_sla_is_not_protected():
    # r0's first token came 1 s ago with 2 tokens out: projected (1 + 9 * 25 ms) / 10
    # = 122.5 ms > 50 ms, lost either way: the 300-token prompt is admitted
    q, running, r0 = queue_with_one_running(now_first=0.0)
    r0.num_output_tokens = 2
    q.begin_step(ctx(1.0), running)
    q.add_request(Req("big", 0.0, 300, 8))
    assert q and q.peek_request().request_id == "big"
    assert q.guard_holds == 0


def test_the_held_prompt_is_admitted_once_the_running_request_finishes():
    q, running, r0 = queue_with_one_running()
    q.add_request(Req("big", 0.0, 300, 8))
    assert not q
    running.remove(r0)
    r0.num_output_tokens = 11
    q.request_finished(r0, learn=True)
    q.begin_step(ctx(0.3), running)
    assert q and q.pop_request().request_id == "big"


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
    assert q and q.guard_holds == 0


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
