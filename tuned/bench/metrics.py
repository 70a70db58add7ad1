"""Serving metrics as vLLM's benchmark defines them (``vllm bench serve``,
``vllm/benchmarks/serve.py``: ``calculate_metrics``), SLO attainment, and the
DistServe capacity search.

Per request (times in seconds, all on one clock, latencies from ``arrival_s``):

- TTFT = first_token_s − arrival_s; E2EL = finish_s − arrival_s;
- TPOT = (E2EL − TTFT) / (output_tokens − 1), undefined for one output token;
- ITL = differences of successive token times;
- first response = the first token or the refusal (``refused_s``: the server
  answered HTTP 429/503, or the simulator refused it) − arrival_s. A refused
  request is neither completed nor good.

Over a run of ``duration_s`` seconds: request goodput = good requests / duration,
where a request is good when it completed and every given SLO holds (value ≤ SLO);
throughputs count completed requests and their tokens only; attainment = good /
submitted (failed and unfinished requests count as not good). Capacity (DistServe)
is the highest arrival rate whose attainment is at least 90%.

Where this matches vLLM: goodput counts a completed request as good when TTFT,
TPOT and E2EL are all within their SLOs, inclusive (vLLM: ``slo >= value``); a
one-token request's TPOT counts as 0 for goodput, so only TTFT and E2EL apply;
mean/percentile TPOT are taken over requests with more than one output token;
percentiles are ``np.percentile``'s default (linear interpolation); failed
requests add no tokens to the throughputs.

Where it differs:

- vLLM's SLOs are milliseconds (``--goodput ttft:500 tpot:50``); :meth:`Slo.parse`
  takes seconds (``ttft=0.5,tpot=0.05``).
- vLLM's duration runs from just before its first inter-arrival sleep (its first
  request waits one gap) to the last response, failed ones included; the default
  here is the last finish time (failed requests with a finish time included)
  minus the first arrival, our workloads' first request arriving at 0. Pass
  ``duration_s`` to use another wall.
- vLLM measures latency from the moment its client sends (after its
  ``--max-concurrency`` semaphore); here from the open-loop arrival. They agree
  without a concurrency limit.
- vLLM's ITLs are gaps between streamed chunks (one chunk may carry several
  tokens); here they are per token, from ``token_times_s``.
- vLLM reports 0 for a statistic with no samples (``np.mean([] or 0)``); here it
  is None. Attainment, unfinished requests, preemptions and recomputed tokens are
  not in vLLM's report.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

__all__ = ["RequestResult", "Slo", "SloSpec", "summarize", "mean_summary", "capacity_search",
           "CapacityResult", "PERCENTILES"]

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """What happened to one request. Times are absolute, on the clock of
    ``arrival_s``; ``first_token_s`` and ``finish_s`` are None when the request
    failed or did not finish."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int                 # tokens generated
    first_token_s: float | None
    finish_s: float | None
    token_times_s: list[float] | None = None   # time of every output token (ITL)
    preemptions: int = 0
    recomputed_tokens: int = 0
    failed: bool = False
    error: str | None = None
    refused_s: float | None = None     # when the server refused it (HTTP 429/503)

    @property
    def refused(self) -> bool:
        return self.refused_s is not None

    @property
    def completed(self) -> bool:
        return not self.failed and not self.refused and self.finish_s is not None

    @property
    def first_response_s(self) -> float | None:
        """Time to first response: the first token or the refusal, from arrival."""
        t = self.refused_s if self.refused else self.first_token_s
        return None if t is None else t - self.arrival_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(E2EL − TTFT) / (output − 1); None for one output token or missing times."""
        ttft, e2e = self.ttft_s, self.e2e_s
        if ttft is None or e2e is None or self.output_tokens <= 1:
            return None
        return (e2e - ttft) / (self.output_tokens - 1)

    @property
    def itls_s(self) -> list[float]:
        t = self.token_times_s or []
        return [b - a for a, b in zip(t, t[1:])]


_SLO_KEYS = ("ttft", "tpot", "e2el")
#: other spellings: the config's TBT SLA (tbt_sla_s) is the bench's TPOT SLO
_SLO_ALIASES = {"tbt": "tpot"}


@dataclass(frozen=True)
class Slo:
    """Latency SLOs in seconds; None = not constrained."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> "Slo":
        """``ttft=2,tpot=0.05[,e2el=10]`` (seconds, any subset, at least one).

        Raises ValueError naming the bad key or value and the allowed keys; a value
        relative to the host (``tpot=2.5x``) needs :class:`SloSpec`."""
        spec = SloSpec.parse(text)
        if spec.multiples:
            k = next(iter(spec.multiples))
            raise ValueError(f"SLO {k}={spec.multiples[k]:g}x: a multiple of the batch-1 "
                             "step needs a measured step (tuned bench); give seconds here")
        return spec.resolve(None)

    def __str__(self) -> str:
        parts = [f"{k}={getattr(self, k + '_s'):g}" for k in _SLO_KEYS
                 if getattr(self, k + "_s") is not None]
        return ",".join(parts) or "none"

    def is_good(self, r: RequestResult) -> bool:
        """Completed, and every given SLO holds (value ≤ SLO). A one-token request
        has no TPOT: only TTFT and E2EL apply (vLLM counts its TPOT as 0)."""
        if not r.completed:
            return False
        checks = ((self.ttft_s, r.ttft_s), (self.e2el_s, r.e2e_s))
        for slo, value in checks:
            if slo is not None and (value is None or value > slo):
                return False
        if self.tpot_s is not None and r.output_tokens > 1:
            tpot = r.tpot_s
            if tpot is None or tpot > self.tpot_s:
                return False
        return True


