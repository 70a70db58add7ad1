"""The vLLM internals tuned relies on (tuned/engines/vllm_surface.py): the installed
vLLM has each of them, the committed reports list the surface as it is, and a
changed source is reported changed or missing, entry by entry."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import zipfile
from pathlib import Path

import pytest

from tuned.engines import vllm_surface
from tuned.engines.vllm_surface import INTERNALS, TUNED_SCHEDULER_NAMES, Internal
from tuned.engines.vllm_surface_check import (SurfaceSourceError, check, counts, report,
                                              report_keys, surface_keys)
from tuned.engines.vllm_version import SUPPORTED_VLLM

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "docs" / "vllm-surface"
TOOL = ROOT / "tools" / "vllm_surface.py"


def installed_dir() -> Path:
    return Path(importlib.util.find_spec("vllm").submodule_search_locations[0])


def regenerate(rep: dict, name: str) -> str:
    src = rep["source"] if rep["source"].endswith(".whl") else "SITE_PACKAGES_WITH_VLLM"
    return f".venv/bin/python tools/vllm_surface.py {src} --json docs/vllm-surface/{name}"


def load_tool():
    spec = importlib.util.spec_from_file_location("vllm_surface_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------- the installed vLLM
def test_the_installed_vllm_has_every_internal_unchanged():
    version, findings = check(installed_dir())
    assert [(f.name, f.expect, f.detail) for f in findings if f.status != "present"] == []
    assert counts(findings) == {"present": len(INTERNALS), "changed": 0, "missing": 0}
    # the committed report of this release is what the check finds now
    committed = json.loads((REPORTS / f"{version}.json").read_text())
    assert committed["internals"] == report(version, "", findings)["internals"], \
        f"regenerate: {regenerate(committed, f'{version}.json')}"


def test_every_committed_report_lists_the_surface_as_it_is_now():
    names = sorted(p.name for p in REPORTS.glob("*.json"))
    # one report per supported release
    assert sorted({tuple(int(x) for x in n.split(".")[:2]) for n in names}) == \
        sorted(SUPPORTED_VLLM)
    for name in names:
        rep = json.loads((REPORTS / name).read_text())
        assert rep["vllm_version"] == name.removesuffix(".json")
        assert report_keys(rep) == surface_keys(), (
            f"docs/vllm-surface/{name} was made from another list of internals than "
            f"tuned/engines/vllm_surface.py's; regenerate it: {regenerate(rep, name)}")
        assert rep["counts"] == {s: sum(d["status"] == s for d in rep["internals"])
                                 for s in ("present", "changed", "missing")}


def test_the_033_report_says_what_changed():
    """vLLM 0.33 keeps every internal as tuned uses it; what moved: the frontend's
    argument class (tuned passes its flags, imports nothing from it) and one new
    POST route, sorted into the routes the gateway refuses."""
    rep = json.loads((REPORTS / "0.33.0.json").read_text())
    assert rep["counts"] == {"present": len(INTERNALS), "changed": 0, "missing": 0}
    found = {(d["kind"], d["name"], d["expect"]): d["found"] for d in rep["internals"]}
    assert found[("flag", "*:FrontendArgs", "--middleware")] == \
        "vllm.entrypoints.common.cli_args:FrontendArgs.middleware"
    routes = next(d for d in rep["internals"] if d["kind"] == "routes")
    assert routes["found"] == "59 POST routes"
    old = json.loads((REPORTS / "0.32.0.json").read_text())
    assert next(d for d in old["internals"] if d["kind"] == "routes")["found"] == \
        "58 POST routes; not in this release: /v1/decisions"
    assert "/v1/decisions" in vllm_surface.QUEUED_ROUTES


def _signature(fn) -> str:
    out, kinds = [], inspect.Parameter
    params = list(inspect.signature(fn).parameters.values())
    for i, p in enumerate(params):
        if p.kind == kinds.KEYWORD_ONLY and not any(
                q.kind == kinds.VAR_POSITIONAL for q in params[:i]) and \
                (i == 0 or params[i - 1].kind != kinds.KEYWORD_ONLY):
            out.append("*")
        mark = {kinds.VAR_POSITIONAL: "*", kinds.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append(mark + p.name + ("=" if p.default is not p.empty else ""))
        if p.kind == kinds.POSITIONAL_ONLY and (
                i + 1 == len(params) or params[i + 1].kind != kinds.POSITIONAL_ONLY):
            out.append("/")
    return ", ".join(out)


def test_the_static_reading_agrees_with_the_imported_vllm(tiny_model):
    """What the source check says is there is there at run time: each method's
    parameters as inspect reads them, each attribute and field on a live scheduler,
    request and config."""
    from fakes import make_scheduler, requests

    for it in INTERNALS:
        if it.kind == "method":
            module, qual = it.name.split(":")
            cls_name, member = qual.split(".")
            cls = getattr(importlib.import_module(module), cls_name)
            assert _signature(getattr(cls, member)) == it.expect, it.name
    s = make_scheduler(str(tiny_model), False)
    try:
        vc = s.vllm_config
        live = {"Scheduler": s, "Request": requests(1)[0], "VllmConfig": vc,
                "SchedulerConfig": vc.scheduler_config, "ModelConfig": vc.model_config,
                "CacheConfig": vc.cache_config, "ParallelConfig": vc.parallel_config,
                "KVCacheManager": s.kv_cache_manager,
                "BlockPool": s.kv_cache_manager.block_pool}
        checked = []
        for it in INTERNALS:
            if it.kind not in ("attribute", "field", "property"):
                continue
            cls_name, member = it.name.split(":")[1].split(".")
            if cls_name in live:
                assert hasattr(live[cls_name], member), it.name
                checked.append(it.name)
        assert len(checked) == 40
    finally:
        s.shutdown()


def test_the_names_tuned_adds_to_the_scheduler_are_the_listed_ones():
    """TUNED_SCHEDULER_NAMES is what _TunedMixin defines (methods and self.X) less the
    scheduler's own names the surface lists (the overrides, the two knobs)."""
    tree = ast.parse((ROOT / "tuned" / "engines" / "vllm.py").read_text())
    mixin = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_TunedMixin")
    names = set()
    for fn in mixin.body:
        if isinstance(fn, ast.FunctionDef):
            names.add(fn.name)
            for node in ast.walk(fn):
                targets = (node.targets if isinstance(node, ast.Assign) else
                           [node.target] if isinstance(node, ast.AnnAssign) else [])
                names |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                          and isinstance(t.value, ast.Name) and t.value.id == "self"}
    vllms = {it.name.rsplit(".", 1)[1] for it in INTERNALS
             if it.name.startswith("vllm.v1.core.sched.scheduler:Scheduler.")}
    assert names - vllms == set(TUNED_SCHEDULER_NAMES)
    assert names & vllms == {"_free_request", "max_num_active_reqs", "max_num_scheduled_tokens",
                             "schedule", "shutdown", "update_from_output"}


