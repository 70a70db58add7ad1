"""A real Prometheus scrapes tuned's endpoint inside a real vLLM CPU engine under load.

Prometheus (Debian's package, run by prom_harness with a 1 s scrape interval on
127.0.0.1) scrapes ``tuned serve``'s endpoint while a closed-loop client keeps the
engine busy. Through Prometheus's HTTP API, PromQL returns the cap tuned applied
(the value ``/decisions`` reports) and the TBT histogram (a count above zero and a
finite median over a 10 s rate); the target is "up"; and ``promtool check metrics``
finds nothing to say about the endpoint's raw exposition text. Prometheus runs the
operator guide's scrape config, so it also scrapes vLLM's own ``/metrics``: the
guide's "cap beside TTFT" query returns both series for the one server, and the
dashboard's vLLM panel finds vLLM's series.
"""

from __future__ import annotations

import math
import time

import pytest

from prom_harness import prometheus, promtool  # noqa: F401  (fixtures)
from serve_harness import Load, tuned_serve
from doc_readers import all_queries, grafana_to_promql as _grafana_to_promql, guide_queries, \
    guide_scrape_configs, load_dashboard

pytestmark = [pytest.mark.slow, pytest.mark.parallel]

CEILING = 16
B_MAX = 6     # the cap tuned settles on: memory is ample, so b_mem = B_max
FALLBACK = 4  # the cap before the first decision (differs from B_MAX on purpose)


def config(model) -> str:
    return (f'model = "{model}"\nmax_num_seqs = {CEILING}\nmax_num_batched_tokens = 512\n'
            f"max_model_len = 512\nnum_gpu_blocks = 64\ninterval_s = 0.25\n"
            f"stale_after_s = 5.0\nfallback_cap = {FALLBACK}\nb_max = {B_MAX}\n"
            f"tbt_sla_s = 0.0\ntbt_window_s = 1.0\nmin_demand_samples = 4\n"
            f'vllm_args = ["--enforce-eager"]\n')


def scalar(result: list) -> float:
    """The value of a one-element instant vector."""
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def wait_stable_cap(srv, hold_s: float, timeout_s: float = 60.0) -> dict:
    """/decisions once the applied cap has not changed for ``hold_s`` seconds (by the
    decisions' own wall-clock stamps), so every scrape in that span saw it."""
    deadline = time.monotonic() + timeout_s
    while True:
        d = srv.decisions(200)
        cap = d["applied"]["cap"]
        recent = d["recent"]
        if (recent and not d["applied"]["fallback"]
                and recent[-1]["t"] - recent[0]["t"] >= hold_s
                and all(e["cap"] == cap for e in recent
                        if e["t"] >= recent[-1]["t"] - hold_s)):
            return d
        assert time.monotonic() < deadline, (cap, [e["cap"] for e in recent[-20:]])
        time.sleep(0.25)


@pytest.mark.timeout(600)
def test_prometheus_scrapes_tuned_under_load(tmp_path, tiny_model, prometheus,  # noqa: F811
                                             promtool):  # noqa: F811
    with tuned_serve(tmp_path, config(tiny_model)) as srv:
        target = srv.endpoint.removeprefix("http://")
        load = Load(srv, concurrency=8, prompt_tokens=(16, 64),
                                      max_tokens=(16, 48)).start()
        try:
            # the operator guide's scrape config: tuned's endpoint and vLLM's own
            # /metrics, both labelled server="127.0.0.1" by its relabelling
            vllm_target = srv.base.removeprefix("http://")
            prom = prometheus([], scrape_interval_s=1.0, scrape_configs=guide_scrape_configs(
                {"tuned": [target], "vllm": [vllm_target]}))
            assert prom.url.startswith("http://127.0.0.1:")
            prom.wait_for_series("tuned_applied_cap_seqs", timeout_s=60)

            # ---- the applied cap: PromQL agrees with /decisions
            d = wait_stable_cap(srv, hold_s=3.0)
            cap = d["applied"]["cap"]
            q_cap = scalar(prom.query("tuned_applied_cap_seqs"))
            d_after = srv.decisions(0)
            assert d_after["applied"]["cap"] == cap  # it did not move while we asked
            assert q_cap == cap
            assert cap == B_MAX and d["current"]["cap"] == B_MAX
            # the whole last 3 s of scrapes saw that one value
            assert scalar(prom.query("min_over_time(tuned_applied_cap_seqs[3s])")) == cap
            assert scalar(prom.query("max_over_time(tuned_applied_cap_seqs[3s])")) == cap

            # ---- TBT: the histogram's count and a finite median from a 10 s rate
            q_count = scalar(prom.wait_for_series("tuned_tbt_seconds_count > 0", 30))
            assert q_count > 0
            median_q = "histogram_quantile(0.5, rate(tuned_tbt_seconds_bucket[10s]))"
            deadline = time.monotonic() + 30
            while True:
                res = prom.query(median_q)
                median = scalar(res) if res else math.nan
                if math.isfinite(median) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            assert math.isfinite(median), (median_q, res)
            assert 0 < median <= 5.0, median   # inside the histogram's buckets

            # ---- the target is healthy
            health = sorted(prom.targets_health(), key=lambda t: t["scrapeUrl"])
            assert health == sorted([{"scrapeUrl": f"{url}/metrics", "health": "up",
                                      "lastError": ""} for url in (srv.endpoint, srv.base)],
                                    key=lambda t: t["scrapeUrl"]), health
            assert scalar(prom.query(f'up{{job="tuned", instance="{target}"}}')) == 1.0

            # ---- tuned's series and the real vLLM's join on (server, engine): the
            # guide's "cap beside TTFT" gives both for this server, and the dashboard's
            # vLLM panels find vLLM's own series under the names it exports
            beside = next(q for c, q in guide_queries().items()
                          if c.startswith("tuned's cap (sequences) beside"))
            deadline = time.monotonic() + 60
            while len(res := prom.query(beside)) < 2 and time.monotonic() < deadline:
                time.sleep(1)
            got = {r["metric"]["series"]: (r["metric"]["server"], r["metric"]["engine"],
                                           float(r["value"][1])) for r in res}
            assert set(got) == {"cap_seqs", "ttft_p95_seconds"}, res
            assert got["cap_seqs"] == ("127.0.0.1", "0", B_MAX)
            assert got["ttft_p95_seconds"][:2] == ("127.0.0.1", "0")
            assert 0 < got["ttft_p95_seconds"][2] < 60, res
            queries = dict(all_queries(load_dashboard()))
            running = _grafana_to_promql(queries[
                "panel 'Requests running / waiting (requests)' A"])
            [r] = prom.wait_for_series(running, 30)
            assert (r["metric"]["server"], r["metric"]["engine"]) == ("127.0.0.1", "0")

            # ---- promtool lints the raw exposition text clean
            text = srv.metrics()
            assert "tuned_tbt_seconds_bucket" in text and "tuned_applied_cap_seqs" in text
            rc, out = promtool(text)
            assert (rc, out) == (0, ""), out
        finally:
            load.stop()
        assert load.errors == [], load.errors[:5]
        assert load.sent == load.completed and load.completed > 0
