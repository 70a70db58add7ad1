"""Fixed-size rings written by the engine's step loop and read by the controller.

One writer (the scheduler, on the EngineCore thread) and any number of readers (the
controller and the HTTP endpoint, on their own threads). Writes are a slot store and
an integer increment, no lock: under CPython's GIL a reader sees each tuple whole, and
a reader that races the writer around the ring drops slots whose sequence number does
not match instead of returning a torn window.
"""

from __future__ import annotations

from typing import NamedTuple

#: the finished-request ring each engine keeps: the longest demand window it can serve
FINISHED_RING = 4096


class StepSample(NamedTuple):
    """One engine step, as the scheduler saw it."""

    seq: int
    t: float                 # monotonic end time of the step, seconds
    step_s: float            # wall time of the step (time between tokens for its decodes)
    num_decode: int          # requests that decoded one token this step
    num_prefill_reqs: int    # requests that ran a prefill chunk this step
    prefill_tokens: int      # prompt tokens computed this step
    scheduled_tokens: int    # all tokens scheduled this step
    generated_tokens: int    # tokens sampled this step
    kv_usage: float          # fraction of KV blocks in use after the step
    kv_used_blocks: int
    kv_tokens_resident: int  # context tokens held by running requests
    num_running: int
    num_waiting: int
    preempted: int           # requests preempted this step


class FinishedRequest(NamedTuple):
    """A request that left the engine: its KV demand and its timing."""

    seq: int
    t: float                 # monotonic time it finished
    request_id: str
    prompt_tokens: int
    output_tokens: int
    max_tokens: int
    arrival_s: float         # when it arrived, on the same clock as t
    preemptions: int
    first_token_s: float | None = None  # when its first token came, on the same clock
                                        # (None: never, or not recorded)


class Ring:
    """Single-writer ring of NamedTuples whose first field is a sequence number."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"ring size must be >= 1, got {size}")
        self._size = size
        self._slots: list = [None] * size
        self._next = 0  # sequence number of the next write

    @property
    def size(self) -> int:
        return self._size

    @property
    def next_seq(self) -> int:
        return self._next

    def append(self, item) -> None:
        """Store an item whose ``seq`` is :attr:`next_seq` (the writer builds it so)."""
        self._slots[item[0] % self._size] = item
        self._next = item[0] + 1

    def since(self, seq: int) -> list:
        """Items with sequence number >= ``seq`` still held by the ring, oldest first."""
        end = self._next
        start = max(seq, end - self._size, 0)
        out = []
        for s in range(start, end):
            item = self._slots[s % self._size]
            if item is not None and item[0] == s:
                out.append(item)
        return out

    def newest_first(self):
        """Items from the newest back, lazily: a reader that needs only a recent
        window stops early instead of copying the whole ring."""
        end = self._next
        for seq in range(end - 1, max(end - self._size, 0) - 1, -1):
            item = self._slots[seq % self._size]
            if item is None or item[0] != seq:
                return  # overwritten by the writer since we started: older data is gone
            yield item

    def last(self, n: int) -> list:
        return self.since(self._next - n)
