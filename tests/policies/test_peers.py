"""Peers' batch-size rules against numbers worked out by hand from their sources:
TensorRT-LLM's DynamicBatchTuner and SGLang's new_token_ratio admission."""

import pytest

from tuned.core.queue_policy import AdmitContext, ReqInfo

from tuned.policies.registry import make_policy
from tuned.policies.sglang import NewTokenRatio, SglangPolicy, ratio_after_retract
from tuned.policies.trtllm import (
    DEFAULT_BATCH_SIZE_TABLE,
    TrtllmDynamicBatchTuner,
    max_block_requirements,
    runtime_max_num_tokens,
    snap_batch_size,
)


# ====================================================================== TensorRT-LLM
def tuner(max_batch_size=512, **kw):
    return TrtllmDynamicBatchTuner(max_batch_size=max_batch_size, **kw)


def test_default_table_and_window_are_the_sources():
    assert DEFAULT_BATCH_SIZE_TABLE == ((144, 128), (336, 256), (672, 512), (832, 768),
                                        (1280, 1024), (1664, 1536))
    assert tuner().window == 128


def test_snap_replays_the_cpp_unit_test():
    # cpp/tests/unit_tests/executor/dynamicBatchTunerTest.cpp, RuntimeBatchSize
    for cap, want in ((143, 128), (335, 256), (671, 512), (831, 768), (1279, 1024),
                      (1663, 1536), (2049, 2048), (1665, 1665)):
        assert snap_batch_size(cap) == want
    # the snap goes up as well as down, and nothing is ever below 128
    assert snap_batch_size(144) == 256 and snap_batch_size(0) == 128
    # past the table: 2048 + 128 = 2176 is the first capacity kept as is
    assert snap_batch_size(2175) == 2048 and snap_batch_size(2176) == 2176


def test_stats_replay_the_cpp_unit_test():
    # DynamicBatchTunerTest.Stats, window 3
    t = tuner(window=3)
    assert (t.avg_input_len, t.avg_output_len) == (0, 0)
    for (i, o), (ai, ao) in zip(((1, 2), (2, 3), (3, 4), (4, 5)),
                                ((1, 2), (1.5, 2.5), (2, 3), (3, 4))):
        t.observe_request(i, o)
        assert (t.avg_input_len, t.avg_output_len) == (ai, ao)


def test_average_500_300_on_10000_blocks_of_16():
    # ceil((500 + 300) / 16) = 50 blocks per sequence; 10000 // 50 = 200 sequences;
    # 144 <= 200 < 336 -> 256, above the 200 that fit
    t = tuner(max_batch_size=512)
    t.observe_request(500, 300)
    assert t.max_capacity_batch_size(10000, 16) == 200
    assert t.batch_size(10000, 16) == 256
    # the engine's static maximum is the only clamp
    small = tuner(max_batch_size=64)
    small.observe_request(500, 300)
    assert small.batch_size(10000, 16) == 64


def test_capacity_boundary_144_and_integer_truncation_of_averages():
    # 7150 // 50 = 143 -> 128; 7200 // 50 = 144 -> 256
    t = tuner(max_batch_size=512)
    t.observe_request(500, 300)
    assert t.batch_size(7150, 16) == 128 and t.batch_size(7200, 16) == 256
    # averages 500.5 / 300.5 are truncated to 500 / 300 before the block count:
    # 800 tokens -> 50 blocks, 7200 // 50 = 144 -> 256 (with 801 tokens it would be
    # 51 blocks, 141 -> 128)
    t2 = tuner(max_batch_size=512)
    t2.observe_step([(500, 300), (501, 301)])
    assert (t2.avg_input_len, t2.avg_output_len) == (500.5, 300.5)
    assert t2.max_capacity_batch_size(7200, 16) == 144 and t2.batch_size(7200, 16) == 256


