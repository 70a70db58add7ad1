"""A bound on every request's wait for its first token, around any queue policy.

A queue policy that serves on-time requests first (fcfs with a TTFT target, SABER's
demotion, MC-SF's shortest-first) leaves the requests it gives up on waiting until a
lull; under a sustained overload there is none. :class:`WaitBound` keeps that wait
bounded, the operator's choice in the config (``on_max_wait``):

* **aging** (both modes): a request that has waited ``age_after_s`` (``age_after_s``
  in the config; by default twice the TTFT target, at most half the bound) regains its turn: it is admitted before whatever the policy would choose, oldest
  first. The requests a policy sacrifices (late ones, the largest prefills that
  Moore and Hodgson's rule sets aside, SABER's demoted ones) therefore come back at
  a stated wait, whatever their length.
* **refusal** (``on_max_wait = "refuse"``): a request still waiting at the bound is
  refused -- taken out of the queue and finished at once, so its client hears back
  within the bound and may retry elsewhere, as an overloaded gateway answers. SABER's
  admission control is the published form of this: it rejects the
  requests it cannot serve within their SLA rather than letting every one miss it.

Preempted requests are not bounded here: they were admitted once and resume first.
The bound is on the engine's clock, from the request's arrival.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable


class WaitBound:
    """Tracks the waiting requests by arrival; says which one has aged and which are
    due for refusal. ``bound_s`` > 0; ``refuse``: refuse at the bound (else serve,
    aged); ``age_after_s``: when a request regains its turn (None: half the bound). The queue reports every request that joins the ordered set (:meth:`add`)
    and every one that leaves it (:meth:`discard`)."""

    def __init__(self, bound_s: float, refuse: bool, age_after_s: float | None = None) -> None:
        if not (isinstance(bound_s, (int, float)) and math.isfinite(bound_s) and bound_s > 0):
            raise ValueError(f"max_wait_s: must be a number of seconds > 0, got {bound_s!r}")
        self.bound_s = float(bound_s)
        self.age_after_s = min(float(age_after_s), self.bound_s) if age_after_s else \
            self.bound_s / 2
        self.refuse = bool(refuse)
        self._heap: list[tuple[float, int, str]] = []   # (arrival, seq, id)
        self._members: dict[str, int] = {}              # id -> seq of its live entry
        self._seq = 0
        self._aged_ids: set[str] = set()
        self.aged = 0        # requests that regained their turn by age (counter)
        self.refused = 0     # requests refused at the bound (counter, kept by the queue)

    def add(self, request_id: str, arrival_s: float) -> None:
        seq = self._seq
        self._seq += 1
        self._members[request_id] = seq
        heapq.heappush(self._heap, (arrival_s, seq, request_id))

    def discard(self, request_id: str) -> None:
        """Left the ordered set (admitted, removed, pinned); its heap entry goes stale."""
        self._members.pop(request_id, None)
        self._aged_ids.discard(request_id)

    def _top(self) -> tuple[float, str] | None:
        heap, members = self._heap, self._members
        while heap:
            arrival, seq, rid = heap[0]
            if members.get(rid) == seq:
                return arrival, rid
            heapq.heappop(heap)
        return None

    def due(self, now_s: float, lead_s: Callable[[str], float] | None = None,
            lead_max_s: float = 0.0) -> list[str]:
        """With ``refuse``: the waiting requests that reached the bound, oldest first;
        they leave the set here. Without: none. ``lead_s(id)``: how long the request
        would take to its first token if admitted now (the prefill ahead of it and
        its own, at the engine's pace): it is refused that much earlier, so that no
        first token comes past the bound. ``lead_max_s`` bounds every lead: each
        request that has waited ``bound_s - lead_max_s`` is checked, not only the
        oldest (a younger request with a longer prompt may be due first)."""
        out: list[str] = []
        if not self.refuse:
            return out
        heap, keep = self._heap, []
        lead_max_s = max(lead_max_s, 0.0) if lead_s is not None else 0.0
        while (top := self._top()) is not None and now_s - top[0] + lead_max_s >= self.bound_s:
            entry = heapq.heappop(heap)
            rid = entry[2]
            if now_s - entry[0] + (lead_s(rid) if lead_s is not None else 0.0) >= self.bound_s:
                self.discard(rid)
                out.append(rid)
            else:
                keep.append(entry)
        for entry in keep:
            heapq.heappush(heap, entry)
        return out

    def aged_head(self, now_s: float,
                  eligible: Callable[[str], bool] | None = None) -> str | None:
        """The oldest waiting request when it has waited ``age_after_s`` or more
        (it goes before the policy's choice), else None; None too when
        ``eligible(id)`` says it may not go now (under priority scheduling, a request
        of a less urgent level than the one being served: it is not counted aged)."""
        top = self._top()
        if top is None or now_s - top[0] < self.age_after_s:
            return None
        if eligible is not None and not eligible(top[1]):
            return None
        rid = top[1]
        if rid not in self._aged_ids:
            self._aged_ids.add(rid)
            self.aged += 1
        return rid

    def __len__(self) -> int:
        return len(self._members)
