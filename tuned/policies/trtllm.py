"""TensorRT-LLM's dynamic batch-size tuner, as a pure peer baseline.

Reproduces ``DynamicBatchTuner`` of NVIDIA/TensorRT-LLM, read at these commits:

* ``cpp/tensorrt_llm/executor/dynamicBatchTuner.cpp`` @ 2a9abd9536aa62ad3e4b9314be9286b1b1be523b
  and its header ``dynamicBatchTuner.h`` @ 3585984b32cded5cc002d3087d3da4b0fd9fb8a5;
* ``cpp/tensorrt_llm/executor/dynamicBatchConfig.cpp`` @ 3585984b (defaults);
* ``cpp/tensorrt_llm/executor/executorImpl.cpp`` @ b35ac1b64368513d215c57d2ed01d62d910df8da
  (where it is fed and applied);
* ``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp`` @ b35ac1b (``getMaxCapacityBatchSize``);
* ``TrtGptModelInflightBatching::setRuntimeBatchSize`` / ``setRuntimeMaxNumTokens``
  (``cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp``);
* ``cpp/tests/unit_tests/executor/dynamicBatchTunerTest.cpp`` @ 2a9abd95 (its cases are
  replayed in ``tests/policies/test_peers.py``).

What the source does, step by step:

1. **Statistics.** Two moving windows of the last N values (``DynamicBatchConfig::
   kDefaultDynamicBatchMovingAverageWindow = 128``), one of input and one of output
   length, each a deque plus a running sum: ``while (stats.size() >= windowSize) {
   sum -= stats.front(); stats.pop_front(); } stats.push_back(value); sum += value;``.
   They are fed neither on arrival nor on completion but *every executor iteration,
   once per active request* (``executionLoop``, after ``fetchNewRequests``):
   ``for (auto const& req : activeRequests) { ... updateStats(req->mPromptLen,
   req->mMaxNewTokens); }``. So the "input length" is the prompt length and the
   "output length" is the request's *requested* ``max_new_tokens``, not what it
   generated; and the window holds the last 128 (request, iteration) samples: with
   128 or more active requests it is the current batch, with fewer it is the last
   few iterations' snapshots, so a long-running request is counted in every one.
   The averages are ``sum / size`` (0 when empty) in double.
2. **Capacity.** Before every ``forwardAsync`` the executor truncates both averages to
   integers (``static_cast<SizeType32>(getAverageInputLength())``) and asks the KV
   cache manager how many such sequences fit:
   ``maxCapacityBatchSize = allottedPrimaryBlocks / calculateMaxBlockRequirements(
   in, out, sink, windowSize, beamWidth, tokensPerBlock)`` (integer division, minimum
   over attention-window sizes). For beam width 1 the requirement is
   ``ceilDiv(min(in + out, window) + sinkBubble, tokensPerBlock)`` plus
   ``kSWAExtraBlock = 1`` when the sequence is longer than the window.
3. **Snap.** ``getRuntimeBatchSize`` walks the table ``kDefaultBatchSizeTable =
   {{144, 128}, {336, 256}, {672, 512}, {832, 768}, {1280, 1024}, {1664, 1536}}``:
   the first row with ``maxCapacityBatchSize < limit`` gives the batch size. Past the
   table: ``threshold = cap / 512 * 512``; ``cap < threshold + 128`` gives
   ``threshold``, else ``cap`` itself. The snap goes either way: 143 -> 128 (down),
   144 -> 256 (*up*, past the memory-only capacity), and everything below 144,
   however small, -> 128. There is no minimum other than that.
4. **Apply.** ``setRuntimeBatchSize``: ``mMaxBatchSizeRuntime = std::min(
   getMaxBatchSize(), runtimeMaxBatchSize)`` -- the engine's static maximum is the only
   clamp. It is recomputed before every iteration: there is no update interval,
   hysteresis or rate limit.
5. **Token budget** (only with ``enable_max_num_tokens_tuning``), from the runtime batch
   size B and the (untruncated) averages: ``adjusted = int(B * in / out + B)``;
   threshold 8192 when ``in / out > 2.0`` (context heavy), 4096 when ``> 0.5``
   (balanced), else 2048 (generation heavy); result
   ``max(1 << ceil(log2(adjusted)), threshold)``, then
   ``min(static max_num_tokens, result)`` in ``setRuntimeMaxNumTokens``.

TensorRT-LLM ships the tuner off (``DynamicBatchConfig(enableBatchSizeTuning = false,
enableMaxNumTokensTuning = false, ...)``); the executor builds it only when a
``dynamic_batch_config`` is given and the model is a transformer with a KV cache.

Mapping onto tuned (engine-neutral; the lead wraps it as a batch policy):

* ``observe_step(active)`` is the executor's per-iteration loop; feed it
  ``(prompt_tokens, max_tokens)`` of every running request, once per engine step
  (a request paused by TRT-LLM's MAX_UTILIZATION scheduler moves its generated
  tokens into the prompt, which keeps the sum; vLLM's preempted requests keep
  their prompt, so no mapping is needed).
* ``batch_size(kv_capacity_blocks, tokens_per_block)`` is the batch size the source
  would set, in vLLM's terms the ``max_num_active_reqs`` gate, capped at
  ``max_batch_size`` (``max_num_seqs``). ``kv_capacity_blocks`` plays
  ``allottedPrimaryBlocks``: all blocks of the pool, not the free ones.
* Before any sample the source never runs (stats are fed before the first
  ``forwardAsync``); here the static ``max_batch_size`` is returned, which is also
  the runtime value TRT-LLM starts with (``mMaxBatchSizeRuntime = getMaxBatchSize()``).
* Beam search, sink tokens and sliding windows are kept as parameters with vLLM's
  defaults (beam 1, no sink, full attention); one window size only.

The rule has no latency input and no notion of free memory: it sizes the batch for
an *average* request filling the *whole* pool.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from tuned.core.types import Decision, Observation

#: ``DynamicBatchConfig::kDefaultBatchSizeTable``: (capacity limit, batch size) rows.
DEFAULT_BATCH_SIZE_TABLE: tuple[tuple[int, int], ...] = (
    (144, 128), (336, 256), (672, 512), (832, 768), (1280, 1024), (1664, 1536))
#: ``DynamicBatchConfig::kDefaultDynamicBatchMovingAverageWindow``
DEFAULT_WINDOW = 128
BATCH_SIZE_FALLBACK_GRANULARITY = 512     # kBatchSizeFallbackGranularity
BATCH_SIZE_FALLBACK_THRESHOLD = 128       # kBatchSizeFallbackThreshold
MAX_NUM_TOKENS_RATIO_CONTEXT_HEAVY = 2.0  # kMaxNumTokensRatioContextHeavy
MAX_NUM_TOKENS_RATIO_BALANCED = 0.5       # kMaxNumTokensRatioBalanced
MAX_NUM_TOKENS_THRESHOLD_CONTEXT_HEAVY = 8192
MAX_NUM_TOKENS_THRESHOLD_BALANCED = 4096
MAX_NUM_TOKENS_THRESHOLD_GEN_HEAVY = 2048
SWA_EXTRA_BLOCK = 1                       # kSWAExtraBlock (kvCacheManager.h)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def snap_batch_size(max_capacity_batch_size: int,
                    table: Sequence[tuple[int, int]] = DEFAULT_BATCH_SIZE_TABLE) -> int:
    """``DynamicBatchTuner::getRuntimeBatchSize``.

    The first row (limit, size) with ``cap < limit`` gives ``size``; past the table,
    ``t = cap // 512 * 512`` is returned when ``cap < t + 128``, else ``cap``.
    """
    cap = int(max_capacity_batch_size)
    for limit, size in table:
        if cap < limit:
            return size
    threshold = cap // BATCH_SIZE_FALLBACK_GRANULARITY * BATCH_SIZE_FALLBACK_GRANULARITY
    if cap < threshold + BATCH_SIZE_FALLBACK_THRESHOLD:
        return threshold
    return cap


def runtime_max_num_tokens(runtime_batch_size: int, avg_input_len: float,
                           avg_output_len: float) -> int:
    """``DynamicBatchTuner::getRuntimeMaxNumTokens`` ("fully overlapped case").

    ``adjusted = int(B * in/out + B)`` (C++ double -> int truncation); the threshold is
    8192 for in/out > 2.0, 4096 for in/out > 0.5, else 2048; the result is
    ``max(2 ** ceil(log2(adjusted)), threshold)``.
    """
    if avg_output_len <= 0 or runtime_batch_size <= 0:
        # unreachable in the source (max_new_tokens >= 1 and B >= 1), where it would
        # divide by zero or take log2(0)
        raise ValueError(f"need runtime_batch_size >= 1 and avg_output_len > 0, got "
                         f"{runtime_batch_size} and {avg_output_len}")
    b = int(runtime_batch_size)
    ratio = avg_input_len / avg_output_len
    adjusted = int(1.0 * (b * avg_input_len / avg_output_len + b))
    if ratio > MAX_NUM_TOKENS_RATIO_CONTEXT_HEAVY:
        threshold = MAX_NUM_TOKENS_THRESHOLD_CONTEXT_HEAVY
    elif ratio > MAX_NUM_TOKENS_RATIO_BALANCED:
        threshold = MAX_NUM_TOKENS_THRESHOLD_BALANCED
    else:
        threshold = MAX_NUM_TOKENS_THRESHOLD_GEN_HEAVY
    return max(1 << math.ceil(math.log2(adjusted)), threshold)


def sink_bubble_length(sink_token_length: int, tokens_per_block: int) -> int:
    """``BaseKVCacheManager::getSinkBubbleLength``."""
    in_last = sink_token_length % tokens_per_block
    return 0 if in_last == 0 else tokens_per_block - in_last


def block_requirements_per_beam(sequence_length: int, sink_token_length: int,
                                window: int, tokens_per_block: int) -> int:
    """``KVCacheManager::calculateMaxBlockRequirementsPerBeam``."""
    tokens = min(sequence_length, window) + sink_bubble_length(sink_token_length,
                                                               tokens_per_block)
    blocks = _ceil_div(tokens, tokens_per_block)
    if sequence_length > window:
        blocks += SWA_EXTRA_BLOCK
    return blocks


def max_block_requirements(input_len: int, output_len: int, tokens_per_block: int, *,
                           window: int | None = None, sink_token_length: int = 0,
                           beam_width: int = 1) -> int:
    """``KVCacheManager::calculateMaxBlockRequirements``: KV blocks one sequence of
    ``input_len`` + ``output_len`` tokens needs (``window`` None = full attention)."""
    whole = input_len + output_len
    w = whole if window is None else window
    if beam_width == 1:
        return block_requirements_per_beam(whole, sink_token_length, w, tokens_per_block)
    if w <= output_len:
        return block_requirements_per_beam(output_len, sink_token_length, w,
                                           tokens_per_block) * beam_width
    context_in_window = min(w, whole) - output_len
    bubble = sink_bubble_length(sink_token_length, tokens_per_block)
    context_blocks = (context_in_window + bubble) // tokens_per_block
    leftover = context_in_window - context_blocks * tokens_per_block
    output_blocks = _ceil_div(output_len + leftover, tokens_per_block)
    if whole > w:
        output_blocks += SWA_EXTRA_BLOCK
    return context_blocks + output_blocks * beam_width


def max_capacity_batch_size(kv_capacity_blocks: int, input_len: int, output_len: int,
                            tokens_per_block: int, *, window: int | None = None,
                            sink_token_length: int = 0, beam_width: int = 1) -> int:
    """``KVCacheManager::getMaxCapacityBatchSize`` for one window size:
    ``blocks // max_block_requirements(in, out)``."""
    need = max_block_requirements(input_len, output_len, tokens_per_block, window=window,
                                  sink_token_length=sink_token_length,
                                  beam_width=beam_width)
    if need <= 0:
        raise ValueError(f"a sequence of {input_len} + {output_len} tokens needs no block")
    return int(kv_capacity_blocks) // need


