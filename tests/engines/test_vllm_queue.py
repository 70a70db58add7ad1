"""PolicyQueue against vLLM 0.32's RequestQueue contract, with real vLLM Requests,
and inside a real vLLM Scheduler (fake KV-cache config, no model run)."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest
import torch
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue, RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from tuned.engines import vllm_queue
from tuned.engines.vllm_queue import PolicyQueue, install, make_policy_queue
from tuned.core.predictor import OutputLengthPredictor
from tuned.core.queue_policy import AdmitContext
from tuned.policies.registry import QUEUE_POLICIES, make_policy

from fakes import req


def ctx(m=10**6, now=100.0, cap=64, speed=None):
    return AdmitContext(now_s=now, kv_capacity_tokens=m, kv_free_tokens=m, cap=cap,
                        speed_tok_s=speed)


def ids(q):
    return [r.request_id for r in q]


def vllm_admission_loop(q, running, limit=100):
    """vLLM's loop: `if not queue: break`, peek, pop, append to running."""
    admitted = []
    while q and len(admitted) < limit:
        r = q.peek_request()
        assert q.pop_request() is r
        running.append(r)
        admitted.append(r.request_id)
    return admitted


def queue(name, options=None, predictor=None, **kw):
    return make_policy_queue(name, options or {}, predictor or OutputLengthPredictor(), **kw)


# ---------------------------------------------------------------- contract
def test_is_a_request_queue():
    assert isinstance(queue("fcfs"), RequestQueue)


@pytest.mark.parametrize("name", list(QUEUE_POLICIES))
def test_prepend_goes_to_the_very_front_for_every_policy(name):
    q = queue(name)
    ref = FCFSRequestQueue()
    running: list[Request] = []
    for i, t in enumerate((1.0, 2.0, 3.0)):
        q.add_request(req(f"w{i}", t=t))
        ref.add_request(req(f"w{i}", t=t))
    q.begin_step(ctx(), running)
    running.append(q.pop_request())
    ref.pop_request()
    x, y = req("x", t=0.5), req("y", t=9.0)
    for r in (x, y):
        r.status = RequestStatus.PREEMPTED
        q.prepend_request(r)
        ref.prepend_request(r)
    assert ids(q)[:2] == ids(ref)[:2] == ["y", "x"]      # most recently preempted first
    assert q.peek_request() is y and bool(q) and len(q) == 4
    # the gate never holds back a preempted request, even with no KV room at all
    q.begin_step(ctx(m=1), running)
    assert bool(q) and q.pop_request() is y
    running.append(y)
    assert bool(q) and q.pop_request() is x
    assert len(q) == 2


def test_gate_refuses_after_pinned_under_mcsf():
    q = queue("mcsf")
    q.add_request(req("a", xargs={"tuned_output_tokens": 5}))
    p = req("p", t=-1.0)
    q.prepend_request(p)
    running = [req("run", prompt=10, xargs={"tuned_output_tokens": 5})]
    q.begin_step(ctx(m=30), running)
    assert vllm_admission_loop(q, running) == ["p"]     # then a does not fit
    assert len(q) == 1 and not q


def test_len_counts_every_request_bool_is_the_gate():
    # inequality 5 at the boundary (see test_policy_mcsf): running A s=10, 2 generated,
    # õ=5; candidate B s=4, õ=6 -> peak 22 at +3 steps
    q = queue("mcsf")
    a = req("A", prompt=10, xargs={"tuned_output_tokens": 5})
    q.add_request(a)
    q.begin_step(ctx(m=22), [])
    running = [q.pop_request()]
    a.append_output_token_ids([5, 5])
    q.add_request(req("B", prompt=4, xargs={"tuned_output_tokens": 6}))
    q.begin_step(ctx(m=22), running)
    assert len(q) == 1 and bool(q)
    q.begin_step(ctx(m=21), running)
    assert len(q) == 1 and not q and not q and not q
    assert q.peek_request().request_id == "B"          # the policy head, refused now
    assert q.stats.deferred == 1                        # once per request and step
    assert "22 > M=21 tokens at +3 steps" in q.last_verdict.reason
    q.begin_step(ctx(m=21), running)
    assert not q
    assert q.stats.deferred == 2
    assert q.stats.admitted == 1                        # A


