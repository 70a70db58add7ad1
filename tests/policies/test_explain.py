"""Whether the cap binds, in words, on every decision the controller makes."""

from __future__ import annotations

from tuned.core.types import Observation
from tuned.policies.explain import cap_binding


def obs(running, waiting, binding=0.0, held=None):
    return Observation(num_running=running, num_waiting=waiting, kv_capacity_blocks=1000,
                       demand_mean=None, demand_std=None, demand_samples=0,
                       tbt_mean_s=None, decode_batch_mean=None, binding=binding, held=held)


def test_binds_when_requests_wait_at_a_full_cap():
    assert cap_binding(obs(8, 5, 0.36), 8) == {
        "cap_binds": True,
        "cap_note": "the cap binds: 8 running at cap 8, 5 waiting (full with requests "
                    "waiting on 36% of the window's steps)"}


def test_does_not_bind_under_a_light_load():
    assert cap_binding(obs(4, 0), 16) == {
        "cap_binds": False,
        "cap_note": "the cap does not bind: 4 running under cap 16, nothing waiting "
                    "(full with requests waiting on 0% of the window's steps)"}
    assert cap_binding(obs(16, 0, 0.1), 16)["cap_note"] == (
        "the cap does not bind: 16 running at cap 16, nothing waiting (full with requests "
        "waiting on 10% of the window's steps)")


def test_requests_waiting_under_the_cap_are_held_by_something_else():
    got = cap_binding(obs(13, 22), 20)
    assert got["cap_binds"] is False
    assert got["cap_note"] == (
        "the cap does not bind: 13 running under cap 20 while 22 wait, held by the token "
        "budget, the admission guard, the queue policy or the KV cache, not by the cap "
        "(full with requests waiting on 0% of the window's steps)")


def test_the_note_names_what_in_tuneds_queue_held_them_since_the_last_tick():
    tail = " (full with requests waiting on 0% of the window's steps)"
    assert cap_binding(obs(2, 3, held=(("tpot_guard", 14),)), 10)["cap_note"] == (
        "the cap does not bind: 2 running under cap 10 while 3 wait, held by the "
        "admission guard's TPOT check (14 holds) since the last decision, not by the cap"
        + tail)
    assert cap_binding(obs(2, 3, held=(("tpot_guard", 4), ("ttft_guard", 1),
                                       ("queue_policy", 2))), 10)["cap_note"] == (
        "the cap does not bind: 2 running under cap 10 while 3 wait, held by the "
        "admission guard's TPOT check (4 holds), the admission guard's TTFT check (1 "
        "hold) and the queue policy (2 holds) since the last decision, not by the cap"
        + tail)
    # tuned's queue held none: what holds admissions without counting them
    assert cap_binding(obs(2, 3, held=()), 10)["cap_note"] == (
        "the cap does not bind: 2 running under cap 10 while 3 wait, held by the token "
        "budget or the KV cache (tuned's queue held no admission since the last "
        "decision), not by the cap" + tail)
    # a binding cap says so whatever else held
    assert cap_binding(obs(10, 3, held=(("tpot_guard", 1),)), 10)["cap_binds"] is True


def test_a_request_that_just_finished_does_not_unbind_the_cap():
    # between two steps one under a cap of 3 with 20 waiting; the window was full
    got = cap_binding(obs(2, 20, 0.9), 3)
    assert got == {"cap_binds": True,
                   "cap_note": "the cap binds: 2 running under cap 3, 20 waiting (full with "
                               "requests waiting on 90% of the window's steps)"}
    assert cap_binding(obs(2, 20, 0.49), 3)["cap_binds"] is False


def test_explained_adds_the_binding_and_names_the_first_reason():
    from tuned.core.types import Decision
    from tuned.policies.explain import explained

    dec = Decision(8, 1, 16, 8, 8, 512, "initial", inputs={"b_mem": 12})
    out = explained(dec, obs(8, 5, 0.36), "profile_initial")
    assert out.reason == "profile_initial" and dec.reason == "initial"   # a copy
    assert out.inputs == {"b_mem": 12, **cap_binding(obs(8, 5, 0.36), 8)}
    # after the first decision, or for another reason, the policy's reason stands
    assert explained(dec, obs(8, 5), None).reason == "initial"
    assert explained(Decision(8, 1, 16, 8, 8, 512, "memory"), obs(8, 5),
                     "profile_initial").reason == "memory"
    # anything but a Decision with an integer cap is handed back as it is (a fault)
    bad = Decision(8.5, 1, 16, 8.5, 8, 512, "initial")
    assert explained(bad, obs(8, 5), "x") is bad and explained(None, obs(8, 5)) is None
