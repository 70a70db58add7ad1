"""Output-length predictor and request-hint parsing."""

import math

import numpy as np
import pytest

from tuned.core.predictor import (OutputLengthPredictor, RequestHints, parse_request_hints,
                                      upper_quantile)


# ---------------------------------------------------------------- predictor
def test_before_any_finished_request_predict_max_tokens():
    p = OutputLengthPredictor()
    assert p.predict(100, 256) == 256
    assert p.predict(100, 256, overestimate=True) == 256


def test_hint_wins_and_is_capped_at_max_tokens():
    p = OutputLengthPredictor(min_samples=1)
    for _ in range(10):
        p.observe(100, 50)
    assert p.predict(100, 256) == 50
    assert p.predict(100, 256, hint=7) == 7
    assert p.predict(100, 256, hint=1000) == 256


def test_estimate_never_above_max_tokens():
    p = OutputLengthPredictor(min_samples=2)
    for n in (500, 600, 700):
        p.observe(10, n)
    assert p.estimate(10) == 600
    assert p.predict(10, 100) == 100
    assert p.predict(10, 100, overestimate=True) == 100


def test_quantiles_and_overestimate_mode_on_known_sample():
    p = OutputLengthPredictor(quantile=0.5, overestimate_quantile=0.9, min_samples=8)
    sample = list(range(1, 101))                       # outputs 1..100
    for n in sample:
        p.observe(10, n)
    # upper neighbour at index ceil(q*(n-1)): q=0.5 -> ceil(49.5)=50 -> 51; q=0.9 -> 90 -> 91
    assert p.predict(10, 1000) == 51
    assert p.predict(10, 1000, overestimate=True) == 91
    for q in (0.5, 0.75, 0.9, 0.95, 0.99):
        got = upper_quantile(sorted(sample), q)
        assert got >= np.quantile(sample, q)                       # linear (default)
        assert got >= np.quantile(sample, q, method="inverted_cdf")
        assert got == np.quantile(sample, q, method="higher")
    # at least 90 % of the observed outputs are <= the over-estimate
    assert sum(n <= 91 for n in sample) / len(sample) >= 0.9


def test_prompt_length_buckets_learn_separately_with_global_fallback():
    p = OutputLengthPredictor(min_samples=4, prompt_bucket_edges_tokens=(32, 512))
    for _ in range(4):
        p.observe(10, 20)          # short prompts -> short answers
        p.observe(1000, 400)       # long prompts  -> long answers
    assert p.predict(5, 1000) == 20
    assert p.predict(2000, 1000) == 400
    # the middle bin (32 <= p < 512) has no samples: interpolate in log prompt length
    # between the trained neighbours' centres, sqrt(1*32) = 5.66 and sqrt(512*2048) =
    # 1024: w = (ln 100 - ln 5.66) / (ln 1024 - ln 5.66) = 0.5527 -> 20 + 0.5527 * 380
    # = 230.0 -> 230
    assert p.predict(100, 1000) == 230


def test_prediction_has_real_resolution():
    """600 lognormal outputs growing with the prompt gave only {56, 58, 64}
    from one quantile per prompt bucket; the interpolated estimate moves with the
    prompt length."""
    import random

    rng = random.Random(3)
    p = OutputLengthPredictor()
    prompts = [int(rng.lognormvariate(5.0, 1.0)) + 1 for _ in range(600)]
    for pr in prompts:
        p.observe(pr, max(1, int(rng.lognormvariate(math.log(pr) * 0.6 + 1.5, 0.5))))
    preds = {p.predict(pr, 4096) for pr in range(10, 3000, 7)}
    assert len(preds) >= 50
    # and it follows the trend: longer prompts, longer predicted outputs
    assert p.predict(2000, 4096) > 2 * p.predict(20, 4096)


def test_ratio_estimate_wins_when_max_tokens_tracks_the_answer():
    p = OutputLengthPredictor()
    for i in range(200):
        m = 16 + (i * 37) % 500
        p.observe(100, m, max_tokens=m)          # the answer always fills max_tokens
    assert p.predict(100, 50) == 50
    assert p.predict(100, 400) == 400
    # unrelated max_tokens: the direct estimate wins
    q = OutputLengthPredictor()
    for i in range(200):
        q.observe(100, 60 + i % 5, max_tokens=16 + (i * 37) % 4000)
    assert 60 <= q.predict(100, 4000) <= 64