def test_mcsf_order_and_admissions_through_vllm_loop():
    # prompts 10, hints õ = 30, 10, 20: order by õ. Look-ahead with nothing running:
    # {10}: d=10: 20;  {10,20}: d=10: 20+20 = 40;  {10,20,30}: d=10: 60, d=20: 60, d=30: 40
    def fresh():
        q = queue("mcsf")
        for rid, o, t in (("o30", 30, 1.0), ("o10", 10, 2.0), ("o20", 20, 3.0)):
            q.add_request(req(rid, prompt=10, t=t, xargs={"tuned_output_tokens": o}))
        return q

    q = fresh()
    assert ids(q) == ["o10", "o20", "o30"]
    running: list[Request] = []
    q.begin_step(ctx(m=59), running)
    assert vllm_admission_loop(q, running) == ["o10", "o20"]
    assert ids(q) == ["o30"] and len(q) == 1
    q = fresh()
    running = []
    q.begin_step(ctx(m=60), running)
    assert vllm_admission_loop(q, running) == ["o10", "o20", "o30"]


def test_skipped_requests_return_to_their_place_and_are_not_admissions():
    q = queue("mcsf")
    for rid, o in (("a", 2), ("b", 3), ("c", 4)):
        q.add_request(req(rid, xargs={"tuned_output_tokens": o}))
    running: list[Request] = []
    q.begin_step(ctx(), running)
    # vLLM skips a and b (e.g. waiting for a grammar): pops them, then at the end of
    # the loop prepend_requests(step_skipped) with the later-skipped first
    skipped: deque[Request] = deque()
    skipped.appendleft(q.pop_request())
    skipped.appendleft(q.pop_request())
    assert [r.request_id for r in skipped] == ["b", "a"] and len(q) == 1
    q.prepend_requests(skipped)
    assert ids(q) == ["a", "b", "c"] and len(q) == 3
    # back in the policy order, not pinned: a shorter newcomer goes before them
    q.add_request(req("d", xargs={"tuned_output_tokens": 1}))
    assert ids(q) == ["d", "a", "b", "c"]
    q.begin_step(ctx(), running)
    assert q.stats.admitted == 0
    running.append(q.pop_request())                    # d admitted for real
    q.begin_step(ctx(), running)
    assert q.stats.admitted == 1 and ids(q) == ["a", "b", "c"]


@pytest.mark.parametrize("name", list(QUEUE_POLICIES))
def test_skip_and_return_leaves_the_order_unchanged_for_every_policy(name):
    q = queue(name, {"window": 3} if name == "saber" else {})
    for i, o in enumerate((40, 10, 30, 20, 50)):
        q.add_request(req(f"r{i}", t=float(i), xargs={"tuned_output_tokens": o,
                                                      "tuned_deadline_s": 1000.0}))
    q.begin_step(ctx(now=10.0, speed=lambda n: 1000.0 / n), [])
    before = ids(q)
    skipped = deque()
    skipped.appendleft(q.pop_request())          # whatever the policy chose (saber: random)
    skipped.appendleft(q.pop_request())
    assert len(q) == 3
    q.prepend_requests(skipped)
    assert ids(q) == before and len(q) == 5
    q.begin_step(ctx(now=10.0, speed=lambda n: 1000.0 / n), [])
    assert q.stats.admitted == 0


def test_skipped_preempted_request_stays_pinned():
    q = queue("mcsf")
    q.add_request(req("a", xargs={"tuned_output_tokens": 1}))
    p = req("p", xargs={"tuned_output_tokens": 90})
    q.prepend_request(p)
    q.begin_step(ctx(), [])
    assert q.pop_request() is p
    q.prepend_requests([p])
    assert ids(q) == ["p", "a"]


def test_prefill_backlog_counts_the_prompt_tokens_running_requests_still_owe():
    """fcfs' Moore-Hodgson pace starts after the prompts already admitted: the queue's
    begin_step reads them off the running list. A real vLLM Request 30 tokens into a
    100-token prompt owes 70, one decoding owes 0."""
    half, decoding, fresh = req("h", prompt=100), req("d", prompt=40, out=3), req("f", prompt=25)
    half.num_computed_tokens = 30
    decoding.num_computed_tokens = 42
    q = queue("fcfs")
    q.begin_step(ctx(), [half, decoding, fresh])
    assert q._context().prefill_backlog_tokens == 70 + 0 + 25
    assert q._context().num_running == 3
    q.begin_step(ctx(), [])
    assert q._context().prefill_backlog_tokens == 0


def test_remove_requests():
    q = queue("multibin")
    a, b, c, p = req("a", t=1), req("b", t=2), req("c", t=3), req("p")
    for r in (a, b, c):
        q.add_request(r)
    q.prepend_request(p)
    q.remove_requests([b, p, req("not-here")])          # unknown ones ignored, as vLLM's
    assert ids(q) == ["a", "c"] and len(q) == 2
    q.remove_request(a)
    assert ids(q) == ["c"]
    with pytest.raises(ValueError, match="request a is not in the waiting queue"):
        q.remove_request(a)
    q.remove_requests([c])
    assert len(q) == 0 and not q
    with pytest.raises(IndexError):
        q.peek_request()
    with pytest.raises(IndexError):
        q.pop_request()


