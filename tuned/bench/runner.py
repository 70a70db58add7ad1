"""Running contenders: one workload, one seed, many configurations, side by side.

A :class:`Contender` is a name, a kind (``static``, ``peer``, ``tuned``) and the
:class:`~tuned.config.Config` its engine runs. :func:`contenders` builds the
standard field from a base config:

* ``vllm-default``: vLLM's own ``max_num_seqs`` / ``max_num_batched_tokens`` for the
  engine kind (:data:`tuned.sim.hardware.VLLM_DEFAULTS`);
* ``static-<cap>``: the sweep, powers of two and their midpoints up to the ceiling
  (``--quick``: powers of two), each with vLLM's default token budget; the best of
  them in hindsight is picked per metric by the report;
* ``trtllm``: TensorRT-LLM's dynamic batch-size tuner as the batch policy;
* ``sglang``: SGLang's new_token_ratio admission as the queue policy, cap at the ceiling;
* ``tuned`` (memory and SLA bounds, token budget against the SLA, and with a TTFT
  SLO the fcfs queue serving requests that can still make it before late ones),
  ``tuned-fifo`` (the same without that demotion: plain FCFS order),
  ``tuned-memory``, ``tuned-sla``, ``tuned-paper`` (Algorithm 2 as published),
  ``tuned-noguard`` (without the per-request TPOT admission guard) and
  ``tuned-<queue policy>`` for mcsf, multibin, bucket, saber.

Engines: :class:`SimBench` runs a contender on the simulator; the real-engine one is
:mod:`tuned.bench.live`. Both return a :class:`RunOutput`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuned import config as config_mod
from tuned.bench.metrics import RequestResult
from tuned.config import Config


@dataclass(frozen=True)
class Contender:
    name: str               # "vllm-default", "static-8", "trtllm", "sglang", "tuned", ...
    kind: str               # "static" | "peer" | "tuned"
    config: Config          # what the engine runs
    cap: int | None = None  # static only


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
                          if r.request_id in failed else None)
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


def _with(cfg: Config, **changes: Any) -> Config:
    d = cfg.to_dict()
    src = d.pop("source_path", "")
    d.update(changes)
    return config_mod.validate(d, source=src)


def contenders(base: Config, *, default_seqs: int, default_tokens: int, quick: bool = False,
               caps: Sequence[int] | None = None, peers: bool = True,
               only: Sequence[str] | None = None) -> list[Contender]:
    """The standard field (see the module docstring) around ``base``, whose
    ``max_num_seqs`` is the ceiling and whose ``tbt_sla_s`` is the TPOT SLO. ``caps``
    replaces the sweep; a sweep cap equal to vLLM's default is not run twice (the
    ``vllm-default`` run is that static cap)."""
    ceiling = base.max_num_seqs
    # static caps and peers run vLLM's own FCFS queue: no TTFT demotion
    static = dict(batch_policy="static", token_budget_policy="max", queue_policy="fcfs",
                  queue_options={}, ttft_sla_s=0.0, admission_guard="off")
    out: list[Contender] = []

    def static_run(name: str, cap: int, tokens: int) -> Contender:
        cfg = _with(base, max_num_seqs=cap, b_max=0, b_min=1, fallback_cap=min(base.fallback_cap, cap),
                    max_num_batched_tokens=max(tokens, cap + base.min_chunk_tokens), **static)
        return Contender(name, "static", cfg, cap)

    out.append(static_run("vllm-default", default_seqs, default_tokens))
    for cap in (sorted(set(caps)) if caps else sweep_caps(ceiling, quick)):
        if cap == default_seqs:
            continue
        if not 1 <= cap <= max(ceiling, default_seqs):
            raise ValueError(f"--caps: {cap} is outside [1, {max(ceiling, default_seqs)}]")
        out.append(static_run(f"static-{cap}", cap, default_tokens))
    peer_tokens = dict(max_num_batched_tokens=max(default_tokens, ceiling + base.min_chunk_tokens),
                       token_budget_policy="max", ttft_sla_s=0.0, admission_guard="off")
    if peers:
        out.append(Contender("trtllm", "peer", _with(base, batch_policy="trtllm",
                                                       queue_policy="fcfs", queue_options={},
                                                       **peer_tokens)))
        out.append(Contender("sglang", "peer", _with(base, batch_policy="static",
                                                       queue_policy="sglang",
                                                       queue_options={}, **peer_tokens)))
    out.append(Contender("tuned", "tuned", base))
    if base.ttft_sla_s and peers:
        # the batch-size and token-budget control alone, in vLLM's plain FCFS order
        out.append(Contender("tuned-fifo", "tuned", _with(base, ttft_sla_s=0.0)))
    if not quick:
        out.append(Contender("tuned-memory", "tuned", _with(base, batch_policy="memory")))
        out.append(Contender("tuned-sla", "tuned", _with(base, batch_policy="sla")))
        out.append(Contender("tuned-paper", "tuned", _with(base, sla_mode="paper")))
        if base.guards_admission:
            out.append(Contender("tuned-noguard", "tuned", _with(base, admission_guard="off")))
        for q in ("mcsf", "multibin", "bucket", "saber"):
            if q != base.queue_policy:
                out.append(Contender(f"tuned-{q}", "tuned",
                                     _with(base, queue_policy=q, queue_options={})))
    if only:
        known = {c.name for c in out}
        missing = [n for n in only if n not in known]
        if missing:
            raise ValueError(f"--contenders: unknown {', '.join(missing)} "
                             f"(known: {', '.join(c.name for c in out)})")
        out = [c for c in out if c.name in only]
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

    def __init__(self, hardware, horizon_s: float = HORIZON_S) -> None:
        self.hardware = hardware
        self.horizon_s = horizon_s

    def run(self, contender: Contender, requests: Sequence, *, timelines: bool = True,
            give_up: tuple | None = None) -> RunOutput:
        from tuned.engines.sim import simulate

        res = simulate(contender.config, self.hardware, requests, record_steps=timelines,
                       horizon_s=self.horizon_s, give_up=give_up)
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


def attainment_at(bench: SimBench, contender: Contender, workload, slo,
                  base_rate: float, target: float = 0.9) -> Callable[[float], float]:
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
