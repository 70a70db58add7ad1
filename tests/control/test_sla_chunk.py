"""The demo's derived SLA raised where no prefill chunk fits beside a decode."""

import pytest

from tuned.control.sla import CHUNK_HEADROOM, sla_fitting_chunk

# a burst fit measured on the CPU engine, where a prompt token cost 0.37 ms
FIT = {"a": 0.0068, "beta": 0.00054, "gamma": 0.00037}


def test_an_sla_below_one_decode_beside_the_smallest_chunk_is_raised():
    step = 0.0068 + 0.00054 + 32 * 0.00037           # 19.18 ms
    assert sla_fitting_chunk(0.0173, FIT, 32) == round(CHUNK_HEADROOM * step, 4) == 0.023


def test_an_sla_the_chunk_fits_under_is_kept():
    assert sla_fitting_chunk(0.0295, FIT, 32) == 0.0295
    # a smaller chunk fits under the same SLA: 6.8 + 0.54 + 8 x 0.37 = 10.3 ms
    assert sla_fitting_chunk(0.0173, FIT, 8) == 0.0173


@pytest.mark.parametrize("fit", [{}, None, {"a": 0.0068, "beta": 0.00054},
                                 {"a": "x", "beta": 0.0, "gamma": 0.0},
                                 {"a": float("nan"), "beta": 0.0, "gamma": 0.0}])
def test_without_a_usable_fit_the_sla_is_kept(fit):
    assert sla_fitting_chunk(0.0173, fit, 32) == 0.0173
