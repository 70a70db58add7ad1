"""The queue-policy interface: what a queue policy sees (:class:`ReqInfo`,
:class:`AdmitContext`) and must implement (:class:`QueuePolicy`).

The concrete policies and the registry of their names live above this floor, in
:mod:`tuned.policies`; the queue core (:mod:`tuned.core.queue`) drives any object with
this interface.

A queue policy decides two things about the waiting requests of one engine:

* the admission order (:meth:`QueuePolicy.order`), and
* whether the head of that order may join the running batch now
  (:meth:`QueuePolicy.admit`); :meth:`QueuePolicy.select` combines the two and is
  what an engine adapter calls, once per admission attempt.

Policies are pure: they see requests through the frozen :class:`ReqInfo` view and
the engine through :class:`AdmitContext`; they import no engine and start no thread.
The vLLM adapter (``tuned.engines.vllm_queue``) and the simulator drive the very
same objects.

Who calls what, how often (one engine step = one ``schedule()``):

* ``observe_arrival(info)`` once per new request;
* ``refresh(waiting, ctx)`` once per step, must be O(1) or O(n) without sorting;
  returns True when the order must be recomputed although no request arrived or
  left (a starvation bound passed, a deadline expired, the buckets changed);
* ``order(waiting, now_s, ctx)`` only when the waiting set changed or ``refresh``
  asked for it; the adapter removes admitted heads from the cached order itself;
* ``select(ordered, running, admitted_this_step, ctx)`` once per admission attempt;
  changes no state apart from drawing from the policy's seeded RNG (SABER's window);
* ``on_admitted(info, now_s)`` once per request that really joined the batch;
  ``on_deferred(info, verdict)`` at most once per request and step;
  ``on_finished(info)`` / ``forget(request_id)`` when a request leaves.

Common rule of every policy (liveness): when nothing is running and nothing was
admitted this step, the first candidate is admitted even if the policy refuses it;
otherwise a request whose own predicted demand exceeds what the policy allows would
idle the engine forever. The verdict's reason says so.

Time: ``now_s``, ``arrival_s`` and ``deadline_s`` are unix seconds (vLLM's
``arrival_time`` clock).
"""

from __future__ import annotations

import dataclasses
import inspect
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple


@dataclass(frozen=True, slots=True)
class ReqInfo:
    """What a queue policy may know about one request.

    ``predicted_output`` is the output length the policy plans with (a client hint
    or the predictor's estimate, never above ``max_tokens``); ``output_tokens`` and
    ``started_s`` describe progress of a running request (0 / None while waiting).
    """

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    predicted_output: int
    output_tokens: int = 0
    started_s: float | None = None
    hint_output_tokens: int | None = None
    deadline_s: float | None = None
    priority: int = 0
    sla_class: str | None = None     # the accepted tuned_class hint, if any

    @property
    def seq_tokens(self) -> int:
        """Predicted total sequence length: prompt + predicted output (BucketServe's S)."""
        return self.prompt_tokens + self.predicted_output

    @property
    def remaining_predicted(self) -> int:
        """Predicted decode steps still to run, at least 1 unless max_tokens is reached.

        A running request that already outran its prediction is still running, so
        it will produce at least one more token; planning with 0 would free its
        memory in the look-ahead while the engine still holds it.
        """
        if self.output_tokens >= self.max_tokens:
            return 0
        return max(self.predicted_output - self.output_tokens, 1)

    def with_progress(self, output_tokens: int, started_s: float | None) -> ReqInfo:
        # The constructor, not dataclasses.replace: the queue rebuilds the running
        # requests' views at every admission gate, and replace (which reads the fields
        # on every call) was a third of a simulation's time.
        return ReqInfo(self.request_id, self.arrival_s, self.prompt_tokens, self.max_tokens,
                       self.predicted_output, output_tokens, started_s,
                       self.hint_output_tokens, self.deadline_s, self.priority,
                       self.sla_class)


class Verdict(NamedTuple):
    """An admission decision with the reason an operator reads in logs and metrics."""

    admit: bool
    reason: str


@dataclass(frozen=True)
class AdmitContext:
    """The engine as an admission decision sees it, fixed for one step.

    ``speed_tok_s(n)`` is the per-request decode speed (tokens/s) with ``n`` requests
    running, from the speed profile; None when no profile is loaded. ``block_size``:
    the KV allocator's unit in tokens (a request holding h tokens holds
    ceil(h / block_size) blocks); 1 plans token-exact.
    """

    now_s: float
    kv_capacity_tokens: int
    kv_free_tokens: int
    cap: int
    speed_tok_s: Callable[[int], float] | None = None
    block_size: int = 1
    under_prediction: float = 0.0    # expected memory share beyond the predicted output
                                     # (the predictor's measured under-prediction)
    step_model: Any = None           # the engine's step time T(b, c, kv) (.predict_step_s,
                                     # .beta, .gamma), for the TPOT admission guard
    tpot_sla_s: float = 0.0          # per-request TPOT target of that guard (0 = off)
    ttft_sla_s: float = 0.0          # TTFT target of the guard's prefill-cohort half and
                                     # of fcfs' predicted lateness (0 = off)
    token_budget: int = 0            # the step's token budget (0 = unknown)
    num_running: int = 0             # requests running at the top of the step (set by
                                     # QueueCore.begin_step from the running list)
    prefill_backlog_tokens: int = 0  # prompt tokens the running requests still have to
                                     # prefill (likewise set by QueueCore.begin_step)
    gpu_free_tokens: int | None = None  # NVML's free device memory (the lowest GPU) in
                                     # KV tokens; None without NVML (BucketServe's N_max)

    @property
    def kv_resident_tokens(self) -> int:
        """Tokens held in the KV cache now (capacity less free), which every step reads."""
        return max(int(self.kv_capacity_tokens) - int(self.kv_free_tokens), 0)


