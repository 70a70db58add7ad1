"""vLLM's ``--scheduling-policy priority`` with tuned inside, on the real CPU engine:
the priority measurement. One request at a time (``max_num_seqs = 1``, tuned's cap
1): a long request running, three requests at priority 10 queued behind it, then one
at priority -10. The -10 one must run right after the long one, before the three
others, as vLLM's own priority queue runs it.

One ``tuned serve`` for the module, three phases switched by live reload (the
helpers of test_e2e_queue_policies, which explains how the order is read: the
engine paused in mode "keep" while the backlog is queued, admissions read from
tuned's /steps by distinct prompt lengths):

* ``fcfs`` with no options: vLLM's own waiting queue (its PriorityRequestQueue) --
  plain vLLM's order;
* ``fcfs`` with ``late_after_s``: tuned's queue installed, fcfs order: the same;
* ``mcsf``: tuned's queue, shortest predicted output first within a priority level:
  the -10 request still first, the three priority-10 ones shortest first.

The server also gets ``--async-scheduling``, which vLLM's CPU build turns off: tuned
then runs on vLLM's synchronous ``Scheduler`` (the last test reads it from the log).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest

from serve_harness import get_json, tuned_serve
from test_e2e_queue_policies import (Ctx, admissions, engine_pause, engine_resume,
                                     policy_lines, queue_installed, settle, steps_since,
                                     use_policy, wait_ticks)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def base_config(model) -> str:
    return (f'model = "{model}"\nmax_num_seqs = 1\nmax_num_batched_tokens = 1024\n'
            f"max_model_len = 1024\nnum_gpu_blocks = 11\ninterval_s = 0.25\n"
            f"stale_after_s = 5.0\nb_min = 1\nb_max = 1\nfallback_cap = 1\n"
            f'vllm_args = ["--enforce-eager", "--scheduling-policy", "priority", '
            f'"--async-scheduling"]\n')


@pytest.fixture(scope="module")
def ctx(tmp_path_factory, tiny_model):
    from openai import OpenAI

    base = base_config(tiny_model)
    tmp = tmp_path_factory.mktemp("priority")
    with tuned_serve(tmp, base + policy_lines("fcfs"),
                     env_extra={"VLLM_SERVER_DEV_MODE": "1"}) as srv:
        client = OpenAI(base_url=srv.api, api_key="none", max_retries=0, timeout=300)
        yield Ctx(srv, client, srv.model_id(), base)


@dataclass
class PReq:
    name: str
    priority: int
    prompt_tokens: int
    max_tokens: int
    completion_tokens: int | None = None
    error: str | None = None


def send(c: Ctx, r: PReq) -> None:
    import random

    rng = random.Random(r.name)
    prompt = [rng.randrange(10, 500) for _ in range(r.prompt_tokens)]
    try:
        out = c.client.completions.create(
            model=c.model, prompt=prompt, max_tokens=r.max_tokens,
            extra_body={"ignore_eos": True, "priority": r.priority,
                        "vllm_xargs": {"tuned_output_tokens": r.max_tokens}})
        r.completion_tokens = out.usage.completion_tokens
    except Exception as e:  # reported by the test
        r.error = f"{type(e).__name__}: {e}"


def telemetry(c: Ctx) -> dict:
    return c.srv.decisions(0)["telemetry"]


def start_long_and_pause(c: Ctx) -> tuple[PReq, threading.Thread, int]:
    """The long request admitted and still running with the engine paused (mode
    keep); returns it, its thread and the /steps sequence before it was sent.

    Its 900 tokens take about a second on a fast host, and /decisions sees it
    running up to a tick (0.25 s) late, so the pause can land after it finished
    (a CI host did: running 0 once the other four were queued). The state is
    read after the pause, one whole tick later; if the long request finished
    before that, the engine is resumed, the request is let finish, and it starts
    again."""
    for _ in range(5):
        settle(c)
        step0 = get_json(f"{c.srv.endpoint}/steps?since=0")["next"]
        long = PReq("long", 0, 30, 900)
        thread = threading.Thread(target=send, args=(c, long), daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while telemetry(c)["running"] < 1 and long.completion_tokens is None:
            assert long.error is None and time.monotonic() < deadline, long
            time.sleep(0.01)
        if long.completion_tokens is None:
            engine_pause(c)
            wait_ticks(c.srv, 1)
            tel = telemetry(c)
            if (tel["running"], tel["waiting"]) == (1, 0) and long.completion_tokens is None:
                return long, thread, step0
            engine_resume(c)
        thread.join(300)
        assert long.error is None, long
    raise AssertionError("the long request finished before the pause, 5 times")


def run_priority_measurement(c: Ctx) -> list[str]:
    """The long request admitted and running, then the engine paused while three
    priority-10 requests and one priority -10 request queue behind it; the admission
    order after the resume, by name."""
    long, first, step0 = start_long_and_pause(c)
    low = [PReq("lo1", 10, 31, 30), PReq("lo2", 10, 32, 20), PReq("lo3", 10, 33, 10)]
    high = PReq("hi", -10, 34, 40)
    reqs = [long, *low, high]
    by_len = {r.prompt_tokens: r.name for r in reqs}
    threads = [first]
    try:
        for i, r in enumerate([*low, high]):
            t = threading.Thread(target=send, args=(c, r), daemon=True)
            t.start()
            threads.append(t)
            deadline = time.monotonic() + 30
            while telemetry(c)["waiting"] < i + 1:
                assert r.error is None and time.monotonic() < deadline, r
                time.sleep(0.01)
        tel = telemetry(c)
        assert (tel["running"], tel["waiting"]) == (1, 4), tel
    finally:
        engine_resume(c)
    for t in threads:
        t.join(300)
    assert [r.error for r in reqs if r.error] == []
    assert [r.completion_tokens for r in reqs] == [r.max_tokens for r in reqs]
    steps = steps_since(c, step0)
    # one request at a time and no preemption: admission order is finish order
    assert max(s["num_running"] for s in steps) <= 1
    assert sum(s["preempted"] for s in steps) == 0
    return [by_len.get(n, f"?{n}") for n in admissions(steps)]


def test_vllms_own_priority_queue(ctx):
    """fcfs without options keeps vLLM's queue: plain vLLM's priority order."""
    use_policy(ctx, "fcfs")
    assert run_priority_measurement(ctx) == ["long", "hi", "lo1", "lo2", "lo3"]
    settle(ctx)
    assert not queue_installed(ctx)


def test_tuned_queue_fcfs_honours_priority(ctx):
    """tuned's queue installed (fcfs with a lateness option): the -10 request
    overtakes the three queued priority-10 ones, which keep arrival order."""
    use_policy(ctx, "fcfs", "late_after_s = 1000.0")
    assert run_priority_measurement(ctx) == ["long", "hi", "lo1", "lo2", "lo3"]
    settle(ctx)     # the queue is installed at the first step after the reload
    assert queue_installed(ctx)


def test_tuned_queue_mcsf_orders_within_a_priority_level(ctx):
    """mcsf: priority first, then shortest predicted output within the level."""
    use_policy(ctx, "mcsf")
    assert run_priority_measurement(ctx) == ["long", "hi", "lo3", "lo2", "lo1"]
    settle(ctx)     # the queue is installed at the first step after the reload
    assert queue_installed(ctx)


def test_async_scheduling_is_turned_off_by_the_cpu_build(ctx):
    """--async-scheduling was passed; vLLM's CPU platform sets it off and tuned runs
    on the synchronous base (``AsyncScheduler`` on a GPU)."""
    from serve_harness import log_events

    started = log_events(ctx.srv.log_path, "tuned_started")
    assert [e["scheduler"] for e in started] == ["Scheduler"], started
