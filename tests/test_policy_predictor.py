"""Output-length predictor and request-hint parsing."""

import math

import numpy as np
import pytest

from tuned.policies.predictor import (OutputLengthPredictor, RequestHints, parse_request_hints,
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
    # the middle bucket (32 <= p < 512) has no samples: global window of 8 -> median
    # sorted [20,20,20,20,400,400,400,400], index ceil(0.5*7)=4 -> 400
    assert p.predict(100, 1000) == 400


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
