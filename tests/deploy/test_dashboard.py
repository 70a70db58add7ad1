"""dashboards/tuned-grafana.json and the alerts of deploy/kubernetes/prometheusrule.yaml:
structure, metric names, and every query and alert expression against a real Prometheus
scraping tuned's own metrics registry."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest
import yaml

from doc_readers import (DASHBOARD, all_queries, grafana_to_promql as _grafana_to_promql,
                         guide_queries, guide_scrape_configs, load_dashboard as load)
from prom_harness import prometheus  # noqa: F401  (fixture)
from tuned.engines.gateway import EXPORTED as GATEWAY_EXPORTED, REFUSED_METRIC

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
TUNED_SELECTOR = 'job=~"$job", server=~"$server", engine=~"$engine"'
VLLM_SELECTOR = 'job=~"$vllm_job", server=~"$server", engine=~"$engine"'
#: the gateway's count of 429s is on vLLM's /metrics (its API server: no engine label)
GATEWAY_SELECTOR = 'job=~"$vllm_job", server=~"$server"'
#: the alerts (a PrometheusRule; its spec is a Prometheus rules file)
RULES = DASHBOARD.parents[1] / "deploy" / "kubernetes" / "prometheusrule.yaml"
#: series Prometheus makes itself for every target, which no code exports
PROMETHEUS_OWN = {"up"}
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
    from tuned.sim.engine import SimEngine
    from tuned.sim.hardware import gpu_hardware
    from tuned.base.workloads import RequestSpec

    cfg = config_mod.validate({"max_num_seqs": 16, "max_num_batched_tokens": 2048,
                               "max_model_len": 4096, "queue_policy": "multibin"})
    hw = gpu_hardware("a100-llama2-7b")
    eng = SimEngine(cfg, hw.step_model, block_size=hw.block_size, num_gpu_blocks=256)
    eng.run([RequestSpec(f"r{i}", 0.05 * i, 64, 16, 16) for i in range(8)])
    fams = list(eng.runtime.metrics.exported.collect())
    seen = {s.name for f in fams for s in f.samples}
    declared = set().union(*(sample_names(f.name, f.type) for f in fams))
    return seen | declared


def vllm_definitions() -> dict[str, str]:
    """{family name: type} of every series vLLM's Prometheus logger registers, read from
    the installed vLLM's source (vllm/v1/metrics/loggers.py), not from a list kept here."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")   # located, not imported
    if spec is None or spec.origin is None:
        pytest.skip("vLLM is not installed")
    src = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text()
    found = re.findall(r'self\._(gauge|counter|histogram)_cls\(\s*name="(vllm:\w+)"', src)
    assert len(found) > 20, "vLLM's metric definitions moved: update vllm_definitions()"
    return {(n.removesuffix("_total") if t == "counter" else n): t for t, n in found}


def vllm_exported() -> set[str]:
    """Every sample name vLLM's Prometheus logger registers (:func:`vllm_definitions`)."""
    return set().union(*(sample_names(n, t) for n, t in vllm_definitions().items()))


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


def alert_rules() -> dict[str, dict]:
    """{alert name: rule} of the PrometheusRule."""
    spec = yaml.safe_load(RULES.read_text())["spec"]
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"]}


@pytest.fixture(scope="module")
def exported() -> tuple[set[str], set[str]]:
    """(tuned's names: its registry's and the gateway's 429 count on vLLM's /metrics,
    vLLM's names)."""
    return tuned_exported() | set(GATEWAY_EXPORTED), vllm_exported()


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


def test_every_alert_names_only_exported_metrics(exported):
    """The alerts' expressions, checked as the dashboard's are: tuned's names from its
    registry (and the gateway's), vLLM's by a pattern that matches one of its names,
    and Prometheus's own ``up``."""
    tuned, vllm = exported
    rules = alert_rules()
    assert len(rules) == 8
    for name, rule in rules.items():
        names, patterns = metric_names(rule["expr"]), name_patterns(rule["expr"])
        assert names or patterns, name
        assert names <= tuned | PROMETHEUS_OWN, f"{name}: {sorted(names - tuned)}"
        for pat in patterns:
            assert pat.startswith(VLLM_PREFIX), name
            assert len({n for n in vllm if re.fullmatch(pat, n)}) == 1, (name, pat)
    used = set().union(*(metric_names(r["expr"]) for r in rules.values()))
    assert {"tuned_requests_refused_total", REFUSED_METRIC, "tuned_step_path_errors_total",
            "tuned_fallback_active", "tuned_fallbacks_total", "tuned_engine_steps_total",
            "tuned_reloads_total", "up"} == used


