"""The demo's side-by-side summary says whether its verdict stands above the noise:
it runs tuned and vLLM's default once each, so it says that no spread was measured."""

from __future__ import annotations

from types import SimpleNamespace

from tuned.bench.metrics import RequestResult, Slo, summarize
from tuned.demo import _summary


def _rows(good_tuned: int, good_default: int):
    slo = Slo(ttft_s=3.0, tpot_s=0.1)

    def run(good: int):
        return summarize([RequestResult(f"r{i}", float(i), 10, 5, i + 0.5,
                                        i + 0.5 + (0.2 if i < good else 1.0))
                          for i in range(4)], slo)

    return [("tuned", run(good_tuned)), ("vllm-default", run(good_default))], slo


def test_the_demo_says_one_run_each_measures_no_spread(capsys):
    rows, slo = _rows(3, 2)
    alive = SimpleNamespace(server_returncode=None)
    verdict = _summary(rows, slo, {"sla": 3}, alive, alive)
    out = capsys.readouterr().out
    assert verdict["state"] == "one_repeat" and verdict["ratio"] == 1.5
    assert ("  above the host's noise? tuned's mean goodput 0.667 req/s is 1.50x vllm-default's "
            "0.444: one repeat: no spread measured\n") in out
