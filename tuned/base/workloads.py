"""Open-loop workloads: requests with arrival times, shared by ``tuned simulate``,
``tuned bench`` and the real-engine driver.

One module, past the usual size, because it is the one workload model: the spec
grammar below is its manual, and every kind shares the parser, the seeded streams
and the bounds.

``parse_workload(spec, seed)`` turns a one-line spec into a :class:`Workload`, a
tuple of :class:`RequestSpec` in arrival order (ids ``r000000``, ``r000001``, ...).
The same spec and seed always give the same requests: every random stream is a
``random.Random`` seeded from ``(seed, stream name)``, so lengths do not change when
only the arrival process or the rate does.

Spec grammar (``KIND:FIELD=VALUE,...``; a length ``P``/``O`` is a token count or a
distribution, see :func:`parse_dist`):

``trace:PATH[,time_scale=X,length_scale=Y,n=N,rate=R]``
    Replay a CSV with columns ``arrived_at,num_prefill_tokens,num_decode_tokens``.
    A bare name (no path separator, no such file) is a trace packaged with tuned
    (:mod:`tuned.data`): ``trace:azure_conv_2023`` is the Azure conversation trace,
    19,366 requests in an hour.
    ``n`` keeps the first N rows; arrivals are shifted so the first is at 0 and
    multiplied by ``time_scale`` (> 1 stretches time, i.e. lowers the rate);
    ``rate`` instead rescales time so the mean arrival rate, (n − 1) / (last −
    first arrival), is R req/s (give one of the two). Lengths are multiplied by
    ``length_scale``, rounded, at least 1. Rows are sorted by arrival; PATH may
    not contain ``,`` (or ``;`` inside ``phases``).

``poisson:rate=R,prompt=P,output=O,n=N[,length_scale=Y]``
    Poisson arrivals (exponential gaps, mean 1/R); the first request arrives at 0.

``gamma:rate=R,cv=C,prompt=P,output=O,n=N[,length_scale=Y]``
    Gamma gaps with mean 1/R and coefficient of variation C: shape 1/C², scale
    C²/R (bursty when C > 1; C = 1 is Poisson). vLLM's ``--burstiness b`` is shape
    b, i.e. C = 1/√b.

``saber:mix=W1|W2|W3,rate=R,n=N[,arrival=poisson|gamma,cv=C,length_scale=Y]``
    SABER's code-assistant tasks (Table I), each request tagged with its
    ``sla_class`` and ``deadline_s`` (the class SLA, relative to arrival)::

        Task type (sla_class)      Avg input tokens  Avg output tokens  SLA (s)
        Code QnA (qna)                   186                43              1
        Code Generation (generation)     463               387              8
        Code Summary (summary)            31                30              1
        Code Translation (translation)   670               617             12

    Mixes (Section III-B): W1 (heavy) 40% translation, 40% generation, 10% QnA,
    10% summary; W2 (light) 40% QnA, 40% summary, 10% generation, 10% translation;
    W3 (balanced) 25% each. Class counts are exact (largest remainder, then
    shuffled), so n = 100 gives 40/40/10/10. The paper gives only averages; lengths
    here are lognormal with the table's mean and a coefficient of variation of
    0.5 (:data:`SABER_LENGTH_CV`, our choice). ``length_scale`` shrinks the lengths
    for a small engine; the deadlines stay as in the table (they are the users'
    SLA, not a property of the model), so a scaled run is easier than the paper's.
    Arrivals are Poisson (the paper's) unless ``arrival=gamma,cv=C``.

``lmsys:rate=R,n=N[,arrival=poisson|gamma,cv=C,length_scale=Y]``
    LMSYS-Chat-like lengths from Jaillet et al. (Section 6): prompt lognormal with mean
    40.6 and median 11, output lognormal with mean 85.3 and median 45 (rounded,
    at least 1).

``phases:SPEC1;SPEC2;...``
    Concatenation: phase i is generated on its own (seed stream ``p<i>``) and
    shifted so that its first request arrives one mean inter-arrival gap of phase i
    (1/R, or the trace's mean gap) after the last arrival of phase i − 1.
    Requests carry ``phase`` = ``p0``, ``p1``, ... Phases do not nest.

``phase-shift[:rate=R,n=N,scale=S]``
    Alias for three phases, "light chat → heavy long-prompt summarisation → chat"
    (defaults R = 2 req/s, N = 100 requests per phase, S = 1)::

        chat1      poisson rate R,  prompt LN(200,120), output LN(150,100)
        summarise  poisson rate 2R, prompt U(400,800),  output U(16,64)
        chat2      as chat1 (fresh draws)

    with every length multiplied by S (use S < 1 for a small CPU model). Chat is
    decode-heavy (≈150 output tokens per request at a moderate rate: a large
    batch cap pays), summarisation is prefill-heavy (≈6× the prompt tokens per
    second of chat, short answers: a large cap or token budget admits several
    long prompts at once and stalls running decodes), so no single static
    ``max_num_seqs`` / ``max_num_batched_tokens`` suits every phase, and the
    return to chat checks that a controller recovers.

Closed-loop lengths (``tuned profile --workload``, :func:`parse_lengths`): the same
grammar without arrival times, drawn for as long as a sweep level runs:

``synthetic:prompt=P,output=O``
    Each request's lengths drawn from P and O.
``trace:PATH[,length_scale=Y]``
    The trace's rows in file order, cycling, lengths multiplied by Y (rounded, at
    least 1). ``trace:PATH:scale=Y``, the profiler's older spelling, is read as
    ``length_scale=Y``.

Rates relative to the host (``tuned bench --engine vllm`` with a relative SLO):
in a ``poisson`` or ``gamma`` spec, alone or as a phase, ``rate=Kx`` is K times the
engine's capacity within the SLOs for that spec's lengths, as measured on this host
(:func:`sized_workload`), and ``s=S`` may stand for ``n``: the phase lasts S seconds
(n = rate x S). ``phases:poisson:rate=10x,prompt=U(26,486),output=U(13,243),s=20;
poisson:rate=0.25x,prompt=U(26,486),output=U(13,243),n=20`` is a burst at ten times
capacity for 20 s, then a light load at a quarter of it.

Every kind also takes ``max_tokens=M``: requests send ``max_tokens`` M and their
output is cut to at most M (by default ``max_tokens`` equals the output length).
With ``max_model_len`` the lengths are clamped so that prompt + output ≤
max_model_len (the output keeps at least one token and is cut first, the prompt
gets the rest; ``max_tokens`` is cut to what is left after the prompt); the number
of clamped requests is in :meth:`Workload.describe`.

Bounds (a :class:`WorkloadError` names the field and the range): token counts and
distribution parameters up to :data:`MAX_TOKENS`, ``n`` up to :data:`MAX_REQUESTS`,
``cv`` in :data:`CV_RANGE`, ``length_scale`` / ``scale`` up to
:data:`MAX_LENGTH_SCALE`, and every arrival within :data:`MAX_ARRIVAL_S` (30 days) of
the first; a trace file is a regular file of at most :data:`MAX_TRACE_BYTES`.
"""