#: the multiple a relative TPOT SLO must exceed: the same rule as the config's
#: tbt_sla_auto (at or below the batch-1 step, no batch could meet it)
MIN_TPOT_MULTIPLE = 1.0


@dataclass(frozen=True)
class SloSpec:
    """``--slo`` as given: each key in seconds (``tpot=0.05``) or as a multiple of the
    decode step at batch 1 measured in the same run (``tpot=2.5x``), so that a
    comparison measures the controller rather than the host's speed of the moment.
    :meth:`resolve` turns it into an :class:`Slo` once that step is known."""

    seconds: dict
    multiples: dict
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> "SloSpec":
        """Raises ValueError naming the bad key or value and the allowed forms."""
        allowed = ", ".join(_SLO_KEYS)
        items = [t.strip() for t in text.split(",")]
        if not text.strip():
            raise ValueError(f"SLO {text!r}: expected KEY=SECONDS[,KEY=SECONDS...] with KEY "
                             f"one of {allowed}")
        seconds: dict[str, float] = {}
        multiples: dict[str, float] = {}
        for item in items:
            key, eq, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not eq:
                hint = " (seconds with '=', not vLLM's KEY:MS)" if ":" in item else ""
                raise ValueError(f"SLO {item!r}: expected KEY=SECONDS with KEY one of "
                                 f"{allowed}{hint}")
            key = _SLO_ALIASES.get(key, key)
            if key not in _SLO_KEYS:
                raise ValueError(f"SLO key {key!r} is not one of {allowed}")
            if key in seconds or key in multiples:
                raise ValueError(f"SLO key {key!r} given twice")
            relative = value.lower().endswith("x")
            try:
                x = float(value[:-1] if relative else value)
            except ValueError:
                x = math.nan
            if relative:
                low = MIN_TPOT_MULTIPLE if key == "tpot" else 0.0
                if not (math.isfinite(x) and x > low):
                    raise ValueError(f"SLO {key}={value!r}: expected {key}=MULTIPLEx, a "
                                     f"number > {low:g} times the batch-1 decode step "
                                     f"(e.g. {key}={'2.5' if key == 'tpot' else '40'}x)")
                multiples[key] = x
                continue
            if not (math.isfinite(x) and x > 0):
                raise ValueError(f"SLO {key}={value!r}: expected a number of seconds > 0")
            if key == "tpot" and x >= 1:
                # the same rule as the config's tbt_sla_s, which this value sets
                raise ValueError(f"SLO tpot={value}: must be below 1 s (probably "
                                 f"milliseconds: the SLA is in seconds, {value} ms is "
                                 f"{round(x / 1000, 9):g})")
            seconds[key] = x
        return cls(seconds, multiples, text)

    @property
    def relative(self) -> bool:
        return bool(self.multiples)

    def resolve(self, step_s: float | None) -> Slo:
        """The SLO in seconds, ``step_s`` being the batch-1 decode step (needed only
        when a key is a multiple). ValueError when a resolved TPOT is 1 s or more."""
        values = dict(self.seconds)
        if self.multiples:
            if not (step_s is not None and math.isfinite(step_s) and step_s > 0):
                raise ValueError(f"SLO {self.text}: a multiple of the batch-1 step needs a "
                                 f"measured step > 0, got {step_s!r}")
            for k, m in self.multiples.items():
                values[k] = round(m * step_s, 6)
            if values.get("tpot", 0.0) >= 1:
                raise ValueError(f"SLO tpot={self.multiples['tpot']:g}x: {values['tpot']:g} s "
                                 f"with a batch-1 step of {step_s:g} s; must be below 1 s")
        return Slo(**{f"{k}_s": v for k, v in values.items()})

    def __str__(self) -> str:
        return ",".join([f"{k}={self.seconds[k]:g}" if k in self.seconds else
                         f"{k}={self.multiples[k]:g}x" for k in _SLO_KEYS
                         if k in self.seconds or k in self.multiples]) or "none"


