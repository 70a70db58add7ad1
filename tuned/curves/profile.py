"""Profile files: the samples of a `tuned profile` sweep, their per-level aggregates and
the fitted curves, and the :class:`Profile` object the controller asks for predictions.

One module, past the usual size, because the file format is one contract: reading,
writing, the migration of older schemas and the :class:`Profile` built from them
change together.

File format (JSON, ``schema_version`` 2)::

    {
      "schema_version": 2,
      "meta": {"model": {"path": str, "config": {...}}, "hardware": {...},
               "created_at": ISO-8601 str, "workload": {"spec": str, ...},
               "vllm_version": str|null, "tuned_version": str|null,
               "engine": {...}, "sweep": {...}},
      "samples": {
        "requests": {"concurrency": [...], "prompt_tokens": [...], "output_tokens": [...],
                     "duration_s": [...], "speed_tok_s": [...],
                     optional "start_s": [...], "load": [...]},
        "steps": {"num_decode": [...], "prefill_tokens": [...], "step_s": [...],
                  "kv_tokens_resident": [...], "kv_used_blocks": [...],
                  optional "concurrency": [...]}
      },
      "levels": [{"concurrency": int, "num_requests": int, "throughput_tok_s": float,
                  "speed_tok_s_mean": float, ...}, ...],
      "fits": {"usl": FitResult|null, "speed": {"usl": FitResult, "linear": ...,
               "logistic": ..., "best": str}|null, "step_time": FitResult|null,
               "kv_demand": {"mean": float, "var": float, "n": int}|null, "notes": [str]}
    }

Samples are stored column-wise (one list per field, equal lengths) to keep files of
tens of thousands of engine steps small. Schema 1 (``"version": 1``: per-level
throughput rows and USL parameters as ``[lam, sigma, kappa]``, no samples) is
migrated on load; :func:`load_profile` rejects anything else with a
:class:`ProfileError` naming the file and the problem.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tuned.curves.fit import (FitError, FitResult, KvDemand, _is_number, fit_speed_models,
                              fit_step_time, fit_usl, kv_demand, r_squared)
from tuned.curves.models import usl_speed
from tuned.curves.online import LinearStepModel, SpeedStepModel
from tuned.base.inputs import UserError, clip_path, read_text

SCHEMA_VERSION = 2

REQUEST_COLUMNS = ("concurrency", "prompt_tokens", "output_tokens", "duration_s", "speed_tok_s")
REQUEST_OPTIONAL = ("start_s", "load")
STEP_COLUMNS = ("num_decode", "prefill_tokens", "step_s", "kv_tokens_resident",
                "kv_used_blocks")
STEP_OPTIONAL = ("concurrency", "gap_s")
LEVEL_KEYS = ("concurrency", "num_requests", "throughput_tok_s", "speed_tok_s_mean")
SPEED_NAMES = {"usl": "usl_speed", "linear": "linear_speed", "logistic": "logistic_speed"}


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the problem."""

    def __init__(self, source: str, problem: str):
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}" if source else problem)


class _Bad(Exception):
    """Internal: one validation problem, wrapped into ProfileError with the file name."""


def empty_columns(names) -> dict[str, list]:
    return {n: [] for n in names}


