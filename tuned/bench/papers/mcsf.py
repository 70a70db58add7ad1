"""Paper scenario ``mcsf``: Section 5.1 of Jaillet et al. (*Online
Scheduling for LLM Inference with KV Cache Constraints*,
``shared/seeds/003_730bb3baf6ac1209.txt``), in the paper's own discrete-time model.

One module, past the usual size, as every paper scenario is one: the model, the
hindsight IP, the algorithms and the report all cite this docstring's equations.

Model (Section 2). One batch per time unit, one token per running request per
batch. Request i (arrival a_i, prompt s_i, output o_i) started at p_i ≥ a_i holds
s_i + (t − p_i) KV tokens at every time t with p_i < t ≤ p_i + o_i, completes at
c_i = p_i + o_i and frees its memory afterwards; at every t the running requests
hold at most M tokens. Latency c_i − a_i; objective the total latency (Σ o_i of it
is fixed, so it is Σ start times up to a constant).

Hindsight optimum (Section 3, (1)–(4)), :func:`solve_hindsight_ip`: binary x_{i,k}
= 1 iff i starts at k,

    min  Σ_i Σ_k (k + o_i − a_i) x_{i,k}
    s.t. Σ_k x_{i,k} = 1                                          ∀i        (2)
         Σ_i Σ_{k = max(a_i, t − o_i)}^{t − 1} (s_i + t − k) x_{i,k} ≤ M  ∀t        (3)

solved by ``scipy.optimize.milp`` (HiGHS). Departure: the paper lets every k run
over {a_i, …, T̄} with T̄ = Σ (a_i + o_i); here k runs over a window that provably
holds every optimal start (this is what makes HiGHS fast enough). With UB the total
latency of a feasible schedule (the better of MC-SF and MC-Benchmark) and LB_{−i}
a lower bound on the total latency of the other requests, an optimal schedule has
lat_i = OPT − Σ_{j≠i} lat_j ≤ UB − LB_{−i}, so k ≤ a_i + UB − LB_{−i} − o_i.
LB_{−i} (:func:`latency_lower_bound`): the k-th earliest completion among the
other requests is at least the k-th smallest a_j + o_j, and at least
a_min + ⌈V_k / M⌉ where V_k is the sum of the k smallest volumes
vol_j = s_j·o_j + o_j(o_j + 1)/2, since those k requests must fit their whole
volume into (a_min, c] at M tokens per time (the bound behind Lemma 4.7).
Memory rows (3) are written for every t up to the last possible completion, so no
schedule the IP returns can overflow after T̄ either.

MC-SF (Algorithm 1, :func:`mcsf`): each round t, running requests continue;
waiting requests that have arrived are tried in ascending õ_i (ties: arrival, then
index) and admitted while inequality (5) holds at every completion time
t' = p_j + õ_j of S(t) ∪ U(t) ∪ {i}; the first one that does not fit ends the
round. Predictions are exact, õ = o, as in Section 5.1. No second implementation:
:func:`drive_policy` runs the shipped :class:`tuned.policies.mcsf.MCSFPolicy`
(``reserve_fraction = 0``, blocks of one token) through this model, so its order and
its check decide; the check sees (tokens held now, steps left) =
(s_j + t − p_j, p_j + õ_j − t) for running j and (s_i, õ_i) for new i: at d = t' − t
steps ahead j holds s_j + t' − p_j while d ≤ steps left, i.e. while õ_j ≥ t' − p_j,
which is (5) with the paper's inclusive indicator; it evaluates exactly the
completion times t' > t (the paper's list; running requests that completed at or
before t are gone and their memory was already checked). Algorithm 1 and (5) agree
with (3): a request started at t first holds s_i + 1 at t + 1, so the start round
itself is not checked.

MC-Benchmark (Appendix C, Algorithm 2, :func:`mc_benchmark`): the same round, the
shipped policy's check, with candidates in ascending arrival time (ties: index,
i.e. generation order, which under all-at-once arrivals is a random order).

α-protection greedy and α-protection β-clearing (Section 5.2,
:func:`alpha_protection`). The paper defines them in prose; choices where the text
leaves room (the admission rule and the clearing rule are
:mod:`tuned.bench.papers.mcsf_baselines`, which Table 1 on the simulator uses too):

* New prompts are tried first-come first-served (the text motivates both by
  vLLM's FCFS); a prompt i is admitted while the batch's memory after this round,
  Σ_{running} (s_j + g_j + 1) + Σ_{admitted} (s_j + 1), stays ≤ (1 − α)M ("a new
  prompt with initial memory s_i + 1 would cause the memory usage to exceed
  (1 − α)M"); the first that does not fit ends the round. (An idle round admits
  its first prompt anyway, the shipped queue's liveness rule; with s_i + 1 ≤ 3 and
  (1 − α)M ≥ 7 here it never applies.)
* Overflow is detected when the running requests alone would exceed M after this
  round's token. Greedy clears all of them, β-clearing each independently with
  probability β; cleared requests lose their tokens and go back to the waiting
  queue at their original arrival position (as vLLM requeues a recomputed
  request). Clearing takes no time: if the survivors fit, the round goes on as
  usual; if they still exceed M, the round is lost (no token, no admission) and
  clearing repeats next round; the appendix's remark that a small β "requires a
  significant time" to clear enough memory is read this way.
* Greedy can loop for ever (the paper saw "infinite processing loops" for small
  α): after a full clear with no arrivals left, the state is the set of
  unfinished requests; if that set repeats, the run is declared livelocked. Any
  run also stops after ``max_rounds``. Unfinished runs are counted, not averaged.
* α and β: Section 5.1 names none (the paper runs the baselines only in 5.2);
  the six configurations of Section 5.2 / Table 1 are used: greedy α ∈ {0.3,
  0.25}, β-clearing (α, β) ∈ {0.2, 0.1} × {0.2, 0.1}.

Instances (Section 5.1, scaled). The paper draws M ∈ U{30..50}, s_i ∈ U{1..5},
o_i ∈ U{1..M − s_i}; model 1: n ∈ U{40..60} all at t = 0; model 2: horizon
T ∈ U{40..60}, Poisson(λ) arrivals at each t ∈ {1..T}, λ ∈ U[0.5, 1.5]; 200
trials each, Gurobi for the IP. HiGHS does not prove optimality at that size in
seconds (already slow at n ≈ 10, M ≈ 16), so
:data:`SCALED_SIZES` shrinks lengths by about 0.35 (M ∈ U{11..17}, s_i ∈ U{1..2},
o_i ∈ U{1..M − s_i} as in the paper) and the request count to n ∈ U{5..8}
(model 1) or T ∈ U{4..8} with the paper's λ ∈ U[0.5, 1.5] (model 2), redrawing
model-2 instances with more than 10 requests: Poisson counts at a mean of 6
reach 21, which HiGHS cannot solve in reasonable time, and the cap keeps the
spread (max about 1.6x the mean) near the paper's (n ≈ 20–90 around 50). The IP
then has at most ~1200 binaries over horizons up to ~150 and is proven optimal
(gap 0) within seconds of CPU. Fewer requests per instance leave fewer ways to hide one
scheduling mistake, so per-instance ratios spread wider than the paper's at
n ≈ 50; with the paper's λ the scaled model 2 is also less overloaded (an arrival
brings about 3 time units' worth of the full memory M, against about 8).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from tuned.bench.papers.mcsf_baselines import (BASELINES, AlphaProtectionPolicy,
                                              ArrivalOrderMCSF, clear_on_overflow)
from tuned.bench.papers.mcsf_table1 import (PAPER_TABLE1, format_load_sweep, format_table1,
                                            load_sweep, run_table1)
from tuned.bench.papers.mcsf_table1 import SEEDS as T1_SEEDS
from tuned.policies.mcsf import MCSFPolicy
from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo

ARRIVAL_MODELS = ("all_at_once", "online")

#: Section 5.1's reported latency ratios to the hindsight optimum (MC-SF only;
#: the paper reports no baseline in 5.1).
PAPER_FIGURES: dict[str, dict[str, float]] = {
    "all_at_once": {"avg": 1.005, "worst": 1.074, "best": 1.000, "optimal_share": 114 / 200},
    "online": {"avg": 1.047, "worst": 1.227, "best": 1.000},
}

#: Section 5.2, Table 1 (real-data simulation, 1000 requests, λ = 50, 50 runs):
#: average end-to-end latency in seconds. Not the 5.1 experiment; shown as each
#: algorithm's latency relative to MC-SF's, next to ours.
PAPER_TABLE1_AVG_LATENCY_S: dict[str, float] = {name: row[0] for name, row in PAPER_TABLE1.items()}


@dataclass(frozen=True)
class Request:
    """One request of the model: arrival time, prompt tokens s_i, output tokens o_i."""

    arrival: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Instance:
    """Requests and the KV memory M (tokens); every request must fit alone (s + o ≤ M)."""

    memory_tokens: int
    requests: tuple[Request, ...]
    arrival_model: str = "all_at_once"

    def __post_init__(self) -> None:
        for i, r in enumerate(self.requests):
            if r.output_tokens < 1 or r.prompt_tokens < 0 or r.arrival < 0:
                raise ValueError(f"request {i}: need o >= 1, s >= 0, a >= 0, got {r}")
            if r.prompt_tokens + r.output_tokens > self.memory_tokens:
                raise ValueError(f"request {i}: s + o = {r.prompt_tokens + r.output_tokens} "
                                 f"> M = {self.memory_tokens}, it can never run")


@dataclass(frozen=True)
class Schedule:
    """What an algorithm did: the (last) start and the completion of every request.

    ``finished`` is False when the run livelocked or hit its round cap; then
    ``total_latency`` is None. ``evictions`` counts cleared requests and
    ``lost_rounds`` rounds spent over M (α-protection baselines only).
    """

    starts: tuple[int | None, ...]
    completions: tuple[int | None, ...]
    total_latency: int | None
    finished: bool = True
    evictions: int = 0
    lost_rounds: int = 0


@dataclass(frozen=True)
class IPResult:
    """The hindsight IP's answer.

    ``total_latency``: best integer solution found (None if none); ``proven_optimal``:
    the dual bound closes the gap to below one latency unit (the objective is
    integral); ``mip_gap``: HiGHS's (primal − dual) / primal.
    """

    total_latency: int | None
    status: int
    message: str
    proven_optimal: bool
    mip_gap: float | None
    dual_bound: float | None
    starts: tuple[int, ...] | None
    variables: int
    memory_rows: int
    horizon: int
    solve_s: float


def memory_profile(instance: Instance, starts: Sequence[int]) -> list[int]:
    """KV tokens held at each time 0..H by a non-preemptive schedule, the left side of (3).

    mem[t] = Σ_{i: p_i < t ≤ p_i + o_i} (s_i + t − p_i).
    """
    reqs = instance.requests
    horizon = max((p + r.output_tokens for p, r in zip(starts, reqs)), default=0)
    mem = [0] * (horizon + 1)
    for p, r in zip(starts, reqs):
        for t in range(p + 1, p + r.output_tokens + 1):
            mem[t] += r.prompt_tokens + t - p
    return mem


def total_latency(instance: Instance, starts: Sequence[int]) -> int:
    """Σ_i (p_i + o_i − a_i), objective (1)."""
    return sum(p + r.output_tokens - r.arrival for p, r in zip(starts, instance.requests))


def latency_lower_bound(instance: Instance, exclude: int | None = None) -> int:
    """A lower bound on the total latency of every feasible schedule (request ``exclude`` left out).

    Sorting completions, the k-th earliest is ≥ the k-th smallest a_j + o_j and
    ≥ a_min + ⌈V_k / M⌉ with V_k the sum of the k smallest volumes
    vol_j = s_j·o_j + o_j(o_j + 1)/2 (the k first finishers hold that much memory
    inside (a_min, c_(k)], at most M per time); minus Σ a_j.
    """
    reqs = [r for j, r in enumerate(instance.requests) if j != exclude]
    if not reqs:
        return 0
    a_min = min(r.arrival for r in reqs)
    ends = sorted(r.arrival + r.output_tokens for r in reqs)
    vols = sorted(r.prompt_tokens * r.output_tokens + r.output_tokens * (r.output_tokens + 1) // 2
                  for r in reqs)
    m = instance.memory_tokens
    total, cum = 0, 0
    for end, vol in zip(ends, vols):
        cum += vol
        total += max(end, a_min + -(-cum // m))
    return total - sum(r.arrival for r in reqs)


@contextlib.contextmanager
def _quiet_stdout_fd() -> Iterator[None]:
    # HiGHS 1.12 prints a debug line from C++ straight to fd 1 even with disp=False
    # ("HighsMipSolverData::transformNewIntegerFeasibleSolution ..."); keep it out
    # of the printed table.
    try:
        sys.stdout.flush()
        fd = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            try:
                yield
            finally:
                os.dup2(fd, 1)
    finally:
        os.close(fd)


def solve_hindsight_ip(instance: Instance, *, time_limit_s: float = 30.0,
                       mip_rel_gap: float = 0.0, upper_bound: int | None = None,
                       clock: Callable[[], float] = time.perf_counter) -> IPResult:
    """The Section 3 integer program (1)–(4) with HiGHS, start windows as in the module docstring.

    ``upper_bound``: total latency of any feasible schedule; defaults to the better of
    :func:`mcsf` and :func:`mc_benchmark`. ``time_limit_s`` and ``mip_rel_gap`` go to
    HiGHS; with the default gap 0 a status of 0 means proven optimal.
    """
    reqs = instance.requests
    n = len(reqs)
    if n == 0:
        return IPResult(0, 0, "empty instance", True, 0.0, 0.0, (), 0, 0, 0, 0.0)
    if upper_bound is None:
        upper_bound = min(mcsf(instance).total_latency, mc_benchmark(instance).total_latency)
    cols: list[tuple[int, int]] = []
    cost: list[float] = []
    for i, r in enumerate(reqs):
        others = latency_lower_bound(instance, exclude=i)
        latest = r.arrival + upper_bound - others - r.output_tokens
        for k in range(r.arrival, latest + 1):
            cols.append((i, k))
            cost.append(k + r.output_tokens - r.arrival)
    if any(not any(i == j for j, _ in cols) for i in range(n)):
        raise ValueError("upper_bound is below the optimum: some request has no start time left")
    t0 = min(r.arrival for r in reqs)
    horizon = max(k + reqs[i].output_tokens for i, k in cols)
    rows, cidx, vals = [], [], []
    for c, (i, k) in enumerate(cols):
        r = reqs[i]
        rows.append(i)
        cidx.append(c)
        vals.append(1.0)
        for t in range(k + 1, k + r.output_tokens + 1):   # (3): i holds s_i + t − k at t
            rows.append(n + t - t0 - 1)
            cidx.append(c)
            vals.append(float(r.prompt_tokens + t - k))
    n_mem = horizon - t0
    a = coo_matrix((vals, (rows, cidx)), shape=(n + n_mem, len(cols))).tocsr()
    lo = np.concatenate([np.ones(n), np.full(n_mem, -np.inf)])
    hi = np.concatenate([np.ones(n), np.full(n_mem, float(instance.memory_tokens))])
    start = clock()
    with _quiet_stdout_fd():
        res = milp(np.asarray(cost), constraints=LinearConstraint(a, lo, hi),
                   integrality=np.ones(len(cols)), bounds=Bounds(0, 1),
                   options={"time_limit": float(time_limit_s), "mip_rel_gap": float(mip_rel_gap),
                            "disp": False})
    solve_s = clock() - start
    primal = None if res.x is None or res.fun is None else int(round(res.fun))
    dual = getattr(res, "mip_dual_bound", None)
    gap = getattr(res, "mip_gap", None)
    if gap is None and primal is not None and dual is not None:
        gap = (primal - dual) / max(abs(primal), 1e-9)
    if primal is None:
        proven = False
    elif dual is not None:
        proven = primal - math.ceil(dual - 1e-6) <= 0   # integral objective
    else:
        proven = res.status == 0 and mip_rel_gap == 0.0
    starts = None
    if res.x is not None:
        chosen = [0] * n
        for c, (i, k) in enumerate(cols):
            if res.x[c] > 0.5:
                chosen[i] = k
        starts = tuple(chosen)
    return IPResult(primal, int(res.status), str(res.message), proven,
                    None if gap is None else float(gap), None if dual is None else float(dual),
                    starts, len(cols), n_mem, horizon, solve_s)


def drive_policy(instance: Instance, policy: QueuePolicy) -> Schedule:
    """Algorithm 1's round in the paper's discrete-time model, decided by ``policy``.

    Each round t the policy orders the arrived waiting requests (listed in index
    order, so a stable order breaks ties by index) and :meth:`QueuePolicy.select`
    admits heads until it refuses one, which ends the round (no skipping). The
    policy sees request i as prompt s_i, prediction õ_i = o_i = max_tokens and, while
    running, t − p_i tokens generated; the engine as M tokens of KV cache in blocks
    of one token. Requests complete at p_i + o_i and free their memory for that round.
    """
    reqs = instance.requests
    ctx = AdmitContext(now_s=0.0, kv_capacity_tokens=instance.memory_tokens,
                       kv_free_tokens=instance.memory_tokens, cap=len(reqs), block_size=1)
    views = [ReqInfo(request_id=str(i), arrival_s=float(r.arrival),
                     prompt_tokens=r.prompt_tokens, max_tokens=r.output_tokens,
                     predicted_output=r.output_tokens) for i, r in enumerate(reqs)]
    n = len(reqs)
    start: list[int | None] = [None] * n
    running: list[int] = []
    left = n
    t = min((r.arrival for r in reqs), default=0)
    while left:
        running = [j for j in running if start[j] + reqs[j].output_tokens > t]
        run_views = [views[j].with_progress(t - start[j], float(start[j])) for j in running]
        waiting = [views[i] for i in range(n) if start[i] is None and reqs[i].arrival <= t]
        ordered = policy.order(waiting, float(t), ctx)
        admitted: list[ReqInfo] = []
        while ordered:
            chosen = policy.select(ordered, run_views, admitted, ctx).chosen
            if chosen is None:
                break
            i = int(chosen.request_id)
            start[i] = t
            running.append(i)
            admitted.append(chosen)
            ordered = [v for v in ordered if v is not chosen]
            left -= 1
        if not running and left:
            t = min(r.arrival for j, r in enumerate(reqs) if start[j] is None)
            continue
        t += 1
    comps = tuple(p + r.output_tokens for p, r in zip(start, reqs))
    return Schedule(tuple(start), comps, total_latency(instance, start))


def mcsf(instance: Instance) -> Schedule:
    """MC-SF, Algorithm 1: the shipped :class:`~tuned.policies.mcsf.MCSFPolicy`
    (α = 0, exact predictions) driven through the paper's discrete-time model."""
    return drive_policy(instance, MCSFPolicy(reserve_fraction=0.0, overestimate=False))