@dataclass
class PolicyStats:
    """Counters (monotonic) and gauges a policy exports; read by the metrics module.

    ``admitted``: requests that joined the batch; ``deferred``: (request, step)
    pairs whose admission the policy refused; ``demoted``: requests moved to a
    lower tier (SABER). ``bins_in_use`` / ``buckets_in_use``: non-empty length
    groups among waiting requests (multibin / bucket). ``last_reason``: the reason
    of the latest refusal or admission.
    """

    admitted: int = 0
    deferred: int = 0
    demoted: int = 0
    bins_in_use: int = 0
    buckets_in_use: int = 0
    last_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Selection(NamedTuple):
    """Result of :meth:`QueuePolicy.select`: the request to admit next (or None),
    the verdict, and the candidates refused on the way."""

    chosen: ReqInfo | None
    verdict: Verdict
    refused: tuple[ReqInfo, ...]


class QueuePolicy:
    """Base class of queue policies; subclasses override :meth:`order` and :meth:`admit`.

    Options are keyword arguments of ``__init__``; :meth:`from_options` builds a
    policy from a config mapping and rejects unknown keys.
    """

    name: ClassVar[str] = ""
    #: plan with an over-estimating output prediction (MC-SF needs õ >= o)
    overestimate: bool = False
    #: admit() reads running requests' progress (output_tokens); when False an
    #: adapter may pass running requests' views as they were when admitted
    uses_running_progress: ClassVar[bool] = False

    def __init__(self, *, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.Random(0)
        self.stats = PolicyStats()

    # ---------------------------------------------------------------- build
    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        sig = inspect.signature(cls.__init__)
        return tuple(p for p in sig.parameters if p not in ("self", "rng"))

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None = None,
                     rng: random.Random | None = None) -> QueuePolicy:
        """Build from a config mapping; ``ValueError`` names unknown keys and bad values."""
        options = dict(options or {})
        known = cls.option_names()
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"{cls.name}: unknown option(s) {', '.join(unknown)} "
                             f"(known: {', '.join(known) or 'none'})")
        try:
            return cls(rng=rng, **options)
        except TypeError as e:      # e.g. a string where a number belongs
            raise ValueError(f"{cls.name}: bad option value: {e}") from None

    # ---------------------------------------------------------------- decide
    def order_key(self, info: ReqInfo) -> Any:
        """A sort key when the order is a plain stable sort by a per-request key
        (an adapter may then insert arrivals without re-sorting); None when the order
        depends on the whole set (groups, tiers, time)."""
        return None

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        """The admission order of ``waiting`` (default: arrival order, stable)."""
        return sorted(waiting, key=lambda r: r.arrival_s)

    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        """Whether ``candidate`` may join ``running`` ∪ ``admitted_this_step`` now."""
        return Verdict(True, f"{self.name}: always admit")

    def candidates(self, ordered: Sequence[ReqInfo], ctx: AdmitContext) -> Sequence[ReqInfo]:
        """Which requests one admission attempt may try, in turn (default: the head
        only, so a refused head stops admission: no skipping)."""
        return ordered[:1]

    def select(self, ordered: Sequence[ReqInfo], running: Sequence[ReqInfo],
               admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Selection:
        """The next request to admit from ``ordered`` (the output of :meth:`order`
        minus requests already admitted), or None. Pure apart from RNG draws."""
        tried = self.candidates(ordered, ctx)
        if not tried:
            return Selection(None, Verdict(False, f"{self.name}: queue empty"), ())
        refused: list[ReqInfo] = []
        last = Verdict(False, "")
        for cand in tried:
            v = self.admit(cand, running, admitted_this_step, ctx)
            if v.admit:
                return Selection(cand, v, tuple(refused))
            refused.append(cand)
            last = v
        if not running and not admitted_this_step:
            return Selection(tried[0], Verdict(
                True, f"{last.reason}; admitted anyway: nothing is running (liveness)"),
                tuple(refused[1:]))
        return Selection(None, last, tuple(refused))

    # ---------------------------------------------------------------- events
    def observe_arrival(self, info: ReqInfo) -> None:
        """A new request entered the waiting queue."""

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        """Once per step; True when the order must be recomputed."""
        return False

    def on_admitted(self, info: ReqInfo, now_s: float) -> None:
        self.stats.admitted += 1

    def on_deferred(self, info: ReqInfo, verdict: Verdict) -> None:
        self.stats.deferred += 1
        self.stats.last_reason = verdict.reason

    def on_finished(self, info: ReqInfo) -> None:
        """A request this policy admitted finished (or was aborted while running)."""
        self.forget(info.request_id)

    def forget(self, request_id: str) -> None:
        """Drop any per-request state (request aborted or finished)."""


__all__ = ["AdmitContext", "PolicyStats", "QueuePolicy", "ReqInfo", "Selection", "Verdict"]