# ------------------------------------------------------------- a planted change
FAKE = {
    "__init__.py": "from .version import __version__\n",
    "version.py": "from vllm._version import __version__\n",
    "_version.py": "__version__ = version = '9.1.0'\n",
    "v1/__init__.py": "", "v1/core/__init__.py": "", "v1/core/sched/__init__.py": "",
    "v1/core/sched/interface.py": (
        "class SchedulerInterface:\n"
        "    def __init__(self, vllm_config):\n"
        "        self.vllm_config = vllm_config\n"
        "        self._setup()\n"
        "    def _setup(self):\n"
        "        self.running = []\n"
        "    def shutdown(self):\n"
        "        self.metrics = None\n"),
    "v1/core/sched/scheduler.py": (
        "from vllm.v1.core.sched.interface import SchedulerInterface\n"
        "class Scheduler(SchedulerInterface):\n"
        "    def __init__(self, vllm_config, kv_cache_config, *, block_size):\n"
        "        super().__init__(vllm_config)\n"
        "        self.max_num_scheduled_tokens = 8\n"
        "    def schedule(self, budget, throttle_prefills=False):\n"
        "        self.waiting.pop_request()\n"
        "        self.waiting.popleft()\n"
        "    @property\n"
        "    def waiting(self):\n"
        "        return []\n"
        "    @property\n"
        "    def get_request_counts(self):\n"
        "        return 0, 0\n"),
    "v1/core/sched/request_queue.py": (
        "from abc import ABC, abstractmethod\n"
        "class RequestQueue(ABC):\n"
        "    @abstractmethod\n"
        "    def add_request(self, request): ...\n"
        "    @abstractmethod\n"
        "    def pop_request(self): ...\n"
        "    @abstractmethod\n"
        "    def drain(self): ...\n"),
    "v1/engine/__init__.py": (
        "import msgspec\n"
        "class EngineCoreOutput(msgspec.Struct):\n"
        "    request_id: str\n"
        "    new_token_ids: list\n"
        "    error: object\n"
        "    finish_reason: object = None\n"),
}

