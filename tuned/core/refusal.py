"""Refusal in one room: when tuned refuses a request, why, and how each engine answers.

A refusal is a request tuned will not serve: the queue gives up on it at the wait
bound (``on_max_wait = "refuse"``), or, while the queue keeps refusing, the API
server turns new requests away at the door. Everything about it lives here, in three
parts, one per question a change asks:

* **The decision.** :func:`bound_spec` reads the config's wait bound (``max_wait_s``,
  ``on_max_wait``, ``age_after_s``, ``ttft_sla_s``); :class:`QueueRefusals`, the
  waiting queue's collaborator, refuses each waiting request whose first token
  cannot come within it (:mod:`tuned.core.wait_bound` keeps the waiting requests by
  arrival; a large prompt is refused rather than the several small ones it would
  hold back, and past twice the engine's capacity the newest go first, so a request
  arriving can still meet its target); :class:`RefusalWatch` says while the queue
  is refusing (what tuned's
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
  ``Retry-After`` (:mod:`tuned.engines.gateway`; it also turns vLLM's empty answer to
  a request the queue refused into the same 429), the simulator records it finished
  (:mod:`tuned.sim.engine`). :func:`answer` hands an engine its queue's refusals.

Changing how a refusal is answered is this module (the reason, the text, what a
client reads) and the one engine adapter concerned.
"""

from __future__ import annotations

import heapq
from collections import deque
import math
from collections.abc import Awaitable, Collection, Iterable, Sequence
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
REASONS = {REASON_MAX_WAIT: "its first token could not come within the wait bound "
                            "(max_wait_s, by default the TTFT target)",
           REASON_OVERLOADED: "turned away with HTTP 429: its first token would come "
                              "past the wait bound"}
#: the reasons the queue refuses for (``tuned_requests_refused_total{reason}``)
QUEUE_REASONS = (REASON_MAX_WAIT,)
#: HTTP statuses a client reads as "refused, retry elsewhere": too many requests,
#: unavailable
REFUSAL_STATUSES = (429, 503)

R = TypeVar("R")

#: the most waiting requests one prediction refuses to make room for later ones
#: (Moore and Hodgson's rule, :func:`first_token_leads`); past it, each request that
#: cannot come in time is refused itself
MAX_DROPS = 8
#: the queue turns newest first once, over the last bound, it refused more than this
#: many times as many requests as it admitted: an overload past twice what the
#: engine serves (:func:`first_token_leads`)
OVERLOAD_FACTOR = 1.0


