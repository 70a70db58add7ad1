"""The wait bound around any queue policy: a request the policy keeps
passing over is served once it has waited twice the TTFT target (aging), or refused
at the bound; with ``on_max_wait = "off"`` (the queue as it was) it waits until the stream
of on-time requests stops."""

from __future__ import annotations


import pytest

from tuned import config as config_mod
from fakes import QueuedReq
from tuned.core.queue import QueueCore
from tuned.core.queue_policy import AdmitContext
from tuned.core.wait_bound import WaitBound
from tuned.curves.online import LinearStepModel
from tuned.policies.fcfs import FCFSPolicy
from tuned.policies.registry import make_policy

STEP_S = 0.1            # one engine step, one admission per step
TTFT_S = 1.0            # the TTFT target: late_after_s
BOUND_S = 10 * TTFT_S   # the bound these tests set: 10 x the target (serve's default)
AGE_S = 2 * TTFT_S      # the default aging point: 2 x the target
# 1 ms per prompt token: a 980-token prompt turns late 20 ms after it arrives
MODEL = LinearStepModel(a=0.0, beta=0.0, gamma=0.001)


Req = QueuedReq


def ctx(now_s: float) -> AdmitContext:
    return AdmitContext(now_s=now_s, kv_capacity_tokens=1 << 20, kv_free_tokens=1 << 20,
                        cap=64, step_model=MODEL, token_budget=1024, num_running=0)


def run(q: QueueCore, arrivals: list[Req], until_s: float) -> tuple[dict, dict]:
    """Steps of STEP_S: the arrivals due join, then one request is admitted. Returns
    (admitted id -> wait, refused id -> wait)."""
    admitted, refused = {}, {}
    pending = sorted(arrivals, key=lambda r: r.arrival_time)
    now, i = 0.0, 0
    while now <= until_s and (i < len(pending) or len(q)):
        while i < len(pending) and pending[i].arrival_time <= now + 1e-9:
            q.add_request(pending[i])
            i += 1
        q.begin_step(ctx(now), [])
        for r, event in q.refusals.take():
            assert (event.reason, event.request_id, event.at_s) == ("max_wait", r.request_id, now)
            refused[r.request_id] = event.waited_s
        if q:
            r = q.pop_request()
            admitted[r.request_id] = now - r.arrival_time
        now = round(now + STEP_S, 9)
    return admitted, refused


def stream(n_steps: int, per_step: int = 1, start: float = 0.0) -> list[Req]:
    """Short prompts, ``per_step`` arriving every step: always one on time waiting."""
    return [Req(f"s{k}-{j}", round(start + k * STEP_S, 9), 10)
            for k in range(n_steps) for j in range(per_step)]


def starving_load() -> list[Req]:
    """Five short prompts at 0, one long one just after them, then a steady stream of
    short ones for 30 s: the long prompt turns late after 20 ms, and one on-time short
    prompt always waits ahead of it."""
    head = [Req(f"h{j}", 0.0, 10) for j in range(5)]
    return head + [Req("big", 0.0, 980)] + stream(300, start=STEP_S)


def bounded(on_max_wait: str) -> QueueCore:
    """fcfs with the TTFT target and a wait bound of 10x it (refusing by default at
    the target itself: these tests read the bound's arithmetic on a longer one)."""
    cfg = config_mod.validate({"ttft_sla_s": TTFT_S, "on_max_wait": on_max_wait,
                               "max_wait_s": BOUND_S})
    q = QueueCore(make_policy("fcfs", cfg.queue_spec()[1]))
    q.set_wait_bound(cfg.wait_bound_spec())
    return q


def test_the_default_bound_is_the_ttft_target_when_refusing():
    cfg = config_mod.validate({"ttft_sla_s": 2.0})
    assert cfg.wait_bound_spec() == (2.0, True, 1.0)
    assert config_mod.validate({"ttft_sla_s": 2.0, "on_max_wait": "serve"}
                               ).wait_bound_spec() == (20.0, False, 4.0)
    assert config_mod.validate({"ttft_sla_s": 2.0, "max_wait_s": 7.5,
                                "on_max_wait": "serve"}).wait_bound_spec() == (7.5, False, 3.75)
    assert config_mod.validate({"max_wait_s": 30.0}).wait_bound_spec() == (30.0, True, 15.0)
    assert config_mod.validate({"ttft_sla_s": 2.0, "age_after_s": 9.0}).wait_bound_spec() == (
        2.0, True, 2.0)
    assert config_mod.validate({"ttft_sla_s": 2.0, "on_max_wait": "off"}).wait_bound_spec() is None
    assert config_mod.validate({}).wait_bound_spec() is None          # no TTFT target
    assert not config_mod.validate({"max_wait_s": 30.0}).native_queue
    with pytest.raises(config_mod.ConfigError, match="on_max_wait"):
        config_mod.validate({"on_max_wait": "drop"})


def test_without_the_bound_a_passed_over_request_waits_for_the_lull():
    q = bounded("off")
    admitted, refused = run(q, starving_load(), until_s=60.0)
    assert refused == {}
    # admitted only once the stream stopped (the last short prompt arrives at 30 s)
    assert admitted["big"] > 30.0 > BOUND_S


def test_aging_serves_it_within_the_bound():
    """(a) served late within the bound: its turn comes at twice the TTFT target."""
    q = bounded("serve")
    admitted, refused = run(q, starving_load(), until_s=60.0)
    assert refused == {}
    assert AGE_S <= admitted["big"] < AGE_S + STEP_S
    assert q.refusals.bound.aged == 1 and q.snapshot()["aged"] == 1
    assert max(admitted.values()) < BOUND_S


