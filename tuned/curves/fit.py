"""Fits of tuned's speed curves: USL / linear / logistic speed, step time, KV demand.

Every fit returns a :class:`FitResult` (parameters, standard errors, R², sample
count) that serialises to a plain dict for the profile file and evaluates itself
with :meth:`FitResult.predict`. Nonlinear shapes are fitted with
``scipy.optimize.curve_fit`` from the initial values of the model's ``guess()``
inside its bounds; the step-time model is linear and fitted by ordinary least
squares.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from tuned.curves.models import (MODELS, linear_speed, logistic_speed, usl_speed,
                                 usl_throughput)


class FitError(ValueError):
    """The samples cannot support the requested fit (too few, not finite, no convergence)."""


@dataclass(frozen=True)
class FitResult:
    """One fitted model: ``name`` is a key of :data:`tuned.curves.models.MODELS`.

    ``stderr`` holds one standard error per parameter, ``None`` where it is not
    defined (a parameter fixed for lack of variation, or an exactly determined fit).
    ``adj_r2`` is set for linear least-squares fits; ``note`` says what was decided
    (e.g. whether the KV term was kept).
    """

    name: str
    params: dict[str, float]
    stderr: dict[str, float | None]
    r2: float
    n_samples: int
    adj_r2: float | None = None
    note: str = ""

    def predict(self, *x):
        """Evaluate the model at the independent variables (see ``MODELS[name][1]``)."""
        func, _ = MODELS[self.name]
        return func(*x, **self.params)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "params": dict(self.params),
                             "stderr": dict(self.stderr), "r2": self.r2,
                             "n_samples": self.n_samples}
        if self.adj_r2 is not None:
            d["adj_r2"] = self.adj_r2
        if self.note:
            d["note"] = self.note
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FitResult":
        """Inverse of :meth:`to_dict`; raises ``ValueError`` naming the bad field."""
        if not isinstance(d, dict):
            raise ValueError(f"must be an object, got {type(d).__name__}")
        for key in ("name", "params", "r2", "n_samples"):
            if key not in d:
                raise ValueError(f"missing key '{key}'")
        name = d["name"]
        if not isinstance(name, str) or name not in MODELS:
            raise ValueError(f"unknown model name {name!r} (known: {', '.join(MODELS)})")
        func, xs = MODELS[name]
        want = _param_names(func, len(xs))
        params = d["params"]
        if not isinstance(params, dict):
            raise ValueError(f"'params' must be an object, got {type(params).__name__}")
        missing = [p for p in want if p not in params]
        if missing:
            raise ValueError(f"'params' is missing {', '.join(missing)} for model {name}")
        for p in want:
            if not _is_number(params[p]):
                raise ValueError(f"'params.{p}' must be a number, got {params[p]!r}")
        stderr = d.get("stderr", {}) or {}
        if not isinstance(stderr, dict):
            raise ValueError(f"'stderr' must be an object, got {type(stderr).__name__}")
        for p, v in stderr.items():
            if v is not None and not _is_number(v):
                raise ValueError(f"'stderr.{p}' must be a number or null, got {v!r}")
        if not _is_number(d["r2"]):
            raise ValueError(f"'r2' must be a number, got {d['r2']!r}")
        n = d["n_samples"]
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"'n_samples' must be an integer, got {n!r}")
        adj = d.get("adj_r2")
        if adj is not None and not _is_number(adj):
            raise ValueError(f"'adj_r2' must be a number, got {adj!r}")
        return cls(name=name, params={p: float(params[p]) for p in want},
                   stderr={p: (None if stderr.get(p) is None else float(stderr[p]))
                           for p in want},
                   r2=float(d["r2"]), n_samples=n,
                   adj_r2=None if adj is None else float(adj), note=str(d.get("note", "")))


def _is_number(v) -> bool:
    """A finite number that converts to a float (JSON allows integers of any size)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _param_names(func: Callable, n_x: int) -> tuple[str, ...]:
    return func.__code__.co_varnames[n_x:func.__code__.co_argcount]


