"""The cap damper around a batch policy: a cap sequence in, the damped sequence out;
config validation; where the registry puts it."""

from __future__ import annotations

import pytest

from tuned import config
from tuned.core.types import Decision, Observation
from tuned.policies.damping import CapDamper, hold_ticks
from tuned.policies.gpu_memory import GpuMemoryGuard
from tuned.policies.registry import build_batch_policy


def obs(running=4, waiting=2):
    return Observation(num_running=running, num_waiting=waiting, kv_capacity_blocks=1000,
                       demand_mean=None, demand_std=None, demand_samples=0,
                       tbt_mean_s=None, decode_batch_mean=None)


class Scripted:
    """A batch policy that decides the caps it is given, one per tick."""

    wants_active = False

    def __init__(self, caps):
        self.caps = list(caps)
        self.marker = "inner"

    def decide(self, o: Observation) -> Decision:
        cap = self.caps.pop(0)
        return Decision(target=cap, lower=1, upper=32, cap=cap, batch=max(cap, o.num_running),
                        token_budget=2048, reason="sla_expand", inputs={"running": o.num_running})


def run(caps, ticks, running=4):
    damper = CapDamper(Scripted(caps), hold_ticks=ticks, ceiling=32)
    return damper, [damper.decide(obs(running)) for _ in caps]


def test_saw_tooth_in_smooth_out():
    # a raise wanted for one tick at a time is never applied; falls apply at once
    _, out = run([4, 10, 4, 10, 4, 10, 4, 10], ticks=3)
    assert [d.cap for d in out] == [4] * 8
    assert [d.reason for d in out] == ["sla_expand", "cap_raise_hold"] * 4
    # the demo's course 4, 10, 5, 9: three ticks agree on 5 at least, so 5 applies
    _, out = run([4, 10, 5, 9, 4, 10, 5, 9], ticks=3)
    assert [d.cap for d in out] == [4, 4, 4, 5, 4, 4, 4, 5]
    assert [d.reason for d in out] == ["sla_expand", "cap_raise_hold", "cap_raise_hold",
                                       "cap_raise_hold"] * 2


def test_raise_applies_after_the_hold_to_the_lowest_cap_wanted_meanwhile():
    _, out = run([4, 10, 8, 9, 12, 12, 12, 12], ticks=3)
    assert [d.cap for d in out] == [4, 4, 4, 8, 8, 8, 12, 12]
    held = out[1]
    assert held.inputs["policy_cap"] == 10 and held.inputs["policy_reason"] == "sla_expand"
    assert (held.inputs["cap_raise_wanted_ticks"], held.inputs["cap_raise_hold_ticks"]) == (1, 3)
    assert held.target == 10 and held.upper == 32   # the recommendation passes through
    assert held.batch == 4                          # max(cap, running)
    # the tick that applies the raise to 8 while 9 is wanted: still held above 8
    assert (out[3].reason, out[3].inputs["policy_cap"]) == ("cap_raise_hold", 9)
    assert out[6].reason == "sla_expand" and "policy_cap" not in out[6].inputs


def test_decreases_apply_at_once_and_reset_the_raise():
    _, out = run([8, 12, 12, 3, 12, 12, 12, 2], ticks=3)
    assert [d.cap for d in out] == [8, 8, 8, 3, 3, 3, 12, 2]


def test_batch_never_below_running_while_held():
    _, out = run([4, 10], ticks=2, running=7)
    assert (out[1].cap, out[1].batch) == (4, 7)


def test_off_passes_the_inner_decision_object_through():
    inner = Scripted([4, 10, 5])
    damper = CapDamper(inner, hold_ticks=0, ceiling=32)
    assert [damper.decide(obs()).cap for _ in range(3)] == [4, 10, 5]
    assert damper.marker == "inner"     # the inner policy's attributes show through


def test_hold_ticks_span_the_hold():
    assert hold_ticks(0.0, 0.5) == 0
    assert hold_ticks(1.0, 0.5) == 3     # wanted at t, t + 0.5, t + 1.0
    assert hold_ticks(1.5, 0.5) == 4
    assert hold_ticks(0.1, 0.5) == 2
    assert hold_ticks(0.3, 0.1) == 4
    with pytest.raises(ValueError, match=r"hold_ticks: must be >= 0, got -1"):
        CapDamper(Scripted([]), hold_ticks=-1, ceiling=32)


def test_config_key_is_validated():
    assert config.validate({}).cap_raise_hold_s == 0.0
    assert config.validate({"cap_raise_hold_s": 2}).cap_raise_hold_s == 2.0
    with pytest.raises(config.ConfigError,
                       match=r"cap_raise_hold_s: must be in \[0, 600\], got -1"):
        config.validate({"cap_raise_hold_s": -1})
    with pytest.raises(config.ConfigError,
                       match=r"cap_raise_hold_s: must be a number in \[0, 600\], got 'x'"):
        config.validate({"cap_raise_hold_s": "x"})


def test_registry_puts_the_damper_inside_the_gpu_guard():
    cfg = config.validate({"max_num_seqs": 16, "cap_raise_hold_s": 1.0, "interval_s": 0.5})
    pol, _ = build_batch_policy(cfg, ceiling=16, max_num_batched_tokens=2048, block_size=16)
    assert isinstance(pol, GpuMemoryGuard) and isinstance(pol.inner, CapDamper)
    assert pol.inner.hold_ticks == 3
    assert pol.wants_active is False    # read through both wrappers