def test_the_name_check_fails_a_misspelt_metric(exported):
    tuned, _ = exported
    names = metric_names("sum by (where) (increase(tuned_step_path_error_total[15m])) > 0")
    assert names - tuned == {"tuned_step_path_error_total"}


def test_dashboard_shows_decisions_beside_vllm_latency(exported):
    """Feasibility, holds and fallbacks from tuned, TTFT and TPOT from vLLM, on the
    panel that shows the cap; the series duplicating vLLM's are read from vLLM."""
    dash = load()
    used = set()
    for _, expr in all_queries(dash):
        used |= metric_names(expr) | name_patterns(expr)
    assert {"tuned_sla_feasible", "tuned_queue_deferred_total", "tuned_fallback_active",
            "tuned_controller_tick_phase_seconds_bucket"} <= used
    # what an operator is paged for: refusals (the queue's and the gateway's 429s) and
    # errors on the step path; and the guard's holds, which are not the policy's deferrals
    panel_of = {t["legendFormat"]: (p["title"], metric_names(t["expr"]))
                for p in dash["panels"] for t in p["targets"]}
    assert panel_of["held {{reason}}"] == ("Queue holds, deferrals and admissions (per s)",
                                           {"tuned_queue_held_total"})
    assert panel_of["deferred {{policy}}"][1] == {"tuned_queue_deferred_total"}
    assert panel_of["refused {{reason}}"] == ("Refusals by reason (requests/s)",
                                              {"tuned_requests_refused_total"})
    assert panel_of["refused overloaded (HTTP 429, gateway)"] == (
        "Refusals by reason (requests/s)", {REFUSED_METRIC})
    assert panel_of["{{where}}"] == ("Step-path errors by place (count per 5 min)",
                                     {"tuned_step_path_errors_total"})
    panel = next(p for p in dash["panels"] if p["title"].startswith("vLLM TTFT and TPOT"))
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
        "server": 'label_values(tuned_applied_cap_seqs{job=~"$job"}, server)',
        "engine": 'label_values(tuned_applied_cap_seqs{job=~"$job", server=~"$server"}, '
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
        # a count over Grafana's rate interval changes with the zoom: a count has a
        # fixed window its title names, a rate is per second
        bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)    # no string literals
        for fn, window in re.findall(r"\b(rate|increase|changes)\([^\[]*\[([^\]]+)\]", bare):
            if fn == "rate":
                assert window == "$__rate_interval", f"{where}: rate over {window}"
            else:
                assert window != "$__rate_interval", f"{where}: {fn} changes with the zoom"
                if where.startswith("panel"):
                    title = where.split("'")[1]
                    assert {"1h": "last 1 h", "5m": "per 5 min"}[window] in title, where
        # every selector filters by the dashboard's variables: tuned's by job, instance
        # and engine, vLLM's by its own job and the same engine
        selectors = re.findall(r"([\w:]*)\{([^}]*)\}", re.sub(r"\{\{\w+\}\}", "", expr))
        assert selectors, where
        for name, sel in selectors:
            if "__name__" in sel:
                assert sel.endswith(VLLM_SELECTOR), f"{where}: {sel}"
            elif name == REFUSED_METRIC:
                assert sel == GATEWAY_SELECTOR, f"{where}: {sel}"
            else:
                assert sel == TUNED_SELECTOR, f"{where}: {sel}"
    titles = {p["title"] for p in dash["panels"]}
    for required in ("Batch size: decision vs applied cap (sequences)",
                     "Time between tokens vs SLA (s)",
                     "KV cache: used (%), capacity (tokens, right axis)",
                     "GPU memory (bytes)",
                     "Throughput (tokens/s; requests/s and preemptions/s on the right axis)",
                     "Fallbacks, controller errors, reloads (count per 5 min)",
                     "Decisions by reason (decisions/s)", "SLA feasible (1 = yes)",
                     "Fallback active (1 = yes)", "Queue holds, deferrals and admissions (per s)",
                     "Refusals by reason (requests/s)",
                     "Step-path errors by place (count per 5 min)",
                     "vLLM TTFT and TPOT p95 (s) beside the cap (sequences, right axis)",
                     "SLA feasible, fallback active (1 = yes)"):
        assert required in titles
    # every title names its unit, in parentheses at the end, and the unit Grafana draws
    # the (left) axis in agrees with it
    axis_word = {"s": "s", "percentunit": "%", "bytes": "bytes"}
    for p in dash["panels"]:
        m = re.search(r" \(([^()]+(?:\([^()]*\)[^()]*)*)\)$", p["title"])
        assert m, f"no unit in {p['title']!r}"
        unit = p["fieldConfig"]["defaults"]["unit"]
        if unit in axis_word:
            assert axis_word[unit] in re.split(r"[ ,;()]+", p["title"]), p["title"]


