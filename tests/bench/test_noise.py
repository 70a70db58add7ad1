"""Whether tuned's margin stands above the noise: the verdict on given numbers
(never on this host's speed), and where the bench's report carries it."""

from __future__ import annotations

import pytest

from tuned.bench.report import markdown, noise, noise_verdict


def test_a_margin_inside_the_spread():
    v = noise_verdict("tuned", [0.44, 0.50, 0.26], "the best pair (static-128)",
                      [0.46, 0.78, 0.26], "the pair")
    assert v["state"] == "inside" and v["ratio"] == pytest.approx(0.4 / 0.5)
    assert v["words"] == ("tuned's mean goodput 0.4 req/s is 0.80x the best pair "
                          "(static-128)'s 0.5: inside the host's noise: tuned's best repeat "
                          "0.5 above the pair's worst 0.26")
    v = noise_verdict("tuned", [1.2, 1.5, 1.4], "vllm-default", [1.0, 1.3, 1.1])
    assert v["state"] == "inside" and v["ratio"] == pytest.approx(4.1 / 3.4)
    assert v["words"].endswith("inside the host's noise: tuned's worst repeat 1.2 below "
                               "vllm-default's best 1.3")


def test_a_margin_above_the_spread():
    v = noise_verdict("tuned", [1.5, 1.6, 1.4], "vllm-default", [1.0, 1.3, 1.1])
    assert v["state"] == "above"
    assert v["words"] == ("tuned's mean goodput 1.5 req/s is 1.32x vllm-default's 1.13: "
                          "above the host's noise: tuned's worst repeat 1.4 above "
                          "vllm-default's best 1.3")


def test_a_loss_beyond_the_spread():
    v = noise_verdict("tuned", [0.5, 0.6], "vllm-default", [0.7, 0.9], noise="the spread "
                      "over seeds")
    assert v["state"] == "below"
    assert v["words"].endswith("below, beyond the spread over seeds: tuned's best repeat "
                               "0.6 below vllm-default's worst 0.7")


@pytest.mark.parametrize("mine, theirs", [([1.061], [1.079]), ([1.0, 2.0], [1.5])])
def test_one_repeat_measures_no_spread(mine, theirs):
    v = noise_verdict("tuned", mine, "vllm-default", theirs)
    assert v["state"] == "one_repeat"
    assert v["words"].endswith(": one repeat: no spread measured")


def test_the_report_judges_tuned_against_the_best_pair_and_the_default():
    runs = [{"name": "vllm-default", "kind": "static", "goodput_rps": 1.0,
             "goodput_rps_runs": [0.9, 1.0, 1.1], "goodput_rps_min": 0.9,
             "goodput_rps_max": 1.1, "goodput_rps_std": 0.1, "ttft_p99_s_runs": [3.0, 2.0, 4.0]},
            {"name": "static-8", "kind": "static", "goodput_rps": 1.5,
             "goodput_rps_runs": [1.2, 1.5, 1.8]},
            {"name": "tuned", "kind": "tuned", "goodput_rps": 1.6,
             "goodput_rps_runs": [1.4, 1.6, 1.8]}]
    out = noise(runs, {"by_goodput": "static-8"})
    assert [(v["vs_run"], v["state"]) for v in out] == [("static-8", "inside"),
                                                        ("vllm-default", "above")]
    # the best pair being vLLM's default: one verdict
    assert [v["vs_run"] for v in noise(runs, {"by_goodput": "vllm-default"})] == \
        ["vllm-default"]
    rep = {"engine": "vllm", "hardware": "h", "workload": "w", "seed": 0, "slo": "tpot=0.1",
           "slo_relative": {"spec": "tpot=2.5x", "step_s_batch1": 0.04, "source": "measured"},
           "repeats": 3, "runs": runs, "noise": out}
    md = markdown(rep)
    assert "- SLO: tpot=0.1 (from tpot=2.5x, a batch-1 decode step of 40.00 ms: measured)" in md
    assert f"- {out[0]['words']}." in md and f"- {out[1]['words']}." in md
    assert "| vllm-default | static | 1 | 0.9-1.1 (0.1) | 3.00 s, 2.00 s, 4.00 s |" in md
    assert "| tuned | tuned | 1.6 | - | - |" in md


def test_the_report_says_what_the_default_was_sized_to_meet_and_what_it_met():
    runs = [{"name": "vllm-default", "kind": "static", "goodput_rps": 1.0,
             "attainment": 0.4375}]
    rep = {"engine": "vllm", "hardware": "h", "workload": "w", "seed": 0, "slo": "tpot=0.1",
           "runs": runs, "workload_sized": {"attainment": {
               "target": 0.5, "factor": 0.6877, "predicted": 0.5065, "gap_s": 0.002}}}
    assert ("- sized for vLLM's default to meet 50%: every rate x 0.6877, where the "
            "simulator of the measured step put it at 51%; it met 44% here") in markdown(rep)