PLANTED = (
    Internal("method", "vllm.v1.core.sched.scheduler:Scheduler.schedule",
             "self, throttle_prefills="),
    Internal("method", "vllm.v1.core.sched.scheduler:Scheduler.__init__",
             "self, vllm_config, kv_cache_config, block_size"),
    Internal("method", "vllm.v1.core.sched.scheduler:Scheduler.get_request_counts", "self"),
    Internal("method", "vllm.v1.core.sched.scheduler:Scheduler.shutdown", "self"),
    Internal("attribute", "vllm.v1.core.sched.scheduler:Scheduler.max_num_active_reqs"),
    Internal("attribute", "vllm.v1.core.sched.scheduler:Scheduler.max_num_scheduled_tokens"),
    Internal("attribute", "vllm.v1.core.sched.scheduler:Scheduler.waiting"),
    Internal("attribute", "vllm.v1.core.sched.scheduler:Scheduler.running"),
    Internal("attribute", "vllm.v1.core.sched.scheduler:Scheduler.vllm_config"),
    Internal("unclaimed", "vllm.v1.core.sched.scheduler:Scheduler", "ceiling metrics steps"),
    Internal("abstract", "vllm.v1.core.sched.request_queue:RequestQueue",
             "add_request peek_request pop_request"),
    Internal("calls", "vllm.v1.core.sched:self.waiting", "add_request pop_request"),
    Internal("constructor", "vllm.v1.engine:EngineCoreOutput",
             "request_id new_token_ids finish_reason events"),
    Internal("class", "vllm.v1.core.sched.async_scheduler:AsyncScheduler", "Scheduler"),
    Internal("name", "vllm:__version__"),
)

