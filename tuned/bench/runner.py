"""Running contenders: one workload, one seed, many configurations, side by side.

A :class:`Contender` is a name, a kind (``static``, ``peer``, ``tuned``,
``ablation``) and the :class:`~tuned.config.Config` its engine runs.
:func:`contenders` builds the standard field from a base config:

* ``vllm-default``: vLLM's own ``max_num_seqs`` / ``max_num_batched_tokens`` for the
  engine kind (:data:`tuned.sim.hardware.VLLM_DEFAULTS`);
* static (cap, token budget) pairs, what an operator tuning by hand (or vLLM's
  ``auto_tune``) sets: caps from :func:`sweep_caps` (powers of two and their
  midpoints up to the ceiling; ``--quick``: powers of two) times token budgets
  from :func:`sweep_budgets`, named ``static-<cap>`` at vLLM's default budget and
  ``static-<cap>@<budget>`` at another; the best pair in hindsight is picked per
  metric by the report, and so is the best cap at the default budget;
* the peers: each policy's declared ``peer`` runs (:func:`policy_runs`), at the full
  token budget without tuned's TTFT ordering or guard -- ``trtllm`` (TensorRT-LLM's
  dynamic batch-size tuner as the batch policy), ``sglang`` (SGLang's new_token_ratio
  admission as the queue policy, cap at the ceiling), and any policy added since;
* ``tuned`` (memory and SLA bounds, token budget against the SLA, and with a TTFT
  SLO the fcfs queue serving requests that can still make it before late ones);
* the ablations (:data:`ABLATIONS`, kind ``ablation``), each one of tuned's levers
  alone against the static pair it holds fixed: ``tuned-cap-only``,
  ``tuned-budget-only``, ``tuned-queue-only``, ``tuned-guard-only``
  (:func:`ablations`), so that the report can say which lever produced a gain;
* without ``--quick``: each policy's declared ``tuned`` runs (``tuned-memory``,
  ``tuned-sla``, then ``tuned-<queue policy>`` for mcsf, multibin, bucket, saber),
  each left out when the base config already runs it, and ``tuned-paper``
  (Algorithm 2 as published) after the batch policies'.

Engines: :class:`SimBench` runs a contender on the simulator; the real-engine one is
:mod:`tuned.bench.live`. Both return a :class:`RunOutput`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuned import config as config_mod
from tuned.bench.metrics import CAPACITY_TARGET, RequestResult
from tuned.config import Config
from tuned.policies import catalog


@dataclass(frozen=True)
class Contender:
    name: str               # "vllm-default", "static-8", "static-8@512", "tuned", ...
    kind: str               # "static" | "peer" | "tuned" | "ablation"
    config: Config          # what the engine runs
    cap: int | None = None  # static: its cap; ablation: the cap it holds fixed
    budget: int | None = None  # static: its token budget; ablation: the fixed one


@dataclass
class RunOutput:
    """One contender's run: per-request results and what the controller did."""

    results: list[RequestResult]
    cap_timeline: list[tuple[float, int]] = field(default_factory=list)   # (t, applied cap)
    tbt_timeline: list[tuple[float, float]] = field(default_factory=list)  # (t, mean TBT s)
    decisions: list[dict] = field(default_factory=list)
    duration_s: float | None = None


def results_from_sim(res) -> list[RequestResult]:
    """The simulated run's requests as the benchmark's per-request results."""
    failed = set(res.failed)
    return [RequestResult(r.request_id, r.arrival_time, r.num_prompt_tokens,
                          r.num_output_tokens, r.first_token_s, r.finish_s,
                          list(r.token_times) if r.token_times is not None else None,
                          r.preemptions, r.recomputed_tokens,
                          failed=r.request_id in failed,
                          error="needs more KV blocks than the cache holds"
                          if r.request_id in failed else None,
                          # set by a simulator whose queue refuses requests
                          refused_s=getattr(r, "refused_s", None))
            for r in res.requests]


