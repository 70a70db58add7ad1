"""The simulated engine (tuned.sim.engine): vLLM v1's scheduling invariants on random
workloads, hand-worked timelines, and the rule that it runs the shared control core.

The properties run on a step-time model whose times are multiples of 2**-12 s, with
arrivals on a 2**-10 s grid and controller ticks every 2**-4 s: every virtual time is
then an exact binary fraction, so "the decision made before this step" is an exact
comparison, not a tolerance. Seeds are fixed (``derandomize=True``, no database).
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuned import config as config_mod
from tuned.config import BATCH_POLICIES, QUEUE_POLICIES
from tuned.core.knobs import KnobSlot
from tuned.core.queue import QueueCore
from tuned.core.window import request_tpot_s
from tuned.sim.engine import FcfsQueue, SimEngine
from tuned.sim.stepmodel import ConstantStepModel, StepShape
from tuned.commands.simulate import result_json, run_summary
from tuned.base.workloads import RequestSpec, Workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]

PROPS = settings(derandomize=True, database=None, deadline=None, max_examples=30,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INTERVAL_S = 2.0 ** -4   # controller period: a binary fraction, ticks land exactly


class DyadicStepModel:
    """A linear step time (fixed cost, per decode, per prefill token, per resident KV
    token) rounded up to a multiple of 2**-12 s: always > 0, and exact in binary."""

    name = "dyadic-linear"

    def step_s(self, shape: StepShape) -> float:
        raw = (0.006 + 0.003 * shape.num_decode + 5e-5 * shape.prefill_tokens
               + 1e-6 * shape.kv_tokens)
        return math.ceil(raw * 4096) / 4096

    def describe(self) -> dict:
        return {"kind": "dyadic-linear"}


def make_cfg(**kw) -> config_mod.Config:
    raw = {"max_num_seqs": 8, "max_num_batched_tokens": 256, "min_chunk_tokens": 1,
           "fallback_cap": 1, "interval_s": INTERVAL_S, "tbt_window_s": 0.5,
           "batch_policy": "static", "log_level": "error"}
    raw.update(kw)
    return config_mod.validate(raw)


class RunningLog(list):
    """The engine's ``running`` list, recording each admission with the cap in force
    and each preemption victim with the admission order of what was running."""

    def __init__(self, eng: SimEngine):
        super().__init__()
        self.eng = eng
        self.admissions: list[tuple[str, int, int]] = []   # (id, running before, cap)
        self.order: dict[str, int] = {}
        self.victims: list[tuple[str, int, int]] = []      # (id, its order, newest order)

    def append(self, r) -> None:
        self.admissions.append((r.request_id, len(self), self.eng.cap))
        self.order[r.request_id] = len(self.admissions)
        super().append(r)

    def pop(self, *args):
        newest = max(self.order[r.request_id] for r in self)
        r = super().pop(*args)
        self.victims.append((r.request_id, self.order[r.request_id], newest))
        return r


def run_engine(cfg, specs, *, step_model=None, block_size=16, num_gpu_blocks=64, **kw):
    eng = SimEngine(cfg, step_model or DyadicStepModel(), block_size=block_size,
                    num_gpu_blocks=num_gpu_blocks, record_token_times=True, **kw)
    log = RunningLog(eng)
    eng.running = log
    res = eng.run(specs)
    return eng, res, log


def blocks_needed(spec: RequestSpec, block_size: int) -> int:
    # the last sampled token is never fed back, so it never takes a KV slot
    return -(-(spec.prompt_tokens + spec.output_tokens - 1) // block_size)


# ------------------------------------------------------------------ strategies

@st.composite
def workloads(draw, max_n: int = 14, max_prompt: int = 80, max_output: int = 60):
    n = draw(st.integers(1, max_n))
    t, specs = 0.0, []
    for i in range(n):
        t += draw(st.integers(0, 100)) / 1024
        p = draw(st.integers(1, max_prompt))
        o = draw(st.integers(1, max_output))
        specs.append(RequestSpec(f"r{i:03d}", t, p, o, o))
    return specs


@st.composite
def engines(draw):
    """(config, requests, block size, blocks) with a cache that holds every request
    alone and sometimes little more, so that preemption is common."""
    specs = draw(workloads())
    block_size = draw(st.sampled_from([1, 4, 16]))
    need = max(blocks_needed(s, block_size) for s in specs)
    num_gpu_blocks = need + 1 + draw(st.integers(0, 12))
    seqs = draw(st.integers(1, 12))
    budget = draw(st.integers(max(16, seqs + 1), 160))
    policy = draw(st.sampled_from(["tuned", "static", "memory", "sla"]))
    extra = {"tbt_sla_s": 0.02} if policy in ("tuned", "sla") else {}
    cfg = make_cfg(max_num_seqs=seqs, max_num_batched_tokens=budget, batch_policy=policy,
                   fallback_cap=min(4, seqs), **extra)
    return cfg, specs, block_size, num_gpu_blocks


# ------------------------------------------------------------------ the invariants

def check_invariants(eng: SimEngine, res, log: RunningLog, specs, *, budget_applies=True,
                     strict_ttft=True) -> None:
    by_id = {s.request_id: s for s in specs}
    # every request finished, once, with exactly its output length
    assert res.failed == []
    assert sorted(r.request_id for r in res.requests) == sorted(by_id)
    finished = [f.request_id for f in eng.finished.since(0)]
    assert sorted(finished) == sorted(by_id)
    for r in res.requests:
        s = by_id[r.request_id]
        assert r.num_output_tokens == s.output_tokens
        assert r.finish_s is not None and r.first_token_s is not None
        assert r.first_token_s <= r.finish_s
        if strict_ttft:
            assert r.first_token_s > r.arrival_time
        else:
            assert r.first_token_s >= r.arrival_time
        assert len(r.token_times) == s.output_tokens
        assert r.token_times[0] == r.first_token_s and r.token_times[-1] == r.finish_s
        assert r.token_times == sorted(r.token_times)
        assert r.num_blocks == 0
    # tokens are conserved: generated = outputs; scheduled = every fed token, once per
    # computation: prompt + output - 1 (the last token is never fed) + what preemption
    # threw away and recomputed. (Prefill tokens alone are not prompts + recomputed: a
    # one-token chunk counts as a decode, and a resumed request prefills the token it
    # would have decoded.)
    steps = res.steps
    assert sum(s.generated_tokens for s in steps) == sum(s.output_tokens for s in specs)
    recomputed = sum(r.recomputed_tokens for r in res.requests)
    assert sum(s.scheduled_tokens for s in steps) == \
        sum(s.prompt_tokens + s.output_tokens - 1 for s in specs) + recomputed
    assert sum(s.preempted for s in steps) == sum(r.preemptions for r in res.requests)
    assert (recomputed > 0) == any(r.preemptions for r in res.requests)
    # a request given one token is a decode (the vLLM adapter's count); all else prefill
    for s in steps:
        assert s.scheduled_tokens == s.num_decode + s.prefill_tokens
        assert s.prefill_tokens >= 2 * s.num_prefill_reqs
        assert s.generated_tokens <= s.num_decode + s.num_prefill_reqs
    # KV blocks: within the cache (the null block excluded), consistent with the
    # resident tokens of the running requests, all returned at the end
    bs, usable = eng.block_size, eng.num_gpu_blocks - 1
    for s in steps:
        assert 0 <= s.kv_used_blocks <= usable
        assert s.kv_used_blocks * bs >= s.kv_tokens_resident
        assert s.kv_used_blocks * bs < s.kv_tokens_resident + bs * max(s.num_running, 1)
        assert s.kv_usage == s.kv_used_blocks / usable     # vLLM's get_usage()
    last = steps[-1]
    assert (last.kv_used_blocks, last.kv_tokens_resident, last.num_running,
            last.num_waiting) == (0, 0, 0, 0)
    assert eng.free_blocks == usable
    # the applied knobs: each admission under the cap in force; a lower cap lets the
    # requests already running finish (vLLM's gate stops admissions, never evicts),
    # so running after a step <= max(running after the step before, its cap)
    assert len(res.knobs) == len(steps)
    for rid, running_before, cap in log.admissions:
        assert running_before < cap, (rid, running_before, cap)
    prev = 0
    for s, (cap, budget) in zip(steps, res.knobs):
        assert s.num_running <= max(prev, cap)
        if budget_applies:
            assert s.scheduled_tokens <= budget
        prev = s.num_running
    # preemption victims: always the most recently admitted running request
    for rid, order, newest in log.victims:
        assert order == newest, rid


def check_knobs_are_the_controllers(eng: SimEngine, res) -> None:
    """Each step's (cap, budget) is the slot's clamp of the newest decision made at or
    before the step's start (a tick at the very start runs first), or the fallback cap
    with the full budget before any decision."""
    slot = eng.controller.slot
    assert slot.fallback_cause is None
    assert res.decisions, "the tick at t=0 decides before the first step"
    fallback = slot.clamp(eng.cfg.fallback_cap, eng.max_num_batched_tokens)
    times = [d["t"] for d in res.decisions]
    assert times == sorted(times)
    j = -1
    for s, knobs in zip(res.steps, res.knobs):
        start = s.t - s.step_s
        while j + 1 < len(times) and times[j + 1] <= start:
            j += 1
        if j < 0:
            want = fallback
        else:
            d = res.decisions[j]
            want = slot.clamp(d["cap"], d["token_budget"])
        assert knobs == tuple(want), (s.seq, start, knobs, want)


# ------------------------------------------------------------------ properties

@PROPS
@given(engines())
def test_random_workloads_keep_every_invariant(case):
    cfg, specs, block_size, num_gpu_blocks = case
    eng, res, log = run_engine(cfg, specs, block_size=block_size, num_gpu_blocks=num_gpu_blocks)
    check_invariants(eng, res, log, specs)
    check_knobs_are_the_controllers(eng, res)


@PROPS
@given(engines(), st.sampled_from(QUEUE_POLICIES))
def test_one_seed_gives_byte_identical_result_json(case, queue_policy):
    cfg, specs, block_size, num_gpu_blocks = case
    cfg = config_mod.validate({**_file(cfg), "queue_policy": queue_policy})
    wl = Workload("hypothesis", tuple(specs))
    texts = []
    for _ in range(2):
        eng = SimEngine(cfg, DyadicStepModel(), block_size=block_size,
                        num_gpu_blocks=num_gpu_blocks)
        res = eng.run(specs)
        texts.append(result_json(res, wl, run_summary(res)))
    assert texts[0] == texts[1]
    assert '"requests":[' in texts[0]


def _file(cfg) -> dict:
    d = cfg.to_dict()
    d.pop("source_path")
    return d


@st.composite
def tiny_cache_workloads(draw):
    """2-6 requests that each fit alone in 4 blocks of 4 tokens, with outputs long
    enough that two of them decoding side by side outgrow the cache."""
    n = draw(st.integers(2, 6))
    t, specs = 0.0, []
    for i in range(n):
        t += draw(st.integers(0, 40)) / 1024
        p = draw(st.integers(1, 8))
        o = draw(st.integers(4, 17 - p))
        specs.append(RequestSpec(f"r{i:03d}", t, p, o, o))
    return specs


@PROPS
@given(tiny_cache_workloads(), st.integers(2, 4))
def test_tiny_cache_long_outputs_preempt_and_still_finish(specs, seqs):
    cfg = make_cfg(max_num_seqs=seqs, fallback_cap=seqs)
    eng, res, log = run_engine(cfg, specs, block_size=4, num_gpu_blocks=5)
    check_invariants(eng, res, log, specs)


def test_tiny_cache_preempts_on_a_fixed_workload():
    specs = [RequestSpec(f"r{i}", 0.0, 4, 12, 12) for i in range(3)]
    cfg = make_cfg(max_num_seqs=3, fallback_cap=3)
    eng, res, log = run_engine(cfg, specs, block_size=4, num_gpu_blocks=5)
    check_invariants(eng, res, log, specs)
    assert sum(s.preempted for s in res.steps) >= 2
    assert [v[0] for v in log.victims][:1] == ["r2"]


@pytest.mark.parametrize("queue_policy", ["multibin", "saber"])
def test_the_queue_sees_every_step_from_its_top(queue_policy):
    """Contract step 2, as the vLLM adapter does it (before vLLM's schedule()): the
    queue's begin_step runs at the top of every step, preempting steps included, and
    its context holds the free KV of that moment, before the running pass grows."""
    specs = [RequestSpec(f"r{i}", 0.0, 4, 12, 12) for i in range(3)]
    cfg = make_cfg(max_num_seqs=3, fallback_cap=3, queue_policy=queue_policy)
    eng = SimEngine(cfg, DyadicStepModel(), block_size=4, num_gpu_blocks=5)
    seen: dict[int, int] = {}
    begin = eng.waiting.begin_step

    def spy(ctx, running):
        seen[eng.steps.next_seq] = ctx.kv_free_tokens
        begin(ctx, running)
    eng.waiting.begin_step = spy
    res = eng.run(specs)
    assert sum(s.preempted for s in res.steps) >= 2
    assert set(seen) >= {s.seq for s in res.steps}
    used_before = [0] + [s.kv_used_blocks for s in res.steps[:-1]]
    assert [seen[s.seq] for s in res.steps] == [(4 - u) * 4 for u in used_before]


# ------------------------------------------------------------------ every policy

SMALL = "poisson:rate=40,prompt=U(8,120),output=U(4,60),n=30"
SABER = "saber:mix=W3,rate=20,n=30,length_scale=0.1"


@pytest.mark.parametrize("batch_policy", BATCH_POLICIES)
@pytest.mark.parametrize("queue_policy", QUEUE_POLICIES)
def test_every_queue_and_batch_policy_runs_to_completion(queue_policy, batch_policy):
    wl = parse_workload(SABER if queue_policy == "saber" else SMALL, seed=3)
    cfg = make_cfg(max_num_seqs=16, max_num_batched_tokens=512, fallback_cap=4,
                   queue_policy=queue_policy, batch_policy=batch_policy, tbt_sla_s=0.012,
                   interval_s=0.125)
    eng, res, log = run_engine(cfg, list(wl.requests), num_gpu_blocks=48)
    assert eng.queue_policy == queue_policy
    # fcfs keeps the plain queue only without the TPOT admission guard (on: SLA set)
    assert cfg.guards_admission and not cfg.native_queue
    assert isinstance(eng.waiting, QueueCore)
    check_invariants(eng, res, log, wl.requests)
    check_knobs_are_the_controllers(eng, res)


def test_static_batch_policy_holds_the_ceiling():
    wl = parse_workload(SMALL, seed=1)
    eng, res, _ = run_engine(make_cfg(max_num_seqs=6, fallback_cap=2), list(wl.requests))
    assert set(res.knobs) == {(6, 256)}
    assert {d["reason"] for d in res.decisions} == {"static"}


# ------------------------------------------------------------------ hand-worked timelines
# ConstantStepModel (Multi-bin batching's model) charges step_s for a step with at least one
# decode and 0 for a prefill-only step: a request's first token comes at the end of
# the step that computes its last prompt token, at no cost when nothing decodes.

def const_run(specs, *, step_s=0.25, **cfg_kw):
    cfg_kw.setdefault("max_num_seqs", 4)
    cfg_kw.setdefault("fallback_cap", cfg_kw["max_num_seqs"])
    static = cfg_kw.pop("static_batching", False)
    blocks = cfg_kw.pop("num_gpu_blocks", 64)
    bs = cfg_kw.pop("block_size", 16)
    return run_engine(make_cfg(**cfg_kw), specs, step_model=ConstantStepModel(step_s),
                      block_size=bs, num_gpu_blocks=blocks, static_batching=static)


def test_one_request_prefill_is_free_then_one_step_per_token():
    eng, res, _ = const_run([RequestSpec("a", 0.0, 10, 5, 5)])
    (r,) = res.requests
    assert r.first_token_s == 0.0          # the prefill-only step costs nothing
    assert r.token_times == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert r.finish_s == 1.0
    assert [(s.t, s.step_s, s.num_decode, s.prefill_tokens) for s in res.steps] == \
        [(0.0, 0.0, 0, 10), (0.25, 0.25, 1, 0), (0.5, 0.25, 1, 0), (0.75, 0.25, 1, 0),
         (1.0, 0.25, 1, 0)]
    assert [s.kv_tokens_resident for s in res.steps] == [10, 11, 12, 13, 0]
    assert res.duration_s == 1.0
    # the finished ring carries the first token's time: TPOT (1.0 - 0.0) / 4 tokens
    (f,) = eng.finished.since(0)
    assert (f.first_token_s, f.t, request_tpot_s(f)) == (0.0, 1.0, 0.25)


def test_the_gap_between_steps_moves_the_clock_but_not_the_step_time():
    model = ConstantStepModel(0.25)
    model.gap_s = 0.05           # what a profile measured between back-to-back steps
    _, res, _ = run_engine(make_cfg(max_num_seqs=4, fallback_cap=4),
                           [RequestSpec("a", 0.0, 10, 3, 3)], step_model=model,
                           block_size=16, num_gpu_blocks=64)
    (r,) = res.requests
    assert r.token_times == pytest.approx([0.05, 0.35, 0.65])
    assert [s.step_s for s in res.steps] == [0.0, 0.25, 0.25]


def test_a_one_token_prompt_is_counted_and_charged_as_a_decode():
    _, res, _ = const_run([RequestSpec("a", 0.0, 1, 3, 3)])
    assert res.requests[0].token_times == [0.25, 0.5, 0.75]
    assert [s.num_decode for s in res.steps] == [1, 1, 1]


def test_a_late_arrival_waits_for_the_idle_engine_to_jump_to_it():
    _, res, _ = const_run([RequestSpec("a", 0.0, 8, 2, 2), RequestSpec("b", 3.0, 8, 2, 2)])
    a, b = res.requests
    assert (a.first_token_s, a.finish_s) == (0.0, 0.25)
    assert (b.first_token_s, b.finish_s) == (3.0, 3.25)


def test_chunked_prefill_runs_decodes_first_under_the_token_budget():
    """Budget 16, cap 2: A (prompt 4, output 6) and B (prompt 40, output 2).
    step 1: A 4 + B 12 (no decode: free)        -> A's first token at 0
    step 2: A 1 + B 15,  step 3: A 1 + B 13      -> B's first token at 0.5
    step 4: A 1 + B 1 (B done at 0.75), steps 5-6: A alone (done at 1.25)"""
    specs = [RequestSpec("A", 0.0, 4, 6, 6), RequestSpec("B", 0.0, 40, 2, 2)]
    _, res, _ = const_run(specs, max_num_seqs=2, max_num_batched_tokens=16)
    a, b = res.requests
    assert a.token_times == [0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    assert b.token_times == [0.5, 0.75]
    assert [(s.scheduled_tokens, s.num_decode, s.num_prefill_reqs, s.prefill_tokens)
            for s in res.steps] == \
        [(16, 0, 2, 16), (16, 1, 1, 15), (14, 1, 1, 13), (2, 2, 0, 0), (1, 1, 0, 0),
         (1, 1, 0, 0)]
    assert set(res.knobs) == {(2, 16)}


def test_prefilling_counts_running_requests_without_a_first_token():
    """The engine's ``prefilling`` view, as the controller reads it: B (prompt 40)
    part-computed counts, A decoding does not, and neither does a preempted request
    recomputing its prompt (it has its first token)."""
    from tuned.sim.engine import SimRequest

    eng = SimEngine(make_cfg(), ConstantStepModel(0.25), block_size=16, num_gpu_blocks=64)
    a = SimRequest(RequestSpec("A", 0.0, 4, 6, 6), False)
    b = SimRequest(RequestSpec("B", 0.0, 40, 2, 2), False)
    a.num_computed_tokens, a.num_output_tokens = 5, 2
    b.num_computed_tokens = 12
    eng.running = [a, b]
    assert eng.prefilling() == 1
    b.num_computed_tokens, b.num_output_tokens = 0, 1       # preempted, recomputing
    assert eng.prefilling() == 0


def test_preemption_recomputes_the_most_recently_admitted_request():
    """Six usable blocks of 4 tokens, cap 2, step 1 s. r0 (prompt 12, 3 blocks) and r1
    (prompt 4, 1 block) are admitted; r2 waits for the cap. At step 6 r0 needs a 5th
    block with none free: vLLM preempts r1 (admitted last, though r0 holds more) and
    puts it at the front of the queue. r1 (9 tokens, 3 blocks) cannot fit in the 1
    free block, so FCFS admits nobody, not even r2 (1 block would do), until r0
    ends at t=7; then r1 recomputes its 9 tokens and r2 prefills, in one free step."""
    specs = [RequestSpec("r0", 0.0, 12, 8, 8), RequestSpec("r1", 0.0, 4, 8, 8),
             RequestSpec("r2", 0.0, 4, 2, 2)]
    eng, res, log = const_run(specs, step_s=1.0, max_num_seqs=2, max_num_batched_tokens=64,
                              block_size=4, num_gpu_blocks=7)
    check_invariants(eng, res, log, specs, strict_ttft=False)
    r0, r1, r2 = res.requests
    assert [v[0] for v in log.victims] == ["r1"]
    assert [a[0] for a in log.admissions] == ["r0", "r1", "r1", "r2"]
    assert (r1.preemptions, r1.recomputed_tokens) == (1, 8)
    assert (r0.preemptions, r2.preemptions) == (0, 0)
    assert r0.token_times == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]
    assert r1.token_times == [0.0, 1.0, 2.0, 3.0, 4.0, 7.0, 8.0, 9.0]
    assert r2.token_times == [7.0, 8.0]
    assert [s.preempted for s in res.steps] == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert [s.kv_used_blocks for s in res.steps] == [4, 6, 6, 6, 6, 5, 5, 0, 4, 3, 0]
    assert [s.scheduled_tokens for s in res.steps] == [16, 2, 2, 2, 2, 1, 1, 1, 13, 2, 1]
    assert [s.num_waiting for s in res.steps] == [1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 0]


def test_a_tick_due_at_a_steps_start_runs_before_it_late_in_a_run():
    """An arrival at exactly a tick time after hours idle: the tick runs first and sees
    the idle engine; the step after it starts on its decision (at 20040 s a float
    cannot tell now + 1e-12 from now)."""
    specs = [RequestSpec("a", 20040.0, 8, 4, 4)]
    eng, res, _ = const_run(specs, interval_s=60.0, stale_after_s=120.0)
    at = [d for d in res.decisions if d["t"] == 20040.0]
    assert len(at) == 1 and at[0]["inputs"]["running"] == 0
    assert res.steps[0].t - res.steps[0].step_s == 20040.0
    check_knobs_are_the_controllers(eng, res)


def static_case(static: bool):
    specs = [RequestSpec(f"r{i}", 0.0, 4, o, o) for i, o in enumerate((2, 5, 9, 3))]
    return const_run(specs, step_s=1.0, max_num_seqs=3, static_batching=static)


def test_static_batching_admits_nothing_while_the_batch_runs():
    """Cap 3; outputs 2, 5, 9 form the batch (steps 1-9, its last member ends at t=8);
    the 4th request waits through every step of it although slots free up at t=1."""
    eng, res, log = static_case(True)
    check_invariants(eng, res, log, [RequestSpec(f"r{i}", 0.0, 4, o, o)
                                     for i, o in enumerate((2, 5, 9, 3))],
                     budget_applies=False, strict_ttft=False)
    r0, r1, r2, r3 = res.requests
    assert [r.finish_s for r in (r0, r1, r2)] == [1.0, 4.0, 8.0]
    assert (r3.first_token_s, r3.finish_s) == (8.0, 10.0)
    assert [s.num_running for s in res.steps[:9]] == [3, 2, 2, 2, 1, 1, 1, 1, 0]
    assert [s.num_waiting for s in res.steps[:9]] == [1] * 9
    assert [a[0] for a in log.admissions] == ["r0", "r1", "r2", "r3"]
    assert len(res.steps) == 12


def test_continuous_batching_admits_the_4th_request_when_a_slot_frees():
    _, res, _ = static_case(False)
    r3 = res.requests[3]
    # r0 ends at t=1 (step 2); step 3 prefills r3 beside two decodes, so it costs 1 s
    assert (r3.first_token_s, r3.finish_s) == (2.0, 4.0)


# ------------------------------------------------------------------ the shared core

KNOB_SLOT_METHODS = {"take", "offer", "mark_ok", "clamp", "_enter_fallback", "configure"}
QUEUE_CORE_METHODS = {"begin_step", "step_done", "switch_policy", "request_finished",
                      "snapshot", "_select_head", "_commit_pops", "_pin"}
WINDOW_FUNCS = {"step_window", "demand_moments"}


def _tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text())


ENGINE_FILES = {"sim": ["tuned/sim/engine.py"],
                "vllm": ["tuned/engines/vllm.py", "tuned/engines/vllm_queue.py"]}


@pytest.mark.parametrize("engine", sorted(ENGINE_FILES))
def test_no_engine_keeps_a_copy_of_the_slot_queue_core_or_window(engine):
    """Issue requirement: no copy of the knob slot, queue core or window logic exists
    in either engine (read as source: the vLLM files are not imported)."""
    for rel in ENGINE_FILES[engine]:
        tree = _tree(rel)
        text = (ROOT / rel).read_text()
        defs = {n.name for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert not defs & (KNOB_SLOT_METHODS | WINDOW_FUNCS), (rel, defs)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            bases = {ast.unparse(b).split("[")[0] for b in cls.bases}
            methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
            if "Queue" in cls.name:
                # tuned's queue is the core, or vLLM's RequestQueue made of it; a base-less
                # queue is vLLM's own FCFS deque (what fcfs keeps) and has no policy logic
                assert bases <= {"QueueCore", "RequestQueue"}, (rel, cls.name, bases)
                if not bases:
                    assert not methods & QUEUE_CORE_METHODS, (rel, cls.name)
            assert not (bases & {"KnobSlot", "QueueCore"}) or "Queue" in cls.name
        # the staleness and fallback rules are the slot's: no engine compares an age
        # against stale_after_s or builds a Fallback itself
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                assert "stale_after_s" not in ast.unparse(node), (rel, ast.unparse(node))
            if isinstance(node, ast.Call):
                assert ast.unparse(node.func) not in {"Fallback", "KnobSlot", "StepWindow"}
        assert not re.search(r"\bstep_window\s*\(", text), rel


def _imports(rel: str) -> set[str]:
    out = set()
    for n in ast.walk(_tree(rel)):
        if isinstance(n, ast.ImportFrom) and n.module:
            out |= {f"{n.module}.{a.name}" for a in n.names}
    return out


def test_both_engines_build_the_shared_runtime_and_queue_core():
    sim = _imports("tuned/sim/engine.py")
    assert {"tuned.control.runtime.build_runtime", "tuned.core.queue.QueueCore"} <= sim
    vllm = _imports("tuned/engines/vllm.py") | _imports("tuned/engines/vllm_queue.py")
    assert {"tuned.control.runtime.production_runtime", "tuned.core.queue.QueueCore"} <= vllm
    runtime = (ROOT / "tuned/control/runtime.py").read_text()
    assert re.search(r"def production_runtime\(.*?\n.*?return build_runtime\(", runtime, re.S)
    queue_cls = next(n for n in ast.walk(_tree("tuned/engines/vllm_queue.py"))
                     if isinstance(n, ast.ClassDef) and n.name == "PolicyQueue")
    assert [ast.unparse(b) for b in queue_cls.bases] == ["QueueCore[Request]", "RequestQueue"]


def test_the_sim_engine_holds_the_core_objects_themselves():
    eng = SimEngine(make_cfg(queue_policy="mcsf", batch_policy="tuned", tbt_sla_s=0.01),
                    DyadicStepModel(), block_size=16, num_gpu_blocks=64)
    assert type(eng.controller.slot) is KnobSlot
    assert eng.runtime.slot is eng.controller.slot
    assert eng.runtime.queue_channel is eng.controller.queue_channel
    assert type(eng.waiting) is QueueCore
    assert eng.controller.engine is eng
    assert (eng.cap, eng.token_budget) == tuple(eng.controller.slot.applied)


def test_give_up_stops_a_run_once_attainment_cannot_reach_the_target():
    """A capacity probe stops as soon as more than max_bad requests missed an SLO for
    sure; the attainment it reports is below the target either way."""
    from tuned import config as config_mod
    from tuned.bench.metrics import Slo, summarize
    from tuned.bench.runner import results_from_sim
    from tuned.sim.engine import simulate
    from tuned.sim.hardware import gpu_hardware
    from tuned.base.workloads import parse_workload

    hw = gpu_hardware("a100-llama2-7b")
    cfg = config_mod.validate({"max_num_seqs": 2, "max_num_batched_tokens": 2048,
                               "max_model_len": 4096, "batch_policy": "static",
                               "token_budget_policy": "max", "fallback_cap": 2})
    wl = parse_workload("poisson:rate=20,prompt=U(200,400),output=U(100,200),n=400", 0)
    slo = Slo(ttft_s=1.0, tpot_s=0.05)
    full = simulate(cfg, hw, wl.requests, record_steps=False)
    cut = simulate(cfg, hw, wl.requests, record_steps=False, give_up=(slo, 40))
    a_full = summarize(results_from_sim(full), slo)["attainment"]
    a_cut = summarize(results_from_sim(cut), slo)["attainment"]
    assert a_full < 0.9 and a_cut < 0.9
    assert cut.truncated and not full.truncated
    assert cut.duration_s < full.duration_s / 4
    # a run that meets the target is not cut
    easy = parse_workload("poisson:rate=0.5,prompt=U(200,400),output=U(100,200),n=40", 0)
    ok = simulate(cfg, hw, easy.requests, record_steps=False, give_up=(slo, 4))
    assert not ok.truncated
    assert summarize(results_from_sim(ok), slo)["attainment"] >= 0.9


@pytest.mark.parametrize("engine", sorted(ENGINE_FILES))
def test_an_engine_reaches_the_slot_and_the_queue_channel_through_its_runtime(engine):
    """The contract names runtime.slot and runtime.queue_channel: no engine reaches
    through the controller for them."""
    texts = [(ROOT / rel).read_text() for rel in ENGINE_FILES[engine]]
    assert not [t for t in texts if re.search(r"controller\.(slot|queue_channel)\b", t)]
    runtime = {"sim": "self.runtime", "vllm": "self.tuned"}[engine]
    assert f"{runtime}.slot" in texts[0] and f"{runtime}.queue_channel" in texts[0]


def test_a_late_queue_head_lifts_the_cap_on_the_simulator():
    """60 requests at once against a 20 ms SLA (about 3 decodes on this step model)
    and a 0.5 s TTFT SLO: with lift, once the oldest waiting request is past 0.5 s the
    cap is the memory bound's (reason ttft_late, b_mem > b_sla) and the last first
    token comes sooner than with hold, which never lifts it."""
    specs = [RequestSpec(f"r{i:03d}", 0.0, 20, 30, 30) for i in range(60)]
    last_first, late = {}, {}
    for mode in ("lift", "hold"):
        cfg = make_cfg(max_num_seqs=16, fallback_cap=2, batch_policy="tuned",
                       tbt_sla_s=0.02, ttft_sla_s=0.5, late_queue=mode,
                       max_wait_s=1000.0, on_max_wait="serve")
        _, res, _ = run_engine(cfg, specs, num_gpu_blocks=200)
        assert all(r.finish_s is not None for r in res.requests)
        late[mode] = [d for d in res.decisions if d["reason"] == "ttft_late"]
        last_first[mode] = max(r.first_token_s for r in res.requests)
        if mode == "lift":
            assert {d["reason"] for d in res.decisions} >= {"ttft_late", "ttft_late_settling"}
    assert late["hold"] == [] and late["lift"]
    assert all(d["cap"] == d["b_mem"] > d["b_sla"] for d in late["lift"])
    assert last_first["lift"] < last_first["hold"]


def test_a_measured_step_fit_is_a_cpu_host_to_simulate():
    """``fitted_hardware``: the step fit the real-engine bench measures, as a host the
    simulator runs (vLLM's CPU build: block 128, the engine's blocks and defaults),
    its steps T(b, c) = a + beta b + gamma c and the given time between steps; a fit
    without a positive step is refused by name."""
    from tuned.sim.hardware import engine_defaults, fitted_hardware
    from tuned.sim.stepmodel import StepShape

    hw = fitted_hardware({"a": 0.01, "beta": 0.001, "gamma": 0.0002}, engine_defaults(None),
                         gap_s=0.002)
    assert (hw.block_size, hw.num_gpu_blocks, hw.vllm_default_max_num_seqs,
            hw.vllm_default_max_num_batched_tokens) == (128, 48, 128, 2048)
    assert hw.step_model.step_s(StepShape(4, 0, 100, 1, 0.0, 500)) == pytest.approx(0.034)
    assert hw.step_model.gap_s == 0.002
    assert hw.describe()["step_model"]["kind"] == "fit"
    with pytest.raises(ValueError, match=r"step fit: a batch-1 step of 0\.0 s"):
        fitted_hardware({"a": 0.0, "beta": 0.0, "gamma": 0.001}, engine_defaults(None))
    with pytest.raises(ValueError, match="step fit: needs numbers a, beta and gamma"):
        fitted_hardware({"a": 0.01}, engine_defaults(None))