from __future__ import annotations

import csv
import dataclasses
from io import StringIO
import math
import os
import random
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tuned.data import trace_path
from tuned.base.inputs import CLIP_CHARS, UserError, clip, clip_path, clip_text, read_text

__all__ = ["RequestSpec", "Workload", "WorkloadError", "Dist", "LengthSource", "parse_dist",
           "parse_lengths", "parse_workload", "has_relative_rates", "sized_workload", "load_trace", "trace_file", "SABER_TASKS", "SABER_MIXES", "SABER_LENGTH_CV",
           "LMSYS_PROMPT", "LMSYS_OUTPUT", "KINDS"]

KINDS = ("trace", "poisson", "gamma", "saber", "lmsys", "phases", "phase-shift")

# Bounds that keep every workload finite and every run ending: a request longer than
# any model's context, a spec of more requests than a run can hold, or arrivals
# spread over more than a month are mistakes (a rate of 1e-300, a trace in
# microseconds read as seconds), refused with the bound rather than run for ever.
MAX_TOKENS = 1 << 24
MAX_REQUESTS = 1_000_000
MAX_ARRIVAL_S = 30 * 24 * 3600.0
MAX_LENGTH_SCALE = 1000.0
CV_RANGE = (1e-3, 1e3)
MAX_TRACE_BYTES = 256 << 20


class WorkloadError(ValueError):
    """A malformed workload spec; the message names the bad part and what is allowed."""


def _spec(spec: str) -> str:
    # a spec is quoted whole in its errors (it may hold a trace path): cut only a huge one
    return clip(spec, 3 * CLIP_CHARS)


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of an open-loop workload."""

    request_id: str          # "r000000", ... in arrival order
    arrival_s: float         # seconds from the start of the run
    prompt_tokens: int       # >= 1
    output_tokens: int       # tokens it will generate (ignore_eos); <= max_tokens
    max_tokens: int
    sla_class: str | None = None     # SABER task class ("qna", "generation", ...)
    deadline_s: float | None = None  # relative to arrival, when the class has an SLA
    phase: str | None = None         # phase name (phase lists)


# --- length distributions -----------------------------------------------------------------

_NUM = r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*"
_DIST_FORMS = "U(lo,hi), N(mean,std), LN(mean,median), Exp(mean)"


def _fmt(x: float) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Dist:
    """An integer token-length distribution.

    ``kind`` and parameters: ``fixed`` (a = count), ``uniform`` (integers in
    [a, b], both included), ``normal`` (mean a, std b), ``lognormal`` (mean a,
    median b: μ = ln b, σ² = 2 ln(a/b)), ``exp`` (mean a). Continuous draws are
    rounded to the nearest integer and clipped to at least 1.
    """

    kind: str
    a: float
    b: float = 0.0

    @classmethod
    def fixed(cls, n: int) -> "Dist":
        return cls("fixed", n)

    @classmethod
    def uniform(cls, lo: int, hi: int) -> "Dist":
        return cls("uniform", lo, hi)

    @classmethod
    def lognormal(cls, mean: float, median: float) -> "Dist":
        return cls("lognormal", mean, median)

    @property
    def mean(self) -> float:
        """The nominal mean (before rounding and clipping)."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def sample(self, rng: random.Random) -> int:
        k = self.kind
        if k == "fixed":
            return int(self.a)
        if k == "uniform":
            lo, hi = int(self.a), int(self.b)
            return lo if lo == hi else rng.randint(lo, hi)
        if k == "normal":
            x = rng.gauss(self.a, self.b)
        elif k == "lognormal":
            x = rng.lognormvariate(math.log(self.b), math.sqrt(2 * math.log(self.a / self.b)))
        elif k == "exp":
            x = rng.expovariate(1.0 / self.a)
        else:
            raise ValueError(f"unknown distribution kind {k!r}")
        # a wide lognormal's tail can pass any context (or overflow): cut at the bound
        return max(1, round(min(x, MAX_TOKENS)))

    def __str__(self) -> str:
        k = self.kind
        if k == "fixed":
            return str(int(self.a))
        if k == "uniform":
            return f"U({int(self.a)},{int(self.b)})"
        if k == "exp":
            return f"Exp({_fmt(self.a)})"
        return f"{'N' if k == 'normal' else 'LN'}({_fmt(self.a)},{_fmt(self.b)})"


