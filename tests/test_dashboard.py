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

# PromQL functions, aggregations and keywords the dashboard may use.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile", "stddev",
    "rate", "irate", "increase", "changes", "delta", "deriv", "resets", "histogram_quantile",
    "clamp_min", "clamp_max", "abs", "round", "vector", "scalar", "time", "absent",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "last_over_time",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool",
}
#: every selector of one of tuned's series, and of one of vLLM's
TUNED_SELECTOR = 'job=~"$job", instance=~"$instance", engine=~"$engine"'
VLLM_SELECTOR = 'job=~"$vllm_job", engine=~"$engine"'
#: vLLM's metric names are ``vllm:<name>``; a selector matches the prefix as
#: ``vllm[:_]`` (some exporters and remote-write paths turn the colon into ``_``)
VLLM_PREFIX = "vllm[:_]"


def sample_names(name: str, typ: str) -> set[str]:
    """The sample names a Prometheus family of this type exposes."""
    if typ == "counter":
        return {name + "_total"}
    if typ == "histogram":
        return {name + s for s in ("_bucket", "_sum", "_count")}
    if typ == "info":
        return {name + "_info"}
    return {name}


def tuned_exported() -> set[str]:
    """Every sample name tuned's registry exposes, collected after a short simulator
    run (the same Metrics object `tuned serve` builds); labelled families the run
    left without a child count by their type."""
    from tuned import config as config_mod
    from tuned.engines.sim import SimEngine
    from tuned.sim.hardware import gpu_hardware
    from tuned.workloads import RequestSpec

    cfg = config_mod.validate({"max_num_seqs": 16, "max_num_batched_tokens": 2048,
                               "max_model_len": 4096, "queue_policy": "multibin"})
    hw = gpu_hardware("a100-llama2-7b")
    eng = SimEngine(cfg, hw.step_model, block_size=hw.block_size, num_gpu_blocks=256)
    eng.run([RequestSpec(f"r{i}", 0.05 * i, 64, 16, 16) for i in range(8)])
    fams = list(eng.runtime.metrics.exported.collect())
    seen = {s.name for f in fams for s in f.samples}
    declared = set().union(*(sample_names(f.name, f.type) for f in fams))
    return seen | declared


def vllm_exported() -> set[str]:
    """Every sample name vLLM's Prometheus logger registers, read from the installed
    vLLM's source (vllm/v1/metrics/loggers.py), not from a list kept here."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")   # located, not imported
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    src = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    found = re.findall(r'self\._(gauge|counter|histogram)_cls\(\s*name="(vllm:\w+)"', src)
    assert len(found) > 20, "vLLM's metric definitions moved: update vllm_exported()"
    return set().union(*(sample_names(n.removesuffix("_total") if t == "counter" else n, t)
                         for t, n in found))


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


def name_patterns(expr: str) -> set[str]:
    """The ``__name__=~"..."`` regexes a PromQL expression selects by."""
    return set(re.findall(r'__name__=~"([^"]+)"', expr))


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects by name (no parser needed for our
    subset; selectors by ``__name__`` are :func:`name_patterns`)."""
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
    expr = 'sum by (engine) (rate({__name__=~"vllm[:_]generation_tokens_total", engine="0"}[5m]))'
    assert metric_names(expr) == set()
    assert name_patterns(expr) == {"vllm[:_]generation_tokens_total"}


@pytest.fixture(scope="module")
def exported() -> tuple[set[str], set[str]]:
    return tuned_exported(), vllm_exported()


def test_exported_names_are_collected_not_listed(exported):
    tuned, vllm = exported
    # the run fed the series the controller writes every tick ...
    assert {"tuned_applied_cap_seqs", "tuned_controller_tick_seconds_count",
            "tuned_controller_tick_phase_seconds_bucket", "tuned_queue_admitted_total",
            "tuned_predictor_observations_total"} <= tuned
    # ... the series that duplicated vLLM's own are gone, and no phase="total" remains
    assert not {"tuned_running_requests", "tuned_waiting_requests",
                "tuned_generated_tokens_total", "tuned_preemptions_total",
                "tuned_predictor_observations"} & tuned
    assert {"vllm:time_to_first_token_seconds_bucket", "vllm:num_requests_running",
            "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc"} <= vllm


