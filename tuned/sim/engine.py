"""A discrete-event engine that schedules like vLLM v1, on a virtual clock, running
tuned's own control core unchanged.

One module, past the usual size, because its scheduling passes, step and event loop
each mirror one part of vLLM's scheduler and share the engine's state; split, they
would only pass that state around.

It implements the engine side of :mod:`tuned.core.contract` exactly as the vLLM
adapter does, and schedules each step as vLLM 0.32's ``Scheduler.schedule`` does
(``vllm/v1/core/sched/scheduler.py``; ``kv_cache_manager.allocate_slots``):

* **Running requests first**, in admission order, each getting
  ``num_tokens - num_computed_tokens`` new tokens (one for a decode, the rest of
  the prompt for a prefill) capped by what is left of the token budget (chunked
  prefill). Its KV blocks grow to ``ceil((computed + new) / block_size)``; when the
  free blocks do not suffice, the most recently admitted running request is
  preempted (``self.running.pop()``): its blocks are freed, its computed tokens
  reset to 0 (recompute) and it goes to the front of the waiting queue; if the
  victim was the request itself, the running pass stops.
* **Then waiting requests**, only when nothing was preempted this step, while the
  budget lasts and fewer than the admission gate (``max_num_active_reqs``, the cap
  the controller sets) are running: the queue's head is admitted if its whole
  sequence fits in the free blocks (``scheduler_reserve_full_isl``, vLLM's
  default), with a first chunk under the budget.
* A request samples a token at the end of every step in which its computed tokens
  reach its length (prompt + outputs so far): the last prefill chunk samples the
  first token, each decode the next. It finishes when it has generated its
  ``output_tokens`` (``ignore_eos``); its blocks are freed at the end of that step.
* The step takes ``step_model.step_s(shape)`` of virtual time, after the model's
  ``gap_s`` (the engine's own time between steps, which the step time as vLLM's
  adapter measures it leaves out: 0 for the GPU models, measured by `tuned
  profile` for a profile); the step ring reports ``step_s``. Controller ticks
  run every ``interval_s`` of virtual time, seeing the steps that ended before
  them, exactly like apscheduler's thread beside vLLM's busy loop; their decision
  is applied at the top of the next step.

Not modelled (stated so the figures are read right): prefix caching (the
benchmarks' prompts share no prefix), speculative decoding, the watermark (0 by
default), ``long_prefill_token_threshold`` (0 by default), async scheduling's
one-step overlap, detokenisation and the API server's own latency. An idle engine
jumps to the next arrival.

``static_batching=True`` gives Multi-bin batching's model instead: a batch is
formed only when nothing runs (up to the cap, from the queue's order, ignoring the
token budget) and runs until its last member ends.

``padded=True`` (with ``static_batching``) is a static batcher without a paged
cache, BucketServe's baseline (UELLM-like): every member of a batch is padded to
the batch's longest prompt and computed until the batch's longest output ends (a
member that finished early still occupies its row), and each member's KV memory is
reserved at the padded length (longest prompt + largest ``max_tokens`` of the
batch) when the batch forms, so a batch takes members from the queue's head only
while their padded reservations fit the cache; it is all released when the batch
ends. Tokens still stream as they are generated (the reading most favourable to
the baseline's latency).

``prefilled=True`` makes the engine the decode instance of a prefill/decode split
(DistServe's disaggregation, BucketServe's other baseline): each request arrives with
its prompt computed elsewhere and its first token sampled (at its arrival, the
hand-off), so it is admitted needing its prompt's KV blocks and decodes from its
second token; the KV transfer itself takes no time. A preempted one recomputes its
prompt here, as vLLM's recompute does.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuned.config import Config
from tuned.core import refusal
from tuned.core.queue import QueueCore, queue_oldest_arrival_s, queue_prompt_tokens
from tuned.core.refusal import Refusal
from tuned.control.runtime import Runtime, build_runtime
from tuned.core.queue_policy import AdmitContext
from tuned.policies.registry import make_policy
from tuned.sim.stepmodel import StepShape, StepClock
from tuned.core.ring import FINISHED_RING, FinishedRequest, Ring, StepSample
from tuned.base.workloads import RequestSpec

STEP_RING = 8192


class SimulationError(RuntimeError):
    """A run that cannot end within the simulator's bound on virtual time
    (``max_sim_s``): a workload that does not drain, or arrivals past the bound."""


class SimRequest:
    """One request inside the simulated engine (the attribute names are vLLM's, so
    the queue core reads it as it reads a vLLM ``Request``)."""

    __slots__ = ("request_id", "arrival_time", "num_prompt_tokens", "max_tokens",
                 "target_output", "num_output_tokens", "num_computed_tokens", "num_blocks",
                 "priority", "extra_args", "first_token_s", "finish_s", "token_times",
                 "preemptions", "recomputed_tokens", "preempted", "refused_s")

    def __init__(self, spec: RequestSpec, record_tokens: bool, prefilled: bool = False) -> None:
        self.request_id = spec.request_id
        self.arrival_time = spec.arrival_s
        self.num_prompt_tokens = spec.prompt_tokens
        self.max_tokens = spec.max_tokens
        self.target_output = spec.output_tokens
        self.num_output_tokens = 0
        self.num_computed_tokens = 0
        self.num_blocks = 0
        self.priority = 0
        hints: dict[str, Any] = {}
        if spec.deadline_s is not None:
            hints["tuned_deadline_s"] = spec.deadline_s
        self.extra_args = hints or None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.token_times: list[float] | None = [] if record_tokens else None
        self.preemptions = 0
        self.recomputed_tokens = 0
        self.preempted = False
        self.refused_s: float | None = None     # when refused at the wait bound
        if prefilled:      # handed over by a prefill instance with its first token
            self.num_computed_tokens = spec.prompt_tokens
            self.num_output_tokens = 1
            self.first_token_s = spec.arrival_s
            if self.token_times is not None:
                self.token_times.append(spec.arrival_s)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


class FcfsQueue:
    """vLLM's own FCFS waiting queue (a deque; preempted requests to the front):
    what the vLLM adapter keeps when the queue policy is fcfs."""

    def __init__(self) -> None:
        self._q: deque[SimRequest] = deque()

    def add_request(self, r: SimRequest) -> None:
        self._q.append(r)

    def prepend_request(self, r: SimRequest) -> None:
        self._q.appendleft(r)

    def peek_request(self) -> SimRequest:
        return self._q[0]

    def pop_request(self) -> SimRequest:
        return self._q.popleft()

    def __bool__(self) -> bool:
        return bool(self._q)

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self):
        return iter(self._q)


@dataclass
class SimResult:
    """What one simulated run produced (see :meth:`to_json`)."""

    requests: list[SimRequest]
    steps: list[StepSample]
    decisions: list[dict]
    knobs: list[tuple[int, int]]          # (cap, token_budget) applied at each step
    duration_s: float
    hardware: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)
    truncated: bool = False      # stopped at the horizon with requests unfinished
    refused: list[str] = field(default_factory=list)   # refused at the wait bound
    events: list[dict] = field(default_factory=list)  # the simulated NVML's events

    def request_rows(self) -> list[dict]:
        return [{"id": r.request_id, "arrival_s": r.arrival_time,
                 "prompt_tokens": r.num_prompt_tokens, "output_tokens": r.num_output_tokens,
                 "first_token_s": r.first_token_s, "finish_s": r.finish_s,
                 "preemptions": r.preemptions, "refused_s": r.refused_s}
                for r in self.requests]


class SimEngine:
    """The simulated engine: see the module docstring. Build one per run."""

    def __init__(self, cfg: Config, step_model: StepClock, *, block_size: int,
                 num_gpu_blocks: int, static_batching: bool = False,
                 padded: bool = False, prefilled: bool = False,
                 record_token_times: bool = False, record_steps: bool = True,
                 max_sim_s: float = 30 * 24 * 3600.0,
                 horizon_s: float | None = None,
                 give_up: tuple | None = None, nvml: Any = None,
                 kv_bytes_per_token: float | None = None, drift: Any = None) -> None:
        if num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks: must be >= 2 (one is vLLM's null block), "
                             f"got {num_gpu_blocks}")
        self.cfg = cfg
        self.step_model = step_model
        self._gap_s = float(getattr(step_model, "gap_s", 0.0) or 0.0)
        # the run's step-time factor over virtual time (tuned.sim.events.StepDrift), or
        # None: the hardware's own step times throughout
        self.drift = drift
        self.block_size = int(block_size)
        self.num_gpu_blocks = int(num_gpu_blocks)
        if padded and not static_batching:
            raise ValueError("padded: a padded batcher is a static one (static_batching=True)")
        self.static_batching = static_batching
        self.padded = padded
        self.prefilled = prefilled
        # the padded batch in flight: its rows, padded prompt, decode steps run, and
        # the blocks its finished members still hold
        self._pad_rows = 0
        self._pad_prompt = 0
        self._pad_steps = 0
        self._pad_held = 0
        self.record_token_times = record_token_times
        self.record_steps = record_steps
        self.max_sim_s = max_sim_s
        # stop horizon_s after the last arrival, leaving the rest unfinished (None:
        # run until every request finished, or fail past max_sim_s)
        self.horizon_s = horizon_s
        # (slo, max_bad): stop as soon as more than max_bad requests have missed an
        # SLO for sure (a late first token, a slow finish): a capacity probe needs
        # only to know that attainment fell below its target
        self.give_up = give_up
        self.bad = 0
        # --- the EngineView the core reads
        self.steps = Ring(STEP_RING)
        self.finished = Ring(FINISHED_RING)
        self.ceiling = cfg.max_num_seqs
        self.max_num_batched_tokens = cfg.max_num_batched_tokens
        self.kv_capacity_tokens = (self.num_gpu_blocks - 1) * self.block_size
        self.dp_rank = 0
        # one GPU's KV bytes per token (the hardware's), for NVML's free memory in tokens
        self.kv_bytes_per_token = kv_bytes_per_token
        # --- engine state
        self.now = 0.0
        self.free_blocks = self.num_gpu_blocks - 1
        self.running: list[SimRequest] = []
        self.waiting: FcfsQueue | QueueCore = FcfsQueue()
        self.queue_policy = "fcfs"
        self._pending_queue: tuple[str, Config] | None = None
        self.decisions: list[dict] = []
        # GPU memory as NVML would report it (tuned.sim.nvml.SimNvml, on this
        # engine's virtual clock), or None: no NVML, as on a host without a GPU
        self.nvml = nvml
        if nvml is not None:
            nvml.clock = self._clock
        self.runtime: Runtime = build_runtime(cfg, self, clock=self._clock, wall=self._clock,
                                              nvml=nvml, on_decision=self.decisions.append)
        self.controller = self.runtime.controller
        if not cfg.native_queue:
            self.set_queue_policy(cfg.queue_policy, cfg)
            self._apply_queue_policy()
        self.cap, self.token_budget = self.runtime.slot.applied

    # ------------------------------------------------------------ EngineView
    def _clock(self) -> float:
        return self.now

    def counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting)

    def active_requests(self) -> list[tuple[int, int]]:
        return [(r.num_prompt_tokens, r.max_tokens) for r in self.running]

    def prefilling(self) -> int:
        return sum(1 for r in self.running
                   if r.num_computed_tokens < r.num_prompt_tokens and not r.num_output_tokens)

    def set_queue_policy(self, name: str, cfg: Config) -> None:
        make_policy(name, cfg.queue_spec()[1])
        self._pending_queue = (name, cfg)

    def queue_snapshot(self) -> dict | None:
        snap = getattr(self.waiting, "snapshot", None)
        return snap() if snap is not None else None

    def present_prompts(self) -> list[int]:
        return [r.num_prompt_tokens for r in self.running] + queue_prompt_tokens(self.waiting)

    def oldest_wait_s(self) -> float | None:
        first = queue_oldest_arrival_s(self.waiting)
        return None if first is None else max(self.now - first, 0.0)

    def _apply_queue_policy(self) -> None:
        name, cfg = self._pending_queue
        self._pending_queue = None
        self.runtime.queue_channel.switched(self.queue_snapshot())
        q = self.waiting
        policy = make_policy(name, cfg.queue_spec()[1], cfg.queue_seed)
        if isinstance(q, QueueCore):
            q.lengths.class_deadlines_s = dict(cfg.class_deadlines_s)
            q.switch_policy(policy)
            q.set_wait_bound(cfg.wait_bound_spec())
        else:
            new: QueueCore = QueueCore(policy, class_deadlines_s=cfg.class_deadlines_s,
                                       clock=self._clock)
            old = list(q)
            for r in old:
                if not r.preempted:
                    new.add_request(r)
            for r in reversed([r for r in old if r.preempted]):
                new.prepend_request(r)
            new.set_wait_bound(cfg.wait_bound_spec())
            self.waiting = new
        self.queue_policy = name

    # ------------------------------------------------------------ blocks
    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _allocate(self, r: SimRequest, new_tokens: int) -> bool:
        need = self._blocks_for(r.num_computed_tokens + new_tokens) - r.num_blocks
        if need > self.free_blocks:
            return False
        if need > 0:
            self.free_blocks -= need
            r.num_blocks += need
        return True

    def _free(self, r: SimRequest) -> None:
        self.free_blocks += r.num_blocks
        r.num_blocks = 0

    def _preempt(self, r: SimRequest) -> None:
        self._free(r)
        r.recomputed_tokens += r.num_computed_tokens
        r.num_computed_tokens = 0
        r.preemptions += 1
        r.preempted = True
        self.waiting.prepend_request(r)

    # ------------------------------------------------------------ one step
    def _schedule(self) -> tuple[list[tuple[SimRequest, int]], int]:
        """vLLM's schedule(): (request, new tokens) pairs and the preemption count."""
        budget = self.token_budget
        if isinstance(self.waiting, QueueCore):
            self._begin_queue_step(budget)
        if self.static_batching:
            budget = 1 << 62
        scheduled: list[tuple[SimRequest, int]] = []
        budget, preempted = self._schedule_running(budget, scheduled)
        if preempted or (self.static_batching and self.running):
            return scheduled, preempted
        if self.padded:
            self._form_padded_batch(scheduled)
        else:
            self._schedule_waiting(budget, scheduled)
        return scheduled, preempted

    def _form_padded_batch(self, scheduled: list[tuple[SimRequest, int]]) -> None:
        """The padded batcher's admission into an empty engine: from the queue's head,
        up to the cap, while every member's reservation at the padded length (the
        longest prompt + the largest ``max_tokens`` so far) fits the free blocks."""
        q = self.waiting
        batch: list[SimRequest] = []
        lp = lo = 0
        while q and len(batch) < self.cap:
            r = q.peek_request()
            p, o = max(lp, r.num_prompt_tokens), max(lo, r.max_tokens)
            if (len(batch) + 1) * self._blocks_for(p + o) > self.free_blocks:
                if not batch:
                    q.pop_request()
                    self._fail(r, "needs more KV blocks than the cache holds")
                    continue
                break
            q.pop_request()
            batch.append(r)
            lp, lo = p, o
        if not batch:
            return
        per = self._blocks_for(lp + lo)
        for r in batch:
            self.free_blocks -= per
            r.num_blocks = per
            r.preempted = False
            self.running.append(r)
            scheduled.append((r, r.num_tokens - r.num_computed_tokens))
        self._pad_rows, self._pad_prompt, self._pad_steps = len(batch), lp, 0

    def _begin_queue_step(self, budget: int) -> None:
        # contract step 2, before the running pass, as the vLLM adapter calls it
        # (before super().schedule()): the context's free KV is that of the top
        # of the step, and the queue hears of every step, preempting ones too
        qi = self.runtime.queue_channel.inputs
        model, sla, ttft = qi.guard
        self.waiting.begin_step(AdmitContext(self.now, self.kv_capacity_tokens,
                                             self.free_blocks * self.block_size, self.cap,
                                             qi.speed_fn, self.block_size,
                                             step_model=model, tpot_sla_s=sla,
                                             ttft_sla_s=ttft, token_budget=budget,
                                             gpu_free_tokens=qi.gpu_free_tokens),
                                self.running)
        refusal.answer(self.waiting.refusals, self)

    def answer_refusals(self, refused: Sequence[tuple[SimRequest, Refusal]]) -> None:
        """The simulator's answer to a refusal (:class:`tuned.core.refusal.RefusalAnswer`):
        the request is finished at once, as the vLLM adapter finishes a refused one,
        and recorded (``refused_s``, the run's ``refused`` list) for the bench."""
        for r, event in refused:
            r.refused_s = event.at_s
            self.refused.append(r.request_id)
            self._finish_queue(r, learn=False)
            if self.give_up is not None:
                self.bad += 1

    def _schedule_running(self, budget: int,
                          scheduled: list[tuple[SimRequest, int]]) -> tuple[int, int]:
        """vLLM's running pass, in order: each running request's next tokens within
        ``budget``, preempting from the back when its blocks cannot be allocated.
        Appends to ``scheduled``; returns the budget left and the preemption count."""
        preempted = 0
        running = self.running
        i = 0
        bs = self.block_size
        while i < len(running) and budget > 0:
            r = running[i]
            n = r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
            if n > budget:
                n = budget
            if r.num_computed_tokens + n <= r.num_blocks * bs:   # fits its blocks
                scheduled.append((r, n))
                budget -= n
                i += 1
                continue
            ok = True
            while not self._allocate(r, n):
                victim = running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            scheduled.append((r, n))
            budget -= n
            i += 1
        return budget, preempted

    def _schedule_waiting(self, budget: int,
                          scheduled: list[tuple[SimRequest, int]]) -> None:
        """vLLM's waiting pass: admit from the head of the queue while the budget,
        the cap and the free blocks allow. Appends to ``scheduled``."""
        q = self.waiting
        running = self.running
        cap = self.cap
        while budget > 0 and q and len(running) < cap:
            r = q.peek_request()
            full = self._blocks_for(r.num_tokens) - r.num_blocks
            if full > self.free_blocks:
                if not running and not scheduled and full > self.num_gpu_blocks - 1:
                    # can never fit, even alone: vLLM rejects such a request up front
                    q.pop_request()
                    self._fail(r, "needs more KV blocks than the cache holds")
                    continue
                break
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            self._allocate(r, n)
            q.pop_request()
            r.preempted = False
            running.append(r)
            scheduled.append((r, n))
            budget -= n

    def _met(self, r: SimRequest, end: float) -> bool:
        """At its finish: False when ``r`` missed the TPOT or E2E SLO with a timely
        first token (a late first token was counted when it came)."""
        slo = self.give_up[0]
        if slo.ttft_s is not None and r.first_token_s - r.arrival_time > slo.ttft_s:
            return True           # already counted
        if slo.e2el_s is not None and end - r.arrival_time > slo.e2el_s:
            return False
        if slo.tpot_s is not None and r.num_output_tokens > 1 and \
                (end - r.first_token_s) / (r.num_output_tokens - 1) > slo.tpot_s:
            return False
        return True

    def _fail(self, r: SimRequest, why: str) -> None:
        self.failed.append(r.request_id)
        self._finish_queue(r, learn=False)

    def _finish_queue(self, r: SimRequest, learn: bool) -> None:
        q = self.waiting
        if isinstance(q, QueueCore):
            q.request_finished(r, learn)

    def _run_step(self, scheduled: Sequence[tuple[SimRequest, int]], preempted: int) -> None:
        """Run one scheduled step to its end: the controller ticks due before it, the
        tokens it produces, the requests it finishes, its :class:`StepSample`."""
        shape = self._step_shape(scheduled)
        dt, gap = self.step_model.step_s(shape), self._gap_s
        if self.drift is not None:
            f = self.drift.factor(self.now)
            dt, gap = dt * f, gap * f
        end = self.now + gap + dt
        self._ticks_until(end)
        self.now = end
        gen, done = self._emit_tokens(scheduled, end)
        freed = self._retire(done, end)
        resident = shape.kv_tokens - (0 if self.padded else freed)
        if self.padded:
            self._pad_steps += 1
            if not self.running:     # the batch ended: release its rows
                self.free_blocks += self._pad_held
                self._pad_held = 0
        n_dec, n_pre, pre_tok = shape.num_decode, shape.num_prefill_reqs, shape.prefill_tokens
        usable = self.num_gpu_blocks - 1      # vLLM's null block is never in use
        used = usable - self.free_blocks
        # decodes counted as the vLLM adapter counts them: requests given one token
        if isinstance(self.waiting, QueueCore):
            self.waiting.step_done(n_dec, preempted)
        sample = StepSample(self.steps.next_seq, end, dt, n_dec, n_pre, pre_tok,
                            n_dec + pre_tok, gen, used / usable, used, resident,
                            len(self.running), len(self.waiting), preempted)
        self.steps.append(sample)
        if self.record_steps:
            self._step_log.append(sample)
            self._knob_log.append((self.cap, self.token_budget))

    def _step_shape(self, scheduled: Sequence[tuple[SimRequest, int]]) -> StepShape:
        """What the step computes; ``kv_tokens`` counts the running requests' KV
        after it (a padded batch: every row at the padded length)."""
        if self.padded:
            b, lp, k = self._pad_rows, self._pad_prompt, self._pad_steps
            if k == 0:
                return StepShape(0, 0, b * lp, b, b * lp * (lp + 1) / 2, b * lp)
            return StepShape(b, b * (lp + k - 1), 0, 0, 0.0, b * (lp + k))
        n_dec = n_pre = pre_tok = dec_ctx = 0
        pairs = 0.0
        for r, n in scheduled:
            p = r.num_computed_tokens
            if n == 1:
                n_dec += 1
                dec_ctx += p
            else:
                n_pre += 1
                pre_tok += n
                pairs += n * (p + (n + 1) / 2)
        resident_before = 0
        for r in self.running:
            resident_before += r.num_computed_tokens
        resident_after = resident_before + n_dec + pre_tok
        return StepShape(n_dec, dec_ctx, pre_tok, n_pre, pairs, resident_after)

    def _emit_tokens(self, scheduled: Sequence[tuple[SimRequest, int]],
                     end: float) -> tuple[int, list[SimRequest]]:
        """Advance each scheduled request at the step's ``end``: a token for each
        that is through its prompt, a late first token counted against the SLO.
        Returns the tokens generated and the requests that reached their output."""
        gen = 0
        done: list[SimRequest] = []
        for r, n in scheduled:
            r.num_computed_tokens += n
            if r.num_computed_tokens >= r.num_prompt_tokens + r.num_output_tokens:
                r.num_output_tokens += 1
                gen += 1
                if r.first_token_s is None:
                    r.first_token_s = end
                    if self.give_up is not None:
                        slo = self.give_up[0]
                        if slo.ttft_s is not None and end - r.arrival_time > slo.ttft_s:
                            self.bad += 1
                if r.token_times is not None:
                    r.token_times.append(end)
                if r.num_output_tokens >= r.target_output:
                    done.append(r)
        return gen, done

    def _retire(self, done: Sequence[SimRequest], end: float) -> int:
        """Finish ``done`` at ``end``: judge each against the SLO, free its blocks,
        record it, tell the queue. Returns the KV tokens they held."""
        freed_tokens = 0
        for r in done:
            if self.give_up is not None and not self._met(r, end):
                self.bad += 1     # (a late first token was counted when it came)
            freed_tokens += r.num_computed_tokens
            self.running.remove(r)
            r.finish_s = end
            if self.padded:      # its row stays reserved until the batch ends
                self._pad_held += r.num_blocks
                r.num_blocks = 0
            else:
                self._free(r)
            self.finished.append(FinishedRequest(
                self.finished.next_seq, end, r.request_id, r.num_prompt_tokens,
                r.num_output_tokens, r.max_tokens, r.arrival_time, r.preemptions,
                r.first_token_s))
            self._finish_queue(r, learn=True)
        return freed_tokens

    # ------------------------------------------------------------ ticks
    def _ticks_until(self, t: float) -> None:
        """Run every controller tick due before virtual time ``t``, each at its own
        time (they see the steps that ended before it)."""
        while self._next_tick < t:
            self.now = self._next_tick
            self.controller.run_once()
            # read each time: a reload may have changed the interval
            self._next_tick += self.controller.cfg.interval_s

    # ------------------------------------------------------------ the loop
    def run(self, requests: Iterable[RequestSpec]) -> SimResult:
        """Run ``requests`` to completion on the virtual clock. The event loop (arrivals,
        controller ticks, steps) reads top to bottom on purpose, a little over 60
        lines: split, its pieces would pass the loop's local state back and forth."""
        specs = sorted(requests, key=lambda s: (s.arrival_s, s.request_id))
        if self.prefilled and any(s.output_tokens < 2 for s in specs):
            raise ValueError("prefilled: every request needs output_tokens >= 2 (its first "
                             "token came from the prefill instance)")
        reqs = [SimRequest(s, self.record_token_times, self.prefilled) for s in specs]
        if self.horizon_s is not None and specs:
            # stop a run that cannot keep up: horizon_s after the last arrival
            self.max_sim_s = specs[-1].arrival_s + self.horizon_s
        elif specs and not specs[-1].arrival_s <= self.max_sim_s:
            # refused before the first tick: reaching it would tick for ever
            raise SimulationError(f"workload: the last arrival at {specs[-1].arrival_s:g} s "
                                  f"is past the simulator's bound of {self.max_sim_s:g} s of "
                                  "virtual time")
        self.failed: list[str] = []
        self.refused: list[str] = []
        self._step_log: list[StepSample] = []
        self._knob_log: list[tuple[int, int]] = []
        self._next_tick = 0.0
        nxt = 0
        total = len(reqs)
        finished_before = 0
        slot = self.runtime.slot
        while True:
            if self._next_tick <= self.now:
                now = self.now
                # the ticks due at now, and no later (now + 1e-12 == now past 16384 s)
                self._ticks_until(math.nextafter(now, math.inf))
                self.now = now
            while nxt < total and reqs[nxt].arrival_time <= self.now:
                self.waiting.add_request(reqs[nxt])
                nxt += 1
            knobs = slot.take()
            if knobs is not None:
                self.cap, self.token_budget = knobs
            if self._pending_queue is not None:
                self._apply_queue_policy()
            scheduled, preempted = self._schedule()
            if scheduled:
                self._run_step(scheduled, preempted)
            elif preempted:
                continue        # everything running was preempted: admit again now
            else:
                idle = not self.running and not self.waiting
                if nxt >= total and idle:
                    break
                if nxt >= total:
                    # waiting but nothing schedulable: a controller tick must change
                    # the knobs (or the liveness rule admits); advance to it
                    t_next = self._next_tick + 1e-9
                else:
                    t_next = reqs[nxt].arrival_time
                self._ticks_until(t_next)
                self.now = max(self.now, t_next)
            if self.give_up is not None and self.bad > self.give_up[1]:
                break          # attainment is below the target whatever comes next
            if self.now > self.max_sim_s:
                if self.horizon_s is not None:
                    break      # the rest stays unfinished (counted so by the metrics)
                raise SimulationError(f"simulation passed {self.max_sim_s:.0f}s of virtual time "
                                   f"with {len(self.running)} running and {len(self.waiting)} "
                                   "waiting: the workload does not drain")
        self._ticks_until(self.now + 1e-9)
        return SimResult(reqs, self._step_log, self.decisions, self._knob_log, self.now,
                         failed=list(self.failed), refused=list(self.refused),
                         truncated=self.now > self.max_sim_s or (
                             self.give_up is not None and self.bad > self.give_up[1]))