def parse_dist(text: str, what: str, *, context: str = "workload") -> Dist:
    """A token length: ``64`` (fixed), ``U(16,128)`` (uniform integers, both ends
    included), ``N(200,50)`` (normal mean, std), ``LN(200,120)`` (lognormal mean,
    median) or ``Exp(100)`` (exponential mean). Names are case-insensitive.

    Raises :class:`WorkloadError` ``"<context>: <what>=<text> ..."``.
    """
    t = text.strip()
    where = f"{context}: {what}={clip(text)}"
    if re.fullmatch(r"\d+", t):
        n = int(t)
        if not 1 <= n <= MAX_TOKENS:
            raise WorkloadError(f"{where} must be a token count in [1, {MAX_TOKENS}]")
        return Dist.fixed(n)
    m = re.fullmatch(r"(\w+)\((.*)\)", t)
    if not m:
        raise WorkloadError(f"{where} is neither a token count (64) nor a distribution "
                            f"({_DIST_FORMS})")
    name, args = m.group(1).upper(), m.group(2)
    nargs = {"U": 2, "N": 2, "LN": 2, "EXP": 1}.get(name)
    if nargs is None:
        raise WorkloadError(f"{where}: unknown distribution {clip(m.group(1))} (allowed: "
                            f"{_DIST_FORMS})")
    parts = args.split(",")
    vals = [re.fullmatch(_NUM, p) for p in parts]
    if len(parts) != nargs or not all(vals):
        form = {"U": "U(lo,hi)", "N": "N(mean,std)", "LN": "LN(mean,median)",
                "EXP": "Exp(mean)"}[name]
        raise WorkloadError(f"{where}: expected {form} with {nargs} number"
                            f"{'s' if nargs > 1 else ''}")
    x = [float(v.group(1)) for v in vals]
    if not all(math.isfinite(v) and v <= MAX_TOKENS for v in x):
        raise WorkloadError(f"{where}: parameters must be token counts <= {MAX_TOKENS}")
    if name == "U":
        if not all(v.is_integer() for v in x):
            raise WorkloadError(f"{where}: U(lo,hi) takes whole token counts")
        lo, hi = int(x[0]), int(x[1])
        if lo < 1 or hi < lo:
            raise WorkloadError(f"{where} must have 1 <= low <= high")
        return Dist.uniform(lo, hi)
    if name == "N":
        if x[0] <= 0:
            raise WorkloadError(f"{where}: N(mean,std) needs mean > 0")
        return Dist("normal", x[0], x[1])
    if name == "LN":
        if not 0 < x[1] <= x[0]:
            raise WorkloadError(f"{where}: LN(mean,median) needs mean >= median > 0")
        return Dist.lognormal(x[0], x[1])
    if x[0] <= 0:
        raise WorkloadError(f"{where}: Exp(mean) needs mean > 0")
    return Dist("exp", x[0])


# --- published workloads --------------------------------------------------------------------

@dataclass(frozen=True)
class SaberTask:
    """A row of SABER's Table I."""

    prompt_mean: float
    output_mean: float
    sla_s: float


SABER_TASKS: dict[str, SaberTask] = {
    "qna": SaberTask(186, 43, 1.0),
    "generation": SaberTask(463, 387, 8.0),
    "summary": SaberTask(31, 30, 1.0),
    "translation": SaberTask(670, 617, 12.0),
}
SABER_MIXES: dict[str, dict[str, float]] = {
    "W1": {"translation": 0.4, "generation": 0.4, "qna": 0.1, "summary": 0.1},
    "W2": {"qna": 0.4, "summary": 0.4, "generation": 0.1, "translation": 0.1},
    "W3": {"qna": 0.25, "generation": 0.25, "summary": 0.25, "translation": 0.25},
}
SABER_LENGTH_CV = 0.5
LMSYS_PROMPT = Dist.lognormal(40.6, 11)
LMSYS_OUTPUT = Dist.lognormal(85.3, 45)

PHASE_SHIFT_DEFAULTS = {"rate": 2.0, "n": 100, "scale": 1.0}


def _saber_dist(mean: float) -> Dist:
    # lognormal with coefficient of variation c: mean / median = sqrt(1 + c²)
    return Dist.lognormal(mean, mean / math.sqrt(1 + SABER_LENGTH_CV ** 2))


