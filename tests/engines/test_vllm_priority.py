"""tuned's waiting queue under vLLM's ``--scheduling-policy priority``: a request's
``priority`` first (smaller first, as vLLM's PriorityRequestQueue), then the tuned
policy's order within a level, preempted requests first within their level."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from vllm.v1.core.sched.request_queue import (FCFSRequestQueue, PriorityRequestQueue,
                                               SchedulingPolicy)
from vllm.v1.request import Request, RequestStatus

from tuned.core.predictor import OutputLengthPredictor
from tuned.engines.vllm_queue import (PolicyQueue, install, make_policy_queue,
                                      priority_scheduling)
from tuned.core.queue_policy import AdmitContext
from tuned.policies.registry import QUEUE_POLICIES

from fakes import req


def ctx(m=10**6, now=100.0, cap=64):
    return AdmitContext(now_s=now, kv_capacity_tokens=m, kv_free_tokens=m, cap=cap)


def ids(q):
    return [r.request_id for r in q]


def preq(rid, priority, t, out_hint=None, prompt=10):
    r = req(rid, prompt=prompt, t=t,
            xargs={"tuned_output_tokens": out_hint} if out_hint else None)
    r.priority = priority
    return r


def pqueue(name, **kw):
    return make_policy_queue(name, {}, OutputLengthPredictor(), priority_first=True, **kw)


def admit_all(q, running, limit=100):
    """vLLM's loop: `if not queue: break`, peek, pop, append to running."""
    out = []
    while q and len(out) < limit:
        r = q.peek_request()
        assert q.pop_request() is r
        running.append(r)
        out.append(r.request_id)
    return out


def test_a_late_high_priority_request_goes_next_then_the_policy_order_within_its_level():
    # one long request running, three at priority 10 queued, then one at -10: the
    # -10 one is next; the three follow in the policy's order within their level
    for name, rest in (("fcfs", ["lo1", "lo2", "lo3"]), ("mcsf", ["lo3", "lo2", "lo1"])):
        q = pqueue(name)
        running = [preq("long", 0, 0.0)]
        for i, hint in ((1, 30), (2, 20), (3, 10)):
            q.add_request(preq(f"lo{i}", 10, float(i), out_hint=hint))
        q.add_request(preq("hi", -10, 9.0, out_hint=40))
        q.begin_step(ctx(), running)
        assert ids(q) == ["hi", *rest], name
        assert admit_all(q, running) == ["hi", *rest], name


@pytest.mark.parametrize("seed", range(5))
def test_fcfs_orders_exactly_as_vllms_priority_queue(seed):
    rng = random.Random(seed)
    q, ref = pqueue("fcfs"), PriorityRequestQueue()
    for i in range(40):
        p, t = rng.choice((-5, 0, 0, 3, 10)), rng.uniform(0, 100)
        q.add_request(preq(f"r{i}", p, t))
        ref.add_request(preq(f"r{i}", p, t))
    q.begin_step(ctx(), [])
    assert ids(q) == ids(ref)
    want = [ref.pop_request().request_id for _ in range(len(ref))]
    assert admit_all(q, []) == want and len(q) == 0


@pytest.mark.parametrize("name", sorted(QUEUE_POLICIES))
def test_no_policy_admits_a_less_urgent_request_first(name):
    # every policy, with all its reordering and gating, chooses within the most
    # urgent level only: the first admission is always the priority -1 request
    q = pqueue(name)
    for i in range(6):
        q.add_request(preq(f"lo{i}", 5, float(i), out_hint=4 + i, prompt=8 + i))
    q.add_request(preq("hi", -1, 50.0, out_hint=200, prompt=200))
    q.begin_step(ctx(), [])
    assert ids(q)[0] == "hi"
    running = []
    first = admit_all(q, running, limit=1)
    assert first == ["hi"], (name, q.last_verdict)


def test_without_priority_scheduling_priority_is_ignored_as_before():
    q = make_policy_queue("fcfs", {}, OutputLengthPredictor())
    q.add_request(preq("lo", 10, 1.0))
    q.add_request(preq("hi", -10, 2.0))
    q.begin_step(ctx(), [])
    assert ids(q) == ["lo", "hi"]


def test_preempted_request_goes_first_within_its_level_only():
    q = pqueue("fcfs")
    q.add_request(preq("w5", 5, 1.0))
    q.add_request(preq("w10", 10, 2.0))
    q.add_request(preq("w0", 0, 3.0))
    p = preq("p5", 5, 9.0)
    p.status = RequestStatus.PREEMPTED
    q.prepend_request(p)
    q.begin_step(ctx(), [])
    # vLLM's PriorityRequestQueue: (priority, arrival) -> w0, w5, p5, w10; tuned
    # resumes the preempted one first within level 5
    assert ids(q) == ["w0", "p5", "w5", "w10"]
    assert admit_all(q, []) == ["w0", "p5", "w5", "w10"]