def _stats(name: str, values: list[float]) -> dict[str, float | None]:
    if not values:
        d: dict[str, float | None] = {f"{name}_mean_s": None, f"{name}_std_s": None}
        d.update({f"{name}_p{p}_s": None for p in PERCENTILES})
        return d
    a = np.asarray(values, dtype=float)
    d = {f"{name}_mean_s": float(a.mean()), f"{name}_std_s": float(a.std())}
    d.update({f"{name}_p{p}_s": float(v) for p, v in zip(PERCENTILES,
                                                          np.percentile(a, PERCENTILES))})
    return d


def phase_counts(results: Sequence[RequestResult], slo: Slo,
                 phase_of: Mapping[str, str | None]) -> list[dict]:
    """Per phase of a phased workload (``phase_of``: request id -> phase name), in the
    order the phases first arrive: ``n``, ``good`` (within every SLO), ``served``
    (completed), ``refused``, ``first_response_p99_s`` (a token or a refusal, from
    arrival) and ``refusal_p99_s`` (arrival to refusal; None without refusals)."""
    order: dict[str, list[RequestResult]] = {}
    for r in sorted(results, key=lambda r: r.arrival_s):
        name = phase_of.get(r.request_id)
        if name is not None:
            order.setdefault(name, []).append(r)
    out = []
    for name, rs in order.items():
        refusals = [r.refused_s - r.arrival_s for r in rs if r.refused and not r.failed]
        first = [x for r in rs if not r.failed for x in [r.first_response_s] if x is not None]
        out.append({"name": name, "n": len(rs), "good": sum(1 for r in rs if slo.is_good(r)),
                     "served": sum(1 for r in rs if r.completed), "refused": len(refusals),
                     "first_response_p99_s": _stats("x", first)["x_p99_s"],
                     "refusal_p99_s": _stats("x", refusals)["x_p99_s"]})
    return out