# --- the workload ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """Requests in arrival order, with the spec that made them.

    ``kinds`` names the generators used (one per phase), ``clamped`` counts the
    requests cut to ``max_model_len``, ``rate_factor`` the product of
    :meth:`scaled_rate` factors applied.
    """

    spec: str
    requests: tuple[RequestSpec, ...]
    kinds: tuple[str, ...] = ()
    clamped: int = 0
    max_model_len: int | None = None
    rate_factor: float = 1.0

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)

    def describe(self) -> dict:
        """A JSON-serialisable summary: kinds, n, duration, length means and
        medians, mean arrival rate (n − 1)/(last − first arrival), clamps, and the
        request counts per SLA class and per phase when there are any."""
        rs = self.requests
        n = len(rs)
        d: dict = {"spec": self.spec, "kinds": list(self.kinds), "n": n}
        if n:
            first, last = rs[0].arrival_s, rs[-1].arrival_s
            p = [r.prompt_tokens for r in rs]
            o = [r.output_tokens for r in rs]
            d.update(duration_s=last - first, rate_rps=_rate(n, first, last),
                     prompt_tokens_mean=statistics.fmean(p),
                     prompt_tokens_median=float(statistics.median(p)),
                     output_tokens_mean=statistics.fmean(o),
                     output_tokens_median=float(statistics.median(o)))
        else:
            d.update(duration_s=0.0, rate_rps=None, prompt_tokens_mean=None,
                     prompt_tokens_median=None, output_tokens_mean=None,
                     output_tokens_median=None)
        d.update(rate_factor=self.rate_factor, max_model_len=self.max_model_len,
                 clamped_requests=self.clamped)
        classes: dict[str, int] = {}
        phases: dict[str, list[RequestSpec]] = {}
        for r in rs:
            if r.sla_class is not None:
                classes[r.sla_class] = classes.get(r.sla_class, 0) + 1
            if r.phase is not None:
                phases.setdefault(r.phase, []).append(r)
        if classes:
            d["sla_classes"] = classes
        if phases:
            d["phases"] = [{"name": name, "n": len(ps), "start_s": ps[0].arrival_s,
                            "end_s": ps[-1].arrival_s,
                            "rate_rps": _rate(len(ps), ps[0].arrival_s, ps[-1].arrival_s)}
                           for name, ps in phases.items()]
        return d

    def scaled_rate(self, factor: float) -> "Workload":
        """The same requests with arrival times divided by ``factor`` (factor 2
        doubles the rate); lengths and deadlines are unchanged."""
        if not (math.isfinite(factor) and factor > 0):
            raise ValueError(f"scaled_rate: factor must be a number > 0, got {factor!r}")
        reqs = tuple(dataclasses.replace(r, arrival_s=r.arrival_s / factor)
                     for r in self.requests)
        return dataclasses.replace(self, requests=reqs, rate_factor=self.rate_factor * factor)

    def head(self, seconds: float) -> "Workload":
        """The requests arriving before ``seconds``."""
        return dataclasses.replace(
            self, requests=tuple(r for r in self.requests if r.arrival_s < seconds))


def _rate(n: int, first: float, last: float) -> float | None:
    return (n - 1) / (last - first) if n > 1 and last > first else None


# --- spec parsing ---------------------------------------------------------------------------

# (arrival_s, prompt, output, max_tokens, sla_class, deadline_s)
_Row = tuple[float, int, int, int, "str | None", "float | None"]


@dataclass
class _Part:
    rows: list[_Row]
    mean_gap_s: float | None
    kind: str


def _split_top(text: str, sep: str) -> list[str]:
    """Split at ``sep`` outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


class _Fields:
    """``key=value`` fields of one spec, with typed, validated getters."""

    def __init__(self, spec: str, kind: str, items: list[str], allowed: tuple[str, ...]):
        self.spec, self.kind = spec, kind
        self.values: dict[str, str] = {}
        for item in items:
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or not key:
                raise self.error(f"{clip(item.strip())} is not FIELD=VALUE (fields of {kind}: "
                                 f"{', '.join(allowed)})")
            if key not in allowed:
                raise self.error(f"unknown field {clip(key)} for {kind} (allowed: "
                                 f"{', '.join(allowed)})")
            if key in self.values:
                raise self.error(f"field {clip(key)} given twice")
            self.values[key] = value.strip()

    def error(self, msg: str) -> WorkloadError:
        return WorkloadError(f"workload {_spec(self.spec)}: {msg}")

    def has(self, key: str) -> bool:
        return key in self.values

    def _raw(self, key: str, default):
        if key not in self.values:
            if default is _REQUIRED:
                raise self.error(f"missing {key}= ({self.kind} needs "
                                 f"{', '.join(_REQUIRED_FIELDS[self.kind])})")
            return None
        return self.values[key]

    def positive(self, key: str, default=None, hi: float = math.inf) -> float | None:
        v = self._raw(key, default)
        if v is None:
            return default if default is not _REQUIRED else None
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x > 0 and x <= hi):
            allowed = "a number > 0" if hi == math.inf else f"a number in (0, {hi:g}]"
            if key == "rate" and v.rstrip().endswith("x"):
                allowed += (" (rate=Kx, K times this host's capacity, is for `tuned bench "
                            "--engine vllm` with a relative --slo such as tpot=2.5x)")
            raise self.error(f"{key}={clip(v)} must be {allowed}")
        return x

    def count(self, key: str, default=None, hi: int = MAX_TOKENS) -> int | None:
        v = self._raw(key, default)
        if v is None:
            return default if default is not _REQUIRED else None
        if not re.fullmatch(r"\d+", v) or not 1 <= int(v) <= hi:
            raise self.error(f"{key}={clip(v)} must be an integer in [1, {hi}]")
        return int(v)

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        v = self.values.get(key, default)
        if v not in allowed:
            raise self.error(f"{key}={clip(v)} is not one of {', '.join(allowed)}")
        return v

    def dist(self, key: str) -> Dist:
        return parse_dist(self._raw(key, _REQUIRED), key, context=f"workload {_spec(self.spec)}")


