"""tuned's scheduler with vLLM serving features, without a model run: what the step
ring records under speculative decoding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from fakes import make_scheduler


@pytest.fixture
def sched(tiny_model):
    s = make_scheduler(str(tiny_model), False)
    yield s
    s.shutdown()


def _record(s, nst, spec, sampled):
    so = SimpleNamespace(num_scheduled_tokens=nst, scheduled_spec_decode_tokens=spec,
                         total_num_scheduled_tokens=sum(nst.values()), preempted_req_ids=set())
    s._tuned_record(so, SimpleNamespace(sampled_token_ids=sampled))
    return s.steps.since(0)[-1]


def test_a_request_verifying_drafts_is_one_decode_and_its_drafts_no_prompt_tokens(sched):
    # a: plain decode; b: decode verifying 3 draft tokens (ngram speculative decoding);
    # c: a 20-token prefill chunk
    got = _record(sched, {"a": 1, "b": 4, "c": 20}, {"b": [5, 6, 7]}, [[1], [1, 2], []])
    assert (got.num_decode, got.num_prefill_reqs, got.prefill_tokens,
            got.scheduled_tokens, got.generated_tokens) == (2, 1, 20, 25, 3)


def test_without_drafts_the_record_is_unchanged(sched):
    got = _record(sched, {"a": 1, "c": 20}, {}, [[1], []])
    assert (got.num_decode, got.num_prefill_reqs, got.prefill_tokens,
            got.scheduled_tokens, got.generated_tokens) == (1, 1, 20, 21, 1)


def test_the_cpu_build_turns_async_scheduling_off(tiny_model):
    """vLLM's CPU platform sets --async-scheduling off while it builds the config,
    before the scheduler (tuned's TunedScheduler picks its base from the result:
    test_vllm_scheduler.py::test_variant_follows_async_flag)."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig

    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256,
                         enable_chunked_prefill=True, is_encoder_decoder=False,
                         async_scheduling=True)
    assert sc.async_scheduling is True
    vc = VllmConfig(scheduler_config=sc,
                    model_config=ModelConfig(model=str(tiny_model), dtype="float32", seed=0,
                                             max_model_len=256, skip_tokenizer_init=True),
                    cache_config=CacheConfig(block_size=16))
    assert vc.scheduler_config.async_scheduling is False      # vLLM's CpuPlatform
