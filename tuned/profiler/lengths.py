"""What the closed-loop sweep sends: an endless, thread-safe stream of (prompt,
output) token lengths.

The sweep keeps N requests in flight and asks for the next pair whenever one
returns, so it needs lengths without arrival times, drawn for as long as a level
runs -- not :class:`tuned.base.workloads.Workload`'s finite, timed requests. The grammar
and the lengths are :func:`tuned.base.workloads.parse_lengths`'s, the one workload
grammar.
"""

from __future__ import annotations

import itertools
import random
import threading
from typing import Any, Callable

from tuned.base.workloads import WorkloadError, parse_lengths


class SweepLengths:
    """Thread-safe source of (prompt_tokens, output_tokens) pairs for the sweep.

    Lengths are clamped so that prompt + output <= ``max_model_len`` (output first
    keeps at least one token, then the prompt gets what is left); ``clamped``
    counts the requests that were cut.
    """

    def __init__(self, spec: str, kind: str, draw: Callable[[random.Random], tuple[int, int]],
                 describe: dict[str, Any], seed: int = 0):
        self.spec = spec
        self.kind = kind
        self._draw = draw
        self._describe = describe
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.max_model_len: int | None = None
        self.output_cap: int | None = None
        self.clamped = 0

    def bind(self, max_model_len: int | None, output_cap: int | None = None) -> "SweepLengths":
        self.max_model_len = max_model_len
        self.output_cap = output_cap
        return self

    def next(self) -> tuple[int, int]:
        with self._lock:
            p, o = self._draw(self._rng)
            if self.output_cap:
                o = min(o, self.output_cap)
            if self.max_model_len:
                o2 = max(1, min(o, self.max_model_len - 1))
                p2 = max(1, min(p, self.max_model_len - o2))
                if (p2, o2) != (p, o):
                    self.clamped += 1
                p, o = p2, o2
            return p, o

    def describe(self) -> dict[str, Any]:
        d = {"spec": self.spec, "kind": self.kind, **self._describe}
        if self.output_cap:
            d["output_cap"] = self.output_cap
        if self.max_model_len:
            d["max_model_len"] = self.max_model_len
        d["clamped_requests"] = self.clamped
        return d


def parse_sweep_workload(spec: str, seed: int = 0) -> SweepLengths:
    """``tuned profile --workload``: :func:`tuned.base.workloads.parse_lengths`'s grammar
    (``synthetic:prompt=P,output=O``, ``trace:PATH[,length_scale=Y]``) as an endless,
    thread-safe stream; raises :class:`WorkloadError`."""
    source = parse_lengths(spec)
    count = itertools.count()
    return SweepLengths(spec, source.kind, lambda rng: source.draw(rng, next(count)),
                        source.describe, seed)
