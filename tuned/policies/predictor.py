"""Output-length prediction and per-request hints, shared by every queue policy.

Order of trust for one request's output length õ:

1. a client hint, ``tuned_output_tokens`` in the request's extra args (OpenAI field
   ``vllm_xargs``), capped at ``max_tokens``;
2. an online estimator learned from finished requests: a quantile of recent output
   lengths among requests with a similar prompt length (prompt-length buckets),
   falling back to all recent requests when a bucket has too few samples;
3. before enough requests finished: ``max_tokens`` (a safe upper bound).

A prediction is never above ``max_tokens`` and never below 1.

MC-SF (seed 003) needs an over-estimate õ ≥ o; its "overestimate" mode uses a high
quantile (``overestimate_quantile``, default 0.9) instead of the median. Quantiles
take the upper neighbour (numpy's ``method="higher"``: the sorted sample's value
at index ⌈q·(n − 1)⌉), so a prediction is an observed length, never below the
sample q-quantile by either the inverted-CDF or the linear-interpolation
definition: at least a fraction q of recent requests finished within it.

Hints: :func:`parse_request_hints` reads ``tuned_output_tokens`` (integer ≥ 1),
``tuned_deadline_s`` (seconds after arrival, number > 0) and ``tuned_class`` (a
name in the operator's SLA table, giving a deadline); it never raises and returns
one warning string per ignored field.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

HINT_OUTPUT_TOKENS = "tuned_output_tokens"
HINT_DEADLINE_S = "tuned_deadline_s"
HINT_CLASS = "tuned_class"


@dataclass(frozen=True)
class RequestHints:
    """What a client told tuned about one request (all optional).

    ``deadline_s`` is relative to the request's arrival; ``sla_class`` is the
    accepted ``tuned_class`` name, if any.
    """

    output_tokens: int | None = None
    deadline_s: float | None = None
    sla_class: str | None = None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_request_hints(extra_args: Mapping[str, Any] | None,
                        class_deadlines_s: Mapping[str, float] | None = None,
                        ) -> tuple[RequestHints, list[str]]:
    """Read tuned's hints from a request's extra args; never raises.

    ``class_deadlines_s`` maps a ``tuned_class`` name to a relative deadline in
    seconds; an explicit ``tuned_deadline_s`` wins over the class. Each ignored
    field yields one warning naming the field and its allowed values, e.g.
    ``"tuned_deadline_s: must be a number > 0, got -3; ignored"``.
    """
    warnings: list[str] = []
    if extra_args is None:
        return RequestHints(), warnings
    if not isinstance(extra_args, Mapping):
        return RequestHints(), [f"extra_args: must be a mapping, got {extra_args!r}; ignored"]

    out_tokens: int | None = None
    if HINT_OUTPUT_TOKENS in extra_args:
        v = extra_args[HINT_OUTPUT_TOKENS]
        ok = (_is_number(v) and math.isfinite(v) and float(v).is_integer() and v >= 1)
        if ok:
            out_tokens = int(v)
        else:
            warnings.append(f"{HINT_OUTPUT_TOKENS}: must be an integer >= 1, got {v!r}; ignored")

    deadline: float | None = None
    if HINT_DEADLINE_S in extra_args:
        v = extra_args[HINT_DEADLINE_S]
        if _is_number(v) and math.isfinite(v) and v > 0:
            deadline = float(v)
        else:
            warnings.append(f"{HINT_DEADLINE_S}: must be a number > 0, got {v!r}; ignored")

    sla_class: str | None = None
    if HINT_CLASS in extra_args:
        v = extra_args[HINT_CLASS]
        table = class_deadlines_s or {}
        if not isinstance(v, str):
            warnings.append(f"{HINT_CLASS}: must be a string, got {v!r}; ignored")
        elif v not in table:
            known = ", ".join(sorted(table)) or "none configured"
            warnings.append(f"{HINT_CLASS}: unknown class {v!r} (known: {known}); ignored")
        else:
            sla_class = v
            if deadline is None:
                deadline = float(table[v])
    return RequestHints(out_tokens, deadline, sla_class), warnings


class PredictionErrors(NamedTuple):
    """Accuracy of the predictions used so far (predicted − actual, in tokens)."""

    count: int
    mean_abs_error_tokens: float
    mean_error_tokens: float          # > 0: over-estimates on average
    last_errors: tuple[int, ...]      # most recent last


def upper_quantile(sorted_values: Sequence[int], q: float) -> int:
    """The sorted sample's value at index ⌈q·(n − 1)⌉ (numpy's method="higher")."""
    n = len(sorted_values)
    return sorted_values[min(math.ceil(q * (n - 1) - 1e-9), n - 1)]


class _Sample:
    """A window of recent values with a lazily re-sorted copy."""

    __slots__ = ("values", "_sorted")

    def __init__(self, window: int) -> None:
        self.values: deque[int] = deque(maxlen=window)
        self._sorted: list[int] | None = None

    def add(self, v: int) -> None:
        self.values.append(v)
        self._sorted = None

    def quantile(self, q: float) -> int:
        if self._sorted is None:
            self._sorted = sorted(self.values)
        return upper_quantile(self._sorted, q)

    def __len__(self) -> int:
        return len(self.values)


class OutputLengthPredictor:
    """Online output-length estimator by prompt-length bucket; see the module doc.

    ``prompt_bucket_edges_tokens``: upper edges of the prompt-length buckets (a
    prompt of length p falls in the first bucket whose edge is > p, the last bucket
    is open). ``quantile``: the planning quantile of the normal mode;
    ``overestimate_quantile``: the one of the over-estimating mode (MC-SF).
    ``min_samples``: finished requests a bucket (or the global window) needs before
    it is trusted. Not thread-safe for learning; :meth:`error_stats` may be read
    from another thread.
    """

    def __init__(self, *, quantile: float = 0.5, overestimate_quantile: float = 0.9,
                 window: int = 512, min_samples: int = 8,
                 prompt_bucket_edges_tokens: Sequence[int] = (32, 128, 512, 2048),
                 error_window: int = 64) -> None:
        for name, q in (("quantile", quantile), ("overestimate_quantile", overestimate_quantile)):
            if not (0.0 < q <= 1.0):
                raise ValueError(f"{name}: must be in (0, 1], got {q!r}")
        if window < 1 or min_samples < 1 or error_window < 1:
            raise ValueError("window, min_samples and error_window must be >= 1")
        edges = list(prompt_bucket_edges_tokens)
        if edges != sorted(set(edges)):
            raise ValueError(f"prompt_bucket_edges_tokens: must be strictly increasing, "
                             f"got {edges!r}")
        self.quantile = quantile
        self.overestimate_quantile = overestimate_quantile
        self.min_samples = min_samples
        self._edges = edges
        self._buckets = [_Sample(window) for _ in range(len(edges) + 1)]
        self._all = _Sample(window)
        self._lock = threading.Lock()
        self._err_count = 0
        self._err_abs_sum = 0
        self._err_sum = 0
        self._last_errors: deque[int] = deque(maxlen=error_window)

    @property
    def observed(self) -> int:
        """Finished requests in the global window."""
        return len(self._all)

    def _bucket(self, prompt_tokens: int) -> _Sample:
        return self._buckets[bisect.bisect_right(self._edges, prompt_tokens)]

    def estimate(self, prompt_tokens: int, *, overestimate: bool = False) -> int | None:
        """The estimator's quantile for this prompt length, uncapped; None if untrained."""
        q = self.overestimate_quantile if overestimate else self.quantile
        b = self._bucket(prompt_tokens)
        if len(b) >= self.min_samples:
            return b.quantile(q)
        if len(self._all) >= self.min_samples:
            return self._all.quantile(q)
        return None

    def predict(self, prompt_tokens: int, max_tokens: int, hint: int | None = None, *,
                overestimate: bool = False) -> int:
        """õ for one request: hint, else estimate, else ``max_tokens``; in [1, max_tokens]."""
        max_tokens = max(int(max_tokens), 1)
        if hint is not None:
            return min(max(int(hint), 1), max_tokens)
        est = self.estimate(prompt_tokens, overestimate=overestimate)
        if est is None:
            return max_tokens
        return min(max(est, 1), max_tokens)

    def observe(self, prompt_tokens: int, output_tokens: int,
                predicted: int | None = None) -> None:
        """Learn from a finished request; ``predicted`` (what was planned with) feeds
        the error statistics."""
        self._bucket(prompt_tokens).add(int(output_tokens))
        self._all.add(int(output_tokens))
        if predicted is not None:
            err = int(predicted) - int(output_tokens)
            with self._lock:
                self._err_count += 1
                self._err_abs_sum += abs(err)
                self._err_sum += err
                self._last_errors.append(err)

    def error_stats(self) -> PredictionErrors:
        """Mean absolute / signed error over every observed prediction, and the last ones."""
        with self._lock:
            n = self._err_count
            return PredictionErrors(n, self._err_abs_sum / n if n else 0.0,
                                    self._err_sum / n if n else 0.0, tuple(self._last_errors))