def mc_benchmark(instance: Instance) -> Schedule:
    """MC-Benchmark, Appendix C Algorithm 2: the shipped MC-SF check in arrival order."""
    return drive_policy(instance, ArrivalOrderMCSF(reserve_fraction=0.0, overestimate=False))


def alpha_protection(instance: Instance, *, alpha: float, beta: float = 1.0,
                     rng: np.random.Generator | None = None,
                     max_rounds: int | None = None) -> Schedule:
    """α-protection greedy (β = 1) or β-clearing (Section 5.2); choices in the module docstring.

    Each round: if the running requests would hold more than M after their next
    token, clear them (:func:`~tuned.bench.papers.mcsf_baselines.clear_on_overflow`);
    if they still do, the round is lost. Otherwise
    :class:`~tuned.bench.papers.mcsf_baselines.AlphaProtectionPolicy` admits waiting
    prompts first-come first-served while the batch's next-step memory stays
    ≤ (1 − α)M (the first refusal ends the round), then every running request
    generates one token.
    """
    if not (0.0 <= alpha < 1.0) or not (0.0 < beta <= 1.0):
        raise ValueError(f"alpha in [0, 1) and beta in (0, 1] required, got {alpha!r}, {beta!r}")
    if beta < 1.0 and rng is None:
        raise ValueError("beta-clearing needs an rng")
    reqs = instance.requests
    m = instance.memory_tokens
    n = len(reqs)
    policy = AlphaProtectionPolicy(alpha=alpha)
    ctx = AdmitContext(now_s=0.0, kv_capacity_tokens=m, kv_free_tokens=m, cap=n, block_size=1)
    views = [ReqInfo(request_id=str(i), arrival_s=float(r.arrival),
                     prompt_tokens=r.prompt_tokens, max_tokens=r.output_tokens,
                     predicted_output=r.output_tokens) for i, r in enumerate(reqs)]
    if max_rounds is None:
        max_rounds = 50 * (max((r.arrival for r in reqs), default=0)
                           + sum(r.output_tokens for r in reqs) + 1)
    last_arrival = max((r.arrival for r in reqs), default=0)
    gen = [0] * n
    start: list[int | None] = [None] * n
    done: list[int | None] = [None] * n
    running: list[int] = []
    evictions = lost = 0
    seen_after_clear: set[frozenset[int]] = set()
    left = n
    t = min((r.arrival for r in reqs), default=0)
    rounds = 0
    while left:
        rounds += 1
        if rounds > max_rounds:
            break
        need = sum(reqs[j].prompt_tokens + gen[j] + 1 for j in running)
        if need > m:
            cleared = clear_on_overflow(running, beta, rng)
            for j in cleared:
                gen[j] = 0
                start[j] = None
            evictions += len(cleared)
            running = [j for j in running if j not in cleared]
            if beta >= 1.0 and not running and t >= last_arrival:
                state = frozenset(j for j in range(n) if done[j] is None)
                if state in seen_after_clear:
                    break   # the same state again with nothing left to arrive: livelock
                seen_after_clear.add(state)
            need = sum(reqs[j].prompt_tokens + gen[j] + 1 for j in running)
            if need > m:
                lost += 1
                t += 1
                continue
        run_views = [views[j].with_progress(gen[j], float(start[j])) for j in running]
        waiting = [views[i] for i in range(n)
                   if start[i] is None and done[i] is None and reqs[i].arrival <= t]
        ordered = policy.order(waiting, float(t), ctx)
        admitted: list[ReqInfo] = []
        while ordered:
            chosen = policy.select(ordered, run_views, admitted, ctx).chosen
            if chosen is None:
                break
            i = int(chosen.request_id)
            start[i] = t
            running.append(i)
            admitted.append(chosen)
            ordered = [v for v in ordered if v is not chosen]
        if not running:
            pending = [reqs[j].arrival for j in range(n) if done[j] is None and reqs[j].arrival > t]
            if not pending:
                break   # nothing left to run or to arrive
            t = min(pending)
            continue
        still = []
        for j in running:
            gen[j] += 1
            if gen[j] == reqs[j].output_tokens:
                done[j] = t + 1
                left -= 1
            else:
                still.append(j)
        running = still
        t += 1
    finished = left == 0
    lat = sum(c - r.arrival for c, r in zip(done, reqs)) if finished else None
    return Schedule(tuple(start), tuple(done), lat, finished, evictions, lost)