def summarize(results: Sequence[RequestResult], slo: Slo, *,
              duration_s: float | None = None,
              phase_of: Mapping[str, str | None] | None = None) -> dict:
    """A flat, JSON-serialisable summary of a run.

    Keys: submitted, completed, failed, refused, unfinished, good, duration_s,
    goodput_rps, attainment, request_throughput_rps, output_tok_s, total_tok_s,
    total_input_tokens, total_output_tokens,
    ``{ttft,tpot,itl,e2el,first_response}_{mean,std,p50,p90,p99}_s``, max_wait_s (the
    longest TTFT of a completed request), waits_over_10x_ttft (completed requests
    whose TTFT exceeds 10x the TTFT SLO; None without one), preemptions,
    recomputed_tokens, slo; with ``phase_of`` (a phased workload's request id ->
    phase), ``phases`` (:func:`phase_counts`). Rates are None when the duration is 0.
    ``duration_s`` defaults to the last finish or refusal − first arrival.
    """
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a number > 0, got {duration_s!r}")
    done = [r for r in results if r.completed]
    failed = sum(1 for r in results if r.failed)
    refused = sum(1 for r in results if r.refused and not r.failed)
    good = sum(1 for r in results if slo.is_good(r))
    if duration_s is None:
        finishes = [r.refused_s if r.refused else r.finish_s for r in results
                    if r.finish_s is not None or r.refused]
        duration_s = (max(finishes) - min(r.arrival_s for r in results)) if finishes else 0.0

    def per_s(x: float) -> float | None:
        return x / duration_s if duration_s > 0 else None

    tin = sum(r.prompt_tokens for r in done)
    tout = sum(r.output_tokens for r in done)
    out: dict = {
        "submitted": len(results), "completed": len(done), "failed": failed,
        "refused": refused, "unfinished": len(results) - len(done) - failed - refused,
        "good": good,
        "duration_s": duration_s, "goodput_rps": per_s(good),
        "attainment": good / len(results) if results else None,
        "request_throughput_rps": per_s(len(done)),
        "output_tok_s": per_s(tout), "total_tok_s": per_s(tin + tout),
        "total_input_tokens": tin, "total_output_tokens": tout,
    }
    out.update(_stats("ttft", [r.ttft_s for r in done if r.ttft_s is not None]))
    out.update(_stats("tpot", [r.tpot_s for r in done if r.tpot_s is not None]))
    out.update(_stats("itl", [x for r in done for x in r.itls_s]))
    out.update(_stats("e2el", [r.e2e_s for r in done]))
    out.update(_stats("first_response", [x for r in results if not r.failed
                                         for x in [r.first_response_s] if x is not None]))
    waits = [r.ttft_s for r in done if r.ttft_s is not None]
    out["max_wait_s"] = max(waits) if waits else None
    out["waits_over_10x_ttft"] = (sum(1 for w in waits if w > 10 * slo.ttft_s)
                                  if slo.ttft_s is not None else None)
    out["preemptions"] = sum(r.preemptions for r in results)
    out["recomputed_tokens"] = sum(r.recomputed_tokens for r in results)
    out["slo"] = str(slo)
    if phase_of and any(v is not None for v in phase_of.values()):
        out["phases"] = phase_counts(results, slo, phase_of)
    return out


def _mean_phases(runs: Sequence[list[dict]]) -> list[dict]:
    """Each phase's figures as the mean over repeats (the phases are the same in every
    repeat: one workload); a figure None in any repeat stays None."""
    out = []
    for i, first in enumerate(runs[0]):
        row = {"name": first["name"]}
        for k in first:
            if k == "name":
                continue
            vals = [r[i].get(k) if i < len(r) else None for r in runs]
            row[k] = None if any(v is None for v in vals) else float(np.mean(vals))
        out.append(row)
    return out


