"""What the closed-loop sweep sends: an endless, thread-safe stream of (prompt,
output) token lengths.

The sweep keeps N requests in flight and asks for the next pair whenever one
returns, so it needs lengths without arrival times, drawn for as long as a level
runs -- not :class:`tuned.workloads.Workload`'s finite, timed requests. The lengths
come from the same places: :func:`tuned.workloads.parse_dist` for ``synthetic:``
and :func:`tuned.workloads.load_trace` for ``trace:``.
"""

from __future__ import annotations

import math
import random
import re
import threading
from typing import Any, Callable

from tuned.workloads import WorkloadError, load_trace, parse_dist, trace_file


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
    """Parse ``tuned profile --workload``; raises :class:`WorkloadError`:

    - ``synthetic:prompt=64,output=64`` (fixed lengths) or with distributions
      (``U(lo,hi)``, ``N(mean,std)``, ``LN(mean,median)``, ``Exp(mean)``; see
      :func:`tuned.workloads.parse_dist`),
    - ``trace:PATH[:scale=0.1]``: a trace CSV as :func:`tuned.workloads.load_trace`
      reads it (e.g. the Azure conversation trace); rows are replayed in file order,
      cycling, with both lengths multiplied by ``scale`` (rounded, at least 1).
      Arrival times are ignored: the sweep is closed-loop.
    """
    kind, sep, rest = spec.partition(":")
    if not sep:
        raise WorkloadError(f"workload {spec!r}: expected 'synthetic:...' or 'trace:PATH'")
    if kind == "synthetic":
        return _synthetic(spec, rest, seed)
    if kind == "trace":
        return _trace(spec, rest, seed)
    raise WorkloadError(f"workload {spec!r}: unknown kind {kind!r} (synthetic or trace)")


def _synthetic(spec: str, rest: str, seed: int) -> SweepLengths:
    fields: dict[str, str] = {}
    pos = 0
    for m in re.finditer(r"\s*(\w+)\s*=\s*(\w+\([^)]*\)|[^,]*)\s*(,|$)", rest):
        if m.start() != pos:
            break
        fields[m.group(1)] = m.group(2)
        pos = m.end()
        if pos >= len(rest):
            break
    if pos != len(rest) or not fields:
        raise WorkloadError(f"workload {spec!r}: expected synthetic:prompt=N,output=N "
                            f"(N a count or U(lo,hi))")
    unknown = set(fields) - {"prompt", "output"}
    if unknown:
        raise WorkloadError(f"workload {spec!r}: unknown field {sorted(unknown)[0]!r} "
                            f"(known: prompt, output)")
    missing = {"prompt", "output"} - set(fields)
    if missing:
        raise WorkloadError(f"workload {spec!r}: missing {sorted(missing)[0]}=")
    pd, od = parse_dist(fields["prompt"], "prompt"), parse_dist(fields["output"], "output")
    return SweepLengths(spec, "synthetic", lambda rng: (pd.sample(rng), od.sample(rng)),
                        {"prompt": str(pd), "output": str(od)}, seed)


def _trace(spec: str, rest: str, seed: int) -> SweepLengths:
    parts = rest.split(":")
    opts: dict[str, str] = {}
    while len(parts) > 1 and re.fullmatch(r"\w+=.*", parts[-1]):
        k, _, v = parts.pop().partition("=")
        opts[k] = v
    try:
        path = trace_file(":".join(parts))
    except ValueError as e:
        raise WorkloadError(f"workload {spec!r}: {e}") from None
    unknown = set(opts) - {"scale"}
    if unknown:
        raise WorkloadError(f"workload {spec!r}: unknown option {sorted(unknown)[0]!r} "
                            f"(known: scale)")
    try:
        scale = float(opts.get("scale", "1"))
    except ValueError:
        raise WorkloadError(f"workload {spec!r}: scale must be a number") from None
    if not (scale > 0 and math.isfinite(scale)):
        raise WorkloadError(f"workload {spec!r}: scale must be > 0")
    rows = [(p, o) for _, p, o in load_trace(path)]
    idx = {"i": 0}

    def draw(_rng: random.Random) -> tuple[int, int]:
        p, o = rows[idx["i"] % len(rows)]
        idx["i"] += 1
        return max(1, round(p * scale)), max(1, round(o * scale))

    return SweepLengths(spec, "trace", draw, {"path": str(path), "scale": scale,
                                              "rows": len(rows)}, seed)