def bound_spec(on_max_wait: str, max_wait_s: float, ttft_sla_s: float,
               age_after_s: float) -> tuple[float, bool, float] | None:
    """(bound, refuse at it, aging point), in seconds, of the wait bound, or None
    without one: the bound is ``max_wait_s``, else with a TTFT target the target
    itself when refusing (a request that cannot meet it is refused as soon as that is
    predicted) and 10 x it when serving late; the aging point ``age_after_s``, else
    2 x ``ttft_sla_s``, at most half the bound."""
    if on_max_wait == "off":
        return None
    bound = max_wait_s or (ttft_sla_s if on_max_wait == "refuse" else 10.0 * ttft_sla_s)
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
    #: queue refusals by prediction: its first token's predicted time from its
    #: arrival, and what the prediction read (cap, running, token budget, prompt
    #: tokens still to prefill, KV tokens resident) -- for the operator's log line
    predicted_s: float | None = None
    seen: dict | None = None

    @property
    def message(self) -> str:
        """What the refused client reads."""
        if self.reason == REASON_OVERLOADED:
            return (f"overloaded: a new request's first token would come past the wait "
                    f"bound ({self.bound_s} s)")
        waited = f" after waiting {self.waited_s:.1f} s" if self.waited_s is not None else ""
        return (f"refused ({self.reason}){waited}: "
                f"{REASONS.get(self.reason, self.reason)}")


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
        self._out: list[tuple[R, Refusal]] = []
        #: predicted time to the first token of a request arriving now (None: no
        #: prediction), what the door decides a new request by
        self.door_wait_s: float | None = None
        self._leads: dict[str, float] = {}
        self._answer_s = 0.0
        self._seen: dict | None = None
        #: the queue serves newest first (an overload, with refusal: see
        #: :func:`first_token_leads`); the requests admitted so (counted once each)
        self.newest_since: float | None = None
        #: (when, refused, admitted) over the last bound: the overload test
        self._window: deque[tuple[float, int, int]] = deque()
        #: (arrival, time since the arrival before it) over the last bound, in order
        self._arrivals: deque[tuple[float, float]] = deque()
        self._last_arrival = -math.inf
        self.newest_admitted = 0
        self._newest_ids: set[str] = set()

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
        if info.arrival_s > self._last_arrival:
            self._arrivals.append((info.arrival_s, info.arrival_s - self._last_arrival))
            self._last_arrival = info.arrival_s
        if self.bound is not None:
            self.bound.add(info.request_id, info.arrival_s)

    def leave(self, request_id: str) -> None:
        self._newest_ids.discard(request_id)
        if self.bound is not None:
            self.bound.discard(request_id)

    def due(self, ctx: AdmitContext, infos: dict[str, ReqInfo],
            running_left: Sequence[int] = ()) -> list[str]:
        """The waiting requests to refuse now, oldest first (``infos``: the requests
        the policy orders, by id, oldest first; ``running_left``: the decode steps each
        running request is predicted still to run): those whose first token cannot
        come within the bound from their arrival, as :func:`first_token_leads`
        predicts it (the work ahead of each, at the engine's pace, under the cap),
        refused as soon as that is known rather than at the bound. Also keeps
        :attr:`door_wait_s`, the same prediction for a request arriving now, and the
        order: newest first (:attr:`newest_since`) once, over the last bound, the
        queue refused more requests than it admitted (:data:`OVERLOAD_FACTOR`) while
        full, until nothing waits; newest first, the requests that arrived once the
        arrivals slowed to the engine's pace (:meth:`_lull`) are refused for none."""
        if self.bound is None:
            self.newest_since = None
            return []
        bound_s, now = self.bound.bound_s, ctx.now_s
        if not infos:
            self.newest_since = None          # the overload is over
        window = self._window
        while window and now - window[0][0] > bound_s:
            window.popleft()
        arrivals = self._arrivals
        while arrivals and now - arrivals[0][0] > bound_s:
            arrivals.popleft()
        keep: set[str] = set()
        if self.newest_since is not None:
            lull = self._lull(bound_s, now)
            if lull is not None:
                keep = {rid for rid, info in infos.items() if info.arrival_s >= lull}
        leads, self.door_wait_s, self._answer_s, full = first_token_leads(
            ctx, infos.values(), running_left, now, bound_s, self.newest_since, keep)
        out = self._due(ctx, leads)
        if out:
            window.append((now, len(out), 0))
        if (self.newest_since is None and leads is not None and self.bound.refuse
                and full and window):
            refused = sum(n for _, n, _ in window)
            if refused > OVERLOAD_FACTOR * sum(a for _, _, a in window):
                # those waiting now keep their order; the ones arriving from now on
                # go ahead of each other, newest first
                self.newest_since = now
        return out

    def _lull(self, bound_s: float, now_s: float) -> float | None:
        """When the arrivals slowed to what the engine serves: the last arrival that
        came at least the time between two admissions (over the last bound) after
        the one before it, while no more have arrived since than the engine admits
        at that pace; None when the overload goes on. The requests arriving from
        then on are traffic the engine can serve, never refused for the overload's
        leftovers."""
        admitted = sum(a for _, _, a in self._window)
        if not admitted:
            return None
        pace = bound_s / admitted
        n = 0
        for t, gap in reversed(self._arrivals):
            n += 1
            if gap >= pace:
                return t if n <= (now_s - t) / pace + 1 else None
        return None

    def admitted(self, now_s: float) -> None:
        """A waiting request was admitted (the queue tells each): what the overload
        test weighs the refusals against."""
        if self.bound is not None:
            self._window.append((now_s, 0, 1))

    def _due(self, ctx: AdmitContext, leads: dict[str, float] | None) -> list[str]:
        self._leads = leads or {}
        if leads is None:
            return self.bound.due(ctx.now_s)
        # a refusal decided now reaches its client as this step ends, and the queue
        # looks again only a step later: refused a step early, its answer comes
        # within the bound (first_token_leads passes over a request by the same rule)
        answer_s = self._answer_s
        self._seen = {"cap": int(ctx.cap), "running": int(ctx.num_running),
                      "token_budget": int(ctx.token_budget),
                      "prefill_backlog_tokens": int(ctx.prefill_backlog_tokens),
                      "kv_resident_tokens": int(ctx.kv_resident_tokens or 0)}
        lead_max = max(leads.values(), default=0.0) + answer_s
        return self.bound.due(ctx.now_s, lambda rid: leads.get(rid, 0.0) + answer_s,
                              lead_max)

    def refused(self, request: R, request_id: str, now_s: float,
                arrival_s: float | None, reason: str = REASON_MAX_WAIT) -> Refusal:
        """``request`` was taken out of the queue, refused: counted, and kept for the
        engine's answer (:meth:`take`)."""
        waited = now_s - arrival_s if arrival_s is not None else None
        lead = self._leads.get(request_id)
        event = Refusal(reason, now_s, request_id, waited,
                        predicted_s=(round(waited + lead, 3) if lead is not None
                                     and waited is not None else None),
                        seen=self._seen if lead is not None else None)
        self._out.append((request, event))
        if self.bound is not None:
            self.bound.refused += 1
        return event

    def take(self) -> list[tuple[R, Refusal]]:
        """The refusals since the last call, oldest first: the engine answers each at
        once (a clean refusal its client hears now)."""
        out, self._out = self._out, []
        return out

    @property
    def newest_first(self) -> bool:
        """Whether the queue serves newest first now (a sustained overload, with
        refusal: see :func:`first_token_leads`)."""
        return self.newest_since is not None

    def newest_head(self, infos: Iterable[ReqInfo],
                    eligible=None) -> tuple[str, bool] | None:
        """While the queue serves newest first (:attr:`newest_first`), the request
        that goes before the policy's choice and the aged head: the oldest of those
        that arrived before the queue turned newest first, then the newest of
        ``infos`` (``eligible(id)``: may it go now, under priority scheduling), with
        whether it is the newest; else None."""
        since = self.newest_since
        if since is None:
            return None
        old = new = None
        for info in infos:
            if eligible is not None and not eligible(info.request_id):
                continue
            if info.arrival_s <= since:
                if old is None or info.arrival_s < old.arrival_s:
                    old = info
            elif new is None or info.arrival_s >= new.arrival_s:
                new = info
        if old is not None:
            return old.request_id, False
        if new is None:
            return None
        if new.request_id not in self._newest_ids:
            self._newest_ids.add(new.request_id)
            self.newest_admitted += 1
        return new.request_id, True

    def aged_head(self, now_s: float, eligible=None) -> str | None:
        """The oldest waiting request once it has waited the aging point (it goes
        before the policy's choice), else None (see :meth:`WaitBound.aged_head`)."""
        return self.bound.aged_head(now_s, eligible) if self.bound is not None else None

    def counts(self) -> dict[str, Any]:
        """``aged``, ``refused`` and ``newest_first`` (requests admitted newest first):
        the queue snapshot's counts; ``door_wait_s``: the prediction for a new request
        (None without one)."""
        b = self.bound
        return {"aged": b.aged if b is not None else 0,
                "refused": b.refused if b is not None else 0,
                "newest_first": self.newest_admitted,
                "door_wait_s": self.door_wait_s if b is not None else None}