def test_guide_queries_are_read_whole():
    q = guide_queries()
    assert len(q) == 4, list(q)
    beside = next(v for k, v in q.items() if k.startswith("tuned's cap (sequences) beside"))
    assert beside.startswith("label_replace(max by (server, engine)") and " or " in beside
    assert all(v.count("(") == v.count(")") for v in q.values()), q


class FakeVllm:
    """The series vLLM's API server exports, under vLLM's own names, types and labels
    (``model_name``, ``engine``), for the dashboard's vLLM queries; one per server."""

    def __init__(self, engines: list[str], running: float, refusing: bool = False):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        kinds = {"gauge": Gauge, "counter": Counter, "histogram": Histogram}
        self.series = {n: kinds[t](n, n, ["model_name", "engine"], registry=self.registry)
                       for n, t in vllm_definitions().items()
                       if n.removeprefix("vllm:") in VLLM_USED}
        self.engines = engines
        # tuned's gateway middleware counts its 429s in the API server's registry
        self.gateway = Counter(REFUSED_METRIC.removesuffix("_total"), "429s",
                               registry=self.registry) if refusing else None
        for e in engines:
            self.series["vllm:num_requests_running"].labels("m", e).set(running)
            self.series["vllm:num_requests_waiting"].labels("m", e).set(2)
            self.series["vllm:kv_cache_usage_perc"].labels("m", e).set(0.5)

    def tick(self) -> None:
        """What a serving engine does between scrapes: counts and latencies move."""
        if self.gateway is not None:
            self.gateway.inc()
        for e in self.engines:
            for name, s in self.series.items():
                child = s.labels("m", e)
                if isinstance(child, type(self.series["vllm:generation_tokens"].labels("m", e))):
                    child.inc(5)
            for name in ("vllm:time_to_first_token_seconds",
                         "vllm:request_time_per_output_token_seconds",
                         "vllm:inter_token_latency_seconds"):
                self.series[name].labels("m", e).observe(0.2)


#: the vLLM families the dashboard and the guide read (names without ``vllm:``)
VLLM_USED = {"num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
             "generation_tokens", "request_success", "num_preemptions",
             "time_to_first_token_seconds", "request_time_per_output_token_seconds",
             "inter_token_latency_seconds"}


def _pairs(result: list) -> list[tuple[str, str]]:
    return sorted((r["metric"].get("server", ""), r["metric"].get("engine", ""))
                  for r in result)


