"""Port picking for child servers stays out of the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket

from tuned.base import netutil


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    lo, hi = netutil.ephemeral_range()
    assert 0 < lo <= hi
    port = netutil.free_port(rng=random.Random(1))
    assert 10000 <= port < lo
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # still free


def test_free_port_skips_a_taken_port_and_the_avoid_list():
    rng_seed = 7
    first = netutil.free_port(rng=random.Random(rng_seed))
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        again = netutil.free_port(rng=random.Random(rng_seed))
        assert again != first
    other = netutil.free_port(rng=random.Random(rng_seed), avoid=(first,))
    assert other != first
