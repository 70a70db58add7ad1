"""Shape functions of tuned.curves.models against hand-computed values."""

import math

import numpy as np
import pytest

from tuned.curves import models as m


def test_usl_throughput_hand_values():
    # X(4) = 40*4 / (1 + 0.1*3 + 0.01*4*3) = 160 / 1.42
    assert m.usl_throughput(4, 40.0, 0.1, 0.01) == pytest.approx(160 / 1.42, rel=1e-12)
    assert m.usl_throughput(1, 40.0, 0.1, 0.01) == pytest.approx(40.0)


def test_usl_speed_is_throughput_over_n():
    n = np.array([1, 2, 4, 8, 16])
    x = m.usl_throughput(n, 40.0, 0.1, 0.01)
    np.testing.assert_allclose(m.usl_speed(n, 40.0, 0.1, 0.01), x / n, rtol=1e-12)
    assert m.usl_speed(4, 40.0, 0.1, 0.01) == pytest.approx(40 / 1.42)


def test_usl_peak_concurrency():
    # N* = sqrt((1 - 0.1) / 0.01) = sqrt(90)
    assert m.usl_peak_concurrency(0.1, 0.01) == pytest.approx(math.sqrt(90))
    assert m.usl_peak_concurrency(0.1, 0.0) == math.inf


def test_linear_and_logistic_speed():
    assert m.linear_speed(10, 100.0, -1.5) == pytest.approx(85.0)
    assert m.logistic_speed(20, 100.0, 0.2, 20.0) == pytest.approx(50.0)  # vmax/2 at n0
    # 100 / (1 + e^(0.2*(30-20))) = 100 / (1 + e^2)
    assert m.logistic_speed(30, 100.0, 0.2, 20.0) == pytest.approx(100 / (1 + math.e ** 2))
    # a wild exponent during fitting does not overflow
    assert m.logistic_speed(1e6, 100.0, 10.0, 0.0) == pytest.approx(0.0)


def test_step_time_models():
    # T = 0.004 + 0.0005*10 + 0.00001*100 = 0.010
    assert m.step_time(10, 100, 0.004, 0.0005, 0.00001) == pytest.approx(0.010)
    assert m.step_time_kv(10, 100, 2000, 0.004, 0.0005, 0.00001, 1e-6) == pytest.approx(0.012)


def test_models_registry_names_variables():
    assert m.MODELS["step_time_kv"][1] == ("b", "c", "kv_tokens")
    assert m.MODELS["usl_speed"][0] is m.usl_speed