def test_min_and_max_clamps():
    t = tuner(max_batch_size=256)
    t.observe_request(500, 300)
    # 10 blocks hold no sequence at all: capacity 0 -> 128, still 128
    assert t.max_capacity_batch_size(10, 16) == 0 and t.batch_size(10, 16) == 128
    t64 = tuner(max_batch_size=64)
    t64.observe_request(500, 300)
    assert t64.batch_size(10, 16) == 64
    # before any sample: the static maximum, what TRT-LLM starts with
    assert tuner(max_batch_size=300).batch_size(10, 16) == 300
    # 32-token sequences = 2 blocks: 4098 blocks -> 2049 -> 2048; 3330 -> 1665 -> 1665
    big = tuner(max_batch_size=4096)
    big.observe_request(16, 16)
    assert big.batch_size(4098, 16) == 2048 and big.batch_size(3330, 16) == 1665
    capped = tuner(max_batch_size=2000)
    capped.observe_request(16, 16)
    assert capped.batch_size(4098, 16) == 2000


def test_window_keeps_the_last_128_samples():
    t = tuner()
    for _ in range(128):
        t.observe_request(100, 100)
    for _ in range(64):
        t.observe_request(900, 500)
    # 64 x 100 + 64 x 900 over 128 = 500; 64 x 100 + 64 x 500 over 128 = 300
    assert t.samples == 128
    assert (t.avg_input_len, t.avg_output_len) == (500.0, 300.0)
    assert t.batch_size(10000, 16) == 256
    for _ in range(64):
        t.observe_request(900, 500)
    assert (t.avg_input_len, t.avg_output_len) == (900.0, 500.0)
    # ceil(1400 / 16) = 88 blocks, 10000 // 88 = 113 -> 128
    assert t.batch_size(10000, 16) == 128


def test_observe_step_feeds_every_active_request_every_iteration():
    # two requests active for 100 iterations: the window holds the last 128 samples,
    # 64 of each, whatever their arrival
    t = tuner()
    for _ in range(100):
        t.observe_step([(100, 50), (300, 150)])
    assert (t.samples, t.avg_input_len, t.avg_output_len) == (128, 200.0, 100.0)
    # a third request joins: 64 iterations push 192 samples; the last 128 are the
    # last 42 iterations plus (300, 2000) of the one before: 42 x 100, 43 x 300,
    # 43 x 2000 -> 103100 / 128; outputs 42 x 50 + 43 x 150 + 43 x 1000 = 51550 / 128
    for _ in range(64):
        t.observe_step([(100, 50), (300, 150), (2000, 1000)])
    assert t.samples == 128
    assert (t.avg_input_len, t.avg_output_len) == (103100 / 128, 51550 / 128)


def test_block_requirements_window_and_beams():
    assert max_block_requirements(500, 300, 16) == 50
    # sliding window 512: min(800, 512) = 512 -> 32 blocks + kSWAExtraBlock
    assert max_block_requirements(500, 300, 16, window=512) == 33
    # beam 2: context 500 tokens -> 31 full blocks + 4 left over; output blocks
    # ceil((300 + 4) / 16) = 19 per beam -> 31 + 2 x 19 = 69
    assert max_block_requirements(500, 300, 16, beam_width=2) == 69
    # sink tokens 4 -> bubble 12: ceil((800 + 12) / 16) = 51
    assert max_block_requirements(500, 300, 16, sink_token_length=4) == 51


def test_max_num_tokens_replays_the_cpp_unit_test():
    # DynamicBatchTunerTest.RuntimeMaxNumTokens, window 1
    t = tuner(window=1)
    t.observe_request(100, 2)          # context heavy (50 > 2)
    assert t.max_num_tokens(1) == 8192 and t.max_num_tokens(256) == 16384
    t.observe_request(100, 100)        # balanced
    assert t.max_num_tokens(1) == 4096 and t.max_num_tokens(4000) == 8192
    t.observe_request(2, 256)          # generation heavy
    assert t.max_num_tokens(1) == 2048 and t.max_num_tokens(4000) == 4096