_REQUIRED = object()
_LEN = ("length_scale", "max_tokens")
_ALLOWED = {
    "trace": ("time_scale", "rate", "n") + _LEN,
    "poisson": ("rate", "prompt", "output", "n") + _LEN,
    "gamma": ("rate", "cv", "prompt", "output", "n") + _LEN,
    "saber": ("mix", "rate", "n", "arrival", "cv") + _LEN,
    "lmsys": ("rate", "n", "arrival", "cv") + _LEN,
    "phase-shift": ("rate", "n", "scale"),
}
_REQUIRED_FIELDS = {
    "trace": (), "poisson": ("rate", "prompt", "output", "n"),
    "gamma": ("rate", "cv", "prompt", "output", "n"), "saber": ("mix", "rate", "n"),
    "lmsys": ("rate", "n"), "phase-shift": (), "synthetic": ("prompt", "output"),
}


_RELATIVE = re.compile(r"(?<![A-Za-z_])rate=\s*([0-9]*\.?[0-9]+)\s*x\b")


def has_relative_rates(spec: str) -> bool:
    """Whether ``spec`` gives a rate relative to the host's capacity (``rate=Kx``)."""
    return bool(_RELATIVE.search(spec))


def sized_workload(spec: str, capacity_rps: Callable[[Dist, Dist], float]) -> str:
    """``spec`` with each ``rate=Kx`` made K x ``capacity_rps(prompt, output)`` req/s
    (that part's length distributions) and each ``s=S`` beside it made ``n`` = the
    rate x S (at least 1); other parts unchanged. A :class:`WorkloadError` names a
    relative rate outside a ``poisson``/``gamma`` part, a part with both ``n`` and
    ``s``, or one with neither."""
    kind, _, body = spec.strip().partition(":")
    if kind.strip() == "phases":
        return "phases:" + ";".join(_sized_part(spec, sub.strip(), capacity_rps)
                                    for sub in _split_top(body, ";"))
    return _sized_part(spec, spec.strip(), capacity_rps)


def _sized_part(spec: str, part: str, capacity_rps) -> str:
    kind, _, body = part.partition(":")
    kind = kind.strip()
    if not _RELATIVE.search(part):
        return part
    if kind not in ("poisson", "gamma"):
        raise WorkloadError(f"workload {_spec(spec)}: rate=Kx (K times this host's "
                            f"capacity) is for poisson and gamma parts, not {clip(kind)}")
    items = [i.strip() for i in _split_top(body, ",")]
    f = _Fields(part, kind, items, _ALLOWED[kind] + ("s",))
    fields = f.values
    k = float(_RELATIVE.search(part).group(1))
    if not 0 < k <= 1e6:
        raise f.error(f"rate={clip(fields.get('rate', ''))} must be K x capacity with K "
                      f"in (0, 1e6]")
    rate = k * capacity_rps(f.dist("prompt"), f.dist("output"))
    if not (math.isfinite(rate) and rate > 0):
        raise f.error(f"the host's capacity for these lengths is {rate!r} req/s")
    if "s" in fields and "n" in fields:
        raise f.error("give n= or s=, not both")
    if "s" in fields:
        try:
            secs = float(fields["s"])
        except ValueError:
            secs = math.nan
        if not (math.isfinite(secs) and 0 < secs <= MAX_ARRIVAL_S):
            raise f.error(f"s={clip(fields['s'])} must be seconds in (0, {MAX_ARRIVAL_S:g}]")
        n = max(round(rate * secs), 1)
    elif "n" in fields:
        n = f.count("n", hi=MAX_REQUESTS)
    else:
        raise f.error("missing n= or s= (requests, or seconds at the rate)")
    kept = [i for i in items if not i.startswith(("rate=", "s=", "n="))]
    return f"{kind}:" + ",".join([f"rate={rate:.4g}", *kept, f"n={n}"])