def test_every_query_names_only_exported_metrics(exported):
    """Every metric a panel, annotation or variable query references is one tuned's
    registry exports, or (selected by name pattern) one of vLLM's."""
    tuned, vllm = exported
    dash = load()
    # a variable's label_values(SELECTOR, LABEL): the selector
    queries = all_queries(dash) + [
        (f"variable {v['name']!r}",
         re.fullmatch(r"label_values\((.*), \w+\)", v["query"]["query"]).group(1))
        for v in dash["templating"]["list"] if v["type"] == "query"]
    for where, expr in queries:
        names, patterns = metric_names(expr), name_patterns(expr)
        assert names or patterns, f"{where}: no metric in {expr!r}"
        assert names <= tuned, f"{where}: not exported by tuned: {sorted(names - tuned)}"
        for pat in patterns:
            assert pat.startswith(VLLM_PREFIX), f"{where}: {pat!r} is not one of vLLM's names"
            hits = {n for n in vllm if re.fullmatch(pat, n)}
            assert len(hits) == 1, f"{where}: {pat!r} matches {sorted(hits)} of vLLM's names"
            # ... and the same name as an exporter that turns ':' into '_' writes it
            assert re.fullmatch(pat, hits.pop().replace("vllm:", "vllm_", 1)), where


def test_dashboard_shows_decisions_beside_vllm_latency(exported):
    """Feasibility, holds and fallbacks from tuned, TTFT and TPOT from vLLM, on the
    panel that shows the cap; the series duplicating vLLM's are read from vLLM."""
    dash = load()
    used = set()
    for _, expr in all_queries(dash):
        used |= metric_names(expr) | name_patterns(expr)
    assert {"tuned_sla_feasible", "tuned_queue_deferred_total", "tuned_fallback_active",
            "tuned_controller_tick_phase_seconds_bucket"} <= used
    panel = next(p for p in dash["panels"] if p["title"] == "vLLM TTFT and TPOT beside the cap")
    shown = set().union(*(metric_names(t["expr"]) | name_patterns(t["expr"])
                          for t in panel["targets"]))
    assert {"tuned_applied_cap_seqs", VLLM_PREFIX + "time_to_first_token_seconds_bucket",
            VLLM_PREFIX + "request_time_per_output_token_seconds_bucket"} <= shown
    for duplicate in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                      "generation_tokens_total", "num_preemptions_total",
                      "request_success_total"):
        assert VLLM_PREFIX + duplicate in used, duplicate
    assert "tuned_kv_usage_ratio" not in used and "tuned_requests_finished_total" not in used


def test_template_variables():
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    q = {k: v["query"]["query"] for k, v in variables.items() if v["type"] == "query"}
    assert q == {
        "job": "label_values(tuned_applied_cap_seqs, job)",
        "instance": 'label_values(tuned_applied_cap_seqs{job=~"$job"}, instance)',
        "engine": 'label_values(tuned_applied_cap_seqs{job=~"$job", instance=~"$instance"}, '
                  'engine)',
        "vllm_job": 'label_values({__name__=~"vllm[:_]num_requests_running"}, job)'}
    for name in q:
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", name


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
    for where, expr in all_queries(dash):
        if "$__rate_interval" not in expr and re.search(r"\brate\(|increase\(", expr):
            assert "[1h]" in expr or "[1m]" in expr, f"{where}: fixed rate window"
        # every selector filters by the dashboard's variables: tuned's by job, instance
        # and engine, vLLM's by its own job and the same engine
        selectors = re.findall(r"\{([^}]*)\}", re.sub(r"\{\{\w+\}\}", "", expr))
        assert selectors, where
        for sel in selectors:
            if "__name__" in sel:
                assert sel.endswith(VLLM_SELECTOR), f"{where}: {sel}"
            else:
                assert sel == TUNED_SELECTOR, f"{where}: {sel}"
    titles = {p["title"] for p in dash["panels"]}
    for required in ("Batch size: decision vs applied cap", "Time between tokens vs SLA",
                     "KV cache", "GPU memory", "Throughput",
                     "Fallbacks, controller errors, reloads", "Decisions by reason",
                     "SLA feasible", "Fallback active", "Queue holds",
                     "vLLM TTFT and TPOT beside the cap", "SLA feasible, fallback active"):
        assert required in titles