def test_skipped_requests_return_to_their_level():
    q = pqueue("fcfs")
    for rid, p, t in (("a", 1, 1.0), ("b", 0, 2.0), ("c", 1, 0.5)):
        q.add_request(preq(rid, p, t))
    q.begin_step(ctx(), [])
    skipped = [q.pop_request(), q.pop_request()]
    assert [r.request_id for r in skipped] == ["b", "c"]
    q.prepend_requests(reversed(skipped))
    assert ids(q) == ["b", "c", "a"]


def test_aging_serves_only_the_level_being_served():
    q = pqueue("fcfs")
    q.set_wait_bound((10.0, False, 2.0))
    q.add_request(preq("old_lo", 5, 0.0))
    q.add_request(preq("hi", 0, 50.0))
    q.begin_step(ctx(now=99.0), [])
    # old_lo waited 99 s (aged) but a more urgent request waits: hi goes first, and
    # old_lo is not counted aged until its level is served
    assert bool(q) and q.peek_request().request_id == "hi"
    assert q.snapshot()["aged"] == 0
    q.pop_request()
    q.begin_step(ctx(now=99.5), [])
    assert admit_all(q, []) == ["old_lo"] and q.snapshot()["aged"] == 1


def test_fallback_is_vllms_priority_queue_in_the_same_order():
    q = pqueue("mcsf")
    for i, (p, hint) in enumerate(((3, 5), (0, 50), (3, 1), (-2, 9))):
        q.add_request(preq(f"r{i}", p, float(i), out_hint=hint))
    q.begin_step(ctx(), [])
    q.enter_fallback()
    assert isinstance(q.fallback, PriorityRequestQueue)
    assert ids(q) == ["r3", "r1", "r0", "r2"]       # vLLM's (priority, arrival)
    assert q.restore() and ids(q) == ["r3", "r1", "r2", "r0"]   # mcsf within level 3
    plain = make_policy_queue("fcfs", {}, OutputLengthPredictor())
    plain.enter_fallback()
    assert isinstance(plain.fallback, FCFSRequestQueue)


def test_install_reads_the_schedulers_policy():
    for policy, want in (("priority", True), ("fcfs", False),
                         (SchedulingPolicy.PRIORITY, True)):
        sc = SimpleNamespace(policy=policy)
        s = SimpleNamespace(waiting=FCFSRequestQueue(), running=[], scheduler_config=sc,
                            vllm_config=SimpleNamespace(scheduler_config=sc))
        assert priority_scheduling(s) is want
        q = install(s, "mcsf")
        assert isinstance(q, PolicyQueue) and q.priority_first is want
        # a live switch keeps it
        assert install(s, "fcfs", SimpleNamespace(queue_options={})).priority_first is want


def test_in_a_real_scheduler_under_priority(tiny_model):
    """vLLM's Scheduler with policy priority, tuned's queue installed, one request
    at a time: the -10 request runs right after the running one."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    import torch
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                            KVCacheGroupSpec)
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.structured_output import StructuredOutputManager
    from tuned.engines import vllm_queue

    class S(Scheduler):
        def schedule(self, *a, **k):
            vllm_queue.begin_step(self)
            return super().schedule(*a, **k)

    def run(queue_policy):
        sc = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=256,
                             enable_chunked_prefill=True, is_encoder_decoder=False,
                             policy="priority")
        vc = VllmConfig(scheduler_config=sc,
                        model_config=ModelConfig(model=str(tiny_model), dtype="float32",
                                                 seed=0, skip_tokenizer_init=True),
                        cache_config=CacheConfig(block_size=16, enable_prefix_caching=False))
        vc.cache_config.num_gpu_blocks = 64
        kv = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=16, num_kv_heads=1,
                                                          head_size=32, dtype=torch.float32))])
        s = S(vllm_config=vc, kv_cache_config=kv,
              structured_output_manager=StructuredOutputManager(vc), block_size=16)
        if queue_policy:
            install(s, queue_policy)
            assert s.waiting.priority_first
        s.max_num_active_reqs = 1

        def add(rid, prio, t, n):
            s.add_request(Request(request_id=rid, prompt_token_ids=[len(rid)] * 20,
                                  pooling_params=None, arrival_time=t, priority=prio,
                                  sampling_params=SamplingParams(
                                      max_tokens=n, ignore_eos=True,
                                      extra_args={"tuned_output_tokens": n})))

        order = []

        def step():
            so = s.schedule()
            rids = list(so.num_scheduled_tokens)
            for nr in so.scheduled_new_reqs:
                order.append(nr.req_id)
            s.update_from_output(so, ModelRunnerOutput(
                req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
                sampled_token_ids=[[] if s.requests[r].is_prefill_chunk else [7]
                                   for r in rids]))

        add("long", 0, 0.0, 30)
        step()
        for i, n in ((1, 12), (2, 8), (3, 4)):
            add(f"lo{i}", 10, float(i), n)
        add("hi", -10, 9.0, 10)
        for _ in range(200):
            if not s.has_requests():
                break
            step()
        assert not s.has_requests()
        return order

    assert run(None) == ["long", "hi", "lo1", "lo2", "lo3"]          # vLLM's own queue
    assert run("fcfs") == ["long", "hi", "lo1", "lo2", "lo3"]        # tuned, fcfs
    assert run("mcsf") == ["long", "hi", "lo3", "lo2", "lo1"]        # tuned, shortest first
