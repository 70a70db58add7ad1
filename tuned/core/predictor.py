"""Output-length prediction and per-request hints, shared by every queue policy.

Order of trust for one request's output length õ:

1. a client hint, ``tuned_output_tokens`` in the request's extra args (OpenAI field
   ``vllm_xargs``), capped at ``max_tokens``;
2. an online estimator learned from finished requests: a quantile of recent output
   lengths among requests with a similar prompt length (prompt-length buckets),
   falling back to all recent requests when a bucket has too few samples;
3. before enough requests finished: ``max_tokens`` (a safe upper bound).

A prediction is never above ``max_tokens`` and never below 1.

MC-SF (Jaillet et al.) needs an over-estimate õ ≥ o; its "overestimate" mode uses a high
quantile (``overestimate_quantile``, default 0.9) instead of the median. Quantiles
take the upper neighbour (numpy's ``method="higher"``: the sorted sample's value
at index ⌈q·(n − 1)⌉), so a prediction is an observed length, never below the
sample q-quantile by either the inverted-CDF or the linear-interpolation
definition: at least a fraction q of recent requests finished within it.

Hints: :func:`parse_request_hints` reads ``tuned_output_tokens`` (integer ≥ 1),
``tuned_deadline_s`` (seconds after arrival, number > 0) and ``tuned_class`` (a
name in the operator's SLA table, giving a deadline); it never raises and returns
one warning string per ignored field (and one for any unknown ``tuned_*`` keys).
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
_HINTS = (HINT_OUTPUT_TOKENS, HINT_DEADLINE_S, HINT_CLASS)


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


def _finite(v: int | float) -> bool:
    """math.isfinite, False for an int beyond a float's range (10**400 would raise)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _shown(v: Any, limit: int = 40) -> str:
    """``repr(v)`` cut to ``limit`` characters: warnings are logged, and a client may
    put anything (text included) in a hint."""
    try:
        s = repr(v)
    except ValueError:  # an int past sys.get_int_max_str_digits()
        s = f"<int of about {int(v.bit_length() * 0.30103)} digits>"
    return s if len(s) <= limit else s[:limit - 3] + "..."


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
        return RequestHints(), [f"extra_args: must be a mapping, got {_shown(extra_args)}; "
                                "ignored"]

    out_tokens: int | None = None
    if HINT_OUTPUT_TOKENS in extra_args:
        v = extra_args[HINT_OUTPUT_TOKENS]
        ok = (_is_number(v) and _finite(v) and float(v).is_integer() and v >= 1)
        if ok:
            out_tokens = int(v)
        else:
            warnings.append(f"{HINT_OUTPUT_TOKENS}: must be an integer >= 1, got {_shown(v)}; "
                            "ignored")

    deadline: float | None = None
    if HINT_DEADLINE_S in extra_args:
        v = extra_args[HINT_DEADLINE_S]
        if _is_number(v) and _finite(v) and v > 0:
            deadline = float(v)
        else:
            warnings.append(f"{HINT_DEADLINE_S}: must be a number > 0, got {_shown(v)}; ignored")

    sla_class: str | None = None
    if HINT_CLASS in extra_args:
        v = extra_args[HINT_CLASS]
        table = class_deadlines_s or {}
        if not isinstance(v, str):
            warnings.append(f"{HINT_CLASS}: must be a string, got {_shown(v)}; ignored")
        elif v not in table:
            known = ", ".join(sorted(table)) or "none configured"
            warnings.append(f"{HINT_CLASS}: unknown class {_shown(v)} (known: {known}); ignored")
        else:
            sla_class = v
            if deadline is None:
                deadline = float(table[v])
    # a misspelt hint (tuned_deadline) would otherwise be dropped without a word; keys
    # outside the tuned_ prefix belong to vLLM or other plugins. One warning per
    # request, whatever the number of keys, under the fixed field label "unknown".
    unknown = [k for k in extra_args
               if isinstance(k, str) and k.startswith("tuned_") and k not in _HINTS]
    if unknown:
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        warnings.append(f"unknown: {_shown(unknown[0])}{more} is not a tuned hint (known: "
                        f"{', '.join(_HINTS)}); ignored")
    return RequestHints(out_tokens, deadline, sla_class), warnings


class PredictionErrors(NamedTuple):
    """Accuracy of the predictions used so far (predicted − actual, in tokens)."""

    count: int
    mean_abs_error_tokens: float
    mean_error_tokens: float          # > 0: over-estimates on average
    last_errors: tuple[int, ...]      # most recent last
    under_rate: float = 0.0           # share of recent requests that outran their prediction
    under_excess: float = 0.0         # mean of max(0, (actual − predicted) / predicted)
                                      # over recent requests: memory beyond the plan


def upper_quantile(sorted_values: Sequence[float], q: float):
    """The sorted sample's value at index ⌈q·(n − 1)⌉ (numpy's method="higher")."""
    n = len(sorted_values)
    return sorted_values[min(math.ceil(q * (n - 1) - 1e-9), n - 1)]


