"""SABER (Algorithm 1): required speed, two-tier queue, admission, demotion."""

import random

import pytest

from tuned.core.queue_policy import AdmitContext, ReqInfo
from tuned.policies.saber import SaberPolicy


def R(rid, max_tokens, deadline, t=0.0, out=0):
    return ReqInfo(request_id=rid, arrival_s=t, prompt_tokens=10, max_tokens=max_tokens,
                   predicted_output=max_tokens, output_tokens=out, deadline_s=deadline)


def speed(n):
    """Per-request speed: 100 tok/s alone, 100/n with n running."""
    return 100.0 / n


def ctx(now, fn=speed):
    return AdmitContext(now_s=now, kv_capacity_tokens=10**6, kv_free_tokens=10**6, cap=64,
                        speed_tok_s=fn)


def test_required_speed_grows_while_waiting():
    # the paper's example: 500 tokens within 10 s -> 50 tok/s; after 5 s -> 100 tok/s
    p = SaberPolicy()
    r = R("a", 500, 10.0)
    assert p.required_speed(r, 0.0) == pytest.approx(50.0)
    assert p.required_speed(r, 5.0) == pytest.approx(100.0)
    assert p.required_speed(R("b", 500, None), 5.0) == 0.0
    assert p.required_speed(r, 10.0) == float("inf")


def test_demote_when_infeasible_even_alone():
    # the paper's example: 100 tok/s alone, request needs 120 tok/s -> low priority
    p = SaberPolicy()
    ok, bad, late = R("ok", 500, 10.0, t=0.0), R("bad", 1200, 10.0, t=0.5), R("late", 5, 0.0, t=1)
    out = p.order([bad, ok, late], 0.0, ctx(0.0))
    assert [r.request_id for r in out] == ["ok", "bad", "late"]   # LPQ in demotion order
    assert p.is_low("bad") and p.is_low("late") and not p.is_low("ok")
    assert p.stats.demoted == 2
    p.order([bad, ok, late], 0.0, ctx(0.0))                      # demoted once only
    assert p.stats.demoted == 2


def test_demotion_boundary_and_refresh_time():
    # 500 tokens by t=10, v(1)=100: infeasible once 500/(10-t) > 100, i.e. t > 5
    p = SaberPolicy()
    r = R("a", 500, 10.0)
    p.order([r], 0.0, ctx(0.0))
    assert not p.refresh([r], ctx(4.9))
    assert p.refresh([r], ctx(5.0))
    p.order([r], 5.0, ctx(5.0))          # 500/5 = 100, not < v(1): stays
    assert not p.is_low("a")
    p.order([r], 5.1, ctx(5.1))          # 500/4.9 = 102.04 > 100: demoted
    assert p.is_low("a")


def test_admission_checks_own_and_running_required_speeds():
    # r1 admitted at t=0 needing 300 tokens by t=10 -> recorded 30 tok/s
    p = SaberPolicy(window=1, running_check="recorded")
    r1 = R("r1", 300, 10.0)
    p.on_admitted(r1, 0.0)
    r2 = R("r2", 100, 10.0)
    p.on_admitted(r2, 0.0)                                  # recorded 10 tok/s
    c = R("c", 200, 10.0)                                   # needs 20 tok/s at t=0
    # 1 running: v(2) = 50 >= 20 and >= 30
    assert p.admit(c, [r1], [], ctx(0.0)).admit
    # 2 running: v(3) = 33.3 >= 30
    assert p.admit(c, [r1, r2], [], ctx(0.0)).admit
    # 3 running: v(4) = 25 < r1's 30
    v = p.admit(c, [r1, r2, R("r3", 1, None)], [], ctx(0.0))
    assert not v.admit and "would break running r1 (needs 30.0 tok/s)" in v.reason
    # own requirement: 400 tokens by t=10 = 40 tok/s; v(3) = 33.3 < 40
    v = p.admit(R("d", 400, 10.0), [r1, r2], [], ctx(0.0))
    assert not v.admit and "v(3) = 33.3 tok/s < required 40.0 tok/s" in v.reason