def time_weighted_load(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The ``load`` column: for each request, the mean number of requests in flight
    (itself included) over its own lifetime: SABER's load L, exact also for the ramp
    and drain of a level."""
    start = np.asarray(start, dtype=float)
    end = np.asarray(end, dtype=float)
    overlap = np.clip(np.minimum(end[:, None], end[None, :]) -
                      np.maximum(start[:, None], start[None, :]), 0.0, None)
    dur = end - start
    with np.errstate(invalid="ignore", divide="ignore"):
        load = overlap.sum(axis=1) / dur
    return np.where(dur > 0, load, 1.0)


@dataclass
class Profile:
    """A measured load-speed profile with its fitted curves.

    Built by :func:`build_profile` from sweep samples or read by :func:`load_profile`.
    The prediction helpers are pure functions of the fits and cheap enough to call
    on every controller tick.
    """

    meta: dict[str, Any]
    requests: dict[str, list]
    steps: dict[str, list]
    levels: list[dict[str, Any]]
    usl: FitResult | None = None
    speed: dict[str, FitResult] = field(default_factory=dict)
    best_speed: str | None = None
    step_time: FitResult | None = None
    kv: KvDemand | None = None
    kv_n: int = 0
    notes: list[str] = field(default_factory=list)
    source: str = ""
    migrated_from: int | None = None

    # --- predictions used by the controller -----------------------------------------

    def predict_step_s(self, b: int, c: int = 0, kv_tokens: int = 0) -> float:
        """Predicted engine step time (s) with ``b`` decodes and ``c`` prefill tokens,
        by :meth:`timing` (``kv_tokens`` matters only if the KV term was kept)."""
        return float(self.timing().predict_step_s(b, c, kv_tokens))

    def speed_tok_s(self, n: int) -> float:
        """Predicted decode speed of one request (tokens/s) with ``n`` requests running,
        v(N) from the best speed fit (the USL throughput fit divided by N if there is
        none). ``n`` below 1 is read as 1 and negative predictions as 0."""
        n = max(int(n), 1)
        if self.best_speed is not None:
            v = float(self.speed[self.best_speed].predict(n))
        elif self.usl is not None:
            v = float(usl_speed(n, **self.usl.params))
        else:
            raise ProfileError(self.source, "no speed curve: the profile has neither a speed "
                               "fit nor a USL fit (re-fit it with `tuned fit`)")
        return max(v, 0.0)

    @property
    def mean_context_tokens(self) -> float:
        """KV tokens a running request of the profiled workload holds on average over
        its life, prompt + output / 2 (0 without request samples)."""
        p = self.requests.get("prompt_tokens") or []
        o = self.requests.get("output_tokens") or []
        if not p:
            return 0.0
        return float(np.mean(np.asarray(p, dtype=float) + np.asarray(o, dtype=float) / 2))

    @property
    def step_gap_s(self) -> float:
        """Median engine time between back-to-back steps that no step measured (the
        scheduler, output processing, the engine's busy loop: the ``gap_s`` step column,
        -1 where unknown); 0 for profiles without that column or fewer than 20 known
        gaps. A client sees it in every token's time; the step time excludes it."""
        g = np.asarray(self.steps.get("gap_s") or [], dtype=float)
        g = g[g >= 0]
        return float(np.median(g)) if g.size >= 20 else 0.0

    def step_model(self) -> LinearStepModel | None:
        """The fitted step time as a :class:`~tuned.curves.online.LinearStepModel`
        (the controller's one implementation of T(b, c, kv)); None without a fit."""
        st = self.step_time
        if st is None:
            return None
        return LinearStepModel.from_fit(st, f"profile:{self.source}")

    def timing(self) -> LinearStepModel | SpeedStepModel:
        """The step-time model this profile predicts with: the fitted one, else its
        speed curve's T(b) = 1 / v(b) (:class:`~tuned.curves.online.SpeedStepModel`)."""
        return self.step_model() or SpeedStepModel(self.speed_tok_s)

    def largest_batch_within(self, tbt_s: float, b_max: int,
                             kv_tokens_per_seq: float | None = None) -> int:
        """Largest b in [1, b_max] with ``predict_step_s(b, 0, b * kv_tokens_per_seq)
        <= tbt_s``; 1 if none. ``kv_tokens_per_seq`` defaults to the profiled
        workload's :attr:`mean_context_tokens` (it matters only when the step model
        kept its KV term)."""
        if b_max < 1:
            return 1
        kv_seq = self.mean_context_tokens if kv_tokens_per_seq is None else kv_tokens_per_seq
        return max(1, self.timing().largest_batch_within(tbt_s, int(b_max), kv_seq))

    def largest_chunk_within(self, b: int, tbt_s: float, lo: int, hi: int,
                             kv_tokens: float = 0.0) -> int:
        """Largest prefill chunk c in [lo, hi] with T(b, c, kv + c) <= tbt_s, ``kv_tokens``
        the KV resident before the chunk; ``lo`` if none fits. Without a step-time fit
        the step time does not depend on c: ``hi`` if T(b) fits, else ``lo``."""
        return self.timing().largest_chunk_within(b, tbt_s, lo, hi, kv_tokens)

    # --- (de)serialisation -----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        speed = None
        if self.speed:
            speed = {k: f.to_dict() for k, f in self.speed.items()}
            speed["best"] = self.best_speed
        return {
            "schema_version": SCHEMA_VERSION,
            "meta": self.meta,
            "samples": {"requests": self.requests, "steps": self.steps},
            "levels": self.levels,
            "fits": {
                "usl": self.usl.to_dict() if self.usl else None,
                "speed": speed,
                "step_time": self.step_time.to_dict() if self.step_time else None,
                "kv_demand": ({"mean": self.kv.mean, "var": self.kv.var, "n": self.kv_n}
                              if self.kv is not None else None),
                "notes": list(self.notes),
            },
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = "") -> "Profile":
        """Validate and build (migrating older schemas); raises :class:`ProfileError`."""
        try:
            return _from_dict(d, source)
        except _Bad as e:
            raise ProfileError(source, str(e)) from None

    def refit(self) -> "Profile":
        """A copy with levels re-aggregated from the request samples (if any) and every
        fit recomputed; fits that the data cannot support are dropped with a note."""
        levels = aggregate_levels(self.requests, self.steps) if _ncols(self.requests) else \
            [dict(lv) for lv in self.levels]
        return replace(self, levels=levels, **fit_all(self.requests, self.steps, levels),
                       migrated_from=self.migrated_from)


def _ncols(cols: dict[str, list]) -> int:
    return len(next(iter(cols.values()))) if cols else 0


# --- building from samples ---------------------------------------------------------------

def aggregate_levels(requests: dict[str, list], steps: dict[str, list]) -> list[dict[str, Any]]:
    """Per-concurrency aggregates of the request (and step) samples.

    ``throughput_tok_s`` is the closed-loop steady-state estimate N · Σ output / Σ duration
    (each of the N slots is busy the whole level, so X = N · tokens per busy second);
    ``wall_throughput_tok_s`` divides by the level's wall time instead when start times
    were recorded (it includes the drain at the end of the level).
    """
    conc = np.asarray(requests.get("concurrency", []), dtype=int)
    out_tok = np.asarray(requests.get("output_tokens", []), dtype=float)
    dur = np.asarray(requests.get("duration_s", []), dtype=float)
    speed = np.asarray(requests.get("speed_tok_s", []), dtype=float)
    start = requests.get("start_s")
    start = np.asarray(start, dtype=float) if start is not None else None
    s_conc = steps.get("concurrency")
    s_conc = np.asarray(s_conc, dtype=int) if s_conc is not None else None
    levels = []
    for n in sorted(set(conc.tolist())):
        sel = conc == n
        row: dict[str, Any] = {
            "concurrency": int(n),
            "num_requests": int(sel.sum()),
            "output_tokens": int(out_tok[sel].sum()),
            "throughput_tok_s": float(n * out_tok[sel].sum() / dur[sel].sum())
            if dur[sel].sum() > 0 else 0.0,
            "speed_tok_s_mean": float(speed[sel].mean()),
            "speed_tok_s_p50": float(np.median(speed[sel])),
            "duration_s_mean": float(dur[sel].mean()),
        }
        if start is not None:
            wall = float((start[sel] + dur[sel]).max() - start[sel].min())
            row["wall_s"] = wall
            row["wall_throughput_tok_s"] = float(out_tok[sel].sum() / wall) if wall > 0 else 0.0
        if s_conc is not None and len(s_conc):
            ssel = (s_conc == n) & (np.asarray(steps["prefill_tokens"]) == 0) & \
                   (np.asarray(steps["num_decode"]) > 0)
            if ssel.any():
                row["step_s_mean"] = float(np.asarray(steps["step_s"], dtype=float)[ssel].mean())
                row["num_decode_mean"] = float(np.asarray(steps["num_decode"])[ssel].mean())
        levels.append(row)
    return levels


def fit_all(requests: dict[str, list], steps: dict[str, list],
            levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Every fit a profile carries, as keyword values for :class:`Profile`.

    Speed models are fitted on the request samples against their time-weighted load L
    (``load``, falling back to the level N), as SABER fits v = f(L) on per-request
    load-speed pairs; without samples (schema 1) on the per-level means. The USL
    throughput is fitted on the per-level aggregates, the step time on busy steps.
    """
    notes: list[str] = []
    out: dict[str, Any] = {"usl": None, "speed": {}, "best_speed": None, "step_time": None,
                           "kv": None, "kv_n": 0}
    if levels:
        try:
            out["usl"] = fit_usl([lv["concurrency"] for lv in levels],
                                 [lv["throughput_tok_s"] for lv in levels])
        except FitError as e:
            notes.append(f"no USL throughput fit: {e}")
    if _ncols(requests):
        x = requests.get("load") or requests["concurrency"]
        y = requests["speed_tok_s"]
    else:
        x = [lv["concurrency"] for lv in levels]
        y = [lv["speed_tok_s_mean"] for lv in levels]
    if len(x):
        try:
            fits = fit_speed_models(x, y)
            for short, reason in fits.pop("failed", {}).items():
                notes.append(f"no {short} speed fit: {reason}")
            out["best_speed"] = fits.pop("best")
            out["speed"] = fits
        except FitError as e:
            notes.append(f"no speed fit: {e}")
    if _ncols(steps):
        b = np.asarray(steps["num_decode"], dtype=float)
        c = np.asarray(steps["prefill_tokens"], dtype=float)
        busy = (b + c) > 0
        try:
            out["step_time"] = fit_step_time(
                b[busy], c[busy], np.asarray(steps["step_s"], dtype=float)[busy],
                np.asarray(steps["kv_tokens_resident"], dtype=float)[busy])
        except FitError as e:
            notes.append(f"no step-time fit: {e}")
    else:
        notes.append("no engine step samples: step time is predicted as 1 / v(b)")
    if _ncols(requests):
        tokens = np.asarray(requests["prompt_tokens"], dtype=float) + \
            np.asarray(requests["output_tokens"], dtype=float)
        out["kv"] = kv_demand(tokens)
        out["kv_n"] = int(tokens.size)
    out["notes"] = notes
    return out


def build_profile(meta: dict[str, Any], requests: dict[str, list],
                  steps: dict[str, list] | None = None) -> Profile:
    """A profile from sweep samples: aggregates per level, then every fit."""
    steps = steps if steps is not None else empty_columns(STEP_COLUMNS)
    levels = aggregate_levels(requests, steps)
    return Profile(meta=meta, requests=requests, steps=steps, levels=levels,
                   **fit_all(requests, steps, levels))


# --- validation --------------------------------------------------------------------------

def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _want(d: dict, key: str, kind: str, where: str, required: bool = True) -> Any:
    path = f"{where}.{key}" if where else key
    if key not in d:
        if required:
            raise _Bad(f"missing key '{path}'")
        return None
    v = d[key]
    ok = {
        "object": isinstance(v, dict),
        "list": isinstance(v, list),
        "string": isinstance(v, str),
        "integer": isinstance(v, int) and not isinstance(v, bool) and -2**63 <= v < 2**63,
        "number": _is_number(v),
        "object or null": v is None or isinstance(v, dict),
        "string or null": v is None or isinstance(v, str),
    }[kind]
    if not ok:
        article = "an" if kind[0] in "aeiou" else "a"
        raise _Bad(f"'{path}' must be {article} {kind}, got {_type_name(v)} {_short(v)}")
    return v




def _short(v: Any) -> str:
    s = json.dumps(v) if not isinstance(v, float) or math.isfinite(v) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _columns(d: dict, where: str, required: tuple, optional: tuple) -> dict[str, list]:
    cols: dict[str, list] = {}
    for key in required + optional:
        v = _want(d, key, "list", where, required=key in required)
        if v is None:
            continue
        for i, x in enumerate(v):
            if not _is_number(x):
                raise _Bad(f"'{where}.{key}[{i}]' must be a number, got {_type_name(x)} "
                           f"{_short(x)}")
        cols[key] = v
    lengths = {k: len(v) for k, v in cols.items()}
    if len(set(lengths.values())) > 1:
        raise _Bad(f"'{where}' columns differ in length: "
                   + ", ".join(f"{k}={n}" for k, n in lengths.items()))
    return cols


def _fit(d: Any, where: str, expect: str | tuple) -> FitResult:
    try:
        f = FitResult.from_dict(d)
    except ValueError as e:
        raise _Bad(f"'{where}': {e}") from None
    names = (expect,) if isinstance(expect, str) else expect
    if f.name not in names:
        raise _Bad(f"'{where}.name' must be {' or '.join(names)}, got {f.name!r}")
    return f


def _from_dict(d: Any, source: str) -> Profile:
    if not isinstance(d, dict):
        raise _Bad(f"not a profile: the top level must be a JSON object, got {_type_name(d)}")
    if "schema_version" in d:
        version = d["schema_version"]
        key = "schema_version"
    elif "version" in d:
        version = d["version"]
        key = "version"
    else:
        raise _Bad("missing key 'schema_version' (not a tuned profile?)")
    if isinstance(version, bool) or not isinstance(version, int):
        raise _Bad(f"'{key}' must be an integer, got {_type_name(version)} {_short(version)}")
    if version > SCHEMA_VERSION:
        raise _Bad(f"schema_version {version} is newer than this tuned can read (up to "
                   f"{SCHEMA_VERSION}); upgrade tuned to use this profile")
    if version == 1:
        return _from_v1(d, source)
    if version != SCHEMA_VERSION:
        raise _Bad(f"unknown schema_version {version} (known: 1, {SCHEMA_VERSION})")

    meta = _want(d, "meta", "object", "")
    model = _want(meta, "model", "object", "meta")
    _want(model, "path", "string", "meta.model")
    _want(model, "config", "object or null", "meta.model", required=False)
    _want(meta, "hardware", "object", "meta")
    _want(meta, "created_at", "string", "meta")
    wl = _want(meta, "workload", "object", "meta")
    _want(wl, "spec", "string", "meta.workload")
    for k in ("vllm_version", "tuned_version"):
        _want(meta, k, "string or null", "meta", required=False)

    samples = _want(d, "samples", "object", "")
    req = _columns(_want(samples, "requests", "object", "samples"), "samples.requests",
                   REQUEST_COLUMNS, REQUEST_OPTIONAL)
    steps = _columns(_want(samples, "steps", "object", "samples"), "samples.steps",
                     STEP_COLUMNS, STEP_OPTIONAL)

    levels = _levels(_want(d, "levels", "list", ""), LEVEL_KEYS)

    fits = _want(d, "fits", "object", "")
    usl = fits.get("usl")
    usl = _fit(usl, "fits.usl", "usl_throughput") if usl is not None else None
    speed: dict[str, FitResult] = {}
    best = None
    sp = _want(fits, "speed", "object or null", "fits", required=False)
    if sp:
        best = _want(sp, "best", "string", "fits.speed")
        for short, name in SPEED_NAMES.items():
            if sp.get(short) is not None:
                speed[short] = _fit(sp[short], f"fits.speed.{short}", name)
        unknown = set(sp) - set(SPEED_NAMES) - {"best"}
        if unknown:
            raise _Bad(f"'fits.speed' has unknown model {sorted(unknown)[0]!r} "
                       f"(known: {', '.join(SPEED_NAMES)})")
        if best not in speed:
            raise _Bad(f"'fits.speed.best' names {best!r}, which is not among the fitted "
                       f"models ({', '.join(speed) or 'none'})")
    st = fits.get("step_time")
    st = _fit(st, "fits.step_time", ("step_time", "step_time_kv")) if st is not None else None
    if st is not None:
        _step_time_in_range(st)
    for where, f in [("fits.usl", usl)] + [(f"fits.speed.{k}", v) for k, v in speed.items()]:
        if f is not None and f.name in ("usl_throughput", "usl_speed"):
            _usl_in_range(f, where)
    kvd = _want(fits, "kv_demand", "object or null", "fits", required=False)
    kv, kv_n = None, 0
    if kvd:
        kv = KvDemand(float(_want(kvd, "mean", "number", "fits.kv_demand")),
                      float(_want(kvd, "var", "number", "fits.kv_demand")))
        kv_n = _want(kvd, "n", "integer", "fits.kv_demand")
        for name, v in (("mean", kv.mean), ("var", kv.var), ("n", kv_n)):
            if v < 0:
                raise _Bad(f"'fits.kv_demand.{name}' must be >= 0, got {_short(v)}")
    notes = _want(fits, "notes", "list", "fits", required=False) or []
    return Profile(meta=meta, requests=req, steps=steps, levels=levels, usl=usl, speed=speed,
                   best_speed=best, step_time=st, kv=kv, kv_n=kv_n,
                   notes=[str(n) for n in notes], source=source)


def _step_time_in_range(f: FitResult) -> None:
    """T(b, c, kv) = a + beta b + gamma c (+ eta kv) is a time: no coefficient that makes
    more work cheaper, and a positive step at batch 1."""
    for k in ("beta", "gamma", "eta"):
        if f.params.get(k, 0.0) < 0:
            raise _Bad(f"'fits.step_time.params.{k}' must be >= 0 (more work never takes "
                       f"less time), got {_short(f.params[k])}")
    t1 = f.params["a"] + f.params["beta"]
    if not t1 > 0:
        raise _Bad(f"'fits.step_time.params': the step at batch 1 (a + beta) must be > 0 s, "
                   f"got {_short(t1)}")


def _usl_in_range(f: FitResult, where: str) -> None:
    """The USL's bounds as fitted (:data:`tuned.curves.fit.USL_THROUGHPUT`): lam > 0,
    sigma in [0, 1], kappa >= 0."""
    p = f.params
    if not p["lam"] > 0:
        raise _Bad(f"'{where}.params.lam' must be > 0, got {_short(p['lam'])}")
    if not 0 <= p["sigma"] <= 1:
        raise _Bad(f"'{where}.params.sigma' must be in [0, 1], got {_short(p['sigma'])}")
    if p["kappa"] < 0:
        raise _Bad(f"'{where}.params.kappa' must be >= 0, got {_short(p['kappa'])}")


def _levels(rows: list, required: tuple) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        where = f"levels[{i}]"
        if not isinstance(row, dict):
            raise _Bad(f"'{where}' must be an object, got {_type_name(row)}")
        for k in required:
            _want(row, k, "integer" if k in ("concurrency", "num_requests") else "number", where)
        if row["concurrency"] < 1:
            raise _Bad(f"'{where}.concurrency' must be >= 1, got {row['concurrency']}")
        out.append(row)
    return out


def _from_v1(d: dict, source: str) -> Profile:
    """Schema 1: ``{"version": 1, "model": str, "created": str, "workload": str?,
    "levels": [{"concurrency": int, "throughput_tok_s": number}], "usl": [lam, sigma,
    kappa], "r2": number}``. Migrated to schema 2 with the same USL parameters, which
    also give the speed curve v(N) = X(N) / N; there are no samples and no step fit."""
    model = _want(d, "model", "string", "")
    created = _want(d, "created", "string", "")
    workload = _want(d, "workload", "string", "", required=False) or ""
    rows = _want(d, "levels", "list", "")
    levels = []
    for i, row in enumerate(rows):
        where = f"levels[{i}]"
        if not isinstance(row, dict):
            raise _Bad(f"'{where}' must be an object, got {_type_name(row)}")
        n = _want(row, "concurrency", "integer", where)
        x = _want(row, "throughput_tok_s", "number", where)
        if n < 1:
            raise _Bad(f"'{where}.concurrency' must be >= 1, got {n}")
        levels.append({"concurrency": n, "num_requests": 0, "throughput_tok_s": float(x),
                       "speed_tok_s_mean": float(x) / n})
    usl_list = _want(d, "usl", "list", "")
    if len(usl_list) != 3 or not all(_is_number(v) for v in usl_list):
        raise _Bad(f"'usl' must be a list of 3 numbers [lam, sigma, kappa], got "
                   f"{_short(usl_list)}")
    r2 = _want(d, "r2", "number", "")
    params = dict(zip(("lam", "sigma", "kappa"), map(float, usl_list)))
    none = {k: None for k in params}
    usl = FitResult("usl_throughput", params, dict(none), float(r2), len(levels),
                    note="migrated from schema 1")
    _usl_in_range(usl, "usl")
    speed: dict[str, FitResult] = {}
    best = None
    if levels:
        n = np.array([lv["concurrency"] for lv in levels], dtype=float)
        v = np.array([lv["speed_tok_s_mean"] for lv in levels])
        speed["usl"] = FitResult("usl_speed", dict(params), dict(none),
                                 r_squared(v, usl_speed(n, **params)), len(levels),
                                 note="migrated from schema 1: v(N) = X(N) / N")
        best = "usl"
    meta = {"model": {"path": model, "config": None}, "hardware": {}, "created_at": created,
            "workload": {"spec": workload}, "vllm_version": None, "tuned_version": None}
    return Profile(meta=meta, requests=empty_columns(REQUEST_COLUMNS),
                   steps=empty_columns(STEP_COLUMNS), levels=levels, usl=usl, speed=speed,
                   best_speed=best, notes=["migrated from schema 1: no samples, no step-time "
                                           "fit (step time is predicted as 1 / v(b))"],
                   source=source, migrated_from=1)


# --- file I/O ----------------------------------------------------------------------------

#: the largest profile file read (a sweep of tens of thousands of steps is a few MB)
MAX_PROFILE_BYTES = 256 << 20


def load_profile(path: str | Path, max_bytes: int = MAX_PROFILE_BYTES) -> Profile:
    """Read, validate and (for schema 1) migrate a profile file.

    Raises :class:`ProfileError` whose message starts with the file name and says what
    is wrong: unreadable, empty, truncated or malformed JSON, not an object, a missing
    key, a wrong type, an unknown or newer ``schema_version``.
    """
    p = Path(path)
    source = clip_path(p)
    if not p.exists():
        raise ProfileError(source, "file not found")
    try:
        text = read_text(p, "profile", max_bytes)
    except UserError as e:
        raise ProfileError(source, f"cannot read: {e.problem}") from None
    if not text.strip():
        raise ProfileError(source, "empty file")
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        kind = "truncated JSON" if _unclosed(text) else "malformed JSON"
        raise ProfileError(source, f"{kind}: {e.msg} at line {e.lineno} column {e.colno}") \
            from None
    except RecursionError:
        raise ProfileError(source, "malformed JSON: nested too deeply") from None
    return Profile.from_dict(d, source)


def _unclosed(text: str) -> bool:
    """True if the text ends inside a string or with brackets still open: a file cut
    short (disk full, copy interrupted), as opposed to one that is wrong in the middle."""
    depth, in_str, esc = 0, False, False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
    return in_str or depth > 0


def dumps_profile(profile: Profile) -> str:
    """The profile as JSON text: indented, with each sample column on one line."""
    d = profile.to_dict()
    compact: dict[str, str] = {}
    samples = d["samples"]
    for group in ("requests", "steps"):
        cols = {}
        for k, v in samples[group].items():
            token = f"@@{group}.{k}@@"
            compact[json.dumps(token)] = json.dumps(list(v), separators=(",", ":"))
            cols[k] = token
        samples[group] = cols
    text = json.dumps(d, indent=1, ensure_ascii=False, allow_nan=False)
    for token, value in compact.items():
        text = text.replace(token, value, 1)
    return text + "\n"


def save_profile(profile: Profile, path: str | Path) -> Path:
    """Write the profile atomically (temporary file in the same folder, fsync, rename),
    so a reader never sees half a file; returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = dumps_profile(profile)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p
