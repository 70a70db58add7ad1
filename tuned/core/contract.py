"""The contract between tuned's control core and an engine.

Two engines implement it: the vLLM adapter (:mod:`tuned.engines.vllm`, a scheduler
subclass inside vLLM's EngineCore) and the simulator (:mod:`tuned.sim.engine`, a
discrete-event loop on a virtual clock). Everything else -- the controller, the
batch and queue policies, the knob slot, the windowed aggregates, metrics and the
endpoint -- is the core and is shared unchanged. vLLM's
``vllm/v1/core/sched/interface.py`` is the model for this page: who calls what,
how often, on which thread, and what it must not do.

**Set-up (once, engine thread).** The engine builds its core with
:func:`tuned.control.runtime.build_runtime` (the composition root, above the core) from a validated
:class:`~tuned.config.Config` (config flows one way: file -> ``Config`` ->
constructors; an engine never reads a config file), passing itself as the
:class:`EngineView` and the one clock of the run (monotonic for vLLM, virtual for
the simulator). It then writes ``runtime.slot.applied`` to its knobs.

**Each engine step (engine thread), in this order:**

1. ``knobs = runtime.slot.take()``; when not None, write ``knobs.cap`` to the
   admission gate (vLLM: ``max_num_active_reqs``) and ``knobs.token_budget`` to the
   per-step token budget (``max_num_scheduled_tokens``) *before* scheduling. Must
   not block; O(1).
2. When a tuned queue is installed: ``queue.begin_step(ctx, running)`` with an
   :class:`~tuned.core.queue_policy.AdmitContext` on the run's clock, the live list
   of running requests, and what the controller last published for the queue
   (``runtime.queue_channel.inputs``: the speed curve, the admission guard's step
   model and targets; see :mod:`tuned.core.queue` for the admission loop). An engine
   that installs another queue policy leaves the outgoing queue's counters with
   ``runtime.queue_channel.switched(snapshot)``; the controller exports them at its
   next tick.
3. Schedule: running requests first (decodes and unfinished prefill chunks, in
   admission order, under the token budget), then waiting requests while the gate
   and the budget allow and the queue's ``__bool__`` is True.
4. After the step's output: append exactly one
   :class:`~tuned.core.ring.StepSample` to ``steps`` for a step that
   scheduled tokens (``t`` = end of the step on the run's clock, ``step_s`` = its
   duration) and one :class:`~tuned.core.ring.FinishedRequest` to
   ``finished`` per request that left the engine. Appends are the only writes to
   the rings; nothing else on the step path may allocate per request beyond that.
   When a tuned queue is installed, also ``queue.step_done(num_decode, preempted)``.
5. Nothing tuned does on the step path may raise into the engine: the vLLM adapter
   wraps steps 1, 2 and 4 and every queue method vLLM calls, and hands each failure
   to :class:`tuned.core.steppath.StepPathGuard` (counted, logged once per episode,
   fallback cap and arrival order until recovery).

**Each controller tick** (every ``interval_s`` on the run's clock: apscheduler's
thread in vLLM, the event loop in the simulator): ``controller.run_once()`` reads
the rings and :meth:`EngineView.counts` / :meth:`EngineView.queue_snapshot`
(observe), runs the batch policy (decide) and offers the decision to the slot
(act). It may call :meth:`EngineView.set_queue_policy` on a reload, which only
records the request: the engine installs the new queue at the top of its next step,
on its own thread. A tick never touches the engine's scheduler state directly.

**What an engine must not do:** change the ceiling (vLLM's
``max_num_running_reqs``, the model runner's slot count) after set-up; read the
config file; keep its own copy of the fallback, staleness or clamp rules (they are
the slot's); call the controller from the step path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tuned.core.ring import Ring

if TYPE_CHECKING:  # the config sits above the core; the contract only names its type
    from tuned.config import Config


class EngineView(Protocol):
    """What the control core reads from (and asks of) an engine.

    Attributes are fixed after set-up. ``counts`` and ``queue_snapshot`` are called
    from the controller's thread and must be safe to call concurrently with a step
    (reading lengths and counters only).
    """

    steps: Ring                  # StepSample per engine step (engine writes, core reads)
    finished: Ring               # FinishedRequest per request that left the engine
    ceiling: int                 # max_num_seqs: the highest cap the slot may write
    max_num_batched_tokens: int  # the highest token budget the slot may write
    kv_capacity_tokens: int      # KV tokens the cache holds for requests
    block_size: int              # KV block size in tokens
    dp_rank: int                 # data-parallel rank (metrics port offset)

    def counts(self) -> tuple[int, int]:
        """(running, waiting) requests right now."""
        ...

    def active_requests(self) -> list[tuple[int, int]]:
        """(prompt tokens, max tokens) of each running request (read only for batch
        policies that ask for it, e.g. TensorRT-LLM's tuner)."""
        ...

    def set_queue_policy(self, name: str, cfg: Config) -> None:
        """Validate ``name`` and ask the engine to install that queue policy at the top
        of its next step (raise ``ValueError`` here, on the caller's thread)."""
        ...

    def queue_snapshot(self) -> dict | None:
        """The installed tuned queue's counters (``QueueCore.snapshot()``), or None
        when the engine runs its own FCFS queue."""
        ...

    # Optional: ``present_prompts() -> list[int]``, the prompt tokens of each request
    # running or waiting (a read from the controller's thread; an empty list where
    # unknown): the memory bound's demand reads the prompts of the batch it sizes
    # (tuned.core.window's present_pairs), not only those of finished requests.
    # Optional: ``oldest_wait_s() -> float | None``, how long the longest-waiting
    # request has waited for admission, in seconds (None: none waits): past the TTFT
    # SLO, the SLA bound steps aside (tuned.policies.batch.BatchPolicy, "ttft_late").
    # Optional: ``kv_bytes_per_token: float | None``, the KV cache's bytes per token on
    # one GPU, with which NVML's free device memory reads as KV tokens (BucketServe's
    # N_max); absent or None where unknown (a CPU engine).
    # Optional: ``kv_usage_now() -> float``, the fraction of usable KV blocks held
    # right now (a live read, safe beside a step). Where an engine frees blocks
    # outside its steps (vLLM: aborts), the controller reads this instead of the
    # newest step sample, which would stay stale while the engine idles.