class _Window:
    """A moving window of the last ``size`` values with a running sum (``::updateStats``)."""

    __slots__ = ("size", "values", "total")

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: deque[int] = deque()
        self.total = 0

    def push(self, value: int) -> None:
        while len(self.values) >= self.size:
            self.total -= self.values.popleft()
        self.values.append(value)
        self.total += value

    def mean(self) -> float:
        return self.total / len(self.values) if self.values else 0.0


class TrtllmDynamicBatchTuner:
    """TensorRT-LLM's ``DynamicBatchTuner`` plus the executor's use of it.

    ``max_batch_size``: the engine's static maximum (TRT-LLM ``getMaxBatchSize()``,
    vLLM ``max_num_seqs``), the only clamp on the tuned size. ``max_num_tokens``: the
    static token budget that caps the tuned one (None = uncapped, as in the source
    when the model has none). ``window``, ``batch_size_table``: ``DynamicBatchConfig``.
    ``attention_window``, ``sink_token_length``, ``beam_width``: the KV cache's geometry
    (vLLM: None = full attention, 0, 1).
    """

    def __init__(self, *, max_batch_size: int, max_num_tokens: int | None = None,
                 window: int = DEFAULT_WINDOW,
                 batch_size_table: Sequence[tuple[int, int]] = DEFAULT_BATCH_SIZE_TABLE,
                 attention_window: int | None = None, sink_token_length: int = 0,
                 beam_width: int = 1) -> None:
        if max_batch_size < 1 or window < 1:
            raise ValueError(f"trtllm: need max_batch_size >= 1 and window >= 1, got "
                             f"max_batch_size={max_batch_size}, window={window}")
        if not batch_size_table:
            raise ValueError("trtllm: batch size table is empty")
        limits = [limit for limit, _ in batch_size_table]
        if any(a >= b for a, b in zip(limits, limits[1:])):
            raise ValueError("trtllm: batch size table is not sorted in ascending order")
        self.max_batch_size = int(max_batch_size)
        self.max_num_tokens_static = max_num_tokens
        self.window = int(window)
        self.batch_size_table = tuple((int(a), int(b)) for a, b in batch_size_table)
        self.attention_window = attention_window
        self.sink_token_length = sink_token_length
        self.beam_width = beam_width
        self._inputs = _Window(self.window)
        self._outputs = _Window(self.window)

    # ---------------------------------------------------------------- statistics
    def observe_request(self, input_tokens: int, output_tokens: int) -> None:
        """``updateStats(inputLen, outputLen)``: one sample of (prompt length,
        requested max_new_tokens)."""
        self._inputs.push(int(input_tokens))
        self._outputs.push(int(output_tokens))

    def observe_step(self, active: Iterable[tuple[int, int]]) -> None:
        """The executor's per-iteration feed: one ``updateStats`` per active request,
        in order, with (prompt tokens, max new tokens)."""
        for input_tokens, output_tokens in active:
            self.observe_request(input_tokens, output_tokens)

    @property
    def samples(self) -> int:
        return len(self._inputs.values)

    @property
    def avg_input_len(self) -> float:
        """``getAverageInputLength`` (0 before any sample)."""
        return self._inputs.mean()

    @property
    def avg_output_len(self) -> float:
        """``getAverageOutputLength`` (0 before any sample)."""
        return self._outputs.mean()

    # ---------------------------------------------------------------- decisions
    def max_capacity_batch_size(self, kv_capacity_blocks: int, tokens_per_block: int) -> int:
        """Sequences of the (integer-truncated) average lengths that fit in the pool."""
        return max_capacity_batch_size(
            kv_capacity_blocks, int(self.avg_input_len), int(self.avg_output_len),
            tokens_per_block, window=self.attention_window,
            sink_token_length=self.sink_token_length, beam_width=self.beam_width)

    def tuner_batch_size(self, kv_capacity_blocks: int, tokens_per_block: int) -> int:
        """``getRuntimeBatchSize(maxCapacityBatchSize)``: the tuner's recommendation,
        before the engine's clamp (``mMaxBatchSizeTunerRecommended``)."""
        return snap_batch_size(self.max_capacity_batch_size(kv_capacity_blocks,
                                                            tokens_per_block),
                               self.batch_size_table)

    def batch_size(self, kv_capacity_blocks: int, tokens_per_block: int) -> int:
        """The runtime max batch size the source sets (``mMaxBatchSizeRuntime``):
        ``min(max_batch_size, snap(blocks // blocks_per_sequence(avg in, avg out)))``;
        ``max_batch_size`` before any sample."""
        if self.samples == 0 or int(self.avg_input_len) + int(self.avg_output_len) <= 0:
            return self.max_batch_size
        return min(self.max_batch_size,
                   self.tuner_batch_size(kv_capacity_blocks, tokens_per_block))

    def max_num_tokens(self, runtime_batch_size: int) -> int | None:
        """The runtime token budget the source sets (``mMaxNumTokensRuntime``):
        ``min(max_num_tokens, getRuntimeMaxNumTokens(B))``. Pass the batch size the
        engine runs with (``batch_size(...)``, or ``max_batch_size`` when only the token
        budget is tuned). The static budget (None = no cap) before any sample."""
        if self.samples == 0 or self.avg_output_len <= 0:
            return self.max_num_tokens_static
        tuned = runtime_max_num_tokens(runtime_batch_size, self.avg_input_len,
                                       self.avg_output_len)
        if self.max_num_tokens_static is None:
            return tuned
        return min(self.max_num_tokens_static, tuned)