def parse_workload(spec: str, seed: int = 0, *, max_model_len: int | None = None) -> Workload:
    """Build the workload a spec describes (grammar in the module docstring).

    Deterministic for (spec, seed). ``max_model_len`` clamps lengths so that
    prompt + output ≤ max_model_len. Raises :class:`WorkloadError`.
    """
    if max_model_len is not None and max_model_len < 2:
        raise WorkloadError(f"max_model_len={max_model_len!r} must be >= 2 (one prompt and "
                            f"one output token)")
    kind, _, body = spec.strip().partition(":")
    kind = kind.strip()
    if kind == "phases" or kind == "phase-shift":
        if kind == "phases":
            subs = _split_top(body, ";")
            named = [(f"p{i}", s.strip()) for i, s in enumerate(subs)]
        else:
            named = _phase_shift(spec, body)
        parts, names = [], []
        for i, (name, sub) in enumerate(named):
            if not sub:
                raise WorkloadError(f"workload {_spec(spec)}: phase {name} is empty "
                                    f"(phases:SPEC1;SPEC2;...)")
            sub_kind = sub.partition(":")[0].strip()
            if sub_kind in ("phases", "phase-shift"):
                raise WorkloadError(f"workload {_spec(spec)}: phase {name}: phases cannot be "
                                    f"nested")
            try:
                parts.append(_build(sub, f"{seed}:{name}"))
            except WorkloadError as e:
                raise WorkloadError(f"workload {_spec(spec)}, phase {name}: {e}") from None
            names.append(name)
        rows, phase_of = _concatenate(parts, names)
        kinds = tuple(p.kind for p in parts)
    else:
        part = _build(spec.strip(), str(seed))
        rows, phase_of, kinds = part.rows, [None] * len(part.rows), (part.kind,)
    return _finish(spec, rows, phase_of, kinds, max_model_len)


def _phase_shift(spec: str, body: str) -> list[tuple[str, str]]:
    f = _Fields(spec, "phase-shift", _split_top(body, ",") if body.strip() else [],
                _ALLOWED["phase-shift"])
    rate = f.positive("rate", PHASE_SHIFT_DEFAULTS["rate"])
    n = f.count("n", PHASE_SHIFT_DEFAULTS["n"], hi=MAX_REQUESTS)
    scale = f.positive("scale", PHASE_SHIFT_DEFAULTS["scale"], hi=MAX_LENGTH_SCALE)
    chat = (f"poisson:rate={rate!r},prompt=LN(200,120),output=LN(150,100),n={n},"
            f"length_scale={scale!r}")
    summarise = (f"poisson:rate={2 * rate!r},prompt=U(400,800),output=U(16,64),n={n},"
                 f"length_scale={scale!r}")
    return [("chat1", chat), ("summarise", summarise), ("chat2", chat)]


def _concatenate(parts: list[_Part], names: list[str]) -> tuple[list[_Row], list[str]]:
    rows: list[_Row] = []
    phase_of: list[str] = []
    prev_last: float | None = None
    prev_gap = 0.0
    for part, name in zip(parts, names):
        gap = part.mean_gap_s if part.mean_gap_s is not None else prev_gap
        if part.rows:
            first = part.rows[0][0]
            offset = 0.0 if prev_last is None else prev_last + gap - first
            for r in part.rows:
                rows.append((r[0] + offset,) + r[1:])
                phase_of.append(name)
            prev_last = rows[-1][0]
        prev_gap = gap
    return rows, phase_of


def _finish(spec: str, rows: list[_Row], phase_of: list, kinds: tuple[str, ...],
            max_model_len: int | None) -> Workload:
    if len(rows) > MAX_REQUESTS:
        raise WorkloadError(f"workload {_spec(spec)}: {len(rows)} requests, must be at most "
                            f"{MAX_REQUESTS}")
    last = max((r[0] for r in rows), default=0.0)
    if not (math.isfinite(last) and last <= MAX_ARRIVAL_S):
        raise WorkloadError(f"workload {_spec(spec)}: the last arrival is at {last:g} s, must "
                            f"be <= {MAX_ARRIVAL_S:g} s (30 days): raise rate= or lower "
                            f"time_scale=")
    reqs = []
    clamped = 0
    for i, ((t, p, o, m, cls, dl), ph) in enumerate(zip(rows, phase_of)):
        if max_model_len is not None:
            o2 = max(1, min(o, max_model_len - 1))
            p2 = max(1, min(p, max_model_len - o2))
            m2 = max(o2, min(m, max_model_len - p2))
            if (p2, o2, m2) != (p, o, m):
                clamped += 1
            p, o, m = p2, o2, m2
        reqs.append(RequestSpec(f"r{i:06d}", t, p, o, m, cls, dl, ph))
    return Workload(spec, tuple(reqs), kinds, clamped, max_model_len)


def _stream(seed: str, name: str) -> random.Random:
    return random.Random(f"{seed}:{name}")


