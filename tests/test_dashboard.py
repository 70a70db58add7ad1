"""dashboards/tuned-grafana.json: structure, metric names, and every query against a real
Prometheus scraping tuned's own metrics registry."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from prom_harness import prometheus  # noqa: F401  (fixture)

DASHBOARD = Path(__file__).resolve().parents[1] / "dashboards" / "tuned-grafana.json"

# The metric contract (tuned/metrics.py exports these names).
METRICS = {
    "tuned_decision_target_seqs", "tuned_decision_lower_seqs", "tuned_decision_upper_seqs",
    "tuned_applied_cap_seqs", "tuned_token_budget_tokens", "tuned_running_requests",
    "tuned_waiting_requests", "tuned_tbt_seconds", "tuned_tbt_sla_seconds",
    "tuned_kv_usage_ratio", "tuned_kv_capacity_tokens", "tuned_gpu_memory_used_bytes",
    "tuned_gpu_memory_total_bytes", "tuned_decisions_total", "tuned_fallbacks_total",
    "tuned_controller_errors_total", "tuned_controller_tick_seconds", "tuned_reloads_total",
    "tuned_generated_tokens_total", "tuned_preemptions_total", "tuned_requests_finished_total",
}
HISTOGRAMS = {"tuned_tbt_seconds", "tuned_controller_tick_seconds"}
SERIES = (METRICS - HISTOGRAMS) | {h + s for h in HISTOGRAMS for s in ("_bucket", "_sum", "_count")}

# PromQL functions, aggregations and keywords the dashboard may use.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev",
    "rate", "irate", "increase", "changes", "delta", "deriv", "resets", "histogram_quantile",
    "clamp_min", "clamp_max", "abs", "round", "vector", "scalar", "time", "absent",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "last_over_time",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool",
}


def load() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_queries(dash: dict) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and annotation."""
    out = []
    for p in dash["panels"]:
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
    for a in dash["annotations"]["list"]:
        if "expr" in a:
            out.append((f"annotation {a['name']!r}", a["expr"]))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (no parser needed for our subset)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)          # string literals
    e = re.sub(r"\{[^}]*\}", "", e)                       # label matchers
    e = re.sub(r"\[[^\]]*\]", "", e)                      # range selectors
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    e = re.sub(r"\$\{?\w+\}?", "", e)                    # Grafana variables
    e = re.sub(r"\b\d+(\.\d+)?\b", "", e)                 # numbers
    return {w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e) if w not in PROMQL_WORDS}


def test_metric_name_extraction():
    assert metric_names('histogram_quantile(0.95, sum by (le, instance) '
                        '(rate(tuned_tbt_seconds_bucket{job=~"$job"}[$__rate_interval])))') \
        == {"tuned_tbt_seconds_bucket"}
    assert metric_names("sum by (cause) (increase(tuned_fallbacks_total[1h])) > 0") \
        == {"tuned_fallbacks_total"}


def test_every_query_uses_only_tuned_metric_names():
    dash = load()
    used = set()
    for where, expr in all_queries(dash):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= SERIES, f"{where}: unknown metric(s) {sorted(names - SERIES)} in {expr!r}"
        used |= names
    # ... and the dashboard shows every metric of the contract
    used_base = {re.sub(r"_(bucket|sum|count)$", "", n) if n.startswith(tuple(HISTOGRAMS)) else n
                 for n in used}
    assert used_base == METRICS


def test_template_variable_queries_use_tuned_metrics():
    for var in load()["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"]
            m = re.fullmatch(r"label_values\((\w+)(\{.*\})?, (\w+)\)", q)
            assert m and m.group(1) in SERIES and m.group(3) == var["name"], q


def test_dashboard_structure():
    dash = load()
    assert 36 <= dash["schemaVersion"] <= 41
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(t["datasource"] == p["datasource"] for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        panel_cells = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                       for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & panel_cells, f"{p['title']} overlaps another panel"
        cells |= panel_cells
        for t in p["targets"]:
            if "$__rate_interval" not in t["expr"] and re.search(r"\brate\(|increase\(", t["expr"]):
                assert "[1h]" in t["expr"], f"{p['title']}: fixed rate window"
            if t["expr"].startswith("tuned_") or "{" in t["expr"]:
                assert 'job=~"$job", instance=~"$instance"' in t["expr"], p["title"]
    titles = {p["title"] for p in dash["panels"]}
    for required in ("Batch size: decision vs applied cap", "Time between tokens vs SLA",
                     "KV cache", "GPU memory", "Throughput",
                     "Fallbacks, controller errors, reloads", "Decisions by reason"):
        assert required in titles


def _grafana_to_promql(expr: str) -> str:
    return (expr.replace("$__rate_interval", "15s")
            .replace('"$job"', '".*"').replace('"$instance"', '".*"'))


@pytest.mark.slow  # a real Prometheus scraping for several seconds
def test_every_query_returns_data_from_tunes_metrics(prometheus):
    """Expose tuned's real metrics registry, let Prometheus scrape it, and run every
    dashboard query: each must parse and return at least one series."""
    metrics_mod = pytest.importorskip("tuned.metrics")
    from prometheus_client import start_http_server

    m = metrics_mod.Metrics()
    m.target.set(12), m.lower.set(8), m.upper.set(16), m.applied_cap.set(12)
    m.token_budget.set(544), m.running.set(12), m.waiting.set(3)
    m.tbt_sla.set(0.05), m.kv_usage.set(0.6), m.kv_capacity.set(65536)
    m.gpu_used.labels("0").set(18 * 2**30), m.gpu_total.labels("0").set(24 * 2**30)
    m.decisions.labels("sla_hold").inc(), m.errors.inc(0)
    m.tick.labels("total").observe(0.002)
    for _ in range(5):
        m.tbt.observe(0.04)
    m.generated.inc(100), m.preemptions.inc(0), m.finished.inc(2)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=m.registry)
    try:
        target = f"127.0.0.1:{server.server_address[1]}"
        prom = prometheus([target])
        prom.wait_for_series("tuned_applied_cap_seqs", timeout_s=60)
        m.reloads.labels("refused").inc()  # after the first scrape: the annotation's change
        # rate() needs two samples inside the window: keep counters moving a little.
        deadline = time.monotonic() + 90
        pending = dict(all_queries(load()))
        while pending and time.monotonic() < deadline:
            m.generated.inc(10), m.tbt.observe(0.03), m.tick.labels("total").observe(0.001)
            for where, expr in list(pending.items()):
                if prom.query(_grafana_to_promql(expr)):  # raises on a PromQL syntax error
                    del pending[where]
            time.sleep(1)
        assert not pending, f"queries without data: {pending}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_operator_guide_documents_exactly_the_exported_metrics():
    """docs/operator-guide.md names every series tuned.metrics registers, and no other."""
    metrics_mod = pytest.importorskip("tuned.metrics")
    registered = {m.name + ("_total" if m.type == "counter" else "")
                  for m in metrics_mod.Metrics().registry.collect()}
    assert METRICS <= registered
    guide = (DASHBOARD.parents[1] / "docs" / "operator-guide.md").read_text()
    documented = set(re.findall(r"`(tuned_[a-z_]+)", guide))
    documented = {re.sub(r"_(bucket|sum|count)$", "", n) for n in documented}
    assert documented == registered
