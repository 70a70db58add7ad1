"""tuned.policies.catalog: the policies' declarations read as data, what config
validates against, and where every list of policy names comes from."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tuned import config as config_mod
from tuned.config import ConfigError
from tuned.policies import catalog
from tuned.policies.registry import make_policy, policy_class

ROOT = Path(__file__).resolve().parents[2]


def _problems(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as e:
        config_mod.validate(raw)
    return e.value.problems


def _in_order(names, known) -> bool:
    """``known`` are all in ``names``, in this order (a policy added since may sit
    between them)."""
    return [n for n in names if n in known] == list(known)


def test_the_names_come_from_the_declarations_in_their_order():
    assert _in_order(catalog.names("batch"), ("tuned", "memory", "sla", "trtllm", "static"))
    assert _in_order(catalog.names("queue"),
                     ("fcfs", "mcsf", "multibin", "bucket", "saber", "sglang"))
    assert config_mod.BATCH_POLICIES == catalog.names("batch")
    assert config_mod.QUEUE_POLICIES == catalog.names("queue")


def test_config_validates_policies_without_importing_policy_code():
    """config reads the declarations as data: after importing it, validating every
    policy with options and printing --explain, the only modules of tuned.policies
    loaded are the package and its catalog."""
    code = textwrap.dedent("""
        import sys
        from tuned import config
        for q in config.QUEUE_POLICIES:
            config.validate({"queue_policy": q})
        config.validate({"queue_policy": "mcsf", "queue_options": {"reserve_fraction": 0.1}})
        for b in config.BATCH_POLICIES:
            config.validate({"batch_policy": b})
        config.explain()
        print(sorted(m for m in sys.modules if m.startswith("tuned.policies")))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['tuned.policies', 'tuned.policies.catalog']"


def test_bad_policy_names_and_options_are_one_line_naming_the_field():
    queues, batches = ", ".join(catalog.names("queue")), ", ".join(catalog.names("batch"))
    assert _problems({"queue_policy": "sjf"}) == [
        f"queue_policy: must be one of {queues}, got 'sjf'"]
    assert _problems({"batch_policy": "tunde"}) == [
        f"batch_policy: must be one of {batches} or package.module:Class, got 'tunde'; "
        "did you mean tuned?"]
    assert _problems({"queue_policy": "mcsf", "queue_options": {"reserve_fraction": "x"}}) \
        == ["queue_options.reserve_fraction: must be a number in [0, 1) or 'auto', got 'x'"]
    assert _problems({"queue_policy": "multibin", "queue_options": {"k": 20}}) == [
        "queue_options.k: must be an integer in [0, 4096] and <= k_max (16), got 20"]
    assert _problems({"queue_policy": "multibin", "queue_options": {"k_max": 2}}) == [
        "queue_options.k_max: must be >= k (4), got 2"]
    assert _problems({"queue_policy": "multibin",
                      "queue_options": {"target_fraction": 1.0, "window": True}}) == [
        "queue_options.target_fraction: must be a number in (0, 1), got 1.0",
        "queue_options.window: must be an integer in [1, 1048576], got True"]
    assert _problems({"queue_policy": "fcfs", "queue_options": {"bogus": 1}}) == [
        "queue_options.bogus: must be an option of queue_policy fcfs (late_after_s), got an "
        "unknown key"]
    assert _problems({"batch_policy": "static", "batch_options": {"x": 1}}) == [
        "batch_options.x: must be an option of batch_policy static (none), got an unknown key"]
    # a plugin reads its own options
    cfg = config_mod.validate({"batch_policy": "pkg.mod:Cls", "batch_options": {"x": 1}})
    assert cfg.batch_options == {"x": 1}


def test_check_config_exits_2_with_the_option_line(tmp_path, capsys):
    from tuned.commands import cli

    f = tmp_path / "t.toml"
    f.write_text('queue_policy = "bucket"\n[queue_options]\nmode = "sjf"\n')
    assert cli.main(["check-config", str(f)]) == 2
    assert capsys.readouterr().err == (f"{f}: queue_options.mode: must be one of online, "
                                       "offline_sjf, offline_ljf, got 'sjf'\n")


@pytest.mark.parametrize("name", catalog.names("queue"))
def test_each_queue_schema_matches_its_class(name):
    """The declared options are the constructor's keywords with the same defaults, and
    the edges of every declared range build."""
    spec = catalog.find("queue", name)
    cls = policy_class(name)
    assert spec.option_names == cls.option_names()
    params = inspect.signature(cls.__init__).parameters
    assert {o.name: o.default for o in spec.options} == {
        n: params[n].default for n in spec.option_names}
    for o in spec.options:
        for edge in (o.lo, o.hi):
            if edge is None or (edge == o.lo and o.lo_open) or (edge == o.hi and o.hi_open):
                continue
            value = int(edge) if o.type == "int" else float(edge)
            options = {o.name: value}
            # an option bounded by another, or bounding one, is set with it
            for other in spec.options:
                if other.at_most == o.name:
                    options[other.name] = min(other.default, value)
                if o.at_most == other.name:
                    options[other.name] = max(other.default, value)
            assert spec.option_problems(options, "queue_options") == []
            make_policy(name, options)     # the class accepts what the schema does