def test_recorded_speed_not_current_speed_protects_running():
    # r1 recorded 30 tok/s at admission; at t=5 it would need 60 tok/s, but SABER
    # compares against the recorded value: v(3) = 33.3 >= 30 -> admit
    p = SaberPolicy(running_check="recorded")
    r1 = R("r1", 300, 10.0)
    p.on_admitted(r1, 0.0)
    assert p.admit(R("c", 50, 10.0), [r1, R("r2", 1, None)], [], ctx(5.0)).admit


def test_random_window_of_hpq_head():
    # a needs 60 tok/s (feasible alone, v(1)=100) but v(2)=50 < 60; b needs 10
    a, b, c = R("a", 600, 10.0, t=0), R("b", 100, 10.0, t=1), R("c", 100, 10.0, t=2)
    running = [R("run", 1, None)]
    for seed in range(5):
        p = SaberPolicy(window=2, rng=random.Random(seed))
        ordered = p.order([a, b, c], 0.0, ctx(0.0))
        sel = p.select(ordered, running, [], ctx(0.0))
        assert sel.chosen is b                     # whatever the draw, b is admitted
    p = SaberPolicy(window=1)
    ordered = p.order([a, b, c], 0.0, ctx(0.0))
    sel = p.select(ordered, running, [], ctx(0.0))
    assert sel.chosen is None and sel.refused == (a,)   # window of 1: a blocks


def test_window_draw_is_seeded():
    reqs = [R(f"r{i}", 10, 100.0, t=float(i)) for i in range(6)]

    def draws(seed):
        p = SaberPolicy(window=4, rng=random.Random(seed))
        ordered = p.order(reqs, 0.0, ctx(0.0))
        return [p.select(ordered, [], [], ctx(0.0)).chosen.request_id for _ in range(5)]

    assert draws(3) == draws(3)
    assert set(draws(3)) <= {"r0", "r1", "r2", "r3"}


def test_low_priority_served_only_when_high_is_empty():
    p = SaberPolicy(window=1)
    hi = R("hi", 600, 10.0)                      # refused with 1 running (v(2)=50 < 60)
    lo = R("lo", 5, 0.0)                         # expired -> LPQ
    running = [R("run", 1, None)]
    ordered = p.order([hi, lo], 0.0, ctx(0.0))
    assert p.select(ordered, running, [], ctx(0.0)).chosen is None
    sel = p.select([lo], running, [], ctx(0.0))
    assert sel.chosen is lo and "best effort" in sel.verdict.reason


def test_without_profile_fcfs_but_expired_still_demoted():
    p = SaberPolicy(window=4)
    a, late, b = R("a", 10_000, 1.0, t=0), R("late", 5, 0.0, t=1), R("b", 5, 50.0, t=2)
    ordered = p.order([b, late, a], 0.0, ctx(0.0, fn=None))
    assert [r.request_id for r in ordered] == ["a", "b", "late"]
    assert p.stats.demoted == 1
    sel = p.select(ordered, [R("run", 1, None)], [], ctx(0.0, fn=None))
    assert sel.chosen is a and "no speed profile" in sel.verdict.reason


def test_default_deadline_option():
    p = SaberPolicy(default_deadline_s=4.0)
    r = R("a", 200, None, t=1.0)                  # deadline 1 + 4 = 5
    assert p.required_speed(r, 3.0) == pytest.approx(100.0)


def test_unrecorded_running_request_uses_current_speed_and_expired_is_ignored():
    p = SaberPolicy(running_check="recorded")
    c = R("c", 100, 10.0)                         # needs 10 tok/s at t=0
    # running u was admitted under another policy: current need 600/10 = 60 > v(2) = 50
    v = p.admit(c, [R("u", 600, 10.0)], [], ctx(0.0))
    assert not v.admit and "would break running u (needs 60.0 tok/s)" in v.reason
    # u already missed its deadline: no SLA left to protect
    assert p.admit(c, [R("u", 600, -1.0)], [], ctx(0.0)).admit


