"""Fits recover known parameters from seeded noisy samples; R² and helpers by hand."""

import numpy as np
import pytest

from tuned.core.window import MAX_PRESENT_PROMPTS, demand_moments, present_pairs

from tuned.curves import models as m
from tuned.curves.fit import (FitError, FitResult, adjusted_r2, fit_speed_models,
                              fit_step_time, fit_usl, kv_bytes_per_token, kv_demand,
                              r_squared)

# Concurrency levels as a sweep visits them, 20 requests each.
N = np.repeat([1, 2, 4, 8, 16, 24, 32, 48, 64], 20).astype(float)


def noisy(y, rel, seed=0):
    return y * (1 + np.random.default_rng(seed).normal(0, rel, np.shape(y)))


def test_r_squared_hand_value():
    # SS_res = .01+.01+.04+.04 = 0.10, SS_tot = 5 -> R² = 0.98
    assert r_squared([1, 2, 3, 4], [1.1, 1.9, 3.2, 3.8]) == pytest.approx(0.98, abs=1e-12)
    assert r_squared([1, 2, 3], [1, 2, 3]) == 1.0
    assert r_squared([2, 2, 2], [2, 2, 2]) == 1.0  # no variance, exact
    assert r_squared([2, 2, 2], [1, 2, 3]) == 0.0  # no variance, not exact


def test_adjusted_r2_hand_value():
    # 1 - (1 - 0.9) * (10 - 1) / (10 - 2 - 1) = 1 - 0.9/7
    assert adjusted_r2(0.9, 10, 2) == pytest.approx(1 - 0.9 / 7)
    assert adjusted_r2(0.9, 3, 2) is None


def test_fit_usl_recovers_parameters_within_5_percent():
    x = noisy(m.usl_throughput(N, 50.0, 0.05, 0.002), 0.02)
    f = fit_usl(N, x)
    assert f.name == "usl_throughput"
    assert f.params["lam"] == pytest.approx(50.0, rel=0.05)
    assert f.params["sigma"] == pytest.approx(0.05, rel=0.05)
    assert f.params["kappa"] == pytest.approx(0.002, rel=0.05)
    assert f.r2 > 0.99
    assert f.n_samples == N.size
    assert all(f.stderr[k] is not None and f.stderr[k] > 0 for k in ("lam", "sigma", "kappa"))


def test_fit_usl_exact_data_has_r2_one():
    n = np.array([1, 2, 4, 8, 16, 32], dtype=float)
    f = fit_usl(n, m.usl_throughput(n, 40.0, 0.1, 0.01))
    assert f.r2 == pytest.approx(1.0, abs=1e-9)
    assert f.params["sigma"] == pytest.approx(0.1, rel=1e-4)


def test_fit_speed_models_usl_data_picks_usl():
    v = noisy(m.usl_speed(N, 50.0, 0.05, 0.002), 0.01, seed=1)
    fits = fit_speed_models(N, v)
    assert fits["best"] == "usl"
    assert set(fits) >= {"usl", "linear", "logistic", "best"}
    u = fits["usl"]
    assert u.name == "usl_speed"
    assert u.params["lam"] == pytest.approx(50.0, rel=0.05)
    assert u.params["sigma"] == pytest.approx(0.05, rel=0.05)
    assert u.params["kappa"] == pytest.approx(0.002, rel=0.05)
    assert fits["usl"].r2 > fits["linear"].r2


def test_fit_speed_models_logistic_data_recovers_logistic():
    n = np.repeat(np.arange(1, 41), 10).astype(float)
    v = noisy(m.logistic_speed(n, 100.0, 0.2, 20.0), 0.01, seed=2)
    fits = fit_speed_models(n, v)
    assert fits["best"] == "logistic"
    p = fits["logistic"].params
    assert p["vmax"] == pytest.approx(100.0, rel=0.05)
    assert p["k"] == pytest.approx(0.2, rel=0.05)
    assert p["n0"] == pytest.approx(20.0, rel=0.05)