def simulate(cfg: Config, hardware, requests: Iterable[RequestSpec], *,
             engine_cls: type[SimEngine] | None = None, **kw: Any) -> SimResult:
    """One run on ``hardware`` (a :class:`tuned.sim.hardware.SimHardware`) of
    ``engine_cls`` (:class:`SimEngine` or a subclass; ``kw``: its options); the config's
    ``num_gpu_blocks`` overrides the hardware's cache size when set. ``nvml=``
    (:meth:`tuned.sim.hardware.SimHardware.nvml` for some memory-pressure events)
    gives the run a simulated NVML; without it the run has none, as a CPU host.
    ``drift=`` (:class:`tuned.sim.events.StepDrift`) scales every step's time by its
    factor at the step's start."""
    blocks = cfg.num_gpu_blocks or hardware.num_gpu_blocks
    kw.setdefault("kv_bytes_per_token", hardware.kv_bytes_per_token or None)
    eng = (engine_cls or SimEngine)(cfg, hardware.step_model, block_size=hardware.block_size,
                                    num_gpu_blocks=blocks, **kw)
    res = eng.run(requests)
    res.hardware = hardware.describe()
    res.config = cfg.to_dict()
    if eng.nvml is not None:
        res.events = [e.describe() for e in eng.nvml.events]
    if eng.drift is not None:
        res.events = res.events + eng.drift.describe()
    return res