def test_switch_policy_keeps_every_request_and_repredicts():
    pred = OutputLengthPredictor(min_samples=4)
    for n in range(1, 21):
        pred.observe(10, n)              # sorted 1..20: q=0.5 -> idx 10 -> 11; q=0.9 -> 19
    q = queue("fcfs", predictor=pred)
    for i in range(5):
        q.add_request(req(f"r{i}", prompt=10, t=float(i)))
    p = req("p", prompt=10)
    q.prepend_request(p)
    before = set(ids(q))
    assert q.info("r0").predicted_output == 11
    old = q.switch_policy(make_policy("mcsf"))
    assert old.name == "fcfs" and q.policy.name == "mcsf"
    assert set(ids(q)) == before and len(q) == 6 and ids(q)[0] == "p"
    assert q.info("r0").predicted_output == 19           # over-estimating mode
    q.switch_policy(make_policy("saber", {"window": 2}))
    assert set(ids(q)) == before and ids(q)[0] == "p"
    assert q.info("r0").predicted_output == 11
    q.begin_step(ctx(), [])
    assert vllm_admission_loop(q, []) == ["p", "r0", "r1", "r2", "r3", "r4"]


def test_hints_warnings_and_sla_classes():
    seen = []
    q = queue("saber", class_deadlines_s={"gold": 1.5},
              on_warning=lambda rid, text: seen.append((rid, text)))
    q.add_request(req("bad", t=100.0, xargs={"tuned_deadline_s": -3, "tuned_output_tokens": 7}))
    q.add_request(req("ok", t=100.0, xargs={"tuned_deadline_s": 2.5}))
    q.add_request(req("gold", t=100.0, xargs={"tuned_class": "gold"}))
    assert q.lengths.hint_warnings == 1
    assert seen == [("bad", "tuned_deadline_s: must be a number > 0, got -3; ignored")]
    assert q.info("bad").deadline_s is None and q.info("bad").predicted_output == 7
    assert q.info("ok").deadline_s == pytest.approx(102.5)
    assert q.info("gold").deadline_s == pytest.approx(101.5)
    snap = q.snapshot()
    assert snap["hint_warnings"] == 1 and snap["waiting"] == 3 and snap["policy"] == "saber"
    assert snap["pinned"] == 0 and snap["prediction_count"] == 0


def test_on_request_finished_learns_and_counts():
    pred = OutputLengthPredictor(min_samples=2)
    q = queue("fcfs", predictor=pred)
    reqs = [req(f"r{i}", prompt=10, max_tokens=100, t=float(i)) for i in range(3)]
    for r in reqs:
        q.add_request(r)
    running: list[Request] = []
    q.begin_step(ctx(), running)
    assert vllm_admission_loop(q, running) == ["r0", "r1", "r2"]
    for r, n, status in ((reqs[0], 5, RequestStatus.FINISHED_STOPPED),
                         (reqs[1], 9, RequestStatus.FINISHED_LENGTH_CAPPED),
                         (reqs[2], 2, RequestStatus.FINISHED_ABORTED)):
        r.append_output_token_ids([5] * n)
        r.status = status
        q.on_request_finished(r)
    assert pred.observed == 2                            # the aborted one is not learned
    e = pred.error_stats()
    assert e.count == 2 and e.last_errors == (95, 91)    # planned with max_tokens = 100
    assert q.stats.admitted == 3
    q.add_request(req("new", prompt=10))
    assert q.info("new").predicted_output == 9           # sorted [5, 9], idx ceil(0.5) = 1
    assert q.info("r0") is None                          # state dropped


def test_install_takes_over_vllm_queue_then_switches_in_place():
    old = FCFSRequestQueue()
    a, b, p = req("a", t=1), req("b", t=2), req("p", t=0)
    old.add_request(a)
    old.add_request(b)
    p.status = RequestStatus.PREEMPTED
    old.prepend_request(p)
    s = SimpleNamespace(waiting=old, running=[])
    q = install(s, "mcsf")
    assert isinstance(s.waiting, PolicyQueue) and s.waiting is q
    assert ids(q)[0] == "p" and sorted(ids(q)) == ["a", "b", "p"]
    assert install(s, "fcfs", SimpleNamespace(queue_options={})) is q
    assert q.policy.name == "fcfs" and ids(q) == ["p", "a", "b"]