def longest_silence(results: Sequence[RequestResult]) -> tuple[float, float] | None:
    """The longest time in which no stream got a token while a request was in
    flight, and when it began: ``(seconds, start)`` on the results' clock, or None
    without token times (the simulator's runs, or no token at all).

    A request is in flight from its arrival to its last token. Between two tokens
    of the run (of any stream) the silence counts from the first of them if a
    request that had arrived by then was still to finish, else from the first
    arrival between them. On a healthy engine it is at most the longest step (a
    prefill of a whole prompt); a host that keeps the API server or the client off
    the cores for seconds shows as a silence of seconds, and every request then in
    flight pays it in its TTFT or its TPOT, whatever the scheduler did."""
    spans = sorted((r.arrival_s, r.token_times_s[-1]) for r in results
                   if r.token_times_s)
    times = sorted(t for r in results for t in (r.token_times_s or ()))
    if not times:
        return None
    arrivals = [a for a, _ in spans]
    reach = list(itertools.accumulate((f for _, f in spans), max))  # by arrival order
    best = (times[0] - arrivals[0], arrivals[0])
    for t, nxt in zip(times, times[1:]):
        k = bisect.bisect_right(arrivals, t)
        if k and reach[k - 1] >= nxt:
            start = t                   # someone in flight since before the gap
        elif k < len(arrivals) and arrivals[k] < nxt:
            start = arrivals[k]         # the first request that arrived inside it
        else:
            continue
        if nxt - start > best[0]:
            best = (nxt - start, start)
    return best


def mean_summary(summaries: Sequence[dict]) -> dict:
    """Repeats of one contender as one summary: every number is the mean over the
    repeats (counts and percentiles too; a key None in any repeat stays None), with
    ``repeats``, ``goodput_rps_runs`` and ``ttft_p99_s_runs`` (each repeat's), and the
    goodput's spread: ``goodput_rps_min``, ``_max`` and ``_std`` (sample standard
    deviation). One summary is returned as it is."""
    if len(summaries) == 1:
        return summaries[0]
    if not summaries:
        raise ValueError("mean_summary: no summaries")
    out: dict = {}
    for k, v in summaries[0].items():
        vals = [s.get(k) for s in summaries]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and \
                all(isinstance(x, (int, float)) for x in vals):
            out[k] = float(np.mean(vals))
        elif isinstance(v, (int, float)) or v is None:
            out[k] = None if any(x is None for x in vals) else v
        else:
            out[k] = v
    if all(s.get("phases") for s in summaries):
        out["phases"] = _mean_phases([s["phases"] for s in summaries])
    out["repeats"] = len(summaries)
    out["goodput_rps_runs"] = runs = [s.get("goodput_rps") for s in summaries]
    out["ttft_p99_s_runs"] = [s.get("ttft_p99_s") for s in summaries]
    if all(isinstance(x, (int, float)) for x in runs):
        # the spread over repeats: how far the host's noise moves this contender
        out.update(goodput_rps_min=float(min(runs)), goodput_rps_max=float(max(runs)),
                   goodput_rps_std=float(np.std(runs, ddof=1)))
    return out


REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "ttft_s",
                   "tpot_s", "e2el_s", "preemptions", "met_ttft", "met_tpot", "good",
                   "refused", "first_response_s", "error")


def request_rows(results: Sequence[RequestResult], slo: Slo) -> list[dict]:
    """One row per request (``REQUEST_COLUMNS``): its latencies, which SLO it met,
    whether it was refused and its time to first response, arrival relative to the
    first arrival; what ``requests.csv`` holds, to see which
    requests a run missed and by what. ``met_*`` is empty where that SLO is not set,
    or the value does not exist (unfinished; TPOT of a one-token request)."""
    t0 = min((r.arrival_s for r in results), default=0.0)

    def met(limit: float | None, value: float | None) -> str:
        if limit is None or value is None:
            return ""
        return "1" if value <= limit else "0"

    def num(x: float | None) -> str:
        return "" if x is None else f"{x:.6f}"

    rows = []
    for r in results:
        tpot = r.tpot_s                  # None for a one-token request
        rows.append({"request_id": r.request_id, "arrival_s": f"{r.arrival_s - t0:.6f}",
                     "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
                     "ttft_s": num(r.ttft_s), "tpot_s": num(tpot), "e2el_s": num(r.e2e_s),
                     "preemptions": r.preemptions, "met_ttft": met(slo.ttft_s, r.ttft_s),
                     "met_tpot": met(slo.tpot_s, tpot), "good": int(slo.is_good(r)),
                     "refused": "1" if r.refused else "0",
                     "first_response_s": num(r.first_response_s), "error": r.error or ""})
    return rows