@dataclass(frozen=True)
class Sizes:
    """Section 5.1's instance distribution: :data:`PAPER_SIZES` as published, :data:`SCALED_SIZES`
    as run here."""

    memory_tokens: tuple[int, int]
    prompt_tokens: tuple[int, int]
    requests_all_at_once: tuple[int, int]
    horizon_online: tuple[int, int]
    rate_online: tuple[float, float]
    max_requests_online: int | None = None


PAPER_SIZES = Sizes((30, 50), (1, 5), (40, 60), (40, 60), (0.5, 1.5))
SCALED_SIZES = Sizes((11, 17), (1, 2), (5, 8), (4, 8), (0.5, 1.5), max_requests_online=10)


def generate_instance(rng: np.random.Generator, arrival_model: str,
                      sizes: Sizes = SCALED_SIZES) -> Instance:
    """One Section 5.1 instance: M, s_i, o_i ∈ U{1..M − s_i}, arrivals by ``arrival_model``.

    ``all_at_once``: n ∈ U{range} requests at t = 0. ``online``: T ∈ U{range},
    λ ∈ U[range], Poisson(λ) arrivals at each t ∈ {1..T}; T, λ and the arrivals are
    redrawn when none arrive or more than ``max_requests_online`` do.
    """
    if arrival_model not in ARRIVAL_MODELS:
        raise ValueError(f"arrival_model must be one of {ARRIVAL_MODELS}, got {arrival_model!r}")
    m = int(rng.integers(sizes.memory_tokens[0], sizes.memory_tokens[1] + 1))
    while True:
        if arrival_model == "all_at_once":
            n = int(rng.integers(sizes.requests_all_at_once[0], sizes.requests_all_at_once[1] + 1))
            arrivals = [0] * n
        else:
            horizon = int(rng.integers(sizes.horizon_online[0], sizes.horizon_online[1] + 1))
            lam = float(rng.uniform(*sizes.rate_online))
            arrivals = [t for t in range(1, horizon + 1) for _ in range(int(rng.poisson(lam)))]
        cap = sizes.max_requests_online
        if arrivals and (cap is None or len(arrivals) <= cap):
            break
    reqs = []
    for a in arrivals:
        s = int(rng.integers(sizes.prompt_tokens[0], sizes.prompt_tokens[1] + 1))
        o = int(rng.integers(1, m - s + 1))
        reqs.append(Request(a, s, o))
    return Instance(m, tuple(reqs), arrival_model)