def _build(spec: str, seed: str) -> _Part:
    """One non-phase spec → rows starting at its first arrival."""
    kind, sep, body = spec.partition(":")
    kind = kind.strip()
    if kind not in _ALLOWED or kind == "phase-shift":
        raise WorkloadError(f"workload {_spec(spec)}: unknown kind {clip(kind)} (allowed: "
                            f"{', '.join(KINDS)})")
    if kind != "trace" and (not sep or not body.strip()):
        raise WorkloadError(f"workload {_spec(spec)}: expected {kind}:FIELD=VALUE,... "
                            f"(fields of {kind}: {', '.join(_ALLOWED[kind])})")
    items = _split_top(body, ",")
    if kind == "trace":
        path = items.pop(0).strip()
        if not path or ("=" in path and not Path(path).exists()):
            raise WorkloadError(f"workload {_spec(spec)}: trace needs a PATH before its fields "
                                f"(trace:PATH[,time_scale=X,length_scale=Y,n=N,rate=R])")
        f = _Fields(spec, kind, items, _ALLOWED[kind])
        return _trace(f, _trace_file(spec, path))
    f = _Fields(spec, kind, items, _ALLOWED[kind])
    rate = f.positive("rate", _REQUIRED)
    n = f.count("n", _REQUIRED, hi=MAX_REQUESTS)
    if kind in ("poisson", "gamma"):
        arrival = kind
        cv = _cv(f, _REQUIRED) if kind == "gamma" else 1.0
        prompt, output = f.dist("prompt"), f.dist("output")
    else:
        arrival = f.choice("arrival", ("poisson", "gamma"), "poisson")
        if arrival == "gamma" and not f.has("cv"):
            raise f.error("arrival=gamma needs cv=C (coefficient of variation of the gaps)")
        if arrival == "poisson" and f.has("cv"):
            raise f.error("cv= applies only with arrival=gamma")
        cv = _cv(f, 1.0)
    scale = f.positive("length_scale", 1.0, hi=MAX_LENGTH_SCALE)
    cap = f.count("max_tokens")
    mix = None
    if kind == "saber":
        mix = f.choice("mix", tuple(SABER_MIXES), f._raw("mix", _REQUIRED))

    try:
        arrivals = _arrivals(n, rate, cv if arrival == "gamma" else None,
                             _stream(seed, "arrivals"))
    except (ValueError, OverflowError, ZeroDivisionError) as e:
        raise f.error(f"cannot draw arrivals at rate={rate:g}"
                      + (f", cv={cv:g}" if arrival == "gamma" else "") + f" ({e})") from None
    rng = _stream(seed, "lengths")
    if kind == "saber":
        classes = _saber_classes(SABER_MIXES[mix], n, _stream(seed, "classes"))
        dists = {c: (_saber_dist(t.prompt_mean), _saber_dist(t.output_mean))
                 for c, t in SABER_TASKS.items()}
    elif kind == "lmsys":
        classes, dists = [None] * n, {None: (LMSYS_PROMPT, LMSYS_OUTPUT)}
    else:
        classes, dists = [None] * n, {None: (prompt, output)}
    rows: list[_Row] = []
    for t, cls in zip(arrivals, classes):
        pd, od = dists[cls]
        p, o = _scaled(pd.sample(rng), scale), _scaled(od.sample(rng), scale)
        deadline = SABER_TASKS[cls].sla_s if cls is not None else None
        rows.append(_row(t, p, o, cap, cls, deadline))
    return _Part(rows, 1.0 / rate, kind)


def _cv(f: _Fields, default) -> float:
    cv = f.positive("cv", default, hi=CV_RANGE[1])
    if cv < CV_RANGE[0]:
        raise f.error(f"cv={clip(f.values['cv'])} must be a number in [{CV_RANGE[0]:g}, "
                      f"{CV_RANGE[1]:g}]")
    return cv


def _scaled(x: int, scale: float) -> int:
    return x if scale == 1.0 else max(1, round(x * scale))


def _row(t: float, p: int, o: int, cap: int | None, cls=None, deadline=None) -> _Row:
    if cap is not None:
        return (t, p, min(o, cap), cap, cls, deadline)
    return (t, p, o, o, cls, deadline)


def _arrivals(n: int, rate: float, cv: float | None, rng: random.Random) -> list[float]:
    """First at 0, then Poisson gaps (cv None) or gamma gaps with mean 1/rate and
    coefficient of variation cv (shape 1/cv², scale cv²/rate)."""
    if cv is None:
        draw: Callable[[], float] = lambda: rng.expovariate(rate)
    else:
        shape, scale = 1.0 / cv ** 2, cv ** 2 / rate
        draw = lambda: rng.gammavariate(shape, scale)
    t, out = 0.0, []
    for i in range(n):
        if i:
            t += draw()
        out.append(t)
    return out


def _saber_classes(mix: dict[str, float], n: int, rng: random.Random) -> list[str]:
    """Exact class counts (largest remainder), in random order."""
    quotas = {c: w * n for c, w in mix.items()}
    counts = {c: int(q) for c, q in quotas.items()}
    rest = n - sum(counts.values())
    for c in sorted(quotas, key=lambda c: (counts[c] - quotas[c], list(mix).index(c)))[:rest]:
        counts[c] += 1
    out = [c for c in mix for _ in range(counts[c])]
    rng.shuffle(out)
    return out


def trace_file(path: str) -> Path:
    """The trace CSV a spec's PATH names: a file on disk as given; a bare name (no path
    separator, no such file) is a trace packaged with tuned
    (:func:`tuned.data.trace_path`); ValueError when it is neither."""
    if Path(path).exists() or "/" in path or os.sep in path:
        return Path(path)
    try:
        return trace_path(path)
    except ValueError as e:
        raise ValueError(f"no file {path!r} and {e}") from None


@dataclass(frozen=True)
class LengthSource:
    """Closed-loop (prompt, output) lengths of a spec (:func:`parse_lengths`):
    ``draw(rng, i)`` gives the i-th pair (``rng`` for the synthetic draws, ``i`` for the
    trace's rows); ``describe`` what the spec resolved to."""

    kind: str
    draw: Callable[[random.Random, int], tuple[int, int]]
    describe: dict