def test_running_check_current_protects_what_a_running_request_needs_now():
    # a: 100 tokens by t=2, admitted at t=0 -> recorded 50 tok/s; b has no deadline.
    # At t=1 with 2 running the candidate would make it v(3) = 33.3 tok/s.
    cand = R("c", 10, 10.0, t=1.0)                       # needs 10/9 tok/s
    b = R("b", 50, None)
    verdicts = {}
    for out in (80, 60, 10):      # a ahead of pace, on pace but tight, behind pace
        a = R("a", 100, 2.0, out=out)
        for mode in ("recorded", "current"):
            p = SaberPolicy(window=1, running_check=mode)
            p.on_admitted(R("a", 100, 2.0), 0.0)
            p.on_admitted(b, 0.0)
            verdicts[out, mode] = p.admit(cand, [a, b], [], ctx(1.0))
    # as written: the 50 tok/s recorded at admission holds whatever a did since
    for out in (80, 60, 10):
        assert verdicts[out, "recorded"] == (
            False, "saber: v(3) = 33.3 tok/s would break running a (needs 50.0 tok/s)")
    # now: 20 tokens left in 1 s -> 20 tok/s <= 33.3: admitted
    assert verdicts[80, "current"].admit is True
    # 40 tok/s: on pace at v(2) = 50, broken at v(3) = 33.3
    assert verdicts[60, "current"] == (
        False, "saber: v(3) = 33.3 tok/s would break running a (needs 40.0 tok/s)")
    # 90 tok/s > v(2) = 50: a misses with or without the candidate, nothing to protect
    assert verdicts[10, "current"] == (True, "saber: v(3) = 33.3 tok/s >= required 1.1 tok/s")


def test_options_are_checked_naming_the_field_and_the_allowed_values():
    p = SaberPolicy.from_options({"running_check": "current", "window": 64})
    assert (p.running_check, p.window, p.demoted) == ("current", 64, "last")
    assert (SaberPolicy().running_check, SaberPolicy().window) == ("executed", 16)
    bad = [({"running_check": "now"}, "saber: running_check must be one of executed, "
                                      "recorded, current, off, got 'now'"),
           ({"window": 0}, "saber: window must be an integer >= 1, got 0"),
           ({"window": 2.5}, "saber: window must be an integer >= 1, got 2.5"),
           ({"window": True}, "saber: window must be an integer >= 1, got True"),
           ({"demoted": "first"}, "saber: demoted must be one of last, in_order, got 'first'"),
           ({"default_deadline_s": -1}, "saber: default_deadline_s must be a number of "
                                        "seconds >= 0, got -1")]
    for opts, msg in bad:
        with pytest.raises(ValueError) as e:
            SaberPolicy.from_options(opts)
        assert str(e.value) == msg


def test_config_names_the_queue_option_and_exits_2_on_a_bad_reading(tmp_path, capsys):
    from tuned.commands import cli
    from tuned.config import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate({"queue_policy": "saber", "queue_options": {"running_check": "any"}})
    assert str(e.value).strip() == (
        "queue_options.running_check: must be one of executed, recorded, current, off, "
        "got 'any'")
    cfg = tmp_path / "tuned.toml"
    cfg.write_text('queue_policy = "saber"\n[queue_options]\nwindow = 0\n')
    assert cli.main(["check-config", str(cfg)]) == 2
    assert capsys.readouterr().err == (f"{cfg}: queue_options.window: must be an integer "
                                       ">= 1, got 0\n")


# a decreasing speed curve, 100/n tok/s: three requests admitted one after another, each
# recording what it needed at its admission; the readings part on the fourth
def _three_running(mode):
    p = SaberPolicy(window=1, running_check=mode)
    run = []
    for i, (tokens, t) in enumerate(((100, 0.0), (150, 0.5), (200, 1.0))):
        r = R(f"r{i}", tokens, 10.0, t=t)
        p.on_admitted(r, t)
        run.append(r)
    return p, run