def test_under_prediction_rate_and_excess():
    p = OutputLengthPredictor()
    p.observe(10, 150, predicted=100)     # 50 % beyond the plan
    p.observe(10, 80, predicted=100)
    p.observe(10, 100, predicted=100)
    p.observe(10, 120, predicted=100)     # 20 %
    e = p.error_stats()
    assert e.under_rate == pytest.approx(0.5)
    assert e.under_excess == pytest.approx((0.5 + 0.2) / 4)
    assert p.under_excess == pytest.approx(0.175)


def test_error_stats():
    p = OutputLengthPredictor()
    p.observe(10, 7, predicted=10)     # +3
    p.observe(10, 9, predicted=5)      # -4
    p.observe(10, 9)                   # no prediction: learns, no error sample
    e = p.error_stats()
    assert e.count == 2
    assert e.mean_abs_error_tokens == pytest.approx(3.5)
    assert e.mean_error_tokens == pytest.approx(-0.5)
    assert e.last_errors == (3, -4)


def test_bad_predictor_options():
    with pytest.raises(ValueError, match=r"overestimate_quantile: must be in \(0, 1\], got 1.5"):
        OutputLengthPredictor(overestimate_quantile=1.5)
    with pytest.raises(ValueError, match="strictly increasing"):
        OutputLengthPredictor(prompt_bucket_edges_tokens=(64, 32))


# ---------------------------------------------------------------- hints
def test_hints_accepted():
    h, w = parse_request_hints({"tuned_deadline_s": 2.5, "tuned_output_tokens": 64})
    assert h == RequestHints(output_tokens=64, deadline_s=2.5) and w == []
    h, w = parse_request_hints({"tuned_output_tokens": 12.0})
    assert h.output_tokens == 12 and w == []
    assert parse_request_hints(None) == (RequestHints(), [])
    assert parse_request_hints({"other": 1}) == (RequestHints(), [])


@pytest.mark.parametrize("value, shown", [
    (-3, "-3"), (0, "0"), ("soon", "'soon'"), ("5", "'5'"), (math.nan, "nan"),
    (math.inf, "inf"), (True, "True"), (None, "None"), ([1], "[1]"),
])
def test_bad_deadline_ignored_with_warning(value, shown):
    h, w = parse_request_hints({"tuned_deadline_s": value, "tuned_output_tokens": 5})
    assert h.deadline_s is None and h.output_tokens == 5
    assert w == [f"tuned_deadline_s: must be a number > 0, got {shown}; ignored"]


def test_exact_warning_text_for_negative_deadline():
    _, w = parse_request_hints({"tuned_deadline_s": -3})
    assert w == ["tuned_deadline_s: must be a number > 0, got -3; ignored"]


@pytest.mark.parametrize("value, shown", [
    (0, "0"), (-1, "-1"), (2.5, "2.5"), ("12", "'12'"), (False, "False"), (math.nan, "nan"),
])
def test_bad_output_tokens_ignored_with_warning(value, shown):
    h, w = parse_request_hints({"tuned_output_tokens": value})
    assert h.output_tokens is None
    assert w == [f"tuned_output_tokens: must be an integer >= 1, got {shown}; ignored"]


def test_sla_class_table():
    table = {"gold": 2.0, "silver": 10.0}
    h, w = parse_request_hints({"tuned_class": "gold"}, table)
    assert h.deadline_s == 2.0 and h.sla_class == "gold" and w == []
    h, w = parse_request_hints({"tuned_class": "gold", "tuned_deadline_s": 7}, table)
    assert h.deadline_s == 7.0 and w == []                     # explicit deadline wins
    h, w = parse_request_hints({"tuned_class": "bronze"}, table)
    assert h.deadline_s is None
    assert w == ["tuned_class: unknown class 'bronze' (known: gold, silver); ignored"]
    _, w = parse_request_hints({"tuned_class": "gold"})
    assert w == ["tuned_class: unknown class 'gold' (known: none configured); ignored"]
    _, w = parse_request_hints({"tuned_class": 3}, table)
    assert w == ["tuned_class: must be a string, got 3; ignored"]


def test_non_mapping_extra_args():
    h, w = parse_request_hints(["tuned_deadline_s", 3])
    assert h == RequestHints()
    assert w == ["extra_args: must be a mapping, got ['tuned_deadline_s', 3]; ignored"]