class _Sample:
    """A window of recent values with a lazily re-sorted copy."""

    __slots__ = ("values", "_sorted")

    def __init__(self, window: int) -> None:
        self.values: deque = deque(maxlen=window)
        self._sorted: list | None = None

    def add(self, v) -> None:
        self.values.append(v)
        self._sorted = None

    def quantile(self, q: float):
        if self._sorted is None:
            self._sorted = sorted(self.values)
        return upper_quantile(self._sorted, q)

    def __len__(self) -> int:
        return len(self.values)


class _Bins:
    """Per prompt-length bin: recent outputs and recent output / max_tokens ratios."""

    __slots__ = ("out", "ratio")

    def __init__(self, n: int, window: int) -> None:
        self.out = [_Sample(window) for _ in range(n)]
        self.ratio = [_Sample(window) for _ in range(n)]


#: default upper edges of the prompt-length bins (tokens): geometric, 16 .. 8192
DEFAULT_EDGES = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MAX_CLASSES = 32


class OutputLengthPredictor:
    """Online conditional output-length estimate from the prompt length, ``max_tokens``
    and the request class; see the module doc.

    Two estimates of the planning quantile q (``quantile``, or
    ``overestimate_quantile`` in over-estimating mode) are kept per request class
    (``tuned_class``; unclassed requests form their own class) and per prompt-length
    bin (``prompt_bucket_edges_tokens``, upper edges, the last bin open):

    * *direct*: the q-quantile of recent output lengths in the bin;
    * *ratio*: the q-quantile of recent output / max_tokens ratios in the bin, times
      the request's own ``max_tokens`` (right when clients size ``max_tokens`` to the
      answer they expect).

    Each is interpolated linearly in log prompt length between the request's bin
    and the adjacent trained bin on its side of the bin's centre (the geometric mean
    of its edges), so predictions move continuously with the prompt length instead
    of taking one value per bin. Which of the two estimates is used is decided per
    class by their running mean absolute log error on finished requests (each
    scored before it is learnt). A class with no trained bin falls back to all
    requests; fewer than ``min_samples`` finished requests: ``max_tokens``.
    Learning is O(1) per request and prediction O(log bins), both on the
    scheduler's thread; :meth:`error_stats` may be read from another thread.
    """

    def __init__(self, *, quantile: float = 0.5, overestimate_quantile: float = 0.9,
                 window: int = 512, min_samples: int = 8,
                 prompt_bucket_edges_tokens: Sequence[int] = DEFAULT_EDGES,
                 error_window: int = 64) -> None:
        for name, q in (("quantile", quantile), ("overestimate_quantile", overestimate_quantile)):
            if not (0.0 < q <= 1.0):
                raise ValueError(f"{name}: must be in (0, 1], got {q!r}")
        if window < 1 or min_samples < 1 or error_window < 1:
            raise ValueError("window, min_samples and error_window must be >= 1")
        edges = list(prompt_bucket_edges_tokens)
        if edges != sorted(set(edges)) or (edges and edges[0] < 1):
            raise ValueError(f"prompt_bucket_edges_tokens: must be strictly increasing "
                             f"and >= 1, got {edges!r}")
        self.quantile = quantile
        self.overestimate_quantile = overestimate_quantile
        self.min_samples = min_samples
        self._window = window
        self._edges = edges
        lows = [1] + edges
        highs = edges + [edges[-1] * 4 if edges else 1 << 20]
        self._centres = [0.5 * (math.log(lo) + math.log(max(hi, lo + 1)))
                         for lo, hi in zip(lows, highs)]
        self._classes: dict[str | None, _Bins] = {}
        self._all = _Bins(len(edges) + 1, window)
        self._global = _Sample(window)
        self._model_err: dict[str | None, list[float]] = {}   # class -> [direct, ratio]
        self._lock = threading.Lock()
        self._err_count = 0
        self._err_abs_sum = 0
        self._err_sum = 0
        self._last_errors: deque[int] = deque(maxlen=error_window)
        self._last_excess: deque[float] = deque(maxlen=error_window)

    @property
    def observed(self) -> int:
        """Finished requests in the global window."""
        return len(self._global)

    def _bin(self, prompt_tokens: int) -> int:
        return bisect.bisect_right(self._edges, prompt_tokens)

    def _interp(self, samples: list[_Sample], prompt_tokens: int, q: float) -> float | None:
        i = self._bin(prompt_tokens)
        own = samples[i]
        if len(own) < self.min_samples:
            # an untrained bin between two trained ones: interpolate across it
            lo = i - 1 if i > 0 and len(samples[i - 1]) >= self.min_samples else None
            hi = i + 1 if i + 1 < len(samples) and len(samples[i + 1]) >= self.min_samples \
                else None
            if lo is None or hi is None:
                return None
        else:
            x = math.log(max(prompt_tokens, 1))
            j = i - 1 if x < self._centres[i] else i + 1
            if not 0 <= j < len(samples) or len(samples[j]) < self.min_samples:
                return float(own.quantile(q))
            lo, hi = min(i, j), max(i, j)
        x = math.log(max(prompt_tokens, 1))
        x0, x1 = self._centres[lo], self._centres[hi]
        w = min(max((x - x0) / (x1 - x0), 0.0), 1.0)
        return (1 - w) * samples[lo].quantile(q) + w * samples[hi].quantile(q)

    def _estimates(self, prompt_tokens: int, max_tokens: int | None, q: float,
                   sla_class: str | None) -> tuple[float | None, float | None, str | None]:
        """(direct, ratio) estimates from the class's bins, else all requests' bins."""
        key = sla_class if sla_class in self._classes else None
        for bins in ((self._classes.get(key),) if key is not None else ()) + (self._all,):
            if bins is None:
                continue
            d = self._interp(bins.out, prompt_tokens, q)
            if d is not None:
                r = self._interp(bins.ratio, prompt_tokens, q) if max_tokens else None
                return d, (r * max_tokens if r is not None else None), key
        return None, None, key

    def estimate(self, prompt_tokens: int, *, overestimate: bool = False,
                 max_tokens: int | None = None, sla_class: str | None = None) -> int | None:
        """The estimator's quantile for this request, uncapped; None if untrained."""
        q = self.overestimate_quantile if overestimate else self.quantile
        direct, ratio, key = self._estimates(prompt_tokens, max_tokens, q, sla_class)
        if direct is None:
            if len(self._global) >= self.min_samples:
                return self._global.quantile(q)
            return None
        err = self._model_err.get(key)
        if ratio is not None and err is not None and err[1] < err[0]:
            return max(int(math.ceil(ratio - 1e-9)), 1)
        return max(int(math.ceil(direct - 1e-9)), 1)

    def predict(self, prompt_tokens: int, max_tokens: int, hint: int | None = None, *,
                overestimate: bool = False, sla_class: str | None = None) -> int:
        """õ for one request: hint, else estimate, else ``max_tokens``; in [1, max_tokens]."""
        max_tokens = max(int(max_tokens), 1)
        if hint is not None:
            return min(max(int(hint), 1), max_tokens)
        est = self.estimate(prompt_tokens, overestimate=overestimate, max_tokens=max_tokens,
                            sla_class=sla_class)
        if est is None:
            return max_tokens
        return min(max(est, 1), max_tokens)

    def observe(self, prompt_tokens: int, output_tokens: int,
                predicted: int | None = None, *, max_tokens: int | None = None,
                sla_class: str | None = None) -> None:
        """Learn from a finished request; ``predicted`` (what was planned with) feeds
        the error statistics, ``max_tokens`` the ratio estimate."""
        out = int(output_tokens)
        # score both estimates on this request before learning it (model choice)
        key = sla_class if sla_class is not None and (
            sla_class in self._classes or len(self._classes) < MAX_CLASSES) else None
        if max_tokens:
            d, r, _ = self._estimates(prompt_tokens, max_tokens, self.quantile, key)
            if d is not None and r is not None:
                err = self._model_err.setdefault(key, [0.0, 0.0])
                lo = math.log(max(out, 1))
                err[0] = 0.9 * err[0] + 0.1 * abs(math.log(max(d, 1)) - lo)
                err[1] = 0.9 * err[1] + 0.1 * abs(math.log(max(r, 1)) - lo)
        i = self._bin(prompt_tokens)
        targets = [self._all]
        if key is not None:
            targets.append(self._classes.setdefault(key, _Bins(len(self._edges) + 1,
                                                               self._window)))
        for bins in targets:
            bins.out[i].add(out)
            if max_tokens:
                bins.ratio[i].add(out / max(int(max_tokens), 1))
        self._global.add(out)
        if predicted is not None:
            err = int(predicted) - out
            with self._lock:
                self._err_count += 1
                self._err_abs_sum += abs(err)
                self._err_sum += err
                self._last_errors.append(err)
                self._last_excess.append(max(0.0, -err / max(int(predicted), 1)))

    def error_stats(self) -> PredictionErrors:
        """Mean absolute / signed error over every observed prediction, the last ones,
        and the recent under-prediction (rate and mean relative excess)."""
        with self._lock:
            n = self._err_count
            ex = list(self._last_excess)
            return PredictionErrors(n, self._err_abs_sum / n if n else 0.0,
                                    self._err_sum / n if n else 0.0, tuple(self._last_errors),
                                    sum(1 for e in ex if e > 0) / len(ex) if ex else 0.0,
                                    sum(ex) / len(ex) if ex else 0.0)

    @property
    def under_excess(self) -> float:
        """Mean relative memory excess of recent under-predictions (MC-SF's α)."""
        ex = self._last_excess
        return sum(ex) / len(ex) if ex else 0.0
