"""The real-Prometheus harness: scrape, query, and promtool's linter."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server
from prometheus_client.exposition import generate_latest

from prom_harness import PromError, prometheus, promtool  # noqa: F401  (fixtures)


@pytest.fixture
def exporter():
    """A prometheus_client endpoint on a private registry: (registry, 'host:port')."""
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    yield registry, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.mark.slow  # a real Prometheus scraping for several seconds
@pytest.mark.parallel
def test_prometheus_scrapes_a_gauge(prometheus, exporter):
    registry, target = exporter
    Gauge("tuned_test_cap_seqs", "test cap", registry=registry).set(7)
    prom = prometheus([target])
    result = prom.wait_for_series("tuned_test_cap_seqs", timeout_s=60)
    assert len(result) == 1
    assert result[0]["metric"] == {"__name__": "tuned_test_cap_seqs", "instance": target,
                                   "job": "tuned"}
    assert float(result[0]["value"][1]) == 7.0
    assert [t["health"] for t in prom.targets_health()] == ["up"]
    assert float(prom.query(f'up{{instance="{target}"}}')[0]["value"][1]) == 1.0


def test_query_errors_are_raised_with_prometheus_message(prometheus, exporter):
    _, target = exporter
    prom = prometheus([target])
    with pytest.raises(PromError, match="bad_data"):
        prom.query("sum(rate(x[5m])")
    assert prom.query("tuned_no_such_metric") == []


def test_wait_for_series_times_out_naming_the_query(prometheus, exporter):
    _, target = exporter
    prom = prometheus([target])
    with pytest.raises(PromError, match="tuned_absent_seqs"):
        prom.wait_for_series("tuned_absent_seqs", timeout_s=1)


def test_promtool_accepts_good_text(promtool):
    registry = CollectorRegistry()
    Gauge("tuned_test_cap_seqs", "Cap on running sequences", registry=registry).set(7)
    rc, out = promtool(generate_latest(registry).decode())
    assert (rc, out) == (0, "")


def test_promtool_flags_a_badly_named_counter(promtool):
    text = ("# HELP tuned_test_requests Requests seen\n"
            "# TYPE tuned_test_requests counter\n"
            "tuned_test_requests 3\n")
    rc, out = promtool(text)
    assert rc != 0
    assert 'tuned_test_requests counter metrics should have "_total" suffix' in out


def test_missing_binary_without_root_gives_a_skip_reason(monkeypatch, tmp_path):
    import prom_harness
    monkeypatch.setattr(prom_harness.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(prom_harness, "_install_errors", {})
    fake = str(tmp_path / "prometheus")
    reason = prom_harness.ensure_prometheus(binary=fake)
    assert reason == (f"{fake} not found and not root to install it: "
                      f"apt-get install prometheus (Debian/Ubuntu) provides {fake}")