def r_squared(y, y_hat) -> float:
    """Coefficient of determination R² = 1 - SS_res / SS_tot.

    When the observations do not vary (SS_tot = 0) R² is 1.0 for an exact fit and
    0.0 otherwise, so that the value is always a finite number.
    """
    y = np.asarray(y, dtype=float)
    y_hat = np.asarray(y_hat, dtype=float)
    ss_res = float(np.sum((y - y_hat) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    if ss_tot == 0.0:
        return 1.0 if ss_res <= 1e-24 else 0.0
    return 1.0 - ss_res / ss_tot


def adjusted_r2(r2: float, n_samples: int, n_regressors: int) -> float | None:
    """Adjusted R² = 1 - (1 - R²)(n - 1) / (n - p - 1), p regressors besides the
    intercept; ``None`` when n - p - 1 <= 0."""
    dof = n_samples - n_regressors - 1
    if dof <= 0:
        return None
    return 1.0 - (1.0 - r2) * (n_samples - 1) / dof


# --- nonlinear curve models -------------------------------------------------------------

@dataclass(frozen=True)
class CurveModel:
    """A one-variable shape with its bounds and initial-value heuristics.

    ``guess(x, y)`` returns one or more starting points (dicts of parameters); the
    fit keeps the start that ends with the smallest residual. ``bounds(x, y)``, when
    set, narrows ``lower``/``upper`` from the data.
    """

    name: str
    func: Callable
    param_names: tuple[str, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]
    guess: Callable[[np.ndarray, np.ndarray], list[dict[str, float]]] = field(repr=False)
    bounds: Callable[[np.ndarray, np.ndarray], tuple[tuple, tuple]] | None = field(
        default=None, repr=False)


def _usl_guess(n: np.ndarray, y: np.ndarray, *, throughput: bool) -> list[dict[str, float]]:
    # lam from the lowest load; then 1 + sigma (N-1) + kappa N (N-1) = lam / v(N) is
    # linear in (sigma, kappa), which gives both by least squares.
    speed = y / n if throughput else y
    low = n <= n.min()
    lam = float(np.mean(speed[low])) if np.all(speed[low] > 0) else float(np.max(speed))
    lam = max(lam, 1e-9)
    ok = speed > 0
    sigma, kappa = 0.05, 1e-3
    if np.count_nonzero(ok & (n > n.min())) >= 2:
        A = np.column_stack([n[ok] - 1.0, n[ok] * (n[ok] - 1.0)])
        rhs = lam / speed[ok] - 1.0
        (s, k), *_ = np.linalg.lstsq(A, rhs, rcond=None)
        sigma, kappa = float(s), float(k)
    sigma = min(max(sigma, 1e-6), 0.99)
    kappa = max(kappa, 1e-9)
    return [{"lam": lam, "sigma": sigma, "kappa": kappa},
            {"lam": lam, "sigma": 0.05, "kappa": 1e-4}]


def _linear_guess(n: np.ndarray, v: np.ndarray) -> list[dict[str, float]]:
    if np.ptp(n) == 0:
        return [{"a": float(np.mean(v)), "b": 0.0}]
    b, a = np.polyfit(n, v, 1)
    return [{"a": float(a), "b": float(b)}]


def _logistic_guess(n: np.ndarray, v: np.ndarray) -> list[dict[str, float]]:
    # For a chosen vmax, ln(vmax / v - 1) = k N - k n0 is linear in N; try a few
    # vmax above the fastest observation and let the fit keep the best.
    vpos = v[v > 0]
    top = float(np.max(vpos)) if vpos.size else 1.0
    span = float(np.ptp(n)) or 1.0
    starts = []
    for mult in (1.02, 1.1, 1.5, 2.0, 4.0):
        vmax = top * mult
        ok = (v > 0) & (v < vmax)
        if np.count_nonzero(ok) >= 2 and np.ptp(n[ok]) > 0:
            z = np.log(vmax / v[ok] - 1.0)
            k, c0 = np.polyfit(n[ok], z, 1)
            if k != 0 and np.isfinite(k) and np.isfinite(c0):
                starts.append({"vmax": vmax, "k": float(k), "n0": float(-c0 / k)})
                continue
        starts.append({"vmax": vmax, "k": 4.0 / span, "n0": float(np.median(n))})
    return starts


INF = np.inf
USL_THROUGHPUT = CurveModel(
    "usl_throughput", usl_throughput, ("lam", "sigma", "kappa"),
    (0.0, 0.0, 0.0), (INF, 1.0, INF), lambda n, y: _usl_guess(n, y, throughput=True))
USL_SPEED = CurveModel(
    "usl_speed", usl_speed, ("lam", "sigma", "kappa"),
    (0.0, 0.0, 0.0), (INF, 1.0, INF), lambda n, y: _usl_guess(n, y, throughput=False))
LINEAR_SPEED = CurveModel("linear_speed", linear_speed, ("a", "b"), (-INF, -INF), (INF, INF),
                          _linear_guess)
LOGISTIC_SPEED = CurveModel(
    "logistic_speed", logistic_speed, ("vmax", "k", "n0"), (0.0, -INF, -INF), (INF, INF, INF),
    _logistic_guess,
    # vmax is the zero-load speed: far above the fastest observation the "logistic"
    # degenerates into an exponential tail and the fit only wanders (slowly).
    bounds=lambda n, v: ((0.0, -INF, -INF), (10.0 * max(float(np.max(np.abs(v))), 1e-9),
                                             INF, INF)))

#: short names used in ``fit_speed_models`` results -> curve model
SPEED_MODELS = {"usl": USL_SPEED, "linear": LINEAR_SPEED, "logistic": LOGISTIC_SPEED}


def _clean_xy(x, y, what: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise FitError(f"{what}: x and y differ in length ({x.size} vs {y.size})")
    ok = np.isfinite(x) & np.isfinite(y)
    return x[ok], y[ok]


def fit_curve(model: CurveModel, x, y) -> FitResult:
    """Fit one :class:`CurveModel` by nonlinear least squares (scipy ``curve_fit``,
    trust-region reflective within the model's bounds), from each of its guesses."""
    x, y = _clean_xy(x, y, model.name)
    p = len(model.param_names)
    if x.size < p:
        raise FitError(f"{model.name}: needs at least {p} samples, got {x.size}")
    if np.unique(x).size < min(p, 2):
        raise FitError(f"{model.name}: needs at least {min(p, 2)} distinct x values")
    lower, upper = model.bounds(x, y) if model.bounds else (model.lower, model.upper)
    best = None
    for start in model.guess(x, y):
        p0 = [_inside(start[k], lo, hi) for k, lo, hi in zip(model.param_names, lower, upper)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OptimizeWarning)
                warnings.simplefilter("ignore", RuntimeWarning)
                popt, pcov = curve_fit(model.func, x, y, p0=p0, bounds=(lower, upper),
                                       maxfev=5000)
        except (RuntimeError, ValueError):
            continue
        y_hat = model.func(x, *popt)
        if not np.all(np.isfinite(y_hat)):
            continue
        sse = float(np.sum((y - y_hat) ** 2))
        if best is None or sse < best[0]:
            best = (sse, popt, pcov, y_hat)
    if best is None:
        raise FitError(f"{model.name}: the fit did not converge from any initial guess")
    _, popt, pcov, y_hat = best
    perr = np.sqrt(np.diag(pcov)) if np.all(np.isfinite(pcov)) else [None] * p
    stderr = {k: (float(e) if e is not None and np.isfinite(e) else None)
              for k, e in zip(model.param_names, perr)}
    if x.size <= p:
        # An exactly determined fit has no residual degrees of freedom.
        stderr = {k: None for k in model.param_names}
    return FitResult(name=model.name,
                     params={k: float(v) for k, v in zip(model.param_names, popt)},
                     stderr=stderr, r2=r_squared(y, y_hat), n_samples=int(x.size))


def _inside(v: float, lo: float, hi: float) -> float:
    """A start value strictly inside (lo, hi), as the trust-region method requires."""
    if np.isfinite(lo) and np.isfinite(hi):
        eps = 1e-9 * (hi - lo)
        return min(max(v, lo + eps), hi - eps)
    if np.isfinite(lo):
        return max(v, lo + 1e-12 * max(1.0, abs(lo)))
    if np.isfinite(hi):
        return min(v, hi - 1e-12 * max(1.0, abs(hi)))
    return v


def fit_usl(n, throughput) -> FitResult:
    """Fit USL throughput X(N) = lam N / (1 + sigma (N-1) + kappa N (N-1)) to
    (concurrency, throughput) pairs (SABER, section IV-B; sigma in [0, 1], kappa >= 0)."""
    return fit_curve(USL_THROUGHPUT, n, throughput)


def fit_speed_models(n, speed) -> dict[str, Any]:
    """Fit per-request speed v(N) with the USL, linear and logistic shapes (SABER's
    comparison) and pick the one with the highest R².

    Returns ``{"usl": FitResult, "linear": FitResult, "logistic": FitResult,
    "best": "usl"}``; a shape whose fit fails is left out (``"failed"`` then maps
    its short name to the reason). Raises :class:`FitError` if every shape fails.
    """
    out: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for short, model in SPEED_MODELS.items():
        try:
            out[short] = fit_curve(model, n, speed)
        except FitError as e:
            failed[short] = str(e)
    if not out:
        raise FitError("speed: no model could be fitted: " + "; ".join(failed.values()))
    # Ties keep the order usl, logistic, linear (SABER's preference).
    order = {"usl": 0, "logistic": 1, "linear": 2}
    out["best"] = max((k for k in out), key=lambda k: (round(out[k].r2, 12), -order[k]))
    if failed:
        out["failed"] = failed
    return out


def _ols(columns: dict[str, np.ndarray], y: np.ndarray, *,
         nonneg: bool = False) -> tuple[dict, dict, np.ndarray, list]:
    """OLS of y on an intercept ``a`` plus ``columns``. A column without variation is
    not identifiable apart from the intercept: its coefficient is fixed at 0. With
    ``nonneg``, a column whose coefficient comes out negative is fixed at 0 too and the
    rest refitted, the most negative first (an active set over the slopes: a cost that
    the data cannot tell from noise is no cost, not a saving)."""
    fixed = [name for name, col in columns.items() if np.ptp(col) == 0]
    while True:
        names = ["a", *(n for n in columns if n not in fixed)]
        X = np.column_stack([np.ones_like(y), *(columns[n] for n in names[1:])])
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        negative = [(c, n) for n, c in zip(names[1:], coef[1:]) if c < 0]
        if not (nonneg and negative):
            break
        fixed.append(min(negative)[1])
    y_hat = X @ coef
    dof = y.size - len(names)
    stderr: dict[str, float | None] = {}
    if dof > 0:
        s2 = float(np.sum((y - y_hat) ** 2)) / dof
        cov = s2 * np.linalg.pinv(X.T @ X)
        for i, name in enumerate(names):
            v = cov[i, i]
            stderr[name] = float(np.sqrt(v)) if np.isfinite(v) and v >= 0 else None
    else:
        stderr = {name: None for name in names}
    params = {name: float(c) for name, c in zip(names, coef)}
    for name in fixed:
        params[name] = 0.0
        stderr[name] = None
    return params, stderr, y_hat, fixed


def fit_step_time(b, c, step_s, kv_tokens=None, *, method: str = "ols") -> FitResult:
    """Fit the engine's step time T(b, c, kv) (Pang et al., PD fusion), the one fitter of
    tuned's step-time model, by one of two methods that each earn their place:

    * ``"ols"`` (profiles): T(b, c) = a + beta b + gamma c by ordinary least squares,
      with standard errors, each slope held at 0 where it fits below 0 (on a model whose
      step is all fixed cost, noise can give a decode or a prompt token a negative
      cost, which a profile may not carry: :func:`tuned.curves.profile.load_profile`
      refuses it), and T = a + beta b + gamma c + eta kv_tokens when
      ``kv_tokens`` is given and the KV term raises adjusted R² with eta > 0
      (attention cost grows with the KV tokens read, so a negative eta is noise, not
      a model). The result's name says which model won (``step_time`` or
      ``step_time_kv``) and ``note`` gives both adjusted R² values.
    * ``"nnls"`` (the controller's online fit on the engine's own recent steps):
      non-negative least squares of T on (1, b, c, kv): a step never gets faster with
      more work, and a negative coefficient would size the token budget without
      bound. Columns are scaled so the solver sees numbers of one size (kv is in the
      thousands). Always ``step_time_kv``; no standard errors; ``r2`` is None when
      every step took the same time.

    ``step_s`` are the measured step times (seconds). :class:`FitError` when fewer
    than 3 finite samples remain or the solver fails.
    """
    if method == "nnls":
        return _fit_step_time_nnls(b, c, step_s, kv_tokens)
    if method != "ols":
        raise ValueError(f"fit_step_time: method must be 'ols' or 'nnls', got {method!r}")
    b = np.asarray(b, dtype=float).ravel()
    c = np.asarray(c, dtype=float).ravel()
    y = np.asarray(step_s, dtype=float).ravel()
    arrays = [b, c, y]
    if kv_tokens is not None:
        kv = np.asarray(kv_tokens, dtype=float).ravel()
        arrays.append(kv)
    if len({a.size for a in arrays}) != 1:
        raise FitError("step_time: b, c, step_s" + (", kv_tokens" if kv_tokens is not None
                                                     else "") + " differ in length")
    ok = np.all([np.isfinite(a) for a in arrays], axis=0)
    b, c, y = b[ok], c[ok], y[ok]
    if y.size < 3:
        raise FitError(f"step_time: needs at least 3 samples, got {y.size}")

    slopes = {"beta": b, "gamma": c}
    params, stderr, y_hat, fixed = _ols(slopes, y, nonneg=True)
    r2 = r_squared(y, y_hat)
    adj = adjusted_r2(r2, y.size, 2 - len(fixed))
    notes = [_fixed_note(name, slopes[name]) for name in fixed]
    result = FitResult("step_time", {k: params[k] for k in ("a", "beta", "gamma")},
                       {k: stderr[k] for k in ("a", "beta", "gamma")}, r2, int(y.size),
                       adj_r2=adj)
    if kv_tokens is not None:
        kv = kv[ok]
        p2, s2, y_hat2, fixed2 = _ols({**slopes, "eta": kv}, y, nonneg=True)
        r2_kv = r_squared(y, y_hat2)
        adj_kv = adjusted_r2(r2_kv, y.size, 3 - len(fixed2))
        keep = ("eta" not in fixed2 and adj_kv is not None and p2["eta"] > 0
                and (adj is None or adj_kv > adj))
        cmp = (f"adj R² {_fmt(adj_kv)} with KV term vs {_fmt(adj)} without"
               + (f", eta = {p2['eta']:.3g} <= 0" if p2.get("eta", 0.0) <= 0 else ""))
        if keep:
            notes = [_fixed_note(name, slopes[name]) for name in fixed2 if name != "eta"]
            notes.append("KV term kept: " + cmp)
            result = FitResult("step_time_kv",
                               {k: p2[k] for k in ("a", "beta", "gamma", "eta")},
                               {k: s2[k] for k in ("a", "beta", "gamma", "eta")},
                               r2_kv, int(y.size), adj_r2=adj_kv)
        else:
            notes.append("KV term dropped: " + cmp)
    return FitResult(result.name, result.params, result.stderr, result.r2, result.n_samples,
                     adj_r2=result.adj_r2, note="; ".join(notes))


def _fixed_note(name: str, col: np.ndarray) -> str:
    what = "b" if name == "beta" else "c"
    if np.ptp(col) == 0:
        return f"{name} fixed at 0 (no variation in {what})"
    return f"{name} fixed at 0 (fitted below 0: no measurable cost per unit of {what})"


def _fit_step_time_nnls(b, c, step_s, kv_tokens) -> FitResult:
    from scipy.optimize import nnls

    kv = np.zeros(len(step_s)) if kv_tokens is None else np.asarray(kv_tokens, float)
    X = np.column_stack([np.ones(len(step_s)), np.asarray(b, float), np.asarray(c, float),
                         kv])
    y = np.asarray(step_s, float)
    ok = np.isfinite(X).all(axis=1) & np.isfinite(y)
    X, y = X[ok], y[ok]
    if len(y) < 3:
        raise FitError(f"step_time: needs at least 3 samples, got {len(y)}")
    scale = np.maximum(np.abs(X).max(axis=0), 1e-12)
    try:
        coef, _ = nnls(X / scale, y, maxiter=50 * X.shape[1])
    except RuntimeError as e:
        raise FitError(f"step_time: non-negative least squares failed: {e}") from None
    coef = coef / scale
    pred = X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else None
    names = ("a", "beta", "gamma", "eta")
    return FitResult("step_time_kv", {k: float(v) for k, v in zip(names, coef)},
                     {k: None for k in names}, r2, int(len(y)),
                     note="non-negative least squares")


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


class KvDemand(NamedTuple):
    """Mean and variance of KV tokens per request (l = l_in + l_out, Pang et al.'s Algorithm 1)."""

    mean: float
    var: float


def kv_demand(tokens_per_request) -> KvDemand:
    """Mean and variance of the per-request KV token demand l_in + l_out, the mu and
    sigma² of Pang et al.'s Algorithm 1, computed exactly as the controller's memory bound
    computes them (:func:`tuned.core.window.demand_moments` in tokens: population
    variance over the window)."""
    from tuned.core.window import demand_moments

    x = np.asarray(tokens_per_request, dtype=float).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        raise FitError("kv_demand: no requests")
    m = demand_moments([int(round(v)) for v in x], 1)
    return KvDemand(float(m.mean), float(m.std) ** 2)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype_bytes: int) -> int:
    """KV-cache bytes per token = 2 · layers · kv_heads · head_dim · bytes
    (BucketServe; the 2 counts keys and values)."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes
