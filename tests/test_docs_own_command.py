"""docs/kubernetes.md: the documented vLLM command line with tuned's scheduler, and
the Kubernetes example, agree with each other and with what tuned checks at start
(tests/e2e/test_e2e_own_command.py starts the same command line)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from tuned import config as config_mod
from tuned.config import engine_problems
from tuned.opscli import config_problems

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "kubernetes.md"
DOC_MODEL = "meta-llama/Llama-2-7b-hf"
DOC_CONFIG = "/etc/tuned/tuned.toml"


def _block(lang: str, after: str = "") -> str:
    text = DOC.read_text()
    if after:
        text = text[text.index(after):]
    return re.search(rf"```{lang}\n(.*?)```", text, re.S).group(1)


def documented_command(model: str = DOC_MODEL, config_path: str = DOC_CONFIG) -> list[str]:
    """The command line of docs/kubernetes.md as an argument list, with ``model`` and
    ``config_path`` in place of the documented ones."""
    text = _block("sh", "## The command line").replace("\\\n", " ")
    return [a.replace(DOC_MODEL, model).replace(DOC_CONFIG, config_path)
            for a in shlex.split(text)]


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _kubernetes() -> list[dict]:
    return list(yaml.safe_load_all(_block("yaml", "## Kubernetes")))


def test_documented_command_line():
    cmd = documented_command()
    assert cmd[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--scheduler-cls") == "tuned.engines.vllm.TunedScheduler"
    assert _flag(cmd, "--additional-config") == \
        '{"tuned": {"config_path": "/etc/tuned/tuned.toml"}}'
    # what the e2e test substitutes is there exactly once
    assert " ".join(cmd).count(DOC_MODEL) == 1 and " ".join(cmd).count(DOC_CONFIG) == 1


def test_kubernetes_container_runs_the_documented_command():
    deploy = next(d for d in _kubernetes() if d["kind"] == "Deployment")
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    argv = container["command"] + container["args"]
    assert argv == documented_command() + ["--host", "0.0.0.0", "--port", "8000"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "tuned-metrics": 9464}
    annotations = deploy["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "9464",
                           "prometheus.io/path": "/metrics"}
    mount = container["volumeMounts"][0]["mountPath"]
    assert DOC_CONFIG.startswith(mount + "/")


def test_kubernetes_config_passes_and_agrees_with_the_engine(tmp_path):
    docs = _kubernetes()
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    path = tmp_path / "tuned.toml"
    path.write_text(cm["data"]["tuned.toml"])
    assert config_problems(str(path), watchdog_s=None, deep=True) == []
    cfg = config_mod.load(path)
    assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9464)
    args = documented_command()
    engine = {"model": _flag(args, "--model"),
              "max_num_seqs": int(_flag(args, "--max-num-seqs")),
              "max_num_batched_tokens": int(_flag(args, "--max-num-batched-tokens")),
              "max_model_len": 4096, "num_gpu_blocks": None}
    assert engine_problems(cfg, engine) == []
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    service = next(d for d in docs if d["kind"] == "Service")
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert {e["port"] for e in monitor["spec"]["endpoints"]} == \
        {p["name"] for p in service["spec"]["ports"]} == {"http", "tuned-metrics"}


def test_readme_links_the_kubernetes_doc():
    assert "(docs/kubernetes.md)" in (ROOT / "README.md").read_text()