def test_max_num_tokens_500_300_and_static_cap():
    # in/out = 1.67 -> balanced (4096). B = 256: int(256 x 500/300 + 256) = 682 -> 1024
    # -> 4096. B = 2048: int(3413.3 + 2048) = 5461 -> 8192
    assert runtime_max_num_tokens(256, 500, 300) == 4096
    assert runtime_max_num_tokens(2048, 500, 300) == 8192
    t = tuner(max_num_tokens=6000)
    assert t.max_num_tokens(2048) == 6000      # no sample yet: the static budget
    t.observe_request(500, 300)
    assert t.max_num_tokens(2048) == 6000 and t.max_num_tokens(256) == 4096


def test_bad_tables_and_sizes_are_refused():
    with pytest.raises(ValueError, match="not sorted in ascending order"):
        tuner(batch_size_table=((336, 256), (144, 128)))
    with pytest.raises(ValueError, match="batch size table is empty"):
        tuner(batch_size_table=())
    with pytest.raises(ValueError, match="need max_batch_size >= 1 and window >= 1"):
        tuner(max_batch_size=0)


# ====================================================================== SGLang
def R(rid, prompt, max_tokens, out=0, t=0.0):
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=prompt, max_tokens=max_tokens,
                   predicted_output=max_tokens, output_tokens=out)


def ctx(free, cap_tokens=100_000):
    return AdmitContext(now_s=0.0, kv_capacity_tokens=cap_tokens, kv_free_tokens=free, cap=64)


def test_ratio_schedule_after_0_300_600_900_decode_steps():
    # init 0.7, min 0.7 x 0.14 = 0.098, decay (0.7 - 0.098) / 600 = 0.00100333...
    r = NewTokenRatio()
    assert (r.init, r.min) == (0.7, pytest.approx(0.098))
    assert r.decay == pytest.approx(0.602 / 600)
    values = {0: r.value}
    for step in range(1, 901):
        r.on_decode_step()
        values[step] = r.value
    assert values[0] == 0.7
    assert values[300] == pytest.approx(0.399)      # 0.7 - 300 x 0.0010033
    assert values[600] == pytest.approx(0.098)
    assert values[900] == r.min                      # clamped at the floor


def test_ratio_scales_with_conservativeness_and_is_capped_at_one():
    r = NewTokenRatio(schedule_conservativeness=2.0)
    assert (r.init, r.min) == (1.0, pytest.approx(0.14))
    assert NewTokenRatio(schedule_conservativeness=0.5).init == pytest.approx(0.35)


def test_retraction_sets_the_ratio_from_the_kept_requests_and_idle_resets():
    r = NewTokenRatio()
    for _ in range(600):
        r.on_decode_step()
    # kept: 100 of 400 and 50 of 200 generated -> (150 + 20 x 2) / (600 + 1)
    assert r.on_retract([(100, 400), (50, 200)]) == pytest.approx(190 / 601)
    assert r.value == pytest.approx(0.316139767)
    r.on_decode_step()
    assert r.value == pytest.approx(190 / 601 - 0.602 / 600)
    assert ratio_after_retract([(10, 20)]) == 1.0    # (10 + 20) / 21 > 1
    assert r.on_idle() == 0.7


def test_admitted_with_strictly_more_room_refused_with_exactly_its_need():
    # nothing running: needs 200 + min(300, 4096) = 500; SGLang refuses when
    # total_tokens >= rem_total_tokens, so 501 free admits and 500 does not
    p = SglangPolicy()
    cand = R("c", 200, 300)
    v = p.admit(cand, [], [], ctx(501))
    assert v.admit and v.reason.startswith("sglang: fits, needs 500 < 501 free")
    v = p.admit(cand, [], [], ctx(500))
    assert not v.admit and v.reason.startswith("sglang: no token, needs 500 >= 500 free")