__all__ = ["BATCH_SIZE_FALLBACK_GRANULARITY", "BATCH_SIZE_FALLBACK_THRESHOLD",
           "DEFAULT_BATCH_SIZE_TABLE", "DEFAULT_WINDOW", "TrtllmDynamicBatchTuner",
           "block_requirements_per_beam", "max_block_requirements",
           "max_capacity_batch_size", "runtime_max_num_tokens", "sink_bubble_length",
           "snap_batch_size"]


class TrtllmPolicy:
    """TensorRT-LLM's dynamic batch-size tuner as a batch policy.

    The source feeds its 128-sample windows with every active request's prompt
    length and ``max_new_tokens`` once per executor iteration; here once per
    controller tick (``Observation.active``), which samples the same population at
    a coarser rate. Capacity is the whole KV pool in blocks over the blocks one
    sequence needs at the averages, snapped by the batch-size table; it has no
    latency input, and its own token budget is ``max_num_batched_tokens`` (the
    source's token tuning is a separate flag, off by default); tuned's
    ``token_budget_policy`` may wrap it like any other policy.
    """

    wants_active = True

    def __init__(self, ceiling: int, max_num_batched_tokens: int, block_size: int) -> None:
        self.tuner = TrtllmDynamicBatchTuner(max_batch_size=ceiling)
        self.ceiling = ceiling
        self.max_num_batched_tokens = max_num_batched_tokens
        self.block_size = block_size

    def decide(self, obs: Observation) -> Decision:
        for prompt, max_new in obs.active:
            self.tuner.observe_request(prompt, max_new)
        cap = min(max(self.tuner.batch_size(obs.kv_capacity_blocks, self.block_size), 1),
                  self.ceiling)
        return Decision(target=cap, lower=1, upper=self.ceiling, cap=cap,
                        batch=min(max(cap, obs.num_running), self.ceiling),
                        token_budget=self.max_num_batched_tokens, reason="trtllm",
                        inputs={"running": obs.num_running, "waiting": obs.num_waiting,
                                "avg_input_tokens": self.tuner.avg_input_len,
                                "avg_output_tokens": self.tuner.avg_output_len,
                                "samples": self.tuner.samples,
                                "kv_capacity_blocks": obs.kv_capacity_blocks})


def build(cfg: Any, *, ceiling: int, max_num_batched_tokens: int, block_size: int,
          **_: Any) -> TrtllmPolicy:
    return TrtllmPolicy(ceiling, max_num_batched_tokens, block_size)


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "trtllm", "kind": "batch", "build": "build", "order": 40,
    "summary": "TensorRT-LLM's dynamic batch tuner",
    "reasons": {"trtllm": "batch_policy = trtllm: TensorRT-LLM's dynamic batch-size tuner"},
    "bench": [{"name": "trtllm", "kind": "peer",
               "config": {"batch_policy": "trtllm", "queue_policy": "fcfs",
                          "queue_options": {}}}],
}