def write_requests_csv(path, results: Sequence[RequestResult], slo: Slo) -> None:
    """``request_rows`` as CSV at ``path``."""
    import csv

    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=REQUEST_COLUMNS)
        w.writeheader()
        w.writerows(request_rows(results, slo))


# --- capacity --------------------------------------------------------------------------------

@dataclass
class CapacityResult:
    """The highest rate found with attainment ≥ target, and every probe made.

    ``capacity_rps`` is the highest probed rate that met the target (0.0 when even
    ``lo_rps`` missed); the true capacity lies in [capacity_rps, upper_rps) when
    attainment is non-increasing in rate (``upper_rps`` None: no probe missed).
    """

    capacity_rps: float
    upper_rps: float | None
    target: float
    converged: bool
    reason: str
    probes: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment)

    def as_dict(self) -> dict:
        return {"capacity_rps": self.capacity_rps, "upper_rps": self.upper_rps,
                "target": self.target, "converged": self.converged, "reason": self.reason,
                "probes": [list(p) for p in self.probes]}


#: the attainment a rate must reach to count toward a contender's capacity (DistServe's)
CAPACITY_TARGET = 0.9


def capacity_search(run: Callable[[float], float], lo_rps: float, hi_rps: float, *,
                    target: float = CAPACITY_TARGET, tol_rel: float = 0.05, max_iter: int = 12,
                    max_doublings: int = 6) -> CapacityResult:
    """DistServe capacity: the highest arrival rate whose attainment ``run(rate)``
    is at least ``target``, assuming attainment does not increase with rate.

    Probes ``lo_rps`` (a miss: capacity 0), then ``hi_rps``, doubling it while it
    still meets the target (at most ``max_doublings`` times), then bisects
    [passing, missing] until its width is at most ``tol_rel`` × the passing rate
    or ``max_iter`` bisection steps are spent. A NaN attainment counts as a miss.
    """
    if not (0 < lo_rps < hi_rps and math.isfinite(hi_rps)):
        raise ValueError(f"capacity_search: need 0 < lo_rps < hi_rps, got {lo_rps!r}, "
                         f"{hi_rps!r}")
    if not 0 < target <= 1 or tol_rel <= 0 or max_iter < 0 or max_doublings < 0:
        raise ValueError("capacity_search: need 0 < target <= 1, tol_rel > 0, "
                         "max_iter >= 0, max_doublings >= 0")
    probes: list[tuple[float, float]] = []

    def ok(rate: float) -> bool:
        a = float(run(rate))
        probes.append((rate, a))
        return a >= target  # False for NaN

    if not ok(lo_rps):
        return CapacityResult(0.0, lo_rps, target, True,
                              f"attainment below {target:g} already at lo_rps={lo_rps:g}",
                              probes)
    lo, hi = lo_rps, hi_rps
    doublings = 0
    while ok(hi):
        if doublings == max_doublings:
            return CapacityResult(hi, None, target, False,
                                  f"attainment still >= {target:g} at {hi:g} req/s after "
                                  f"{doublings} doublings of hi_rps", probes)
        lo, hi = hi, hi * 2
        doublings += 1
    steps = 0
    while hi - lo > tol_rel * lo and steps < max_iter:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
        steps += 1
    converged = hi - lo <= tol_rel * lo
    reason = (f"bracketed within {tol_rel:g} relative" if converged
              else f"max_iter={max_iter} bisection steps spent")
    return CapacityResult(lo, hi, target, converged, reason, probes)