def first_token_leads(ctx: AdmitContext, waiting: Iterable[ReqInfo],
                      running_left: Sequence[int], now_s: float, bound_s: float,
                      newest_since: float | None = None, keep: Collection[str] = ()
                      ) -> tuple[dict[str, float] | None, float | None, float, bool]:
    """Predicted seconds from now to each waiting request's first token, the same for
    a request arriving now, the step now (``answer_s``: a refusal decided now is
    answered as it ends, and the next check comes a step later, so a request is
    refused once its first token would come past ``bound_s - answer_s``), and whether
    the queue is full (a request refused, or one arriving now would be); (None, None,
    0.0, False) without the step model the controller publishes or a token budget.

    **Which are refused.** Served oldest first, a request that would come past the
    bound is refused -- unless refusing a larger one ahead of it (its prefill and its
    share of the slots, :data:`MAX_DROPS` at most) lets it come in time: Moore and
    Hodgson's rule for the most jobs on time (Moore, Management Science 15(1), 1968),
    with the drop undone when it does not save the later one. One large prompt that
    would hold back several small ones is refused instead of them. A request of
    ``keep`` is never refused for another.

    **Which order** (``newest_since``). Oldest first, which meets the most deadlines
    while the engine keeps up. Under an overload past twice what the engine serves
    (:class:`QueueRefusals` decides), oldest first leaves the queue packed with
    requests that will just make it, and a request arriving, however few follow it,
    finds no room: the first request after a burst is refused behind the burst's last
    feasible ones. From ``newest_since`` on, the requests that arrived after it go
    ahead of each other, newest first, behind those waiting then -- adaptive LIFO, as
    Facebook's servers queue under overload (Maurer, "Fail at Scale", ACM Queue 13(8),
    2015): the requests refused are the ones that have waited longest, and a request
    that arrives can still meet its target. A request arriving now is predicted at
    the back, or, newest first, right after the requests waiting since before
    ``newest_since``.

    The engine is a set of batch slots (the cap) and a prefill pace. A slot frees when
    a running request ends (its predicted decode steps left at the decode step time of
    the batch the queue keeps full, T(b, 0, kv)) and again when the request that took
    it ends; the prompt tokens the running requests still owe and those of each
    waiting request ahead clear at T(b, c, kv) / c per token, as a backlog drains. A
    request's first token comes once it has a slot and its prompt and those ahead are
    through, and one step more: the step it comes out of, carrying the prefill pending
    now (the running requests' and the waiting ones', up to the token budget). Under a
    burst that is a full budget's step, a second or more on a CPU host, which also
    covers what the model does not see (the API server's own work under the burst);
    under a light load it is the one prompt's, so a request behind a running one is
    not refused that can still make it. A request whose first token would come past the bound
    from its arrival takes neither a slot nor prefill from those behind it: it is
    refused. This is list scheduling with predicted lengths, not a queueing formula,
    so a burst's first seconds are seen at once, before any request has finished."""
    model = ctx.step_model
    b_now = max(int(ctx.num_running), 0)
    if model is None or ctx.token_budget <= b_now:
        return None, None, 0.0, False
    waiting = list(waiting)
    cap = max(int(ctx.cap), 1)
    kv = ctx.kv_resident_tokens
    b = max(min(cap, b_now + len(waiting)), 1)
    decode_s = model.predict_step_s(b, 0.0, kv)
    c = ctx.token_budget - b_now
    per_token = model.predict_step_s(b_now, c, kv) / c
    pending = max(int(ctx.prefill_backlog_tokens), 0) + sum(
        max(r.prompt_tokens, 0) for r in waiting)
    step_s = model.predict_step_s(b_now, min(c, pending), kv)
    running = sorted(max(int(n), 0) * decode_s for n in running_left)
    free = [0.0] * max(cap - len(running_left), 0)
    prefill_now = per_token * max(int(ctx.prefill_backlog_tokens), 0)

    def cost(r: ReqInfo) -> float:
        """What serving ``r`` takes from those behind it: its prefill, and its share
        of the slots while it decodes."""
        return per_token * max(r.prompt_tokens, 0) + \
            max(r.predicted_output - 1, 0) * decode_s / cap

    def serve(order: list[ReqInfo]) -> tuple[dict[str, float], float, int]:
        """Leads in ``order``, a request arriving after them, the number refused."""
        dropped: dict[str, str] = {}          # refused for a later one: id -> the later
        tried: dict[str, str] = {}            # a later one -> what was dropped for it
        itself: set[str] = set()              # late, and no drop saves it
        while True:
            slots = free + running
            heapq.heapify(slots)
            prefill = prefill_now
            leads: dict[str, float] = {}
            kept: list[ReqInfo] = []
            late = 0
            again = False
            for r in order:
                rid = r.request_id
                if rid in dropped:
                    continue
                slot = slots[0] if slots else 0.0
                own = per_token * max(r.prompt_tokens, 0)
                first = max(slot, prefill) + own + step_s
                leads[rid] = first
                if now_s - r.arrival_s + first + step_s >= bound_s:
                    if rid in tried:          # the drop did not save it: undone
                        del dropped[tried.pop(rid)]
                        itself.add(rid)
                        again = True
                        break
                    victim = max((k for k in kept if k.request_id not in keep),
                                 key=cost, default=None)
                    if (rid not in itself and len(tried) + len(itself) < MAX_DROPS
                            and victim is not None and cost(victim) > cost(r)):
                        dropped[victim.request_id] = rid      # Moore-Hodgson
                        tried[rid] = victim.request_id
                        again = True
                        break
                    itself.add(rid)
                    late += 1
                    continue                  # refused: leaves the slot and the pace
                kept.append(r)
                prefill = max(slot, prefill) + own
                if slots:
                    heapq.heapreplace(slots, first + max(r.predicted_output - 1, 0) * decode_s)
            if not again:
                break
        for r in order:
            if r.request_id in dropped:       # refused so that a later one comes in time
                leads[r.request_id] = max(leads.get(r.request_id, 0.0),
                                          bound_s - (now_s - r.arrival_s))
                late += 1
        return leads, max(slots[0] if slots else 0.0, prefill) + step_s, late

    if newest_since is None:
        leads, door, late = serve(waiting)
        return leads, door, step_s, bool(late) or door + step_s >= bound_s
    before = [r for r in waiting if r.arrival_s <= newest_since]
    after = sorted(reversed([r for r in waiting if r.arrival_s > newest_since]),
                   key=lambda r: r.arrival_s, reverse=True)
    leads, _, _ = serve(before + after)
    _, door, _ = serve(before)
    return leads, door, step_s, True


