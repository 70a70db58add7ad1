"""BucketServe's baselines in the simulator, on hand-worked timelines: the padded static
batcher (``padded=True``, UELLM-like) and the decode instance of a prefill/decode
split (``prefilled=True``, DistServe-like)."""

from __future__ import annotations

import pytest

from fakes import TokenStepModel
from tuned import config as config_mod
from tuned.sim.engine import SimEngine
from tuned.base.workloads import RequestSpec


SPECS = [RequestSpec("r0", 0.0, 10, 2, 2), RequestSpec("r1", 0.0, 30, 5, 5),
         RequestSpec("r2", 0.0, 20, 3, 3)]


def cfg():
    return config_mod.validate({"max_num_seqs": 4, "fallback_cap": 4, "log_level": "warning",
                               "batch_policy": "static", "token_budget_policy": "max",
                               "b_max": 0, "max_num_batched_tokens": 256})


def run(padded: bool, num_gpu_blocks: int, static: bool = True):
    eng = SimEngine(cfg(), TokenStepModel(), block_size=16, num_gpu_blocks=num_gpu_blocks,
                    static_batching=static, padded=padded, record_token_times=True)
    return eng.run(SPECS)


def test_padded_batch_computes_every_row_at_the_longest_prompt_until_the_longest_output():
    """One batch of three: the prefill step computes 3 x 30 padded prompt tokens (90 ms),
    then 4 decode steps of 3 rows each (r0 and r2 finish early but keep their rows)."""
    res = run(True, 64)
    assert [(s.prefill_tokens, s.num_decode) for s in res.steps] == [
        (90, 0), (0, 3), (0, 3), (0, 3), (0, 3)]
    assert res.duration_s == pytest.approx(0.102)
    r0, r1, r2 = res.requests
    assert r0.first_token_s == r1.first_token_s == r2.first_token_s == pytest.approx(0.090)
    assert [r.finish_s for r in res.requests] == pytest.approx([0.093, 0.102, 0.096])
    # every row reserved at 30 + 5 tokens (3 blocks) until the batch ends
    assert [s.kv_used_blocks for s in res.steps] == [9, 9, 9, 9, 0]
    # the same static batch without padding: 60 prompt tokens, rows leave as they end
    plain = run(False, 64)
    assert [(s.prefill_tokens, s.num_decode) for s in plain.steps] == [
        (60, 0), (0, 3), (0, 2), (0, 1), (0, 1)]
    assert plain.duration_s == pytest.approx(0.067)


def test_padded_batch_admits_only_what_fits_at_the_padded_length():
    """8 usable blocks: r0 and r1 padded to 30 + 5 tokens take 3 blocks each; r2 would
    make 9, so it waits for the next batch (unpadded, the three need 1 + 3 + 2 = 6)."""
    res = run(True, 9)
    r0, r1, r2 = res.requests
    assert (r0.first_token_s, r1.first_token_s) == pytest.approx((0.060, 0.060))
    assert r1.finish_s == pytest.approx(0.068)
    assert (r2.first_token_s, r2.finish_s) == pytest.approx((0.088, 0.090))
    assert [s.kv_used_blocks for s in res.steps] == [6, 6, 6, 6, 0, 2, 2, 0]
    plain = run(False, 9)
    assert plain.steps[0].prefill_tokens == 60


def test_padded_needs_static_batching_and_fails_a_request_that_cannot_fit_alone():
    with pytest.raises(ValueError, match="padded: a padded batcher is a static one"):
        run(True, 64, static=False)
    res = run(True, 3)      # 2 usable blocks: r1 (35 tokens, 3 blocks) never fits
    assert res.failed == ["r1"]
    r0, _, r2 = res.requests
    assert (r0.finish_s, r2.finish_s) == pytest.approx((0.011, 0.033))


def test_prefilled_request_is_admitted_with_its_prompt_kv_and_decodes_from_token_two():
    """Handed over at t = 1 with 10 prompt tokens computed and its first token: two
    decode steps of 1 ms (context 10, then 11); its KV is the prompt's block at once."""
    eng = SimEngine(cfg(), TokenStepModel(), block_size=8, num_gpu_blocks=64,
                    prefilled=True, record_token_times=True)
    res = eng.run([RequestSpec("a", 1.0, 10, 3, 3)])
    (r,) = res.requests
    assert r.first_token_s == 1.0
    assert r.token_times == pytest.approx([1.0, 1.001, 1.002])
    assert [(s.num_decode, s.prefill_tokens, s.kv_used_blocks) for s in res.steps] == [
        (1, 0, 2), (1, 0, 0)]
    assert res.steps[0].kv_tokens_resident == 11
    eng = SimEngine(cfg(), TokenStepModel(), block_size=8, num_gpu_blocks=64, prefilled=True)
    with pytest.raises(ValueError, match="prefilled: every request needs output_tokens >= 2"):
        eng.run([RequestSpec("b", 0.0, 10, 1, 1)])