def test_running_requests_reserve_clipped_remaining_output_times_ratio():
    # R1: 400 tokens to go x 0.7 = 280; R2: min(10000, 4096) x 0.7 = 2867.2;
    # reserve 3147.2, candidate needs 500 -> admitted iff free > 3647.2
    p = SglangPolicy()
    running = [R("r1", 100, 500, out=100), R("r2", 50, 10_000)]
    cand = R("c", 200, 300)
    assert p.running_reserve(running) == pytest.approx(3147.2)
    assert p.admit(cand, running, [], ctx(3648)).admit
    v = p.admit(cand, running, [], ctx(3647))
    assert not v.admit and "3647 free - 3147.2 running x ratio 0.7000" in v.reason


def test_decayed_ratio_admits_more():
    # R1 reserves 400 x ratio: 280 at 0.7 -> free > 780; 39.2 at 0.098 -> free > 539.2
    p = SglangPolicy()
    running = [R("r1", 100, 500, out=100)]
    cand = R("c", 200, 300)
    assert p.admit(cand, running, [], ctx(781)).admit
    assert not p.admit(cand, running, [], ctx(780)).admit
    for _ in range(600):
        p.on_step()
    assert p.admit(cand, running, [], ctx(540)).admit
    assert not p.admit(cand, running, [], ctx(539)).admit


def test_requests_admitted_this_pass_reserve_input_plus_clipped_max_new_in_full():
    # A: 100 + min(5000, 4096) = 4196, not scaled by the ratio -> free > 4696
    p = SglangPolicy()
    a, cand = R("a", 100, 5000), R("c", 200, 300)
    assert p.admit(cand, [], [a], ctx(4697)).admit
    assert not p.admit(cand, [], [a], ctx(4696)).admit
    # page 16: ceil(100 / 16) x 16 = 112 -> 4208 -> free > 4708
    p16 = SglangPolicy(page_size=16)
    assert p16.admit(cand, [], [a], ctx(4709)).admit
    assert not p16.admit(cand, [], [a], ctx(4708)).admit


def test_candidate_need_clips_max_new_and_counts_generated_tokens():
    p = SglangPolicy()
    assert p.total_tokens(R("c", 10, 10_000)) == 10 + 4096
    # a preempted request: 100 + 30 in the prompt again, 70 still to generate
    assert p.total_tokens(R("c", 100, 100, out=30)) == 200
    assert SglangPolicy(clip_max_new_tokens=256).total_tokens(R("c", 10, 10_000)) == 266


def test_on_step_retraction_idle_and_missing_running_set():
    p = SglangPolicy()
    for _ in range(300):
        p.on_step()
    assert p.ratio.value == pytest.approx(0.399)
    kept = [R("a", 10, 400, out=100), R("b", 10, 200, out=50)]
    assert p.on_step(retracted=2, running=kept) == pytest.approx(190 / 601)
    assert p.on_step(idle=True) == 0.7
    assert p.on_step(num_decode_steps=3) == pytest.approx(0.7 - 3 * 0.602 / 600)
    assert p.on_step(retracted=1) == 0.7
    assert "retraction reported without the running requests" in p.stats.last_reason


def test_fcfs_order_no_skipping_and_registry():
    p = make_policy("sglang", {"schedule_conservativeness": 2.0})
    assert isinstance(p, SglangPolicy) and p.ratio.init == 1.0
    waiting = [R("b", 5, 5, t=2.0), R("a", 200, 300, t=1.0)]
    ordered = p.order(waiting, 0.0)
    assert [r.request_id for r in ordered] == ["a", "b"]
    # a needs 500 < 505; then b needs 10 but only 505 - 500 = 5 remain: the pass stops
    sel = p.select(ordered, [], [], ctx(505))
    assert sel.chosen.request_id == "a"
    sel = p.select(ordered[1:], [], [ordered[0]], ctx(505))
    assert sel.chosen is None and sel.verdict.reason.startswith("sglang: no token, needs 10")
    # liveness: nothing running, nothing admitted -> the head goes in anyway
    sel = p.select(ordered, [], [], ctx(10))
    assert sel.chosen.request_id == "a" and "admitted anyway" in sel.verdict.reason
    with pytest.raises(ValueError, match="sglang: unknown option"):
        make_policy("sglang", {"ratio": 1})