@pytest.mark.slow  # a real Prometheus scraping for several seconds
@pytest.mark.parallel
def test_every_query_returns_what_it_says(prometheus):
    """Two servers, as a fleet runs them: server A (127.0.0.1) with two data-parallel
    ranks, server B (127.0.0.2) with one; each serves tuned's real metrics registry
    per rank and vLLM's series (same names, types and labels) from its API server.
    Prometheus scrapes them with the operator guide's scrape config, relabelling as
    written, and a third tuned target, server C (127.0.0.3), where nothing listens.
    Then every dashboard query returns one series per server and rank (vLLM's
    included: two servers' engine 0 are not summed), the server variable picks one
    server, each of the guide's queries returns what its comment says, and each alert
    names exactly the servers and ranks whose trouble it is about."""
    from prometheus_client import start_http_server

    from tuned.control.metrics import Metrics
    from tuned.base.netutil import free_port

    a, b = "127.0.0.1", "127.0.0.2"
    ranks = {(a, "0"): Metrics(engine="0"), (a, "1"): Metrics(engine="1"),
             (b, "0"): Metrics(engine="0")}
    ceiling = {a: 16, b: 16}
    cap = {a: 12, b: 16}          # A holds the cap below max_num_seqs, B does not
    for (host, _), m in ranks.items():
        m.target.set(cap[host]), m.lower.set(8), m.upper.set(16), m.applied_cap.set(cap[host])
        m.ceiling.set(ceiling[host])
        m.token_budget.set(544), m.sla_feasible.set(1), m.in_fallback.set(0)
        m.tbt_sla.set(0.05), m.kv_usage.set(0.6), m.kv_capacity.set(65536)
        m.gpu_used.labels("0").set(18 * 2**30), m.gpu_total.labels("0").set(24 * 2**30)
        m.decisions.labels("sla_hold").inc(), m.errors.inc(0)
        m.q_admitted.labels("sjf").inc(), m.q_deferred.labels("sjf").inc()
        m.tick.observe(0.002), m.tick_phase.labels("decide").observe(0.001)
        for _ in range(5):
            m.tbt.observe(0.04)
        m.q_held.labels("ttft_guard").inc()
    vllm = {a: FakeVllm(["0", "1"], running=3, refusing=True), b: FakeVllm(["0"], running=7)}
    servers = [start_http_server(0, addr=host, registry=m.exported)
               for (host, _), m in ranks.items()]
    servers += [start_http_server(0, addr=host, registry=v.registry) for host, v in vllm.items()]
    addr = [f"{s.server_address[0]}:{s.server_address[1]}" for s, _ in servers]
    expected = [(a, "0"), (a, "1"), (b, "0")]
    c = "127.0.0.3"
    try:
        prom = prometheus([], scrape_configs=guide_scrape_configs(
            {"tuned": addr[:3] + [f"{c}:{free_port()}"], "vllm": addr[3:]}))
        prom.wait_for_series("count(tuned_applied_cap_seqs) == 3", timeout_s=60)
        prom.wait_for_series('count({__name__=~"vllm[:_]num_requests_running"}) == 3', 60)
        # after the first scrape: the annotation's change, the guide's refused reloads
        # and one fallback on A's rank 0
        for m in ranks.values():
            m.reloads.labels("refused").inc()
        ranks[(a, "0")].fallbacks.labels("stale").inc()
        ranks[(a, "0")].in_fallback.set(1)
        # the relabelling: tuned's and vLLM's series of one server share its label
        assert _pairs(prom.query("tuned_applied_cap_seqs")) == expected
        assert _pairs(prom.query('{__name__=~"vllm[:_]num_requests_running"}')) == expected
        values = prom.api("label/server/values", **{"match[]": "tuned_applied_cap_seqs"})
        assert values == [a, b]

        queries = dict(all_queries(load()))
        panels = {p["title"]: p for p in load()["panels"]}
        legends = {f"panel {p['title']!r} {t['refId']}": t.get("legendFormat", "")
                   for p in panels.values() for t in p["targets"]}
        guide = guide_queries()
        rules = alert_rules()
        pending = {**{w: _grafana_to_promql(e) for w, e in queries.items()},
                   **{"guide: " + c: q for c, q in guide.items()},
                   **{"alert: " + n: r["expr"] for n, r in rules.items()}}
        deadline = time.monotonic() + 120
        # rate() needs two samples inside the window: keep counters moving a little
        while pending and time.monotonic() < deadline:
            for (host, _), m in ranks.items():
                if host == a:     # B's engine stalls: it holds requests and never steps
                    m.steps.inc()
                m.tbt.observe(0.03), m.tick.observe(0.001), m.q_deferred.labels("sjf").inc()
                m.tick_phase.labels("decide").observe(0.001), m.decisions.labels("sla_hold").inc()
                m.q_held.labels("ttft_guard").inc()
            # B refuses at its wait bound, A's server answers 429s (FakeVllm), and A's
            # rank 1 has errors on its step path
            ranks[(b, "0")].refused.labels("max_wait").inc()
            ranks[(a, "1")].step_path_errors.labels("pop_request").inc()
            for v in vllm.values():
                v.tick()
            for where, expr in list(pending.items()):
                res = prom.query(expr)  # raises on a PromQL syntax error
                want = 6 if where.startswith("guide: tuned's cap") else 1
                if len(res) >= want:
                    del pending[where]
            time.sleep(1)
        assert not pending, f"queries without data: {sorted(pending)}"

        # ---- the dashboard: a line per server and rank wherever the legend names them
        for where, legend in legends.items():
            # asked again now: the first answer may predate a server's second scrape
            res = prom.query(_grafana_to_promql(queries[where]))
            assert all(math.isfinite(float(r["value"][1])) for r in res), (where, res)
            if "{{server}}" in legend and "{{engine}}" in legend:
                keys = [(r["metric"].get("server", ""), r["metric"].get("engine", ""),
                         r["metric"].get("gpu", "")) for r in res]
                assert sorted({k[:2] for k in keys}) == expected, (where, res)
                assert len(keys) == len(set(keys)), \
                    f"{where}: series that differ only in labels the legend hides: {res}"
        # ... and vLLM's series of two servers' engine 0 are not added up
        running = queries[next(w for w in queries if w.startswith(
            "panel 'Requests running / waiting (requests)' A"))]
        got = {(r["metric"]["server"], r["metric"]["engine"]): float(r["value"][1])
               for r in prom.query(_grafana_to_promql(running))}
        assert got == {(a, "0"): 3.0, (a, "1"): 3.0, (b, "0"): 7.0}
        # the server variable picks one server, for tuned's panels and vLLM's alike
        only_b = prom.query(_grafana_to_promql(running, server=b))
        assert [(r["metric"]["server"], r["metric"]["engine"], float(r["value"][1]))
                for r in only_b] == [(b, "0", 7.0)]
        cap_panel = queries["panel 'Applied cap (sequences)' A"]
        assert _pairs(prom.query(_grafana_to_promql(cap_panel, server=b))) == [(b, "0")]

        # ---- the operator guide's queries, each against what its comment says
        def g(start: str) -> list:
            """The query's answer now, every series having moved for several scrapes
            (the first answer may predate the first increment of a counter)."""
            [comment] = [c for c in guide if c.startswith(start)]
            return prom.query(guide[comment])

        assert _pairs(g("TBT p95 per server and rank")) == expected
        assert [r["metric"] for r in g("controller tick p99 over every server and rank")] == [{}]
        beside = sorted((r["metric"]["server"], r["metric"]["engine"], r["metric"]["series"],
                         float(r["value"][1])) for r in
                        g("tuned's cap (sequences) beside vLLM's TTFT p95"))
        assert [x[:3] for x in beside] == [(h, e, s) for h, e in expected
                                            for s in ("cap_seqs", "ttft_p95_seconds")]
        assert [x[3] for x in beside if x[2] == "cap_seqs"] == [12.0, 12.0, 16.0]
        assert all(0.1 <= x[3] <= 0.25 for x in beside if x[2] == "ttft_p95_seconds"), beside
        held = g("vLLM's TTFT p95")
        assert _pairs(held) == [(a, "0"), (a, "1")]       # only A holds its cap below 16

        # ---- the alerts, each naming what its trouble is about
        def alert(name: str, *labels: str) -> list[tuple[str, ...]]:
            return sorted(tuple(r["metric"].get(k, "") for k in labels)
                          for r in prom.query(rules[name]["expr"]))

        assert alert("TunedEndpointDown", "server") == [(c,)]
        assert alert("TunedFallbackActive", "server", "engine") == [(a, "0")]
        assert alert("TunedFallbacks", "cause") == [("stale",)]
        assert alert("TunedEngineStalled", "server", "engine") == [(b, "0")]
        assert alert("TunedReloadRefused", "server", "engine") == expected
        assert alert("TunedRequestsRefused", "server", "engine", "reason") == \
            [(b, "0", "max_wait")]
        assert [r["metric"] for r in prom.query(rules["TunedGatewayRefusing"]["expr"])] == \
            [{"server": a}]
        assert alert("TunedStepPathErrors", "server", "engine", "where") == \
            [(a, "1", "pop_request")]
    finally:
        for server, thread in servers:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def test_exposition_has_no_created_series():
    """prometheus_client's ``_created`` samples are not on tuned's endpoint: the
    exposition's families are exactly the registered ones."""
    from prometheus_client import CollectorRegistry

    from tuned.control.metrics import Metrics

    m = Metrics(registry=CollectorRegistry())
    m.tbt.observe(0.01), m.decisions.labels("memory").inc(), m.reloads.labels("ok").inc()
    text = m.exposition().decode()
    families = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    registered = {f.name + {"counter": "_total", "info": "_info"}.get(f.type, "")
                  for f in m.registry.collect()}
    assert "_created" not in text
    assert families == registered
    # the registry itself still carries them: the exposition drops them
    assert any(s.name.endswith("_created") for f in m.registry.collect() for s in f.samples)


def test_operator_guide_documents_exactly_the_exported_metrics():
    """docs/operator-guide.md names every series tuned.control.metrics registers, and no other."""
    from tuned.control.metrics import Metrics

    from tuned.engines.gateway import EXPORTED

    # the names a query uses: a counter's _total, an info's _info
    registered = {m.name + {"counter": "_total", "info": "_info"}.get(m.type, "")
                  for m in Metrics().registry.collect()}
    registered |= set(EXPORTED)         # the gateway's, on vLLM's own /metrics
    guide = (DASHBOARD.parents[1] / "docs" / "operator-guide.md").read_text()
    documented = set(re.findall(r"`(tuned_[a-z_]+)", guide))
    documented = {re.sub(r"_(bucket|sum|count)$", "", n) for n in documented}
    assert documented == registered