def test_fit_speed_models_linear_data_recovers_linear():
    n = np.repeat(np.arange(1, 41), 10).astype(float)
    v = m.linear_speed(n, 100.0, -1.2) + np.random.default_rng(3).normal(0, 0.5, n.size)
    fits = fit_speed_models(n, v)
    assert fits["best"] == "linear"
    assert fits["linear"].params["a"] == pytest.approx(100.0, rel=0.05)
    assert fits["linear"].params["b"] == pytest.approx(-1.2, rel=0.05)
    # R² reported is R² of that model on the data
    assert fits["linear"].r2 == pytest.approx(
        r_squared(v, m.linear_speed(n, **fits["linear"].params)), abs=1e-12)


def _steps(seed, eta):
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 33, 600)
    c = rng.choice([0, 0, 0, 64, 128, 256], 600)
    kv = b * rng.integers(50, 300, 600)
    y = m.step_time_kv(b, c, kv, 0.004, 0.0006, 0.00002, eta) + rng.normal(0, 0.0002, 600)
    return b, c, kv, y


def test_fit_step_time_recovers_parameters_and_keeps_kv_term():
    b, c, kv, y = _steps(4, 1e-7)
    f = fit_step_time(b, c, y, kv_tokens=kv)
    assert f.name == "step_time_kv"
    assert f.params["a"] == pytest.approx(0.004, rel=0.05)
    assert f.params["beta"] == pytest.approx(0.0006, rel=0.05)
    assert f.params["gamma"] == pytest.approx(0.00002, rel=0.05)
    assert f.params["eta"] == pytest.approx(1e-7, rel=0.10)
    assert "KV term kept" in f.note
    assert f.adj_r2 is not None and f.adj_r2 <= f.r2


def test_fit_step_time_without_kv_samples():
    b, c, _, y = _steps(5, 0.0)
    f = fit_step_time(b, c, y)
    assert f.name == "step_time"
    assert set(f.params) == {"a", "beta", "gamma"}
    assert f.params["beta"] == pytest.approx(0.0006, rel=0.05)
    assert f.params["gamma"] == pytest.approx(0.00002, rel=0.05)


def test_fit_step_time_drops_kv_term_that_does_not_help():
    b, c, kv, y = _steps(5, 0.0)
    f = fit_step_time(b, c, y, kv_tokens=kv)
    assert f.name == "step_time"
    assert "KV term dropped" in f.note


def test_fit_step_time_exact_ols_and_constant_column():
    # y = 1 + 2b exactly, c constant: gamma is not identifiable and fixed at 0
    b = np.array([1, 2, 3, 4, 5], dtype=float)
    f = fit_step_time(b, np.zeros(5), 1 + 2 * b)
    assert f.params == pytest.approx({"a": 1.0, "beta": 2.0, "gamma": 0.0})
    assert f.stderr["gamma"] is None
    assert f.r2 == pytest.approx(1.0)
    assert "gamma fixed at 0" in f.note


def test_fit_step_time_holds_a_slope_that_fits_below_zero_at_zero():
    """A step that is all fixed cost (the tiny demo model): noise gives the decode term
    a negative slope under plain OLS, which no profile may carry; it is held at 0 and
    the rest refitted exactly."""
    b = np.array([1, 2, 3, 4, 1, 2, 3, 4], dtype=float)
    c = np.array([0, 0, 0, 0, 32, 32, 32, 32], dtype=float)
    y = 0.004 + 0.00001 * c - 0.00001 * np.array([0, 1, 2, 3, 0, 1, 2, 3])
    assert np.linalg.lstsq(np.column_stack([np.ones(8), b, c]), y, rcond=None)[0][1] < 0
    f = fit_step_time(b, c, y)
    assert f.params["beta"] == 0.0 and f.stderr["beta"] is None
    assert f.params["gamma"] == pytest.approx(0.00001)
    assert f.params["a"] == pytest.approx(0.004 - 0.000015)
    assert "beta fixed at 0 (fitted below 0: no measurable cost per unit of b)" in f.note
    g = fit_step_time(b, c, y, kv_tokens=100 * b)
    assert min(g.params.values()) >= 0.0


def test_fits_reject_too_few_samples():
    with pytest.raises(FitError, match="usl_throughput: needs at least 3 samples, got 2"):
        fit_usl([1, 2], [10, 18])
    with pytest.raises(FitError, match="step_time: needs at least 3 samples"):
        fit_step_time([1, 2], [0, 0], [0.1, 0.2])


