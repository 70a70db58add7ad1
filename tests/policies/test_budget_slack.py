"""The token budget by the running requests' TPOT slack (issue 29 item 3):
:func:`tuned.policies.budget.slack_chunk`, the progress the engines report
(:func:`tuned.core.queue.running_progress`), each request's time since its first token
read off the step ring (:func:`tuned.core.window.since_first_token`), and the budget
that follows while requests wait (``budget_bound = "tpot_slack"``).

SLO 50 ms TPOT; decode-only steps 30 ms; 0.1 ms a prompt token."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from tuned.core.queue import running_progress
from tuned.core.ring import StepSample
from tuned.core.types import Observation
from tuned.core.window import since_first_token
from tuned.curves.online import LinearStepModel
from tuned.policies.budget import TokenBudget, slack_chunk
from tuned.policies.registry import StaticPolicy

SLA, DEC, TOK = 0.050, 0.030, 0.0001


def spare(g: int, n: int, elapsed: float) -> float:
    return SLA * (n - 1) - elapsed - (n - g) * DEC


def test_a_request_that_can_absorb_the_whole_prefill_does_not_limit_the_chunk():
    # 1000 tokens pending cost each decoding request 0.1 s; this one has 1.18 s to spare
    assert spare(10, 60, 9 * 0.030) == pytest.approx(1.18)
    assert slack_chunk([(10, 60, 9 * 0.030)], 1000, SLA, DEC, TOK) == math.inf


def test_a_request_near_its_end_limits_the_chunk_to_its_slack_over_its_remaining_steps():
    # 2 steps left, 0.097 s to spare (< 0.1 s of prefill): the chunk <= 0.097 / (2 * 0.1 ms)
    near = (58, 60, 57 * 0.049)
    assert spare(*near) == pytest.approx(0.097)
    assert slack_chunk([(10, 60, 0.27), near], 1000, SLA, DEC, TOK) == pytest.approx(485.0)


def test_a_request_past_saving_is_not_protected():
    lost = (30, 60, 29 * 0.090)               # 0.56 s over already
    assert spare(*lost) < 0
    assert slack_chunk([lost], 1000, SLA, DEC, TOK) == math.inf


def test_no_figure_without_pending_prefill_or_a_cost_per_token():
    assert slack_chunk([(10, 60, 0.27)], 0, SLA, DEC, TOK) is None
    assert slack_chunk([(10, 60, 0.27)], 1000, SLA, DEC, 0.0) is None
    assert slack_chunk([(10, 60, 0.27)], 1000, 0.0, DEC, TOK) is None


def test_first_token_dated_from_the_step_ring_g_minus_one_steps_back():
    ring = [StepSample(seq=i, t=10.0 - 0.1 * i, step_s=0.1, num_decode=1, num_prefill_reqs=0,
                       prefill_tokens=0, scheduled_tokens=1, generated_tokens=1, kv_usage=0.0,
                       kv_used_blocks=0, kv_tokens_resident=0, num_running=1, num_waiting=0,
                       preempted=0) for i in range(5)]                 # newest first
    got = since_first_token([(1, 9), (3, 9), (8, 9)], iter(ring), 10.05, 0.1)
    # token 1 of a request with 1 out: the newest step; with 3 out: 2 steps back;
    # with 8 out: 7 back, 3 steps before the ring's oldest (9.6 s)
    assert [(g, n) for g, n, _ in got] == [(1, 9), (3, 9), (8, 9)]
    assert [e for _, _, e in got] == pytest.approx([0.05, 0.25, 0.75])
    assert since_first_token([], iter(ring), 10.0, 0.1) == []
    assert since_first_token([(2, 9)], iter([]), 10.0, 0.1) == []


def _req(rid, prompt, out, max_tokens, computed=None):
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_output_tokens=out,
                           max_tokens=max_tokens,
                           num_computed_tokens=prompt if computed is None else computed)


def test_running_progress_reads_outputs_and_the_prefill_still_owed():
    running = [_req("a", 100, 5, 64), _req("b", 500, 0, 32, computed=200), _req("c", 50, 1, None)]
    waiting = [SimpleNamespace(num_prompt_tokens=700), SimpleNamespace(num_prompt_tokens=40)]
    # a and c are past their first token; b owes 300 prompt tokens, the queue 740
    assert running_progress(running, waiting) == ([(5, 64), (1, 0)], 300 + 740)


def test_running_progress_takes_tuned_queues_prediction_within_max_tokens():
    info = {"a": SimpleNamespace(predicted_output=40), "c": SimpleNamespace(predicted_output=90)}
    waiting = SimpleNamespace(info=info.get, waiting_prompt_tokens=lambda: [10])
    running = [_req("a", 100, 5, 64), _req("c", 50, 2, 64), _req("d", 50, 2, 64)]
    assert running_progress(running, waiting) == ([(5, 40), (2, 64), (2, 64)], 10)


class Model(LinearStepModel):
    pass


def _wrapped():
    # T(b, c) = 10 ms + 1 ms b + 0.1 ms c; SLA 50 ms less a 2 ms margin
    return TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                       min_chunk_tokens=32, sla_s=SLA,
                       step_model=Model(a=0.010, beta=0.001, gamma=TOK), margin_s=0.002)


ROOMY = Observation(num_running=4, num_waiting=8, kv_capacity_blocks=1000, demand_mean=100.0,
                    demand_std=0.0, demand_samples=32, tbt_mean_s=0.040,
                    decode_batch_mean=4.0, decode_only_tbt_s=DEC, mixed_tbt_s=0.060,
                    prefill_pending_tokens=10_000)


def test_waiting_requests_get_the_chunk_the_running_requests_slack_allows():
    """Without progress the window's room sizes the chunk (90 ms: c = 760, bound
    ``ttft``). A request 5 steps from its end with 0.64 s to spare, against 1 s of
    pending prefill, allows 0.64 / (5 x 0.1 ms) = 1280 tokens (bound ``tpot_slack``);
    one that can absorb it all leaves the full budget; none with little slack left
    keeps the window's 760."""
    w = _wrapped()
    d = w.decide(ROOMY)
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 760)
    near = (55, 60, 54 * 0.040)
    chunk = spare(*near) / (TOK * 5)
    assert chunk == pytest.approx(1280)
    d = w.decide(dataclasses.replace(ROOMY, decode_progress=(near,)))
    assert (d.inputs["budget_bound"], d.token_budget) == ("tpot_slack", 4 + int(chunk))
    d = w.decide(dataclasses.replace(ROOMY, decode_progress=((10, 60, 0.27),)))
    assert (d.inputs["budget_bound"], d.token_budget) == ("tpot_slack", 2048)
    tight = (50, 60, 49 * 0.040)                     # 0.69 s over 10 steps: 690 < 760
    d = w.decide(dataclasses.replace(ROOMY, decode_progress=(tight,)))
    assert (d.inputs["budget_bound"], d.token_budget) == ("ttft", 4 + 760)


def test_slack_does_not_size_the_chunk_while_nothing_waits_or_the_cap_holds():
    w = _wrapped()
    roomy = dataclasses.replace(ROOMY, decode_progress=((10, 60, 0.27),))
    d = w.decide(dataclasses.replace(roomy, num_waiting=0))
    assert d.inputs["budget_bound"] == "tpot" and d.token_budget < 2048
    d = w.decide(dataclasses.replace(roomy, binding=1.0))
    assert d.inputs["budget_bound"] == "tpot" and d.token_budget < 2048


def test_the_budget_asks_for_progress_only_where_it_sizes_chunks_for_an_sla():
    assert _wrapped().wants_progress
    assert not TokenBudget(StaticPolicy(16, 2048), max_num_batched_tokens=2048,
                           min_chunk_tokens=32).wants_progress
    assert not dataclasses.replace(_wrapped(), control=False).wants_progress