def sweep_caps(ceiling: int, quick: bool = False) -> list[int]:
    """Powers of two and their midpoints (3, 6, 12, ...) up to ``ceiling``, which is
    always included; ``quick``: powers of two only."""
    caps: set[int] = set()
    p = 1
    while p <= ceiling:
        caps.add(p)
        if not quick and p >= 2 and p + p // 2 <= ceiling:
            caps.add(p + p // 2)
        p *= 2
    caps.add(ceiling)
    return sorted(caps)


#: token budgets swept per engine kind (vLLM's default budget is always added):
#: ``gpu`` for the simulator's GPUs, ``cpu`` for vLLM's CPU engine
BUDGETS = {"gpu": (512, 1024, 2048, 4096, 8192), "cpu": (128, 256, 512, 2048)}
QUICK_BUDGETS = {"gpu": (512, 2048, 8192), "cpu": (256, 2048)}

#: the ablations, in the order reports list them: each runs one of tuned's levers
#: alone against the static pair (ceiling, base budget) in vLLM's FCFS order
ABLATIONS = ("tuned-cap-only", "tuned-budget-only", "tuned-queue-only", "tuned-guard-only")
#: what each ablation moves, in the report's words
LEVERS = {"tuned-cap-only": "the batch cap", "tuned-budget-only": "the token budget",
          "tuned-queue-only": "the queue order", "tuned-guard-only": "the admission guard"}


def sweep_budgets(kind: str, default_tokens: int, quick: bool = False) -> list[int]:
    """The token budgets of the pair sweep for an engine ``kind`` (``gpu`` or
    ``cpu``), vLLM's ``default_tokens`` included; ``quick``: three (two on a CPU)."""
    grid = (QUICK_BUDGETS if quick else BUDGETS)[kind]
    return sorted(set(grid) | {default_tokens})


def _with(cfg: Config, **changes: Any) -> Config:
    d = cfg.to_dict()
    src = d.pop("source_path", "")
    d.update(changes)
    return config_mod.validate(d, source=src)


def static_name(cap: int, budget: int, default_tokens: int) -> str:
    """``static-C`` at vLLM's default token budget, ``static-C@B`` at another."""
    return f"static-{cap}" if budget == default_tokens else f"static-{cap}@{budget}"


def contenders(base: Config, *, default_seqs: int, default_tokens: int, quick: bool = False,
               caps: Sequence[int] | None = None, budgets: Sequence[int] | None = None,
               peers: bool = True, ablate: bool = True,
               only: Sequence[str] | None = None) -> list[Contender]:
    """The standard field (see the module docstring) around ``base``, whose
    ``max_num_seqs`` is the ceiling and whose ``tbt_sla_s`` is the TPOT SLO. ``caps``
    replaces the cap sweep; each cap runs at every token budget of ``budgets`` and at
    vLLM's default budget.
    A budget below what vLLM accepts for a cap (cap + ``min_chunk_tokens``) is
    raised to it, and a pair reached twice runs once; vLLM's default pair runs as
    ``vllm-default`` only. ``peers`` / ``ablate`` False leave out the peers / the
    ablations (a real engine's ``--quick``)."""
    ceiling = base.max_num_seqs
    hi_cap = max(ceiling, default_seqs)
    # static caps and peers run vLLM's own FCFS queue: no TTFT demotion
    static = dict(batch_policy="static", token_budget_policy="max", queue_policy="fcfs",
                  queue_options={}, ttft_sla_s=0.0, admission_guard="off", on_max_wait="off")
    lo_tok, hi_tok = (config_mod.FIELDS["max_num_batched_tokens"].metadata[k]
                      for k in ("lo", "hi"))
    for b in budgets or ():
        if not lo_tok <= b <= hi_tok:
            raise ValueError(f"--budgets: {b} is outside [{lo_tok}, {hi_tok}]")
    out: list[Contender] = []

    def static_run(name: str, cap: int, tokens: int) -> Contender:
        cfg = _with(base, max_num_seqs=cap, b_max=0, b_min=1, fallback_cap=min(base.fallback_cap, cap),
                    max_num_batched_tokens=tokens, **static)
        return Contender(name, "static", cfg, cap, tokens)

    def vllm_budget(cap: int, tokens: int) -> int:
        return max(tokens, cap + base.min_chunk_tokens)

    out.append(static_run("vllm-default", default_seqs,
                          vllm_budget(default_seqs, default_tokens)))
    seen = {(default_seqs, out[0].budget)}
    for cap in (sorted(set(caps)) if caps else sweep_caps(ceiling, quick)):
        if not 1 <= cap <= hi_cap:
            raise ValueError(f"--caps: {cap} is outside [1, {hi_cap}]")
        for b in sorted(set(budgets or ()) | {default_tokens}):
            tokens = vllm_budget(cap, b)
            if (cap, tokens) in seen:
                continue
            seen.add((cap, tokens))
            out.append(static_run(static_name(cap, tokens, default_tokens), cap, tokens))
    peer_tokens = dict(max_num_batched_tokens=max(default_tokens, ceiling + base.min_chunk_tokens),
                       token_budget_policy="max", ttft_sla_s=0.0, admission_guard="off",
                       on_max_wait="off")
    if peers:   # the peers' rules the policies declare, at the full token budget
        out += [Contender(r.name, "peer", _with(base, **{**peer_tokens, **r.config}))
                for r in policy_runs("peer")]
    out.append(Contender("tuned", "tuned", base))
    if ablate:
        out += ablations(base)
    if not quick:   # tuned with another of its policies, and Algorithm 2 as published
        for kind in ("batch", "queue"):
            out += [Contender(r.name, "tuned", _with(base, **r.config))
                    for r in policy_runs("tuned", kind)
                    if any(getattr(base, k) != v for k, v in r.config.items())]
            if kind == "batch":
                out.append(Contender("tuned-paper", "tuned", _with(base, sla_mode="paper")))
    if only:
        known = {c.name for c in out}
        missing = [n for n in only if n not in known]
        if missing:
            raise ValueError(f"--contenders: unknown {', '.join(missing)} "
                             f"(known: {', '.join(c.name for c in out)})")
        out = [c for c in out if c.name in only]
    return out


def policy_runs(kind: str, policy_kind: str | None = None) -> list[catalog.BenchRun]:
    """The bench runs of ``kind`` (``peer`` or ``tuned``) the policies declare
    (:mod:`tuned.policies.catalog`), batch policies first; ``policy_kind`` keeps
    those of batch or queue policies only."""
    return [r for s in catalog.specs() if policy_kind in (None, s.kind)
            for r in s.bench if r.kind == kind]


def ablations(base: Config) -> list[Contender]:
    """tuned's levers one at a time (:data:`ABLATIONS`), each against the static pair
    (``base.max_num_seqs``, ``base.max_num_batched_tokens``) in FCFS order without
    the guard: the cap control alone (full budget), the token budget alone (a static
    cap at the ceiling with tuned's token budget wrapped around it), the queue alone
    (TTFT demotion, needs a TTFT SLO), the admission guard alone (needs a TPOT SLO;
    its TTFT half too when a TTFT SLO is set, with the queue kept in arrival order).
    """
    plain = dict(queue_policy="fcfs", queue_options={}, ttft_sla_s=0.0, admission_guard="off")
    fixed = dict(plain, batch_policy="static", token_budget_policy="max")
    pair = (base.max_num_seqs, base.max_num_batched_tokens)
    out = [Contender("tuned-cap-only", "ablation",
                     _with(base, **dict(plain, token_budget_policy="max")), *pair),
           Contender("tuned-budget-only", "ablation",
                     _with(base, **dict(plain, batch_policy="static",
                                        token_budget_policy="sla")), *pair)]
    if base.ttft_sla_s:
        out.append(Contender("tuned-queue-only", "ablation",
                             _with(base, **dict(fixed, ttft_sla_s=base.ttft_sla_s)), *pair))
    if base.sla_enabled or base.tbt_sla_auto:
        out.append(Contender("tuned-guard-only", "ablation",
                             _with(base, **dict(fixed, ttft_sla_s=base.ttft_sla_s,
                                                queue_options={"late_after_s": 0.0},
                                                admission_guard="tpot")), *pair))
    return out


def tbt_timeline(steps, bin_s: float = 1.0) -> list[tuple[float, float]]:
    """Mean step time of decode steps per ``bin_s`` bin: (bin start, mean TBT)."""
    acc: dict[int, list[float]] = {}
    for s in steps:
        if s.num_decode:
            acc.setdefault(int(s.t // bin_s), []).append(s.step_s)
    return [(k * bin_s, sum(v) / len(v)) for k, v in sorted(acc.items())]


def itl_timeline(results: Sequence[RequestResult], bin_s: float = 1.0) -> list[tuple[float, float]]:
    """Client-side inter-token latencies per bin (the live engine has no step ring
    for static caps)."""
    acc: dict[int, list[float]] = {}
    for r in results:
        t = r.token_times_s or []
        for a, b in zip(t, t[1:]):
            acc.setdefault(int(b // bin_s), []).append(b - a)
    return [(k * bin_s, sum(v) / len(v)) for k, v in sorted(acc.items())]


class SimBench:
    """Runs contenders on the simulator for one hardware model.

    A run stops ``horizon_s`` of virtual time after the last arrival: a contender that
    cannot keep up (a cap of 1 on an hour of traffic would otherwise simulate days)
    leaves its backlog unfinished, and unfinished requests count as not good. With a
    TTFT SLO far below the horizon none of them could have been good anyway.
    """

    engine = "sim"
    HORIZON_S = 300.0

    def __init__(self, hardware, horizon_s: float = HORIZON_S, events: Any = None) -> None:
        self.hardware = hardware
        self.horizon_s = horizon_s
        self.events = events           # tuned.sim.events.SimEvents: the same for every run

    def run(self, contender: Contender, requests: Sequence, *, timelines: bool = True,
            give_up: tuple | None = None) -> RunOutput:
        from tuned.sim.engine import simulate

        kw: dict[str, Any] = {}
        if self.events is not None:
            kw["drift"] = self.events.drift
            if self.events.pressure:
                kw["nvml"] = self.hardware.nvml(self.events.pressure)
        res = simulate(contender.config, self.hardware, requests, record_steps=timelines,
                       horizon_s=self.horizon_s, give_up=give_up, **kw)
        out = RunOutput(results_from_sim(res), decisions=res.decisions if timelines else [],
                        duration_s=res.duration_s)
        if timelines:
            caps = []
            last = None
            for s, (cap, _) in zip(res.steps, res.knobs):
                if cap != last:
                    caps.append((s.t, cap))
                    last = cap
            out.cap_timeline = caps
            out.tbt_timeline = tbt_timeline(res.steps)
        return out


def attainment_at(bench: SimBench, contender: Contender, workload, slo, base_rate: float,
                  target: float = CAPACITY_TARGET) -> Callable[[float], float]:
    """``rate -> attainment`` of ``contender`` on ``workload`` scaled to that rate."""
    from tuned.bench.metrics import summarize

    def run(rate: float) -> float:
        wl = workload.scaled_rate(rate / base_rate)
        # a probe stops once attainment is sure to miss the target (unfinished
        # requests count as not good, so the answer is the same, sooner)
        max_bad = int((1.0 - target) * len(wl.requests))
        out = bench.run(contender, wl.requests, timelines=False, give_up=(slo, max_bad))
        return float(summarize(out.results, slo)["attainment"] or 0.0)

    return run


#: the load that measures a host's decode step at batch 1 (two requests in flight,
#: short prompts): `tuned demo` derives its SLA from it, `tuned bench --slo
#: tpot=2.5x` its relative SLOs
CALIBRATION_WORKLOAD = "poisson:rate=4,prompt=U(32,96),output=64,n=12"


def sim_batch1_step_s(hardware) -> float:
    """The simulated hardware's decode step at batch 1: its step model's time for one
    decode and no prefill at the calibration load's mean context (mean prompt + half
    the mean output), as the real engine's calibration measures it. ValueError when
    the model gives no positive finite time there."""
    import math

    from tuned.sim.stepmodel import StepShape
    from tuned.base.workloads import parse_workload

    reqs = parse_workload(CALIBRATION_WORKLOAD, 0).requests
    ctx = round(sum(r.prompt_tokens + r.output_tokens / 2 for r in reqs) / len(reqs))
    t = hardware.step_model.step_s(StepShape(1, ctx, 0, 0, 0.0, ctx + 1))
    floor = getattr(hardware.step_model, "MIN_STEP_S", 0.0)
    if not (math.isfinite(t) and t > floor):
        raise ValueError(f"{hardware.name}: its step model gives no batch-1 decode step "
                         f"above {floor:g} s ({t!r}); give the SLO in seconds")
    return t