def answer(refusals: QueueRefusals[R], engine: RefusalAnswer[R]) -> int:
    """Hand ``engine`` the refusals its queue made since the last call; their number."""
    out = refusals.take()
    if out:
        engine.answer_refusals(out)
    return len(out)


class RefusalWatch:
    """What the door decides a new request by (what ``GET /admission`` answers,
    :mod:`tuned.engines.gateway` reads).

    With a prediction (the queue's :attr:`QueueRefusals.door_wait_s`, in its
    snapshot: a step model is published), a new request is turned away while its
    predicted first token is past the bound -- the same rule the queue refuses its
    waiting requests by -- and let in the moment it is not, however many the queue
    refused before: a request the engine can serve in time is never refused for the
    ones that came before it. Without one (no TPOT SLA, so no step model), the door
    falls back on the queue's past: refusing while the queue refused a request within
    the last bound (a sustained overload: a new request would wait past it too),
    unless the engine has room (no request waits and fewer run than the cap), with
    the aging point as when to retry."""

    def __init__(self) -> None:
        self.seen = 0                      # the queue's refusals (its counter)
        self.last_t = -math.inf            # when the counter last rose
        self.room = False                  # a new request would start at once
        self.door_wait_s: float | None = None

    def note(self, snap: dict | None, now: float, running: int | None = None,
             waiting: int | None = None, cap: int | None = None) -> None:
        """The queue's snapshot at ``now`` (its refusals, its prediction for a new
        request), the engine's ``running`` and ``waiting`` counts and the applied
        ``cap``: room for a new request? Without all three, no room is assumed. An
        idle engine (none running or waiting) takes no step to update the prediction:
        it is dropped, a new request starts at once."""
        snap = snap or {}
        refused = snap.get("refused", 0)
        if refused > self.seen:
            self.last_t = now
        self.seen = refused
        self.room = (None not in (running, waiting, cap)
                     and waiting <= 0 and running < cap)
        wait = snap.get("door_wait_s")
        idle = (running, waiting) == (0, 0)
        self.door_wait_s = float(wait) if isinstance(wait, (int, float)) and not idle \
            else None

    def state(self, spec: tuple | None, now: float) -> dict:
        """The ``/admission`` answer under wait bound ``spec`` (:func:`bound_spec`).
        ``refusing_for_s``: how long the answer holds through a failed read;
        ``first_token_s``: the prediction for a new request (None without one: then
        ``room`` and ``window_s``, how long until the last refusal is a bound old,
        say why)."""
        if spec is None:
            return {"refusing": False, "max_wait_s": None, "retry_after_s": None,
                    "refusing_for_s": 0.0}
        bound, refuse, age = spec
        wait = self.door_wait_s
        if wait is not None:
            over = max(wait - bound, 0.0) if refuse else 0.0
            return {"refusing": over > 0, "max_wait_s": bound,
                    "retry_after_s": max(1, math.ceil(over)), "refused": self.seen,
                    "first_token_s": round(wait, 3), "refusing_for_s": round(over, 3)}
        window = max(bound - (now - self.last_t), 0.0) if refuse else 0.0
        left = 0.0 if self.room else window
        return {"refusing": left > 0, "max_wait_s": bound,
                "retry_after_s": max(1, math.ceil(age)), "refused": self.seen,
                "first_token_s": None, "room": self.room,
                "refusing_for_s": round(left, 3), "window_s": round(window, 3)}


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
