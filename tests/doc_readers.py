"""What the docs and the dashboard say, read for the tests that check them and for the
end-to-end tests that run them: docs/kubernetes.md's vLLM command line
(docs/test_docs_own_command.py, deploy/test_kubernetes.py, e2e/test_e2e_own_command.py)
and the Grafana dashboard's and the operator guide's PromQL (deploy/test_dashboard.py,
e2e/test_e2e_prometheus.py). A helper module beside fakes.py rather than a test module,
so that a test in one folder never imports a test module of another."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ docs/kubernetes.md

DOC = ROOT / "docs" / "kubernetes.md"
DOC_MODEL = "meta-llama/Llama-2-7b-hf"
DOC_CONFIG = "/etc/tuned/tuned.toml"


def doc_block(lang: str, after: str = "") -> str:
    """The first ``lang`` code block of docs/kubernetes.md after the text ``after``."""
    text = DOC.read_text()
    if after:
        text = text[text.index(after):]
    return re.search(rf"```{lang}\n(.*?)```", text, re.S).group(1)


def documented_command(model: str = DOC_MODEL, config_path: str = DOC_CONFIG) -> list[str]:
    """The command line of docs/kubernetes.md as an argument list, with ``model`` and
    ``config_path`` in place of the documented ones."""
    text = doc_block("sh", "## The command line").replace("\\\n", " ")
    return [a.replace(DOC_MODEL, model).replace(DOC_CONFIG, config_path)
            for a in shlex.split(text)]


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


# ------------------------------------------------------------------ dashboard and guide

DASHBOARD = ROOT / "dashboards" / "tuned-grafana.json"
GUIDE = ROOT / "docs" / "operator-guide.md"


def load_dashboard() -> dict:
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


def grafana_to_promql(expr: str, **values: str) -> str:
    """A dashboard query as Grafana sends it: each variable ".*" (All) unless given."""
    for var in ("job", "server", "engine", "vllm_job"):
        expr = expr.replace(f'"${var}"', '"%s"' % values.get(var, ".*"))
    return expr.replace("$__rate_interval", "15s")


def guide_block(lang: str) -> str:
    """The first ``lang`` code block of the operator guide's Metrics section."""
    text = GUIDE.read_text()
    text = text[text.index("\n## Metrics"):]
    return re.search(rf"```{lang}\n(.*?)```", text, re.S).group(1)


def guide_queries() -> dict[str, str]:
    """The guide's "Useful queries": {comment: query}, a query's continuation lines
    (indented) joined to it."""
    out, comment = {}, ""
    for line in guide_block("promql").splitlines():
        if line.startswith("# "):
            comment = (comment + " " + line[2:]) if comment and comment not in out else line[2:]
        elif line.startswith("  ") and comment in out:
            out[comment] += " " + line.strip()
        elif line.strip():
            out[comment] = line.strip()
    return out


def guide_scrape_configs(targets: dict[str, list[str]]) -> list[dict]:
    """The guide's scrape config with ``targets`` ({job: [host:port]}) in place of the
    documented ones; its relabelling kept as written."""
    import yaml

    jobs = yaml.safe_load(guide_block("yaml"))["scrape_configs"]
    assert sorted(j["job_name"] for j in jobs) == sorted(targets)
    return [dict(j, static_configs=[{"targets": targets[j["job_name"]]}]) for j in jobs]