ALGORITHMS = ("MC-SF", "MC-Benchmark") + tuple(label for label, _, _ in BASELINES)


def _schedules(instance: Instance, seed_words: tuple[int, ...]) -> dict[str, Schedule]:
    out = {"MC-SF": mcsf(instance), "MC-Benchmark": mc_benchmark(instance)}
    for b, (label, alpha, beta) in enumerate(BASELINES):
        rng = np.random.default_rng((*seed_words, 100 + b))
        out[label] = alpha_protection(instance, alpha=alpha, beta=beta, rng=rng)
    return out


def _ratio_stats(ratios: list[float], unfinished: int) -> dict:
    if not ratios:
        return {"avg": None, "worst": None, "best": None, "optimal_share": None,
                "instances": 0, "unfinished": unfinished}
    return {"avg": float(np.mean(ratios)), "worst": max(ratios), "best": min(ratios),
            "optimal_share": sum(r <= 1.0 + 1e-12 for r in ratios) / len(ratios),
            "instances": len(ratios), "unfinished": unfinished}


def run(seed: int = 0, *, instances: int = 50, quick: bool = False,
        time_limit_s: float = 30.0, sizes: Sizes = SCALED_SIZES,
        table1_seeds: int | None = None, data_dir: Path | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time) -> dict:
    """Section 5.1 at :data:`SCALED_SIZES`: both arrival models, IP optimum, every algorithm.

    Instance k of model m is drawn from ``default_rng((seed, m, k))``, so a quick
    run is a prefix of the full one. ``quick`` runs 5 instances per model. Returns
    per model: ``algorithms`` (per algorithm avg / worst / best ratio of total latency
    to the optimum over the instances the IP proved optimal and the algorithm
    finished, the share exactly optimal, unfinished runs, latency relative to
    MC-SF), ``ip`` (proven count, largest gap, solve times, sizes), ``paper``;
    ``table1``: Section 5.2's Table 1 on the simulator
    (:mod:`tuned.bench.papers.mcsf_table1`) over ``table1_seeds`` workload draws
    (full: :data:`~tuned.bench.papers.mcsf_table1.SEEDS` = 50 as in the paper; quick
    skips it: the tolerance is stated over 50 draws, and ten would leave it by
    chance alone about one run in ten, see that module), on the operator tables in
    ``data_dir`` (by default the packaged ones).
    """
    count = 5 if quick else int(instances)
    began, began_cpu = clock(), cpu_clock()
    out: dict = {"seed": seed, "instances_per_model": count, "quick": quick,
                 "sizes": sizes, "paper_sizes": PAPER_SIZES, "models": {}}
    for mi, model in enumerate(ARRIVAL_MODELS):
        ratios: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
        rel: dict[str, list[float]] = {a: [] for a in ALGORITHMS}
        unfinished = dict.fromkeys(ALGORITHMS, 0)
        evictions = dict.fromkeys(ALGORITHMS, 0)
        ip_rows = []
        for k in range(count):
            inst = generate_instance(np.random.default_rng((seed, mi, k)), model, sizes)
            scheds = _schedules(inst, (seed, mi, k))
            ub = min(scheds["MC-SF"].total_latency, scheds["MC-Benchmark"].total_latency)
            ip = solve_hindsight_ip(inst, time_limit_s=time_limit_s, upper_bound=ub, clock=clock)
            ip_rows.append((inst, ip))
            for name, sch in scheds.items():
                evictions[name] += sch.evictions
                if not sch.finished:
                    unfinished[name] += 1
                    continue
                rel[name].append(sch.total_latency / scheds["MC-SF"].total_latency)
                if ip.proven_optimal and ip.total_latency:
                    ratios[name].append(sch.total_latency / ip.total_latency)
        algos = {}
        for name in ALGORITHMS:
            st = _ratio_stats(ratios[name], unfinished[name])
            st["vs_mcsf"] = float(np.mean(rel[name])) if rel[name] else None
            st["evictions"] = evictions[name]
            algos[name] = st
        solve = [ip.solve_s for _, ip in ip_rows]
        gaps = [ip.mip_gap for _, ip in ip_rows if ip.mip_gap is not None]
        out["models"][model] = {
            "algorithms": algos,
            "ip": {
                "instances": len(ip_rows),
                "proven_optimal": sum(ip.proven_optimal for _, ip in ip_rows),
                "max_gap": max(gaps) if gaps else None,
                "solve_s_mean": float(np.mean(solve)),
                "solve_s_max": max(solve),
                "variables_mean": float(np.mean([ip.variables for _, ip in ip_rows])),
                "variables_max": max(ip.variables for _, ip in ip_rows),
                "horizon_max": max(ip.horizon for _, ip in ip_rows),
                "requests": (min(len(i.requests) for i, _ in ip_rows),
                             max(len(i.requests) for i, _ in ip_rows)),
                "memory_tokens": (min(i.memory_tokens for i, _ in ip_rows),
                                  max(i.memory_tokens for i, _ in ip_rows)),
            },
            "paper": PAPER_FIGURES[model],
        }
    out["paper_table1_vs_mcsf"] = {name: v / PAPER_TABLE1_AVG_LATENCY_S["MC-SF"]
                                   for name, v in PAPER_TABLE1_AVG_LATENCY_S.items()}
    t1_seeds = (0 if quick else T1_SEEDS) if table1_seeds is None else int(table1_seeds)
    if t1_seeds:
        out["table1"] = run_table1(seed, t1_seeds, data_dir)
        out["load_sweep"] = load_sweep(seed, data_dir=data_dir)
    out["wall_s"] = clock() - began
    out["cpu_s"] = cpu_clock() - began_cpu
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def format_table(result: dict) -> str:
    """The scenario as text: 'figure | ours | paper' rows, then the IP's sizes and gaps.

    Latency/OPT rows compare with Section 5.1 (MC-SF only); the 'latency / MC-SF's'
    rows compare with Section 5.2 Table 1, a different (real-data) experiment.
    """
    per = result["instances_per_model"]
    lines = [f"mcsf (Jaillet et al., Section 5.1): seed {result['seed']}, {per} instances per "
             f"arrival model" + (" (quick)" if result["quick"] else ""),
             "figure | ours | paper"]
    table1 = result["paper_table1_vs_mcsf"]
    for model, res in result["models"].items():
        paper = res["paper"]
        for name, st in res["algorithms"].items():
            p = paper if name == "MC-SF" else {}
            figs = ("avg", "worst", "best") if name == "MC-SF" else ("avg", "worst")
            for fig in figs:
                lines.append(f"{model} {name} latency/OPT {fig} | {_fmt(st[fig])} | "
                             f"{_fmt(p.get(fig))}")
            if name == "MC-SF":
                lines.append(f"{model} {name} share exactly optimal | "
                             f"{_fmt(st['optimal_share'], 2)} | {_fmt(p.get('optimal_share'), 2)}")
            else:
                lines.append(f"{model} {name} latency / MC-SF's | {_fmt(st['vs_mcsf'])} | "
                             f"{_fmt(table1.get(name))} (Table 1)")
            if st["unfinished"]:
                lines.append(f"{model} {name} unfinished (livelock or cap) | "
                             f"{st['unfinished']}/{per} | —")
    for model, res in result["models"].items():
        ip = res["ip"]
        lines.append(f"IP {model}: proven optimal {ip['proven_optimal']}/{ip['instances']}, "
                     f"max gap {_fmt(ip['max_gap'], 4)}, solve mean {ip['solve_s_mean']:.2f} s "
                     f"max {ip['solve_s_max']:.2f} s, n {ip['requests'][0]}–{ip['requests'][1]}, "
                     f"M {ip['memory_tokens'][0]}–{ip['memory_tokens'][1]}, binaries mean "
                     f"{ip['variables_mean']:.0f} max {ip['variables_max']}, "
                     f"horizon max {ip['horizon_max']}")
    if result.get("table1"):
        lines.extend(format_table1(result["table1"]))
        lines.extend(format_load_sweep(result.get("load_sweep") or []))
    else:
        lines.append("Table 1 (Section 5.2): not run (--quick); run without it for the "
                     "paper's 50 seeds")
    lines.append(f"wall {result['wall_s']:.1f} s, CPU {result['cpu_s']:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":   # pragma: no cover
    print(format_table(run()))
