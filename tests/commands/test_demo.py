"""The demo's side-by-side summary says whether its verdict stands above the noise:
run once each it says that no spread was measured; run twice each, in the order
tuned, default, default, tuned, it judges the margin on the runs' spread."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuned.bench.metrics import RequestResult, Slo, mean_summary, summarize
from tuned.commands.demo import _summary, run_order


def _rows(good_tuned: int, good_default: int):
    slo = Slo(ttft_s=3.0, tpot_s=0.1)

    def run(good: int):
        return summarize([RequestResult(f"r{i}", float(i), 10, 5, i + 0.5,
                                        i + 0.5 + (0.2 if i < good else 1.0))
                          for i in range(4)], slo)

    return [("tuned", run(good_tuned)), ("vllm-default", run(good_default))], slo


def test_the_demo_says_one_run_each_measures_no_spread(capsys):
    rows, slo = _rows(3, 2)
    alive = SimpleNamespace(server_returncode=None, pace_s=(None, None), results=[])
    verdict, pace, quiet = _summary(rows, slo, {"sla": 3}, [alive], [alive])
    out = capsys.readouterr().out
    assert verdict["state"] == "one_repeat" and verdict["ratio"] == 1.5
    assert ("  above the host's noise? tuned's mean goodput 0.667 req/s is 1.50x vllm-default's "
            "0.444: one repeat: no spread measured\n") in out
    assert pace is None and "pace" not in out       # no probe answered: nothing said
    assert quiet == {"tuned": [None], "vllm-default": [None]} and "silence" not in out


def test_the_demo_says_how_fast_the_host_ran_during_each_run(capsys):
    """The pace probe before and after each run (a lone request's step) is the one
    spread a single run each can show: here the host was slower during tuned's run."""
    rows, slo = _rows(3, 2)
    tuned_run = SimpleNamespace(server_returncode=None, pace_s=(0.030, 0.036), results=[])
    default_run = SimpleNamespace(server_returncode=None, pace_s=(0.022, None), results=[])
    _, pace, _ = _summary(rows, slo, {"sla": 3}, [tuned_run], [default_run])
    out = capsys.readouterr().out
    assert pace["by_run"] == {"tuned": [0.030, 0.036, pytest.approx(0.033)],
                              "vllm-default": [0.022, 0.022, 0.022]}
    assert pace["relative"] == pytest.approx(1.5)
    assert ("  the host's pace (a lone request's step just before and just after each run): "
            "22.0-36.0 ms, 1.64x (tuned 30.0-36.0, vllm-default 22.0-22.0 ms); during tuned's "
            "runs the host's step was 1.50x its mean during the others' (slower for tuned)\n"
            ) in out


def test_the_demo_says_how_long_the_streams_went_silent_in_each_run(capsys):
    """A host stall (the API server or the client kept off the cores while the engine
    steps) shows as seconds in which no stream got a token with requests in flight;
    the demo prints each run's longest, so that a TTFT tail it made is not read as
    the scheduler's."""
    rows, slo = _rows(3, 2)

    def req(i, arrival, times):
        return RequestResult(f"r{i}", arrival, 10, len(times), times[0], times[-1],
                             token_times_s=times)

    # tuned: r1 arrives at 1.0 while r0 decodes; no token from 1.2 to 3.6
    stalled = [req(0, 0.0, [0.1, 0.6, 1.1, 1.2]), req(1, 1.0, [3.6, 3.7])]
    smooth = [req(0, 0.0, [0.1, 0.2, 0.3]), req(1, 0.32, [0.5, 0.6])]   # 0.32-0.5: r1's TTFT
    tuned_run = SimpleNamespace(server_returncode=None, pace_s=(None, None), results=stalled)
    default_run = SimpleNamespace(server_returncode=None, pace_s=(None, None), results=smooth)
    _, _, quiet = _summary(rows, slo, {"sla": 3}, [tuned_run], [default_run])
    out = capsys.readouterr().out
    assert quiet["tuned"] == [(pytest.approx(2.4), 1.2)]
    assert quiet["vllm-default"] == [(pytest.approx(0.18), 0.32)]
    assert ("  the longest time no stream got a token while requests were in flight (seconds "
            "of it point at a host stall, which every request in flight then pays): tuned "
            "2.40 s from 1.2 s; vllm-default 0.18 s from 0.3 s\n") in out


def test_two_repeats_run_tuned_default_default_tuned():
    assert run_order(1) == [("tuned", 0), ("vllm-default", 0)]
    assert run_order(2) == [("tuned", 0), ("vllm-default", 0), ("vllm-default", 1), ("tuned", 1)]
    assert [side for side, _ in run_order(3)] == ["tuned", "vllm-default", "vllm-default",
                                                   "tuned", "tuned", "vllm-default"]


def test_two_runs_each_give_a_verdict_on_their_spread_and_counts_over_both(capsys):
    """tuned's runs 3 and 4 good of 4 (0.667 and 1.081 req/s: all 4 good end the run
    sooner), the default's 2 and 2: its worst run beats the default's best, and the
    table's counts are over both runs, its rates the mean."""
    slo = Slo(ttft_s=3.0, tpot_s=0.1)

    def run(good: int):
        return summarize([RequestResult(f"r{i}", float(i), 10, 5, i + 0.5,
                                        i + 0.5 + (0.2 if i < good else 1.0))
                          for i in range(4)], slo)

    rows = [("tuned", mean_summary([run(3), run(4)])),
            ("vllm-default", mean_summary([run(2), run(2)]))]
    alive = SimpleNamespace(server_returncode=None, pace_s=(None, None), results=[])
    verdict, _, quiet = _summary(rows, slo, {"sla": 3}, [alive, alive], [alive, alive])
    out = capsys.readouterr().out
    assert verdict["state"] == "above" and verdict["ratio"] == pytest.approx((0.6667 + 1.0811) / 2 / 0.4444, rel=1e-3)
    assert ("  goodput per run: tuned 0.667, 1.081; vllm-default 0.444, 0.444 req/s (the "
            "table gives each side's mean over its runs)\n") in out
    assert "worst repeat 0.667 above vllm-default's best 0.444" in out
    assert "8/8" in out and "requests lost: 0 (refused with HTTP 429: 0);" in out
    assert quiet == {"tuned": [None, None], "vllm-default": [None, None]}


def test_a_refused_request_is_answered_not_lost(capsys):
    """A request the server refused with HTTP 429 got its answer: the demo counts it as
    refused, and only a request with neither an answer nor a refusal as lost (which
    fails the demo's exit code)."""
    from tuned.commands.demo import _lost

    slo = Slo(ttft_s=3.0, tpot_s=0.1)
    served = RequestResult("r0", 0.0, 10, 5, 0.5, 0.7)
    refused = RequestResult("r1", 0.1, 10, 0, None, None, error="refused: HTTP 429",
                            refused_s=0.9)
    unanswered = RequestResult("r2", 0.2, 10, 0, None, None)
    rows = [("tuned", mean_summary([summarize([served, refused], slo)])),
            ("vllm-default", mean_summary([summarize([served, unanswered], slo)]))]
    assert _lost(rows) == 1
    alive = SimpleNamespace(server_returncode=None, pace_s=(None, None), results=[])
    _summary(rows, slo, {"sla": 3}, [alive], [alive])
    assert "requests lost: 1 (refused with HTTP 429: 1);" in capsys.readouterr().out
