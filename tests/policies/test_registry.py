"""tuned.policies.registry: each declared batch policy built and composed in the
declared wrappers, in order; a package.module:Class plugin likewise, without the
token budget."""

from __future__ import annotations

import pytest

from tuned import config as config_mod
from tuned.policies import catalog, registry
from tuned.policies.batch import BatchPolicy
from tuned.policies.static import StaticPolicy
from tuned.policies.trtllm import TrtllmPolicy


def _chain(policy) -> list[str]:
    out = []
    while policy is not None:
        out.append(type(policy).__name__)
        policy = getattr(policy, "__dict__", {}).get("inner")
    return out


def _build(**raw):
    cfg = config_mod.validate(raw)
    return registry.build_batch_policy(cfg, ceiling=64, max_num_batched_tokens=2048,
                                       block_size=16)[0]


def test_the_wrappers_are_declared_innermost_first():
    assert [w.name for w in registry.WRAPPERS] == ["token_budget", "cap_damper",
                                                   "gpu_memory"]


@pytest.mark.parametrize("name, inner", [("tuned", BatchPolicy), ("memory", BatchPolicy),
                                         ("sla", BatchPolicy), ("trtllm", TrtllmPolicy),
                                         ("static", StaticPolicy)])
def test_each_declared_batch_policy_is_composed_in_the_wrappers(name, inner):
    sla = _build(batch_policy=name, tbt_sla_s=0.05)
    assert _chain(sla) == ["GpuMemoryGuard", "CapDamper", "TokenBudget", inner.__name__]
    full = _build(batch_policy=name, tbt_sla_s=0.05, token_budget_policy="max")
    assert _chain(full) == ["GpuMemoryGuard", "CapDamper", inner.__name__]
    # the memory bound alone sizes no budget for the SLA (budget_sla = false)
    assert sla.inner.inner.sla_s == (0.0 if name == "memory" else 0.05)


def test_auto_budget_sizes_chunks_on_a_staircase_and_leaves_the_full_one_on_a_line():
    from tuned.core.types import Observation

    gpu = _build(batch_policy="tuned", tbt_sla_s=0.05)          # the default granule, 256
    cpu = _build(batch_policy="tuned", tbt_sla_s=0.05, token_budget_granule=0)
    sla_cpu = _build(batch_policy="tuned", tbt_sla_s=0.05, token_budget_granule=0,
                     token_budget_policy="sla")
    paper = _build(batch_policy="tuned", tbt_sla_s=0.05, token_budget_granule=0,
                   sla_mode="paper")
    assert [b.inner.inner.control for b in (gpu, cpu, sla_cpu, paper)] == [True, False,
                                                                         True, True]
    budget = cpu.inner.inner
    d = budget.decide(Observation(num_running=4, num_waiting=3, kv_capacity_blocks=1000,
                                  demand_mean=None, demand_std=None, demand_samples=0,
                                  tbt_mean_s=0.06, decode_batch_mean=4.0))
    # the full budget, reported as chosen for a line, and the SLA bound told that the
    # budget does not act (so a violation caused by prefill moves the cap)
    assert (d.token_budget, d.inputs["budget_bound"], budget.inner.budget_acts) == (
        2048, "line", False)


def test_a_plugin_is_composed_without_the_token_budget(tmp_path, monkeypatch):
    from tests.faults import MODE_ENV, write_mode

    write_mode(tmp_path / "mode", "normal")
    monkeypatch.setenv(MODE_ENV, str(tmp_path / "mode"))
    cfg = config_mod.validate({"batch_policy": "tests.faults:FaultPolicy", "tbt_sla_s": 0.05})
    pol, first = registry.build_batch_policy(cfg, ceiling=64, max_num_batched_tokens=2048,
                                             block_size=16)
    assert _chain(pol) == ["GpuMemoryGuard", "CapDamper", "FaultPolicy"] and first is None


def test_step_fit_and_static_cap_come_from_the_declaration():
    assert [n for n in catalog.names("batch") if registry.wants_step_fit(n)] == ["tuned",
                                                                                 "sla"]
    assert not registry.wants_step_fit("pkg.mod:Cls")
    pol = _build(batch_policy="static", b_max=12, max_num_seqs=32, token_budget_policy="max")
    assert pol.inner.inner.cap == 12


def test_an_unknown_queue_policy_names_the_known_ones():
    with pytest.raises(ValueError, match=r"^unknown queue policy 'sjf' \(known: fcfs, mcsf, "
                                         r"multibin, bucket, saber, sglang\)$"):
        registry.policy_class("sjf")