# ---------------------------------------------------------------- in a real Scheduler
BLOCK = 16


class _QueueHooks:
    """What tuned's scheduler subclass does with the queue, and nothing else."""

    def schedule(self, *args, **kwargs):
        vllm_queue.begin_step(self)
        return super().schedule(*args, **kwargs)

    def _free_request(self, request, *args, **kwargs):
        self.waiting.on_request_finished(request)
        return super()._free_request(request, *args, **kwargs)


class _SyncScheduler(_QueueHooks, Scheduler):
    pass


class _AsyncScheduler(_QueueHooks, AsyncScheduler):
    pass


def _scheduler(model, num_blocks, policy, asynchronous=False):
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=256,
                         enable_chunked_prefill=True, is_encoder_decoder=False)
    vc = VllmConfig(scheduler_config=sc,
                    model_config=ModelConfig(model=model, dtype="float32", seed=0,
                                             skip_tokenizer_init=True),
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=False))
    vc.scheduler_config.async_scheduling = asynchronous
    vc.cache_config.num_gpu_blocks = num_blocks
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                      head_size=32, dtype=torch.float32))])
    cls = _AsyncScheduler if asynchronous else _SyncScheduler
    s = cls(vllm_config=vc, kv_cache_config=kv,
            structured_output_manager=StructuredOutputManager(vc), block_size=BLOCK)
    install(s, policy)
    return s


def _step(s):
    so = s.schedule()
    rids = list(so.num_scheduled_tokens)
    sampled = [[] if s.requests[r].is_prefill_chunk else [7] for r in rids]
    s.update_from_output(so, ModelRunnerOutput(
        req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
        sampled_token_ids=sampled))
    return so


def _add(s, n, hint):
    for i in range(n):
        s.add_request(Request(
            request_id=f"r{i}", prompt_token_ids=[i + 1] * 40, pooling_params=None,
            arrival_time=float(i),
            sampling_params=SamplingParams(max_tokens=40, ignore_eos=True,
                                           extra_args={"tuned_output_tokens": hint})))


def _run(s, max_steps=400):
    max_running, preempted, gated = 0, 0, 0
    for _ in range(max_steps):
        if not s.has_requests():
            break
        so = _step(s)
        max_running = max(max_running, len(s.running))
        preempted += len(so.preempted_req_ids or ())
        if len(s.waiting) and not s.waiting:
            gated += 1
    assert not s.has_requests()
    return max_running, preempted, gated


@pytest.mark.parametrize("asynchronous", [False, True], ids=["Scheduler", "AsyncScheduler"])
def test_scheduler_mcsf_gate_caps_running_at_the_look_ahead(tiny_model, asynchronous):
    # 16 blocks of 16 = 256 tokens, one null block -> M = 240. Each request: prompt
    # 40, exactly 40 outputs, õ = 40 -> peak 80. Three fit with zero slack (240),
    # a fourth would need 320.
    s = _scheduler(str(tiny_model), 16, "mcsf", asynchronous)
    _add(s, 6, 40)
    assert _run(s)[:2] == (3, 0)
    assert s.waiting.stats.admitted == 6 and s.waiting.stats.deferred > 0
    assert s.waiting.lengths.predictor.observed == 6
    # the same load under fcfs: vLLM admits on prefill room alone, then preempts
    s = _scheduler(str(tiny_model), 16, "fcfs", asynchronous)
    _add(s, 6, 40)
    max_running, preempted, gated = _run(s)
    assert max_running > 3 and preempted > 0 and gated == 0


def test_scheduler_preempted_request_resumes_first(tiny_model):
    # Under-estimating hints (õ = 10, truth 40) let MC-SF admit 4 (4 x 50 = 200 <= 240);
    # as they grow to 80 tokens each the cache runs out and vLLM preempts. The
    # preempted request must be the head of the queue, before never-started ones.
    s = _scheduler(str(tiny_model), 16, "mcsf")
    _add(s, 6, 10)
    seen_preemption = False
    for _ in range(600):
        if not s.has_requests():
            break
        so = _step(s)
        if so.preempted_req_ids:
            seen_preemption = True
            head = next(iter(s.waiting)).request_id
            assert head in so.preempted_req_ids
            assert s.waiting.peek_request().request_id == head
    assert seen_preemption
    assert not s.has_requests()


# ---------------------------------------------------------------- the guard
_VLLM_CALLS = ("add_request", "pop_request", "peek_request", "prepend_request",
               "prepend_requests", "remove_request", "remove_requests", "__bool__",
               "__len__", "__iter__")