def test_under_sustained_overload_every_wait_ends_by_the_bound():
    """(b) two arrivals a step, one admission: no order serves everyone within the
    bound, so the requests still waiting at it are refused, never past the bound
    and no earlier than the bound less the largest lead (the 10-token prefill, 0.01 s,
    and the step the first token would come out of, carrying a full budget of the
    prompts pending: T(0, 1024) = 1.024 s) and the step now, which the refusal's
    answer waits for (1.024 s again): at the first step after 7.942 s while the
    stream lasts, later as the queue drains and the pending prefill shrinks. No
    admitted request waited the bound."""
    q = bounded("refuse")
    arrivals = stream(200, per_step=2)
    admitted, refused = run(q, arrivals, until_s=40.0)
    assert len(admitted) + len(refused) + len(q) == len(arrivals)
    assert refused, "an overload this size must refuse"
    due = BOUND_S - (1.024 + 0.01 + 1.024)
    assert all(due - 1e-9 <= w <= BOUND_S + 1e-9 for w in refused.values())
    assert min(refused.values()) == pytest.approx(8.0)
    assert max(admitted.values()) < BOUND_S
    assert q.snapshot()["refused"] == len(refused)


def test_the_largest_prompt_is_not_always_the_one_sacrificed():
    """Long prompts of several sizes among the stream: Moore and Hodgson's rule sets
    the largest prefills aside. Without the bound every long prompt waits for the
    lull, the largest among the longest waits; with it each is served by the bound."""
    longs = [Req(f"long{p}", round(0.05 + k * 2.0, 9), p)
             for k, p in enumerate((600, 800, 990, 700, 950))]
    load = [Req(f"h{j}", 0.0, 10) for j in range(5)] + longs + stream(300, start=STEP_S)
    off, _ = run(bounded("off"), load, until_s=80.0)
    on, refused = run(bounded("refuse"), load, until_s=80.0)
    assert min(off[r.request_id] for r in longs) > BOUND_S
    assert refused == {}
    assert max(on[r.request_id] for r in longs) < BOUND_S


def test_bound_rejects_a_bad_value():
    with pytest.raises(ValueError, match=r"max_wait_s: must be a number of seconds > 0, got 0"):
        WaitBound(0, True)


def test_fcfs_policy_alone_is_unchanged_by_an_unset_bound():
    q = QueueCore(FCFSPolicy(late_after_s=TTFT_S))
    assert q.refusals.bound is None
    admitted, refused = run(q, starving_load(), until_s=60.0)
    assert admitted["big"] > 30.0 and refused == {}


def refusal_times(arrivals: list[Req], n_steps: int) -> dict[str, float]:
    """A refusing queue that only waits (nothing is admitted) for ``n_steps`` steps:
    each refused request's wait when it was refused."""
    q = bounded("refuse")
    refused = {}
    for k in range(n_steps):
        now = round(k * STEP_S, 9)
        for r in arrivals:
            if r.arrival_time == now:
                q.add_request(r)
        q.begin_step(ctx(now), [])
        for r, _ in q.refusals.take():
            refused.setdefault(r.request_id, now - r.arrival_time)
    return refused


def test_a_long_prompt_is_refused_its_prefill_early():
    """With the step model, a request is refused once its wait plus its lead reaches
    the bound: its prefill at the engine's pace (1 ms per prompt token here), plus the
    step it would come out of, carrying the prompts pending up to the budget (T(0,
    1024) = 1.024 s), and that step again for the refusal's answer (it goes out as the
    step now ends, and the next check comes a step later): a 3000-token prompt at
    10 - 5.048 = 4.952 s, the first step at or after it 5.0 s, so its answer would not
    come past the bound."""
    refused = refusal_times([Req("long", 0.0, 3000)] + stream(200, per_step=2), 120)
    assert refused["long"] == pytest.approx(5.0)


def test_a_younger_longer_prompt_is_refused_before_the_oldest():
    """Every request within reach of the bound is checked, not only the oldest: a
    3000-token prompt from t = 1 s, behind a 10-token one from t = 0, is refused after
    waiting 10 - (0.01 + 3.0 + 2 x 1.024) = 4.942 s (the step at 6.0 s: its lead is the
    prompt ahead, its own and a full budget's step, and its answer waits a step), first;
    the 10-token one, alone then, after 10 - (0.01 + 2 x 0.01) = 9.97 s (the step at
    10.0 s)."""
    refused = refusal_times([Req("old", 0.0, 10), Req("long", 1.0, 3000)], 110)
    assert refused == {"long": pytest.approx(5.0), "old": pytest.approx(10.0)}


def test_the_prefill_ahead_counts_in_the_lead():
    """The prompt tokens the running requests still owe are prefilled first: with 2000
    of them (one running request, none of its prompt computed), a 10-token prompt's
    lead is 2.010 s and the step it comes out of, T(1, 1023) = 1.023 s, and its answer
    waits for the step now (1.023 s again): refused at the step at or after
    10 - 4.056 = 5.944 s."""
    q = bounded("refuse")
    q.add_request(Req("r", 0.0, 10))
    running = [Req("running", 0.0, 2000)]      # none of its prompt computed yet
    refused = None
    for k in range(100):
        now = round(k * STEP_S, 9)
        q.begin_step(ctx(now), running)
        out = q.refusals.take()
        if out and refused is None:
            refused = now
    assert refused == pytest.approx(6.0)