def test_a_third_party_policy_comes_through_the_entry_point_group(tmp_path):
    """An installed distribution naming a module in the tuned.policies group adds its
    policy: config accepts its name and options, --explain lists it, the registry builds
    it, the bench runs it beside the others."""
    (tmp_path / "mypol.py").write_text(textwrap.dedent('''
        from tuned.core.types import Decision

        class Half:
            wants_active = False
            def __init__(self, cap):
                self.cap = cap
            def decide(self, obs):
                return Decision(target=self.cap, lower=1, upper=self.cap, cap=self.cap,
                                batch=self.cap, token_budget=2048, reason="half")

        def build(cfg, *, ceiling, options, **_):
            return Half(max(1, int(ceiling * options["share"])))

        POLICY = {"name": "half", "kind": "batch", "build": "build",
                  "summary": "half the ceiling", "reasons": {"half": "half the ceiling"},
                  "options": {"share": {"type": "float", "default": 0.5, "lo": 0.0,
                                        "hi": 1.0, "lo_open": True, "doc": "share"}},
                  "bench": [{"name": "half", "kind": "peer",
                             "config": {"batch_policy": "half"}}]}
    '''))
    dist = tmp_path / "mypol-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mypol\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tuned.policies]\nhalf = mypol\n")
    code = textwrap.dedent("""
        from tuned import config
        from tuned.bench import runner
        from tuned.policies import catalog, registry
        print(catalog.names("batch"))
        cfg = config.validate({"batch_policy": "half", "batch_options": {"share": 0.25},
                               "token_budget_policy": "max"})
        pol, _ = registry.build_batch_policy(cfg, ceiling=32, max_num_batched_tokens=2048,
                                             block_size=16)
        print(pol.inner.inner.cap, type(pol.inner).__name__, type(pol).__name__)
        try:
            config.validate({"batch_policy": "half", "batch_options": {"share": 0}})
        except config.ConfigError as e:
            print(e.problems)
        print([l for l in config.explain().splitlines() if "half" in l])
        base = config.validate({"tbt_sla_s": 0.05})
        print([c.name for c in runner.contenders(base, default_seqs=256, default_tokens=2048,
                                                 caps=[8], ablate=False, quick=True)])
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == str(catalog.names("batch") + ("half",))   # after the built-in ones
    assert lines[1] == "8 CapDamper GpuMemoryGuard"
    assert lines[2] == "['batch_options.share: must be a number in (0, 1], got 0']"
    assert "batch_policy = half: half the ceiling (from mypol, entry point half)" in lines[3]
    field = eval(lines[4])
    assert "half" in field and field.index("half") < field.index("tuned")   # a peer


def test_a_declaration_that_is_not_plain_data_is_refused_naming_the_module():
    src = "import os\nPOLICY = {'name': os.name, 'kind': 'batch'}\n"
    with pytest.raises(catalog.CatalogError,
                       match=r"^x\.y: POLICY must hold plain literals; 'os' is not a "
                             r"top-level constant of the module$"):
        catalog.read_declarations(src, "x.y")
    src = "N = 3\nPOLICY = {'name': 'a', 'kind': 'queue', 'order': N}\n"
    assert catalog.read_declarations(src, "x.y") == [{"name": "a", "kind": "queue",
                                                      "order": 3}]
    with pytest.raises(catalog.CatalogError, match=r"^x\.y: POLICY: kind must be one of "
                                                   r"batch, queue, got 'cap'$"):
        catalog._spec({"name": "a", "kind": "cap", "build": "b", "summary": "s"}, "x.y",
                      "tuned")


def test_status_explains_every_declared_reason():
    from tuned.commands import status

    for reason, text in catalog.reasons().items():
        assert status.REASONS[reason] == text
    assert status.REASONS["trtllm"] == ("batch_policy = trtllm: TensorRT-LLM's dynamic "
                                        "batch-size tuner")


def test_the_bench_field_is_the_declared_runs():
    from tuned.bench import runner

    base = config_mod.validate({"tbt_sla_s": 0.05, "ttft_sla_s": 2.0})
    names = [c.name for c in runner.contenders(base, default_seqs=256, default_tokens=2048,
                                               caps=[8])]
    # the field as it was before the policies declared their runs, in that order
    assert _in_order(names, ["vllm-default", "static-8", "trtllm", "sglang", "tuned",
                             "tuned-cap-only", "tuned-budget-only", "tuned-queue-only",
                             "tuned-guard-only", "tuned-memory", "tuned-sla", "tuned-paper",
                             "tuned-mcsf", "tuned-multibin", "tuned-bucket", "tuned-saber"])
    # and every run a policy declares, where its kind goes
    def runs(kind, policy_kind=None):
        return [r.name for r in runner.policy_runs(kind, policy_kind)]

    assert names == ["vllm-default", "static-8", *runs("peer"), "tuned", "tuned-cap-only",
                     "tuned-budget-only", "tuned-queue-only", "tuned-guard-only",
                     *runs("tuned", "batch"), "tuned-paper", *runs("tuned", "queue")]
    # a variant the base config already runs is left out
    mcsf = config_mod.validate({"queue_policy": "mcsf"})
    assert "tuned-mcsf" not in [c.name for c in runner.contenders(
        mcsf, default_seqs=256, default_tokens=2048, caps=[8])]


def test_a_broken_third_party_declaration_is_left_out_and_named(tmp_path):
    """One unreadable third-party declaration does not make every config invalid: it is
    left out, and a config naming it is told why."""
    (tmp_path / "brokenpol.py").write_text("import os\nPOLICY = {'name': os.name}\n")
    dist = tmp_path / "brokenpol-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenpol\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[tuned.policies]\nbroken = brokenpol\n")
    code = textwrap.dedent("""
        from tuned import config
        config.validate({})
        try:
            config.validate({"batch_policy": "broken"})
        except config.ConfigError as e:
            print(e.problems)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"),
                       timeout=60)
    assert r.returncode == 0, r.stderr
    names = ", ".join(catalog.names("batch"))
    assert r.stdout.strip() == str([
        f"batch_policy: must be one of {names} or package.module:Class, got 'broken' "
        "(policies left out: broken (brokenpol): brokenpol: POLICY must hold plain "
        "literals; 'os' is not a top-level constant of the module)"])