def test_every_method_vllm_calls_on_its_queue_is_behind_the_one_guard():
    abstract = {n for n, f in vars(RequestQueue).items()
                if getattr(f, "__isabstractmethod__", False)}
    assert abstract == set(_VLLM_CALLS)
    assert {n: getattr(PolicyQueue, n).guarded for n in _VLLM_CALLS} == {
        n: n for n in _VLLM_CALLS}


def faulty(monkeypatch, where, after=False):
    """A queue whose QueueCore.``where`` raises (``after``: once it has done its work),
    and the faults it reports."""
    from tuned.core.queue import QueueCore
    orig = getattr(QueueCore, where)

    def boom(self, *args):
        if after:
            orig(self, *args)
        raise RuntimeError(f"injected in {where}")

    monkeypatch.setattr(QueueCore, where, boom)
    faults: list[tuple[str, str]] = []
    q = queue("fcfs", on_fault=lambda w, e: faults.append((w, str(e))))
    return q, faults


@pytest.mark.parametrize("after", [False, True])
def test_a_request_being_added_when_the_fault_hits_is_kept_once(monkeypatch, after):
    q, faults = faulty(monkeypatch, "add_request", after)
    a, b = req("a", t=1.0), req("b", t=2.0)
    q.add_request(a)                       # the first call faults (patched for all)
    q.add_request(b)                       # in fallback: vLLM's queue, no policy code
    assert faults == [("add_request", "injected in add_request")]
    assert isinstance(q.fallback, FCFSRequestQueue) and ids(q) == ["a", "b"]
    assert len(q) == 2 and q.snapshot()["fallback"] is True


@pytest.mark.parametrize("after", [False, True])
def test_a_request_prepended_when_the_fault_hits_goes_to_the_front_once(monkeypatch, after):
    q, faults = faulty(monkeypatch, "prepend_request", after)
    for i in range(3):
        q.add_request(req(f"w{i}", t=float(i)))
    x = req("x", t=9.0)
    q.prepend_request(x)
    assert faults == [("prepend_request", "injected in prepend_request")]
    assert ids(q) == ["x", "w0", "w1", "w2"]


@pytest.mark.parametrize("after", [False, True])
def test_requests_prepended_when_the_fault_hits_go_back_in_front_once(monkeypatch, after):
    q, faults = faulty(monkeypatch, "prepend_requests", after)
    for i in range(4):
        q.add_request(req(f"w{i}", t=float(i)))
    q.begin_step(ctx(), [])
    popped = [q.pop_request(), q.pop_request()]
    q.prepend_requests(r for r in popped)           # a generator: read once
    assert faults == [("prepend_requests", "injected in prepend_requests")]
    # in front once each, in the order vLLM's own deque gives them (extendleft: reversed)
    assert ids(q) == ["w1", "w0", "w2", "w3"]


def test_vllms_own_contract_errors_pass_through_and_are_no_fault():
    faults: list[str] = []
    q = queue("fcfs", on_fault=lambda w, e: faults.append(w))
    with pytest.raises(IndexError, match="pop from an empty queue"):
        q.pop_request()
    with pytest.raises(IndexError, match="peek from an empty queue"):
        q.peek_request()
    with pytest.raises(ValueError, match="request z is not in the waiting queue"):
        q.remove_request(req("z"))
    assert faults == [] and q.fallback is None


@pytest.mark.parametrize("where", ["pop_request", "peek_request", "__bool__", "__len__",
                                   "__iter__", "remove_request", "remove_requests"])
def test_a_fault_answers_the_call_from_vllms_queue_in_arrival_order(monkeypatch, where):
    q, faults = faulty(monkeypatch, where)
    for i, t in enumerate((3.0, 1.0, 2.0)):
        q.add_request(req(f"w{i}", t=t))
    w1 = next(r for r in q if r.request_id == "w1")
    got = {"pop_request": lambda: q.pop_request().request_id,
           "peek_request": lambda: q.peek_request().request_id,
           "__bool__": lambda: bool(q), "__len__": lambda: len(q),
           "__iter__": lambda: ids(q),
           "remove_request": lambda: q.remove_request(w1),
           "remove_requests": lambda: q.remove_requests([w1])}[where]()
    assert got == {"pop_request": "w1", "peek_request": "w1", "__bool__": True,
                   "__len__": 3, "__iter__": ["w1", "w2", "w0"], "remove_request": None,
                   "remove_requests": None}[where]
    assert [w for w, _ in faults] == [where] and q.fallback is not None
    left = {"pop_request": ["w2", "w0"], "remove_request": ["w2", "w0"],
            "remove_requests": ["w2", "w0"]}.get(where, ["w1", "w2", "w0"])
    assert [r.request_id for r in q.fallback] == left