WANT = [
    ("changed", "vllm.v1.core.sched.scheduler:Scheduler.schedule",
     "parameters (self, budget, throttle_prefills=), expected (self, throttle_prefills=)"),
    ("changed", "vllm.v1.core.sched.scheduler:Scheduler.__init__",
     "parameters (self, vllm_config, kv_cache_config, *, block_size), expected "
     "(self, vllm_config, kv_cache_config, block_size)"),
    ("changed", "vllm.v1.core.sched.scheduler:Scheduler.get_request_counts",
     "now a property (tuned expects: method)"),
    ("present", "vllm.v1.core.sched.interface:SchedulerInterface.shutdown", ""),
    ("missing", "",
     "no max_num_active_reqs in vllm.v1.core.sched.scheduler:Scheduler or its vLLM bases"),
    ("present", "vllm.v1.core.sched.scheduler:Scheduler.max_num_scheduled_tokens", ""),
    ("changed", "vllm.v1.core.sched.scheduler:Scheduler.waiting",
     "now a property (tuned expects: attribute)"),
    ("present", "vllm.v1.core.sched.interface:SchedulerInterface.running", ""),
    ("present", "vllm.v1.core.sched.interface:SchedulerInterface.vllm_config", ""),
    ("changed", "vllm.v1.core.sched.scheduler:Scheduler",
     "vLLM now defines metrics (attribute of vllm.v1.core.sched.interface:SchedulerInterface)"),
    ("changed", "vllm.v1.core.sched.request_queue:RequestQueue",
     "new abstract: drain; no longer abstract: peek_request"),
    ("changed", "vllm.v1.core.sched", "now also calls popleft; no longer calls add_request"),
    ("changed", "vllm.v1.engine:EngineCoreOutput", "no field events; now requires error"),
    ("missing", "", "no module vllm.v1.core.sched.async_scheduler"),
    ("present", "vllm._version:__version__", ""),
]


def _plant(root: Path) -> Path:
    for rel, text in FAKE.items():
        f = root / "vllm" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def test_a_planted_change_is_reported_entry_by_entry(tmp_path):
    version, findings = check(_plant(tmp_path), PLANTED)
    assert version == "9.1.0"
    assert [(f.status, f.found, f.detail) for f in findings] == WANT


def test_a_wheel_reads_as_its_unpacked_folder(tmp_path):
    _plant(tmp_path / "tree")
    wheel = tmp_path / "vllm-9.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for rel, text in FAKE.items():
            z.writestr(f"vllm/{rel}", text)
        z.writestr("vllm-9.1.0.dist-info/METADATA", "Name: vllm\n")
    assert check(wheel, PLANTED) == check(tmp_path / "tree" / "vllm", PLANTED)


def test_the_tool_prints_the_table_writes_the_report_and_fails_on_a_change(tmp_path, capsys):
    tool = load_tool()
    out = tmp_path / "r" / "9.1.0.json"
    tree = _plant(tmp_path / "tree")
    assert tool.main([str(tree), "--json", str(out)]) == 1
    lines = capsys.readouterr().out.splitlines()
    c = counts(check(tree)[1])
    assert c["changed"] > 0 and c["missing"] > 0
    assert lines[0] == f"vLLM 9.1.0 from {tree}"
    assert lines[1].split() == ["status", "kind", "internal", "note"]
    assert len(lines) == 2 + len(INTERNALS) + 2
    assert lines[-2] == (f"{c['present']} present, {c['changed']} changed, {c['missing']} "
                         f"missing of {len(INTERNALS)}")
    assert lines[-1] == f"wrote {out}"
    rep = json.loads(out.read_text())
    assert rep["vllm_version"] == "9.1.0" and rep["source"] == "tree"
    assert report_keys(rep) == surface_keys()


def test_a_path_without_vllm_is_one_clear_line(tmp_path, capsys):
    tool = load_tool()
    assert tool.main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err == \
        f"vllm_surface: {tmp_path / 'nowhere'}: no such file or folder\n"
    (tmp_path / "x.whl").write_text("not a zip")
    assert tool.main([str(tmp_path / "x.whl")]) == 2
    assert capsys.readouterr().err == \
        f"vllm_surface: {tmp_path / 'x.whl'}: not a wheel (a zip file) nor a folder\n"
    with pytest.raises(SurfaceSourceError, match=r"no vllm package here"):
        check(tmp_path)


def test_the_check_and_the_gateway_import_no_vllm():
    """The check runs where vLLM is not installed (or another release is); the
    gateway takes its routes from the same list without importing vLLM."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['vllm'] = None; "
            "import tuned.engines.vllm_surface_check, tuned.engines.gateway; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert (out.returncode, out.stdout) == (0, "['vllm']\n"), out.stderr