def test_fit_result_round_trip_and_predict():
    f = fit_usl([1, 2, 4, 8, 16], m.usl_throughput(np.array([1, 2, 4, 8, 16]), 40, 0.1, 0.01))
    g = FitResult.from_dict(f.to_dict())
    assert g == f
    assert g.predict(4) == pytest.approx(160 / 1.42, rel=1e-4)
    with pytest.raises(ValueError, match="'params' is missing kappa"):
        FitResult.from_dict({"name": "usl_speed", "params": {"lam": 1, "sigma": 0},
                             "r2": 1, "n_samples": 3})
    with pytest.raises(ValueError, match="unknown model name 'cubic'"):
        FitResult.from_dict({"name": "cubic", "params": {}, "r2": 1, "n_samples": 3})


def test_kv_demand_is_the_controllers_moments_in_tokens():
    # one definition of the demand moments: population variance over the
    # window, as the memory bound computes them, in tokens (block size 1)
    d = kv_demand([100, 200, 300, 400])
    assert d.mean == pytest.approx(250.0)
    assert d.var == pytest.approx(12500.0)  # np.var(ddof=0)
    m = demand_moments([100, 200, 300, 400], 1)
    assert (m.mean, m.std ** 2) == (pytest.approx(d.mean), pytest.approx(d.var))
    assert kv_demand([7]).var == 0.0
    with pytest.raises(FitError):
        kv_demand([])


def test_kv_bytes_per_token_bucketserve():
    # Llama-2-7B fp16: 2 * 32 layers * 32 heads * 128 dim * 2 bytes = 524288 B = 0.5 MiB
    assert kv_bytes_per_token(32, 32, 128, 2) == 524288
    # Llama-3-8B GQA: 8 KV heads
    assert kv_bytes_per_token(32, 8, 128, 2) == 131072


def test_one_fitter_two_methods_for_the_step_time():
    """fit_step_time is the one fitter of T(b, c, kv): OLS (profiles) and NNLS (the
    online fit) recover the same known coefficients from clean samples; NNLS never
    returns a negative coefficient; an unknown method is refused by name."""
    rng = np.random.default_rng(3)
    b = rng.integers(1, 33, 400).astype(float)
    c = rng.choice([0, 0, 64, 256], 400).astype(float)
    kv = b * rng.integers(50, 400, 400)
    t = 0.004 + 0.0005 * b + 0.00002 * c + 1e-7 * kv
    ols = fit_step_time(b, c, t, kv_tokens=kv)
    nn = fit_step_time(b, c, t, kv_tokens=kv, method="nnls")
    for f in (ols, nn):
        assert f.name == "step_time_kv"
        for k, v in {"a": 0.004, "beta": 0.0005, "gamma": 0.00002, "eta": 1e-7}.items():
            assert f.params[k] == pytest.approx(v, rel=1e-6, abs=1e-12), (f.note, k)
    # a decreasing cost in c: both hold gamma at 0 (a profile may not carry a negative
    # cost: load_profile refuses it), OLS saying so in its note
    t2 = 0.01 + 0.0005 * b - 0.00001 * c
    held = fit_step_time(b, c, t2, kv_tokens=kv)
    assert held.params["gamma"] == 0.0 and "gamma fixed at 0 (fitted below 0" in held.note
    assert held.params["beta"] == pytest.approx(0.0005, rel=1e-2)
    assert fit_step_time(b, c, t2, kv_tokens=kv, method="nnls").params["gamma"] == 0.0
    with pytest.raises(ValueError, match="method must be 'ols' or 'nnls', got 'ridge'"):
        fit_step_time(b, c, t, method="ridge")


def test_present_pairs_pair_each_prompt_with_the_finished_outputs_in_turn():
    assert present_pairs([100, 200], [1, 2, 3]) == [(100, 1), (200, 2), (100, 3)]
    assert present_pairs([100, 200, 300], [7]) == [(100, 7), (200, 7), (300, 7)]
    assert present_pairs([], [1, 2]) == [] and present_pairs([5], []) == []
    # a long queue is read by an even sample
    long = list(range(4 * MAX_PRESENT_PROMPTS))
    pairs = present_pairs(long, [1])
    assert len(pairs) == MAX_PRESENT_PROMPTS
    assert [p for p, _ in pairs[:3]] == [0, 4, 8] and pairs[-1][0] == long[-4]
