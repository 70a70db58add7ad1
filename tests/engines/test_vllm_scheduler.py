"""Contract tests: tuned's scheduler built from vLLM config objects, no GPU, no model run.

Both bases are exercised: vLLM's synchronous ``Scheduler`` (forced on CPU) and
``AsyncScheduler`` (the GPU default). A fake KV-cache config stands in for the
profiled one; steps are driven by hand with ModelRunnerOutputs.
"""

from __future__ import annotations

import time

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from tuned.control.controller import Fallback
from tuned.core.window import request_tpot_s
from tuned.engines.vllm import UnsupportedVllmError, check_vllm_version

from fakes import BLOCK, NUM_BLOCKS, decision, make_scheduler, requests, step  # noqa: F401,E402


@pytest.fixture(params=[False, True], ids=["Scheduler", "AsyncScheduler"])
def sched(request, tiny_model):
    s = make_scheduler(str(tiny_model), request.param)
    yield s
    s.shutdown()


def test_variant_follows_async_flag(sched):
    base = AsyncScheduler if sched.scheduler_config.async_scheduling else Scheduler
    assert isinstance(sched, base)
    assert sched.max_num_running_reqs == 8
    assert sched.kv_capacity_tokens == (NUM_BLOCKS - 1) * BLOCK


def test_applied_cap_bounds_running_and_all_finish(sched):
    for r in requests(6):
        sched.add_request(r)
    sched.tuned.slot.offer(decision(2, budget=100))
    max_running = 0
    for _ in range(200):
        if not sched.has_requests():
            break
        step(sched)
        max_running = max(max_running, len(sched.running))
        # the ceiling (model-runner slots) never moves; only the admission gate does
        assert sched.max_num_running_reqs == 8
    assert sched.max_num_active_reqs == 2
    assert sched.max_num_scheduled_tokens == 100
    assert max_running == 2
    fin = sched.finished.since(0)
    assert sorted(f.request_id for f in fin) == [f"r{i}" for i in range(6)]
    assert {(f.prompt_tokens, f.output_tokens) for f in fin} == {(20, 5)}
    samples = sched.steps.since(0)
    assert max(s.num_decode for s in samples) == 2
    assert sum(s.prefill_tokens for s in samples) == 6 * 20
    assert sum(s.generated_tokens for s in samples) == 6 * 5
    assert all(s.step_s >= 0 for s in samples)
    # each finished request's first token time, between its arrival and its end, for
    # its TPOT; none left behind for the requests gone
    assert all(f.arrival_s <= f.first_token_s <= f.t for f in fin)
    assert all(request_tpot_s(f) is not None for f in fin)
    assert sched._first_token_s == {}


def test_raise_takes_effect_next_step(sched):
    for r in requests(6):
        sched.add_request(r)
    sched.tuned.slot.offer(decision(1))
    step(sched)
    assert len(sched.running) == 1
    sched.tuned.slot.offer(decision(4))
    step(sched)
    assert len(sched.running) == 4


def test_lowering_cap_drains_without_preempting(sched):
    for r in requests(6, max_tokens=8):
        sched.add_request(r)
    sched.tuned.slot.offer(decision(6))
    step(sched)
    assert len(sched.running) == 6
    sched.tuned.slot.offer(decision(2))
    counts = []
    while sched.has_requests():
        so = step(sched)
        assert not so.preempted_req_ids
        counts.append(len(sched.running))
    # running falls only as requests finish, and no new one is admitted above 2
    assert counts[0] == 6 and counts[-1] == 0
    assert sum(1 for f in sched.finished.since(0)) == 6


def test_stale_controller_falls_back(sched):
    sched.tuned.slot.offer(decision(6))
    sched.add_request(requests(1)[0])
    step(sched)
    assert sched.max_num_active_reqs == 6
    sched.tuned.slot.mark_ok(time.monotonic() - 100.0)
    step(sched)
    assert sched.max_num_active_reqs == 3  # fallback_cap
    assert sched.applied() == {"cap": 3, "token_budget": 256, "fallback": True,
                               "fallback_cause": "stale"}
    assert sched.metrics.fallbacks.labels("stale")._value.get() == 1
    step(sched)  # staying in fallback is one fallback, not one per step
    assert sched.metrics.fallbacks.labels("stale")._value.get() == 1
    # a fresh decision clears it
    sched.tuned.slot.mark_ok(time.monotonic())
    sched.tuned.slot.offer(decision(5))
    step(sched)
    assert sched.applied()["fallback"] is False and sched.max_num_active_reqs == 5


def test_controller_error_falls_back_and_engine_keeps_stepping(sched, monkeypatch):
    for r in requests(4):
        sched.add_request(r)

    def boom():
        raise RuntimeError("injected")

    monkeypatch.setattr(sched.controller, "observe", boom)
    assert sched.controller.run_once() is None
    assert isinstance(sched.tuned.slot.pending, Fallback)
    assert sched.metrics.errors._value.get() == 1
    while sched.has_requests():
        step(sched)
    assert sched.max_num_active_reqs == 3
    assert sched.metrics.fallbacks.labels("controller_error")._value.get() == 1
    assert len(sched.finished.since(0)) == 4


def test_tuned_bug_on_step_path_never_reaches_engine(sched, monkeypatch):
    monkeypatch.setattr(sched, "_tuned_record", lambda so, mro: 1 / 0)
    for r in requests(2):
        sched.add_request(r)
    while sched.has_requests():
        step(sched)
    assert sched._tuned_errors > 0
    assert len(sched.finished.since(0)) == 2


def test_controller_tick_decides_from_scheduler_state(sched):
    for r in requests(8, prompt=40, max_tokens=10):
        sched.add_request(r)
    sched.tuned.slot.offer(decision(8))
    while sched.has_requests():
        step(sched)
    dec = sched.controller.run_once()
    # 8 finished requests (the default min_demand_samples) of 40 + 10 tokens, each
    # holding 41..50 tokens over its 10 decode steps: 3 blocks of 16 for 8 steps, 4
    # for 2 (memory_demand = "occupancy"), out of 63 usable blocks
    assert dec.inputs["demand_samples"] == 8
    assert dec.inputs["demand_mean_blocks"] == pytest.approx(3.2)
    assert dec.inputs["demand_std_blocks"] == pytest.approx(0.4)
    assert dec.inputs["kv_capacity_blocks"] == 63


def test_the_demand_reads_the_prompts_the_engine_holds_now(sched):
    """After 8 requests of 40 + 10 tokens finish, 4 of 200-token prompts wait: the
    memory bound's demand pairs their prompts with the finished outputs (10 tokens),
    not the finished prompts: 201..210 tokens held, 13 blocks of 16 for 8 steps and
    14 for 2."""
    for r in requests(8, prompt=40, max_tokens=10):
        sched.add_request(r)
    sched.tuned.slot.offer(decision(8))
    while sched.has_requests():
        step(sched)
    for r in requests(4, prompt=200, max_tokens=10, start=8):
        sched.add_request(r)
    assert sorted(sched.present_prompts()) == [200] * 4
    dec = sched.controller.run_once()
    assert dec.inputs["demand_samples"] == 8
    assert dec.inputs["demand_mean_blocks"] == pytest.approx(13.2)
    assert dec.inputs["demand_std_blocks"] == pytest.approx(0.4)
    step(sched)                       # admitted, running: still held
    assert len(sched.running) > 0
    assert sorted(sched.present_prompts()) == [200] * 4


def test_a_prompt_part_computed_is_counted_as_prefilling(sched):
    """A 200-token prompt under a 64-token budget: after one step it runs with 64 of
    its tokens computed and no first token (prefilling 1, waiting 0); four steps in,
    its first token has come (prefilling 0)."""
    sched.tuned.slot.offer(decision(4, budget=64))
    sched.add_request(requests(1, prompt=200, max_tokens=10)[0])
    assert sched.prefilling() == 0                 # waiting, not admitted
    step(sched)
    assert (len(sched.running), sched.get_request_counts()[1]) == (1, 0)
    assert sched.prefilling() == 1
    for _ in range(3):
        step(sched)
    assert sched.prefilling() == 0
    assert len(sched.running) == 1


def test_unsupported_vllm_version_is_a_clear_error():
    assert check_vllm_version("0.32.0") == (0, 32)
    assert check_vllm_version("0.33.0") == (0, 33)
    assert check_vllm_version("0.33.2rc1") == (0, 33)
    message = ("tuned's scheduler adapter supports vLLM 0.32.x and 0.33.x; found {}. "
               "Install a supported vLLM (extras: tuned-llm[gpu] or tuned-llm[cpu]).")
    for version in ("0.31.2", "0.34.0", "1.0.0"):
        with pytest.raises(UnsupportedVllmError) as e:
            check_vllm_version(version)
        assert str(e.value) == message.format(version)
    with pytest.raises(UnsupportedVllmError, match=r"^cannot parse vLLM version 'dev'$"):
        check_vllm_version("dev")


def test_the_step_path_never_calls_the_controller(tiny_model, monkeypatch):
    """Contract: the engine's step path reads the slot (knobs) and the queue channel
    (the queue's inputs) and never calls the controller; a controller whose every method raises leaves the
    steps untouched."""
    from tuned.control.controller import Controller
    from tuned.core.queue_channel import QueueInputs

    s = make_scheduler(str(tiny_model), False, queue_policy="mcsf")
    try:
        marker = QueueInputs(speed_fn=None, step_model=None, tpot_sla_s=0.0, ttft_sla_s=0.0)
        s.tuned.queue_channel.publish(marker)
        for name in ("run_once", "observe", "decide", "act", "queue_inputs",
                     "decisions_json", "reload"):
            monkeypatch.setattr(s.controller, name, lambda *a, **k: 1 / 0)
        for attr in ("speed_fn", "cfg", "policy"):
            monkeypatch.delattr(s.controller, attr, raising=False)
        for r in requests(3):
            s.add_request(r)
        while s.has_requests():
            step(s)
        assert len(s.finished.since(0)) == 3
        assert s._tuned_errors == 0
        assert s.tuned.queue_channel.inputs is marker
    finally:
        s.shutdown()


def test_the_controller_publishes_the_queue_inputs_it_derives(sched):
    """What the queue reads is what the controller derived, published on each change."""
    ctrl = sched.controller
    assert ctrl.queue_channel.inputs == ctrl.queue_inputs()
    assert ctrl.queue_channel.inputs.step_model is None      # no step fit yet: guard off


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Scheduler", "AsyncScheduler"])
def test_vllm_answers_a_refusal_by_finishing_it_aborted_with_no_tokens(tiny_model,
                                                                       asynchronous):
    """vLLM's answer to the queue's refusal (tuned.core.refusal.RefusalAnswer): a request
    waiting past max_wait_s is finished as aborted before any token, its client gets
    one final output (finish reason abort, no tokens) with the step's outputs, and the
    queue counts it; a fresh request is admitted as usual."""
    from vllm.v1.engine import FinishReason
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus

    from tuned.core.refusal import client_refusal
    from fakes import req

    s = make_scheduler(str(tiny_model), asynchronous, max_wait_s=1.0, on_max_wait="refuse")
    try:
        now = time.time()
        old = [req("old0", t=now - 10.0), req("old1", t=now - 5.0)]
        for r in [*old, req("fresh", t=now)]:
            s.add_request(r)
        so = s.schedule()
        assert list(so.num_scheduled_tokens) == ["fresh"]
        assert all(r.status == RequestStatus.FINISHED_ABORTED for r in old)
        ids = list(so.num_scheduled_tokens)
        result = s.update_from_output(so, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[[7] for _ in ids]))
        outs = {o.request_id: o for eco in result.values() for o in eco.outputs}
        assert {rid: (o.finish_reason, o.new_token_ids) for rid, o in outs.items()
                if rid != "fresh"} == {"old0": (FinishReason.ABORT, []),
                                       "old1": (FinishReason.ABORT, [])}
        # what the client reads: a stream ending with finish reason abort, no token
        assert client_refusal(tokens=0, finish=str(outs["old0"].finish_reason)) == \
            "refused: aborted before any token"
        assert s.waiting.snapshot()["refused"] == 2
        assert s.waiting.refusals.take() == []          # answered once
    finally:
        s.shutdown()


@pytest.mark.parametrize("native", [False, True], ids=["tuned-queue", "vllm-queue"])
def test_the_oldest_wait_is_read_from_the_queue_the_engine_keeps(tiny_model, native):
    """The controller reads how long the longest-waiting request has waited (the SLA
    bound steps aside past the TTFT SLO): from tuned's queue, or from vLLM's own FCFS
    queue where tuned keeps none. Requests stamped 5 s and 2 s ago wait behind a cap
    of 1: the oldest waited 5 s; once it is admitted, the next 2 s; none, None."""
    over = ({"queue_policy": "fcfs", "admission_guard": "off"} if native
            else {"queue_policy": "mcsf"})
    s = make_scheduler(str(tiny_model), False, **over)
    try:
        from tuned.core.queue import QueueCore

        assert isinstance(s.waiting, QueueCore) is not native
        reqs = requests(2, max_tokens=3)
        now = time.time()
        reqs[0].arrival_time, reqs[1].arrival_time = now - 5.0, now - 2.0
        assert s.oldest_wait_s() is None
        for r in reqs:
            s.add_request(r)
        assert s.oldest_wait_s() == pytest.approx(5.0, abs=0.5)
        s.tuned.slot.offer(decision(1))
        step(s)
        assert [r.request_id for r in s.running] == ["r0"]
        assert s.oldest_wait_s() == pytest.approx(2.0, abs=0.5)
        s.tuned.slot.offer(decision(2))
        step(s)
        assert s.oldest_wait_s() is None
        obs = s.controller.observe()
        assert obs.oldest_wait_s is None
    finally:
        s.shutdown()
