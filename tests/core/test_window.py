"""The windowed aggregates: the KV occupancy moments the memory bound sums, held to
their definition token by token."""

from __future__ import annotations

import math
import random

import pytest

from tuned.core.window import occupancy_moments


def _by_definition(requests, block_size):
    # one sample per decode step: the blocks held while writing output token t are
    # those of p + t + 1 tokens; a request without output holds its prompt's once
    bs = max(block_size, 1)
    samples = []
    for p, o in requests:
        p, o = max(p, 0), max(o, 0)
        samples += [-(-(p + t + 1) // bs) for t in range(o)] or [-(-p // bs)]
    mean = sum(samples) / len(samples)
    return mean, math.sqrt(max(sum(k * k for k in samples) / len(samples) - mean * mean, 0.0))


def test_occupancy_moments_hand_value():
    # prompt 3, output 3, blocks of 2 tokens: 4, 5, 6 tokens held -> 2, 3, 3 blocks
    m = occupancy_moments([(3, 3)], block_size=2)
    assert (m.mean, m.n) == (pytest.approx(8 / 3), 1)
    assert m.std == pytest.approx(math.sqrt(22 / 3 - (8 / 3) ** 2))


def test_occupancy_moments_are_the_step_weighted_samples_token_by_token():
    rng = random.Random(7)
    for _ in range(500):
        bs = rng.choice([1, 2, 16, 128])
        reqs = [(rng.randint(0, 600), rng.choice([0, 1, rng.randint(0, 400)]))
                for _ in range(rng.randint(1, 5))]
        m = occupancy_moments(reqs, block_size=bs)
        mean, std = _by_definition(reqs, bs)
        assert m.mean == pytest.approx(mean, rel=1e-12) and m.n == len(reqs), (reqs, bs)
        assert m.std == pytest.approx(std, rel=1e-9, abs=1e-9), (reqs, bs)


def test_no_request_has_no_moments():
    assert occupancy_moments([], block_size=16) == (None, None, 0)