def test_readings_part_on_a_decreasing_speed_curve():
    # recorded: r0 10 tok/s, r1 150/9.5 = 15.8, r2 200/9 = 22.2 tok/s. At t=2 with r0
    # half done (50 of 100 tokens) a candidate needing 10/8 tok/s asks for v(4) = 25.
    cand = R("c", 10, 10.0, t=2.0)
    got = {}
    for mode in SaberPolicy.RUNNING_CHECKS:
        p, run = _three_running(mode)
        run[0] = R("r0", 100, 10.0, out=50)
        got[mode] = p.admit(cand, run, [], ctx(2.0)), p.admit(cand, run + [R("x", 1, None)],
                                                              [], ctx(2.0))
    ok = (True, "saber: v(4) = 25.0 tok/s >= required 1.2 tok/s")
    # at 3 running everyone admits (v(4) = 25 >= 22.2 recorded)
    assert {m: v[0] for m, v in got.items()} == {m: ok for m in got}
    # at 4 running: v(5) = 20 < r2's recorded 22.2: the recorded reading refuses
    assert got["recorded"][1] == (
        False, "saber: v(5) = 20.0 tok/s would break running r2 (needs 22.2 tok/s)")
    # current: r2 needs 200/8 = 25 tok/s now, on pace at v(4) = 25: protected
    assert got["current"][1] == (
        False, "saber: v(5) = 20.0 tok/s would break running r2 (needs 25.0 tok/s)")
    # as executed: v(5) = 20 < any(...) = True (1)? no: admitted; off: no clause at all
    for mode in ("executed", "off"):
        assert got[mode][1] == (True, "saber: v(5) = 20.0 tok/s >= required 1.2 tok/s")


def test_executed_reading_compares_with_a_boolean():
    # v(n) = 0.9 / n: below 1 tok/s from the first request on
    slow = lambda n: 0.9 / n  # noqa: E731
    cand = R("c", 1, 100.0)                           # needs 0.01 tok/s
    p, run = _three_running("executed")
    v = p.admit(cand, run, [], ctx(0.0, fn=slow))
    assert v == (False, "saber: v(4) = 0.2 tok/s < any(running required speeds) = True")
    # running requests that recorded nothing (best effort, no deadline): any() is False
    q = SaberPolicy(running_check="executed")
    idle = [R("n", 5, None)]
    q.on_admitted(idle[0], 0.0)
    assert q.admit(cand, idle, [], ctx(0.0, fn=slow)).admit is True
    # off: never a second clause
    p_off, run = _three_running("off")
    assert p_off.admit(cand, run, [], ctx(0.0, fn=slow)).admit is True


def test_demoted_in_order_keeps_the_arrival_place():
    late = R("late", 5, 0.0, t=0.0)                   # expired at once -> demoted
    a, b = R("a", 10, 100.0, t=1.0), R("b", 10, 100.0, t=2.0)
    for mode, first in (("last", ["a", "b", "late"]), ("in_order", ["late", "a", "b"])):
        p = SaberPolicy(window=1, demoted=mode)
        ordered = p.order([b, a, late], 0.0, ctx(0.0))
        assert [r.request_id for r in ordered] == first and p.is_low("late")
        sel = p.select(ordered, [], [], ctx(0.0))
        assert sel.chosen.request_id == first[0]


# ------------------------------------------------------------ the authors' code's options
AUTHORS_OPTS = dict(window=20, running_check="recorded", pace_s=0.1, refused="tail",
                    speed_limit_tok_s=100.0, expiry_check_s=1.0, load="doubled",
                    speed_curve="authors_code")


def test_authors_code_coefficients_cap_high_priority_running_at_17():
    # 102.55 / (1 + 0.003 L - 0.001 L^2) is negative past L = 33.2; at 2 H + 1 that
    # admits while H <= 16 running requests came from the high-priority queue
    p = SaberPolicy(**AUTHORS_OPTS)
    running = [R(f"h{i}", 51, 100.0) for i in range(17)]
    for r in running:
        p.on_admitted(r, 0.0)
    c = R("c", 51, 1.0)
    ok = p.admit(c, running[:16], [], ctx(0.0, fn=None))
    assert ok.admit and "v(33) = 10255.0 tok/s" in ok.reason
    v = p.admit(c, running, [], ctx(0.0, fn=None))
    assert not v.admit and v.reason.startswith("saber: v(35) = -854.6 tok/s < required 51.0")
    # demoted requests do not count towards H
    p2 = SaberPolicy(**AUTHORS_OPTS)
    for r in running[:16]:
        p2.on_admitted(r, 0.0)
    low = R("low", 51, 0.1)
    p2._low["low"] = 1
    p2.on_admitted(low, 0.0)
    assert p2.admit(c, [*running[:16], low], [], ctx(0.0, fn=None)).admit


def test_authors_fit_coefficients_fall_with_load():
    p = SaberPolicy(speed_curve="authors_fit", window=1)
    v = p.admit(R("c", 600, 10.0), [R(f"r{i}", 1, None) for i in range(39)], [], ctx(0.0))
    # v(40) = 102.55 / (1 + 1.2 - 0.16) = 50.27 < 60
    assert not v.admit and "v(40) = 50.3 tok/s < required 60.0" in v.reason