_LENGTH_KINDS = {"synthetic": ("prompt", "output"), "trace": ("length_scale",)}
_OLD_TRACE_SCALE = re.compile(r":scale=([^,:]*)$")


def parse_lengths(spec: str) -> LengthSource:
    """The lengths a closed-loop spec describes (grammar in the module docstring:
    ``synthetic:prompt=P,output=O`` or ``trace:PATH[,length_scale=Y]``); raises
    :class:`WorkloadError` naming the field."""
    kind, sep, body = spec.strip().partition(":")
    if not sep or kind.strip() not in _LENGTH_KINDS:
        raise WorkloadError(f"workload {_spec(spec)}: expected 'synthetic:prompt=P,output=O' "
                            f"or 'trace:PATH[,length_scale=Y]'")
    kind = kind.strip()
    items = _split_top(body, ",")
    if kind == "synthetic":
        f = _Fields(spec, kind, [i for i in items if i.strip()], _LENGTH_KINDS[kind])
        prompt, output = f.dist("prompt"), f.dist("output")
        return LengthSource(kind, lambda rng, _i: (prompt.sample(rng), output.sample(rng)),
                            {"prompt": str(prompt), "output": str(output)})
    path = items.pop(0).strip()
    old = _OLD_TRACE_SCALE.search(path)
    if old and not Path(path).exists():
        path, items = path[:old.start()], [f"length_scale={old.group(1)}"] + items
    if not path:
        raise WorkloadError(f"workload {_spec(spec)}: trace needs a PATH "
                            f"(trace:PATH[,length_scale=Y])")
    f = _Fields(spec, kind, items, _LENGTH_KINDS[kind])
    scale = f.positive("length_scale", 1.0, hi=MAX_LENGTH_SCALE)
    resolved = _trace_file(spec, path)
    rows = [(max(1, round(p * scale)), max(1, round(o * scale)))
            for _, p, o in load_trace(resolved)]
    return LengthSource(kind, lambda _rng, i: rows[i % len(rows)],
                        {"path": str(resolved), "scale": scale, "rows": len(rows)})


def _trace_file(spec: str, path: str) -> Path:
    try:
        return trace_file(path)
    except ValueError as e:
        raise WorkloadError(f"workload {spec!r}: {e}") from None


def _trace(f: _Fields, path: Path) -> _Part:
    if f.has("time_scale") and f.has("rate"):
        raise f.error("give time_scale= or rate=, not both")
    time_scale = f.positive("time_scale", 1.0)
    rate = f.positive("rate")
    n = f.count("n", hi=MAX_REQUESTS)
    scale = f.positive("length_scale", 1.0, hi=MAX_LENGTH_SCALE)
    cap = f.count("max_tokens")
    rows = load_trace(path)
    if n is not None:
        rows = rows[:n]
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    times = [(t - t0) * time_scale for t, _, _ in rows]
    if rate is not None:
        span = times[-1] - times[0]
        if len(rows) < 2 or span <= 0:
            raise f.error("rate= needs at least two requests with different arrival times")
        k = (len(rows) - 1) / rate / span
        times = [t * k for t in times]
    out = [_row(t, max(1, round(p * scale)), max(1, round(o * scale)), cap)
           for t, (_, p, o) in zip(times, rows)]
    gap = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
    return _Part(out, gap, "trace")


def load_trace(path: Path | str) -> list[tuple[float, int, int]]:
    """``(arrived_at, num_prefill_tokens, num_decode_tokens)`` rows of a trace CSV,
    in file order. Raises :class:`WorkloadError` naming the file (and line)."""
    path = Path(path)
    name = clip_path(path)
    need = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    try:
        text = read_text(path, "trace", MAX_TRACE_BYTES)
    except UserError as e:
        raise WorkloadError(str(e)) from None
    try:
        with StringIO(text, newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader, [])
            missing = [c for c in need if c not in header]
            if missing:
                raise WorkloadError(f"trace {name}: missing column {missing[0]!r} (has: "
                                    f"{clip_text(', '.join(header)) or 'nothing'}; needs: "
                                    f"{', '.join(need)})")
            ia, ip, io = (header.index(c) for c in need)
            rows = []
            for line, rec in enumerate(reader, start=2):
                if not rec:
                    continue
                try:
                    t, pf, of = float(rec[ia]), float(rec[ip]), float(rec[io])
                except (IndexError, ValueError):
                    raise WorkloadError(f"trace {name}: line {line}: arrived_at and token "
                                        f"counts must be numbers") from None
                if not (math.isfinite(t) and 0 <= t <= MAX_ARRIVAL_S):
                    raise WorkloadError(f"trace {name}: line {line}: arrived_at must be in "
                                        f"[0, {MAX_ARRIVAL_S:g}] s, got {clip(rec[ia])}")
                if not (0 <= pf <= MAX_TOKENS and 0 <= of <= MAX_TOKENS):
                    raise WorkloadError(f"trace {name}: line {line}: token counts must be in "
                                        f"[0, {MAX_TOKENS}]")
                rows.append((t, int(pf), int(of)))
    except csv.Error as e:
        raise WorkloadError(f"trace {name}: not CSV ({clip_text(str(e))})") from None
    if not rows:
        raise WorkloadError(f"trace {name}: no rows")
    return rows
