"""docs/kubernetes.md's example: every object valid against the Kubernetes OpenAPI
schema, and as a Kubernetes user expects it (probes, resources, volumes, the token in
a Secret, Recreate, one scrape path, `vllm serve` with tuned's scheduler)."""

from __future__ import annotations

import copy
import subprocess
import sys

import kubernetes_validate
import pytest
import yaml

from doc_readers import DOC_CONFIG, DOC_MODEL, doc_block as _block, documented_command, \
    flag_value as _flag
from tuned import config as config_mod
from tuned.config import engine_problems
from tuned.opscli import config_problems

#: the Kubernetes versions the example is checked against: the oldest the example
#: needs (sidecar-free, startupProbe GA long before) and the newest schema bundled
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
#: the ServiceMonitor (Prometheus Operator, monitoring.coreos.com/v1) fields used;
#: its CRD schema is not bundled with kubernetes-validate
SERVICEMONITOR_ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme",
                                "relabelings", "metricRelabelings", "honorLabels"}
RELABEL_KEYS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus",
                "replacement", "action"}


def manifests() -> list[dict]:
    return list(yaml.safe_load_all(_block("yaml", "## Kubernetes")))


def kind(docs: list[dict], name: str) -> dict:
    [found] = [d for d in docs if d["kind"] == name]
    return found


def container(docs: list[dict]) -> dict:
    [c] = kind(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def schema_problems(doc: dict) -> list[str]:
    """What strict validation against each version's OpenAPI schema says (unknown
    fields included); [] when valid."""
    out = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            out.append(f"{doc['kind']} on {version}: {e.message} at {'.'.join(map(str, e.path))}")
    return out


def servicemonitor_problems(doc: dict) -> list[str]:
    out = []
    spec = doc["spec"]
    if set(spec) - {"selector", "endpoints", "jobLabel", "namespaceSelector"}:
        out.append(f"spec: unknown {sorted(set(spec) - {'selector', 'endpoints'})}")
    for i, ep in enumerate(spec["endpoints"]):
        if set(ep) - SERVICEMONITOR_ENDPOINT_KEYS:
            out.append(f"endpoints[{i}]: unknown {sorted(set(ep) - SERVICEMONITOR_ENDPOINT_KEYS)}")
        for r in ep.get("relabelings", []):
            if set(r) - RELABEL_KEYS:
                out.append(f"endpoints[{i}].relabelings: unknown {sorted(set(r) - RELABEL_KEYS)}")
    return out


def test_every_object_is_valid_against_the_kubernetes_schema():
    docs = manifests()
    assert [d["kind"] for d in docs] == ["Secret", "PersistentVolumeClaim", "Deployment",
                                         "Service", "ServiceMonitor"]
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            assert servicemonitor_problems(doc) == []
        else:
            assert schema_problems(doc) == [], doc["kind"]


@pytest.mark.parametrize("where, broken, message", [
    ("a misspelt field", lambda c, d: c.__setitem__("startupProbes", c.pop("startupProbe")),
     "Additional properties are not allowed ('startupProbes' was unexpected)"),
    ("a port that is no number or name",
     lambda c, d: c["ports"][0].__setitem__("containerPort", "eight thousand"),
     "'eight thousand' is not of type 'integer'"),
    ("a strategy as a string", lambda c, d: d["spec"].__setitem__("strategy", "Recreate"),
     "'Recreate' is not of type 'object'"),
])
def test_the_schema_check_fails_a_broken_manifest(where, broken, message):
    deploy = copy.deepcopy(kind(manifests(), "Deployment"))
    broken(deploy["spec"]["template"]["spec"]["containers"][0], deploy)
    problems = schema_problems(deploy)
    assert len(problems) == len(K8S_VERSIONS), where
    assert all(message in p for p in problems), problems


def test_servicemonitor_check_fails_a_misspelt_field():
    monitor = copy.deepcopy(kind(manifests(), "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["relabellings"] = monitor["spec"]["endpoints"][0].pop(
        "relabelings")
    assert servicemonitor_problems(monitor) == ["endpoints[0]: unknown ['relabellings']"]


def test_probes_ask_vllm_and_cover_a_cold_start():
    docs = manifests()
    c = container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8000, "tuned-metrics": 9464}
    assert int(_flag(c["args"], "--port")) == ports["http"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # vLLM's /health: 503 once its engine is dead; never tuned's /healthz, which is
        # 503 while only the controller is stale and the fallback cap already serves
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
        assert "initialDelaySeconds" not in c[probe], probe
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] >= 1800   # a 30 min download
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] >= 60      # not on one slow answer


def test_resources_volumes_and_rollout():
    docs = manifests()
    deploy = kind(docs, "Deployment")
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    c = container(docs)
    req, lim = c["resources"]["requests"], c["resources"]["limits"]
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(req)
    assert req["nvidia.com/gpu"] == lim["nvidia.com/gpu"] == 1
    gib = lambda q: int(q.removesuffix("Gi"))  # noqa: E731
    assert gib(lim["memory"]) >= gib(req["memory"]) >= 16
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e for e in c["env"]}
    hf_home = env["HF_HOME"]["value"]
    claim = volumes[mounts[hf_home]]["persistentVolumeClaim"]["claimName"]
    assert kind(docs, "PersistentVolumeClaim")["metadata"]["name"] == claim
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token"