def test_speed_limit_demotes_the_tried_candidate_and_a_refusal_goes_to_the_tail():
    p = SaberPolicy(**AUTHORS_OPTS, rng=random.Random(1))
    busy = [R(f"h{i}", 51, 100.0) for i in range(17)]
    for r in busy:
        p.on_admitted(r, 0.0)
    a = R("a", 617, 12.0, t=0.0)        # at t=6.5: 617 / 5.5 = 112 tok/s > 100
    b = R("b", 51, 10.0, t=0.1)         # refused by the cap
    c = R("c", 51, 10.0, t=0.2)
    ordered = p.order([a], 6.5, ctx(6.5, fn=None))
    sel = p.select(ordered, busy, [], ctx(6.5, fn=None))
    assert sel.chosen is None and sel.refused == (a,)
    p.on_deferred(a, sel.verdict)
    assert p.is_low("a") and p.refusals["demoted"] == 1 and p.stats.demoted == 1
    assert p.refresh([a], ctx(6.6, fn=None))              # reorder after a demotion
    ordered = p.order([b, c], 6.6, ctx(6.6, fn=None))
    assert [r.request_id for r in ordered] == ["b", "c"]
    sel = p.select([b], busy, [], ctx(6.7, fn=None))
    p.on_deferred(b, sel.verdict)
    assert p.refusals["negative"] == 1 and p.refresh([b, c], ctx(6.8, fn=None))
    assert [r.request_id for r in p.order([b, c], 6.8, ctx(6.8, fn=None))] == ["c", "b"]


def test_pacing_allows_one_attempt_per_cycle_but_never_holds_an_idle_engine():
    p = SaberPolicy(pace_s=0.1, window=20, speed_curve="authors_code")
    reqs = [R(f"w{i}", 51, 10.0, t=0.0) for i in range(3)]
    run = [R("run", 1, None)]
    ordered = p.order(reqs, 0.0, ctx(0.0, fn=None))
    assert p.select(ordered, run, [], ctx(0.0, fn=None)).chosen is not None
    held = p.select(ordered, run, [], ctx(0.05, fn=None))
    assert held.chosen is None and held.verdict.reason == ("saber: waiting for the next "
                                                          "dispatch cycle")
    assert p.select(ordered, [], [], ctx(0.06, fn=None)).chosen is not None   # idle
    assert p.select(ordered, run, [], ctx(0.17, fn=None)).chosen is not None


def test_expired_deadlines_are_demoted_only_at_the_check_period():
    p = SaberPolicy(expiry_check_s=1.0, speed_limit_tok_s=100.0, speed_curve="authors_code")
    r = R("a", 51, 1.0, t=0.0)
    p.observe_arrival(r)
    assert p.refresh([r], ctx(0.0, fn=None))                 # the speed curve is new
    p.order([r], 0.0, ctx(0.0, fn=None))
    assert not p.refresh([r], ctx(0.5, fn=None))             # a check: nothing expired
    assert not p.refresh([r], ctx(1.2, fn=None))             # expired, no check due
    p.order([r], 1.2, ctx(1.2, fn=None))
    assert not p.is_low("a")
    assert p.refresh([r], ctx(1.5, fn=None))                 # the next check, 1 s on
    p.order([r], 1.5, ctx(1.5, fn=None))
    assert p.is_low("a")


def test_authors_options_are_checked():
    bad = [({"pace_s": -1}, "saber: pace_s must be a number >= 0, got -1"),
           ({"refused": "drop"}, "saber: refused must be one of stay, tail, got 'drop'"),
           ({"load": "triple"}, "saber: load must be one of next, doubled, got 'triple'"),
           ({"speed_curve": "mine"}, "saber: speed_curve must be one of profile, "
                                      "authors_code, authors_fit, got 'mine'")]
    for opts, msg in bad:
        with pytest.raises(ValueError, match=msg):
            SaberPolicy.from_options(opts)
    p = SaberPolicy()
    assert (p.pace_s, p.refused, p.speed_limit_tok_s, p.expiry_check_s, p.load,
            p.speed_curve) == (0.0, "stay", 0.0, 0.0, "next", "profile")