def _grafana_to_promql(expr: str) -> str:
    for var in ("job", "instance", "engine", "vllm_job"):
        expr = expr.replace(f'"${var}"', '".*"')
    return expr.replace("$__rate_interval", "15s")


@pytest.mark.slow  # a real Prometheus scraping for several seconds
def test_every_query_returns_data_from_tunes_metrics(prometheus):
    """Expose tuned's real metrics registry (two ranks, as a data-parallel server
    does), let Prometheus scrape it, and run every dashboard query: each must parse;
    each on tuned's series must return at least one series (vLLM's own series are not
    served here: those queries must parse and select nothing else)."""
    from prometheus_client import start_http_server

    from tuned.metrics import Metrics

    ranks = [Metrics(engine=str(i)) for i in (0, 1)]
    for m in ranks:
        m.target.set(12), m.lower.set(8), m.upper.set(16), m.applied_cap.set(12)
        m.token_budget.set(544), m.sla_feasible.set(1), m.in_fallback.set(0)
        m.tbt_sla.set(0.05), m.kv_usage.set(0.6), m.kv_capacity.set(65536)
        m.gpu_used.labels("0").set(18 * 2**30), m.gpu_total.labels("0").set(24 * 2**30)
        m.decisions.labels("sla_hold").inc(), m.errors.inc(0)
        m.q_admitted.labels("sjf").inc(), m.q_deferred.labels("sjf").inc()
        m.tick.observe(0.002), m.tick_phase.labels("decide").observe(0.001)
        for _ in range(5):
            m.tbt.observe(0.04)
    servers = [start_http_server(0, addr="127.0.0.1", registry=m.exported) for m in ranks]
    try:
        prom = prometheus([f"127.0.0.1:{s.server_address[1]}" for s, _ in servers])
        prom.wait_for_series("tuned_applied_cap_seqs", timeout_s=60)
        for m in ranks:
            m.reloads.labels("refused").inc()  # after the first scrape: the annotation's change
        # rate() needs two samples inside the window: keep counters moving a little.
        deadline = time.monotonic() + 90
        queries = dict(all_queries(load()))
        vllm_only = {w for w, e in queries.items() if not metric_names(e)}
        for where in vllm_only:
            assert prom.query(_grafana_to_promql(queries[where])) == [], where
        pending = {w: e for w, e in queries.items() if w not in vllm_only}
        while pending and time.monotonic() < deadline:
            for m in ranks:
                m.tbt.observe(0.03), m.tick.observe(0.001), m.q_deferred.labels("sjf").inc()
                m.tick_phase.labels("decide").observe(0.001)
            for where, expr in list(pending.items()):
                if prom.query(_grafana_to_promql(expr)):  # raises on a PromQL syntax error
                    del pending[where]
            time.sleep(1)
        assert not pending, f"queries without data: {pending}"
        cap = prom.query('tuned_applied_cap_seqs')
        assert sorted(r["metric"]["engine"] for r in cap) == ["0", "1"]
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def test_operator_guide_documents_exactly_the_exported_metrics():
    """docs/operator-guide.md names every series tuned.metrics registers, and no other."""
    from tuned.metrics import Metrics

    from tuned.engines.gateway import REFUSED_METRIC

    registered = {m.name + ("_total" if m.type == "counter" else "")
                  for m in Metrics().registry.collect()}
    registered.add(REFUSED_METRIC)      # the gateway's, on vLLM's own /metrics
    guide = (DASHBOARD.parents[1] / "docs" / "operator-guide.md").read_text()
    documented = set(re.findall(r"`(tuned_[a-z_]+)", guide))
    documented = {re.sub(r"_(bucket|sum|count)$", "", n) for n in documented}
    assert documented == registered
