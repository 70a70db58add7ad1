"""Refusal in one room: when tuned refuses a request, why, and how each engine answers.

A refusal is a request tuned will not serve: the queue gives up on it at the wait
bound (``on_max_wait = "refuse"``), or, while the queue keeps refusing, the API
server turns new requests away at the door. Everything about it lives here, in three
parts, one per question a change asks:

* **The decision.** :func:`bound_spec` reads the config's wait bound (``max_wait_s``,
  ``on_max_wait``, ``age_after_s``, ``ttft_sla_s``); :class:`QueueRefusals`, the
  waiting queue's collaborator, refuses each waiting request whose first token
  cannot come within it (:mod:`tuned.core.wait_bound` keeps the waiting requests by
  arrival); :class:`RefusalWatch` says while the queue is refusing (what tuned's
  ``GET /admission`` answers) and :func:`at_the_door` turns that answer into a
  refusal of a new request. Queue policies only defer (a deferred request waits);
  none refuses.
* **The reason and the events.** Every refusal is a :class:`Refusal`: its reason (a
  key of :data:`REASONS`, the ``reason`` label of ``tuned_requests_refused_total``),
  when, how long the request had waited, when to retry, and its text
  (:attr:`Refusal.message`). The queue counts them (its snapshot's ``refused``,
  which metrics export and :class:`RefusalWatch` reads); the simulator stamps a
  request's ``refused_s`` from one, which the bench reads; the bench's client reads
  a server's answer back as a refusal with :func:`client_refusal`.
* **The answer.** Each engine answers through :class:`RefusalAnswer`, one method:
  vLLM finishes the request as aborted and sends its client the final output
  (:mod:`tuned.engines.vllm`), the ASGI gateway answers HTTP 429 with
  ``Retry-After`` (:mod:`tuned.engines.gateway`), the simulator records it finished
  (:mod:`tuned.sim.engine`). :func:`answer` hands an engine its queue's refusals.

Changing how a refusal is answered is this module (the reason, the text, what a
client reads) and the one engine adapter concerned.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from tuned.core.wait_bound import WaitBound

if TYPE_CHECKING:
    from tuned.core.queue_policy import AdmitContext, ReqInfo

#: the wait bound's modes (the config's ``on_max_wait``)
MODES = ("refuse", "serve", "off")
#: still waiting at the bound: refused by the queue
REASON_MAX_WAIT = "max_wait"
#: the queue is refusing: a new request is turned away at the API server
REASON_OVERLOADED = "overloaded"
#: every reason, with what it means to an operator (metrics' help text)
REASONS = {REASON_MAX_WAIT: "still waiting at max_wait_s",
           REASON_OVERLOADED: "turned away with HTTP 429 while the queue refuses"}
#: the reasons the queue refuses for (``tuned_requests_refused_total{reason}``)
QUEUE_REASONS = (REASON_MAX_WAIT,)
#: HTTP statuses a client reads as "refused, retry elsewhere": too many requests,
#: unavailable
REFUSAL_STATUSES = (429, 503)

R = TypeVar("R")


def bound_spec(on_max_wait: str, max_wait_s: float, ttft_sla_s: float,
               age_after_s: float) -> tuple[float, bool, float] | None:
    """(bound, refuse at it, aging point), in seconds, of the wait bound, or None
    without one: the bound is ``max_wait_s``, else 10 x ``ttft_sla_s`` when a TTFT
    target is set; the aging point ``age_after_s``, else 2 x ``ttft_sla_s``, at
    most half the bound."""
    if on_max_wait == "off":
        return None
    bound = max_wait_s or 10.0 * ttft_sla_s
    if bound <= 0:
        return None
    age = age_after_s or min(2.0 * ttft_sla_s or bound / 2, bound / 2)
    return bound, on_max_wait == "refuse", min(age, bound)


def refuses(spec: tuple | None) -> bool:
    """Whether a wait bound (:func:`bound_spec`) refuses: then the API server needs the
    gateway that answers 429 while the queue refuses."""
    return spec is not None and bool(spec[1])


@dataclass(frozen=True)
class Refusal:
    """One refusal (the event). ``at_s``: when, on the clock of whoever refused;
    ``waited_s``: how long the request had waited (queue refusals); ``bound_s`` and
    ``retry_after_s``: the bound and when to retry (refusals at the door)."""

    reason: str
    at_s: float
    request_id: str | None = None
    waited_s: float | None = None
    bound_s: Any = None
    retry_after_s: int | None = None

    @property
    def message(self) -> str:
        """What the refused client reads."""
        if self.reason == REASON_OVERLOADED:
            return (f"overloaded: requests are waiting past max_wait_s ({self.bound_s} s); "
                    f"retry in {self.retry_after_s} s")
        return f"refused ({self.reason}): {REASONS.get(self.reason, self.reason)}"


class RefusalAnswer(Protocol[R]):
    """How an engine answers refusals: ``refused`` holds each refused request (the
    engine's own object: a vLLM ``Request``, a simulated one, an ASGI ``send``) with
    its :class:`Refusal`. The gateway's answer is a coroutine (it awaits ``send``)."""

    def answer_refusals(self, refused: Sequence[tuple[R, Refusal]]) -> Awaitable[None] | None:
        ...


class QueueRefusals(Generic[R]):
    """The waiting queue's refusal collaborator: the wait bound (aging and refusal),
    the refusals not yet answered, and the counts. The queue reports each request
    joining the requests its policy orders (:meth:`join`) and leaving them
    (:meth:`leave`); at the top of each step it asks which are :meth:`due`, takes
    them out and hands each back with :meth:`refused`."""

    def __init__(self, bound: WaitBound | None = None) -> None:
        self.bound = bound
        self._max_prompt = 0               # the largest prompt seen (bounds the leads)
        self._out: list[tuple[R, Refusal]] = []

    def set_bound(self, spec: tuple | None, waiting: Iterable[ReqInfo]) -> None:
        """``spec``: ``(bound_s, refuse[, age_after_s])`` (:func:`bound_spec`) or None;
        the same spec again keeps the bound as it is. ``waiting``: the requests the
        policy orders now, bounded from their arrival."""
        old = self.bound
        new = WaitBound(*spec) if spec is not None else None
        if new is None or old is None or (old.bound_s, old.refuse, old.age_after_s) != (
                new.bound_s, new.refuse, new.age_after_s):
            if new is not None:
                if old is not None:      # the counts are the queue's, monotonic
                    new.aged, new.refused = old.aged, old.refused
                for info in waiting:
                    new.add(info.request_id, info.arrival_s)
            self.bound = new

    def join(self, info: ReqInfo) -> None:
        if self.bound is not None:
            self.bound.add(info.request_id, info.arrival_s)
            self._max_prompt = max(self._max_prompt, info.prompt_tokens)

    def leave(self, request_id: str) -> None:
        if self.bound is not None:
            self.bound.discard(request_id)

    def due(self, ctx: AdmitContext, infos: dict[str, ReqInfo]) -> list[str]:
        """The waiting requests to refuse now, oldest first (``infos``: the requests
        the policy orders, by id): those whose first token cannot come within the
        bound -- waited the bound less the prefill ahead of them and their own at the
        engine's pace (the prompt tokens the running requests still owe, then its own,
        at T(b, c, kv) / c per prompt token, with the step model the controller
        publishes; no lead without one), counted twice, because after the check the
        budget may shrink and other requests may be admitted ahead of it, and one step
        more, the time to the next check. The largest prompt seen bounds the leads."""
        if self.bound is None:
            return []
        lead, lead_max = None, 0.0
        b = max(int(ctx.num_running), 0)
        if ctx.step_model is not None and ctx.token_budget > b:
            c = ctx.token_budget - b
            step_s = ctx.step_model.predict_step_s(b, c, ctx.kv_resident_tokens)
            per_token = step_s / c
            ahead = max(int(ctx.prefill_backlog_tokens), 0)
            lead = lambda rid: step_s + 2.0 * per_token * (  # noqa: E731
                ahead + max(infos[rid].prompt_tokens, 0))
            lead_max = step_s + 2.0 * per_token * (ahead + self._max_prompt)
        return self.bound.due(ctx.now_s, lead, lead_max)

    def refused(self, request: R, request_id: str, now_s: float,
                arrival_s: float | None, reason: str = REASON_MAX_WAIT) -> Refusal:
        """``request`` was taken out of the queue, refused: counted, and kept for the
        engine's answer (:meth:`take`)."""
        event = Refusal(reason, now_s, request_id,
                        now_s - arrival_s if arrival_s is not None else None)
        self._out.append((request, event))
        if self.bound is not None:
            self.bound.refused += 1
        return event

    def take(self) -> list[tuple[R, Refusal]]:
        """The refusals since the last call, oldest first: the engine answers each at
        once (a clean refusal its client hears now)."""
        out, self._out = self._out, []
        return out

    def aged_head(self, now_s: float, eligible=None) -> str | None:
        """The oldest waiting request once it has waited the aging point (it goes
        before the policy's choice), else None (see :meth:`WaitBound.aged_head`)."""
        return self.bound.aged_head(now_s, eligible) if self.bound is not None else None

    def counts(self) -> dict[str, int]:
        """``aged`` and ``refused``: the queue snapshot's counts."""
        b = self.bound
        return {"aged": b.aged if b is not None else 0,
                "refused": b.refused if b is not None else 0}


def answer(refusals: QueueRefusals[R], engine: RefusalAnswer[R]) -> int:
    """Hand ``engine`` the refusals its queue made since the last call; their number."""
    out = refusals.take()
    if out:
        engine.answer_refusals(out)
    return len(out)


class RefusalWatch:
    """Whether the queue is refusing, for the door (what ``GET /admission`` answers,
    :mod:`tuned.engines.gateway` reads): refusing while the queue refused a request
    at its wait bound within the last bound (a sustained overload: a new request
    would wait past it too), unless the engine has room (no request waits and fewer
    run than the cap: a new request would start at once), and when to retry (the
    aging point: by then the oldest waiting have turned over). A door shut for the
    whole bound after a refusal turned requests away while the engine ran out of
    work (docs/results.md, "A burst past capacity on the real engine")."""

    def __init__(self) -> None:
        self.seen = 0                      # the queue's refusals at the wait bound
        self.last_t = -math.inf
        self.room = False                  # a new request would start at once

    def note(self, snap: dict | None, now: float, running: int | None = None,
             waiting: int | None = None, cap: int | None = None) -> None:
        """The queue's snapshot at ``now``: a refusal since the last one? ``running``,
        ``waiting`` (the engine's counts) and the applied ``cap``: room for a new
        request? Without all three, no room is assumed (the door stays shut for the
        bound, never opened on a guess)."""
        refused = (snap or {}).get("refused", 0)
        if refused > self.seen:
            self.last_t = now
        self.seen = refused
        self.room = (None not in (running, waiting, cap)
                     and waiting <= 0 and running < cap)

    def state(self, spec: tuple | None, now: float) -> dict:
        """The ``/admission`` answer under wait bound ``spec`` (:func:`bound_spec`);
        ``refusing_for_s``: how long it stays refusing without a new refusal (0 when
        not refusing), which holds the door's answer through a failed read; ``room``:
        whether a new request would start at once (then the door is open); ``window_s``:
        how long until the last refusal is a bound old, room or not."""
        if spec is None:
            return {"refusing": False, "max_wait_s": None, "retry_after_s": None,
                    "refusing_for_s": 0.0}
        bound, refuse, age = spec
        window = max(bound - (now - self.last_t), 0.0) if refuse else 0.0
        left = 0.0 if self.room else window
        return {"refusing": left > 0, "max_wait_s": bound,
                "retry_after_s": max(1, math.ceil(age)), "refused": self.seen,
                "room": self.room, "refusing_for_s": round(left, 3),
                "window_s": round(window, 3)}


def at_the_door(state: dict | None, now_s: float,
                read_s: float | None = None) -> Refusal | None:
    """A new request's refusal at the API server, from the ``/admission`` answer
    (:meth:`RefusalWatch.state`) read at ``read_s``, or None to let it through: when
    there is no answer (never refuse on a guess), and once the answer's
    ``refusing_for_s`` has passed since it was read (never refuse past what the
    endpoint said: a later read that failed keeps the answer, not its window)."""
    if not (state and state.get("refusing")):
        return None
    left = state.get("refusing_for_s")
    if left is not None and read_s is not None and now_s - read_s >= left:
        return None
    return Refusal(REASON_OVERLOADED, now_s, bound_s=state.get("max_wait_s"),
                   retry_after_s=max(int(state.get("retry_after_s") or 1), 1))


def client_refusal(status: int | None = None, *, tokens: int = 0,
                   finish: str | None = None, stream_done: bool = False) -> str | None:
    """How a client reads a server's answer as a refusal (the bench does): its error
    text, or None when it is not one. An HTTP status of :data:`REFUSAL_STATUSES`; or
    a stream that ended before any token with finish reason ``abort``, or with only
    the usage chunk and ``[DONE]`` -- how vLLM sends a request the queue refused
    (finished as aborted before its first token, a choice without tokens skipped)."""
    if status is not None:
        return f"refused: HTTP {status}" if status in REFUSAL_STATUSES else None
    if not tokens and (finish == "abort" or (finish is None and stream_done)):
        return "refused: aborted before any token"
    return None