def test_the_reload_token_is_in_a_secret():
    docs = manifests()
    assert not [d for d in docs if d["kind"] == "ConfigMap"]
    secret = kind(docs, "Secret")
    assert 'reload_token = "' in secret["stringData"]["tuned.toml"]
    volumes = {v["name"]: v for v in kind(docs, "Deployment")["spec"]["template"]["spec"]
               ["volumes"]}
    c = container(docs)
    [mount] = [m for m in c["volumeMounts"] if DOC_CONFIG.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]] == {"name": mount["name"],
                                      "secret": {"secretName": secret["metadata"]["name"],
                                                 "defaultMode": 0o440}}


def test_one_scrape_path_with_the_dashboards_labels():
    docs = manifests()
    for d in docs:
        for meta in (d["metadata"], d.get("spec", {}).get("template", {}).get("metadata", {})):
            assert not any(k.startswith("prometheus.io/") for k in meta.get("annotations", {}))
    monitor, service = kind(docs, "ServiceMonitor"), kind(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {p["name"] for p in service["spec"]["ports"]} \
        == {"http", "tuned-metrics"}
    # the labels the dashboard and the operator guide's queries join on
    for port, job in (("tuned-metrics", "tuned"), ("http", "vllm")):
        assert endpoints[port]["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "server"},
            {"targetLabel": "job", "replacement": job}], port


def container_argv() -> list[str]:
    c = container(manifests())
    return c["command"] + c["args"]


def test_container_runs_vllm_serve_with_the_documented_flags():
    documented = documented_command()
    i = documented.index("--model")
    flags = documented[3:i] + documented[i + 2:]
    assert documented[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert container_argv() == ["vllm", "serve", DOC_MODEL, *flags,
                                "--host", "0.0.0.0", "--port", "8000"]
    assert _flag(container_argv(), "--scheduler-cls") == "tuned.engines.vllm.TunedScheduler"


def _secret_config(tmp_path):
    path = tmp_path / "tuned.toml"
    path.write_text(kind(manifests(), "Secret")["stringData"]["tuned.toml"])
    return path


def test_config_passes_and_agrees_with_the_engine(tmp_path):
    path = _secret_config(tmp_path)
    assert config_problems(str(path), watchdog_s=0, deep=True) == []
    cfg = config_mod.load(path)
    assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9464)
    argv = container_argv()
    engine = {"model": argv[2], "max_num_seqs": int(_flag(argv, "--max-num-seqs")),
              "max_num_batched_tokens": int(_flag(argv, "--max-num-batched-tokens")),
              "max_model_len": 4096, "num_gpu_blocks": None}
    assert engine_problems(cfg, engine) == []


def test_init_container_refuses_a_bad_config(tmp_path):
    """The init container's command, run here as written (``tuned`` as ``python -m
    tuned``) on the Secret's config and on a broken copy of it."""
    [init] = kind(manifests(), "Deployment")["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["tuned", "check-config"]
    assert init["command"][-1] == DOC_CONFIG
    good = _secret_config(tmp_path)
    run = lambda path: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "tuned", *init["command"][1:-1], str(path)],
        capture_output=True, text=True, timeout=120)
    r = run(good)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace("max_num_seqs = 256", "max_num_seqs = 0"))
    r = run(bad)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "max_num_seqs" in r.stdout + r.stderr


@pytest.mark.slow  # imports vLLM's CLI (tens of seconds); starts no engine
def test_vllm_serve_parses_the_container_arguments(tmp_path, monkeypatch):
    """vLLM's own `vllm serve` parser reads the container's arguments: the model as
    its positional, tuned's scheduler class, the additional config tuned's scheduler
    reads (which loads the Secret's config) and the middleware."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args(container_argv()[1:])
    assert args.subcommand == "serve" and args.model_tag == DOC_MODEL
    assert args.scheduler_cls == "tuned.engines.vllm.TunedScheduler"
    assert args.middleware == ["tuned.engines.gateway.RefuseWhenOverloaded"]
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (256, 8192)
    additional = args.additional_config
    additional = additional if isinstance(additional, dict) else dict(additional)
    assert additional == {"tuned": {"config_path": DOC_CONFIG}}
    path = _secret_config(tmp_path)
    setup = config_mod.engine_setup({"tuned": {"config_path": str(path)}}, {})
    assert setup.cfg.max_num_seqs == args.max_num_seqs
    assert setup.reload_token_sha256 and "change-me" not in setup.reload_token_sha256
    assert engine_problems(setup.cfg, {"model": args.model_tag,
                                       "max_num_seqs": args.max_num_seqs,
                                       "max_num_batched_tokens": args.max_num_batched_tokens,
                                       "max_model_len": 4096, "num_gpu_blocks": None}) == []
