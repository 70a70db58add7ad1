"""SABER admission control (seed 002, Chang et al., Algorithm 1 and Section IV-C).

Two-tier queue. Every request enters the high-priority queue (HPQ) with a deadline
and a number of tokens to generate; its required speed is

    required speed = remaining tokens / (deadline − now)      [tokens/s]

which grows while it waits. A request that cannot make its deadline even alone —
the deadline passed, or the profile's single-request speed v(1) is below its
required speed — is demoted to the low-priority queue (LPQ), served only when the
HPQ is empty, without speed checks (best effort).

Admission (Algorithm 1): draw a random window of ``window`` requests from the HPQ
head and try them in random order; a candidate is admitted if the profile's
per-request speed with one more running request, v(L + 1), is at least its own
required speed and at least every running request's recorded required speed (the
speed it needed when it was admitted). Otherwise it stays in the HPQ. ``v`` is the
profile's ``speed_tok_s`` (a USL fit, seed 002's offline phase).

Mapping onto vLLM:

* The paper's loop admits one request per iteration and sleeps δ; here one
  ``schedule()`` step makes as many admission attempts as vLLM's cap and token
  budget allow, each drawing a fresh window, and L counts requests admitted earlier
  in the same step.
* "Remaining tokens" is max_tokens minus tokens already generated, as in the paper
  (max tokens); ``use_predicted`` plans with the predicted output instead.
* Requests without a deadline have required speed 0: never demoted, admitted
  whenever running requests' SLAs allow (``default_deadline_s`` gives them one).
* Without a profile (``speed_tok_s`` is None) nothing can be predicted: requests are
  admitted in arrival order like FCFS, but expired deadlines are still demoted.
* A running request admitted before this policy was active (or this step) has no
  recorded speed; its current required speed is used instead, and ignored once
  its deadline passed.
* ``running_check``: the readings of line 10's second clause,
  ``predSpd < any(actReq.reqSpd)``:

  - ``"executed"`` (the default): as the pseudo-code executes. ``any(...)`` is a
    boolean, so the clause compares v(L + 1) with True (1) when some running request
    recorded a nonzero required speed, else with False (0): it refuses only when the
    predicted speed is below 1 tok/s. Only the first clause (the candidate's own
    speed) acts in practice. This is the reading that reproduces the paper's
    direction on the saber scenario (``docs/papers.md``, saber).
  - ``"recorded"``: v(L + 1) at least the largest required speed any running request
    recorded at its admission (Section IV-C: "records this request's required
    generation speed ... with the current timestamp"). On any decreasing speed curve
    this ratchets concurrency down: a request admitted at load L needed at most
    v(L + 1), and while it runs no admission may push the prediction below that.
  - ``"current"``: each running request's need now, (planned tokens − generated) /
    (deadline − now), protected only while it is on pace at the present load
    (need ≤ v(L)): a request already behind would miss whether or not the candidate
    joins, so the admission does not "cause" its violation (the paper's wording).
  - ``"off"``: no second clause. Differs from ``"executed"`` only when v(L + 1) < 1
    tok/s, so the two are not identical for every profile.

  Best-effort requests (from the LPQ) and requests without a deadline record 0 and
  protect nothing in any reading.
* ``demoted``: where demoted requests are served. ``"last"`` (Algorithm 1, lines
  17–20): only when the HPQ is empty. ``"in_order"``: they keep their arrival place
  and are admitted without a speed check when reached, a one-tier queue; a
  diagnostic of what the two-tier ordering does to the spread of completion time,
  not the paper's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Verdict


class SaberPolicy(QueuePolicy):
    """Two-tier queue with speed-based admission; see the module doc.

    Options: ``window`` (head requests sampled per attempt, Algorithm 1's windowSize;
    the paper gives no value, 16 reproduces its direction on the saber scenario),
    ``default_deadline_s`` (relative deadline for requests without one; 0 = none),
    ``use_predicted``, ``running_check`` (the reading of line 10's second clause:
    ``"executed"``, ``"recorded"``, ``"current"`` or ``"off"``; see the module doc),
    ``demoted`` (``"last"``, the paper's two-tier queue, or ``"in_order"``, a
    diagnostic).
    """

    name = "saber"
    uses_running_progress = True     # running_check = "current" reads output_tokens
    RUNNING_CHECKS = ("executed", "recorded", "current", "off")
    DEMOTED = ("last", "in_order")
    #: the default window (module doc; docs/papers.md, saber: the window sweep)
    WINDOW = 16

    def __init__(self, *, window: int = WINDOW, default_deadline_s: float = 0.0,
                 use_predicted: bool = False, running_check: str = "executed",
                 demoted: str = "last", rng=None) -> None:
        super().__init__(rng=rng)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"saber: window must be an integer >= 1, got {window!r}")
        if isinstance(default_deadline_s, bool) or not isinstance(
                default_deadline_s, (int, float)) or not default_deadline_s >= 0:
            raise ValueError(f"saber: default_deadline_s must be a number of seconds >= 0, "
                             f"got {default_deadline_s!r}")
        if running_check not in self.RUNNING_CHECKS:
            raise ValueError(f"saber: running_check must be one of "
                             f"{', '.join(self.RUNNING_CHECKS)}, got {running_check!r}")
        if demoted not in self.DEMOTED:
            raise ValueError(f"saber: demoted must be one of {', '.join(self.DEMOTED)}, "
                             f"got {demoted!r}")
        self.running_check = running_check
        self.demoted = demoted
        self.window = window
        self.default_deadline_s = float(default_deadline_s)
        self.use_predicted = bool(use_predicted)
        self._low: dict[str, int] = {}          # demoted request id -> demotion sequence
        self._demote_seq = 0
        self._recorded: dict[str, float] = {}   # running request id -> required tok/s
        self._t_demote: dict[str, float] = {}  # waiting request id -> demotion time
        self._next_demote_s = math.inf
        self._speed_fn = None

    # ------------------------------------------------------------ speeds
    def deadline_of(self, r: ReqInfo) -> float | None:
        if r.deadline_s is not None:
            return r.deadline_s
        if self.default_deadline_s:
            return r.arrival_s + self.default_deadline_s
        return None

    def remaining_tokens(self, r: ReqInfo) -> int:
        total = r.predicted_output if self.use_predicted else r.max_tokens
        return max(total - r.output_tokens, 0)

    def required_speed(self, r: ReqInfo, now_s: float) -> float:
        """remaining tokens / (deadline − now); 0 without a deadline, inf once it passed."""
        dl = self.deadline_of(r)
        if dl is None:
            return 0.0
        if dl <= now_s:
            return math.inf
        return self.remaining_tokens(r) / (dl - now_s)

    def is_low(self, request_id: str) -> bool:
        return request_id in self._low

    def _demotion_time(self, r: ReqInfo, v1: float | None) -> float:
        """When r becomes infeasible alone: the deadline, or with a profile the time
        deadline − remaining / v(1) after which v(1) < required speed."""
        dl = self.deadline_of(r)
        if dl is None:
            return math.inf
        if v1 is None or v1 <= 0:
            return dl
        return min(dl, dl - self.remaining_tokens(r) / v1)

    def _demote_reason(self, r: ReqInfo, now_s: float, v1: float | None) -> str | None:
        dl = self.deadline_of(r)
        if dl is None:
            return None
        if dl <= now_s:
            return "deadline passed"
        need = self.required_speed(r, now_s)
        if v1 is not None and v1 < need:
            return f"needs {need:.1f} tok/s > {v1:.1f} tok/s alone"
        return None

    # ------------------------------------------------------------ order
    def _v1(self) -> float | None:
        return self._speed_fn(1) if self._speed_fn is not None else None

    def _demote_at(self, r: ReqInfo) -> float:
        t = self._t_demote.get(r.request_id)
        if t is None:
            # constant while r waits: its remaining tokens do not change
            t = self._t_demote[r.request_id] = self._demotion_time(r, self._v1())
        return t

    def order_key(self, info: ReqInfo) -> tuple[int, float]:
        """HPQ (tier 0) in arrival order, then LPQ (tier 1) in demotion order; with
        ``demoted = "in_order"`` one tier in arrival order."""
        seq = self._low.get(info.request_id)
        if seq is None or self.demoted == "in_order":
            return (0, info.arrival_s)
        return (1, float(seq))

    def observe_arrival(self, info: ReqInfo) -> None:
        # a newcomer may already be infeasible: make the next refresh reorder
        self._next_demote_s = min(self._next_demote_s, self._demote_at(info))

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        """HPQ in arrival order, then LPQ in demotion order; demotes infeasible requests
        (each request's demotion time is computed once, then compared)."""
        if ctx is not None and ctx.speed_tok_s != self._speed_fn:
            self._speed_fn = ctx.speed_tok_s
            self._t_demote.clear()
        v1 = self._v1()
        next_demote = math.inf
        for r in sorted(waiting, key=lambda r: r.arrival_s):
            if r.request_id in self._low:
                continue
            t = self._demote_at(r)
            if now_s >= t and self._demote_reason(r, now_s, v1) is not None:
                self._demote_seq += 1
                self._low[r.request_id] = self._demote_seq
                self.stats.demoted += 1
                continue
            next_demote = min(next_demote, t if t > now_s else now_s)
        self._next_demote_s = next_demote
        return sorted(waiting, key=self.order_key)

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        # != rather than `is not`: a bound method is a new object at every access
        if ctx.speed_tok_s != self._speed_fn:
            self._speed_fn = ctx.speed_tok_s
            self._t_demote.clear()
            return True
        return ctx.now_s >= self._next_demote_s

    def candidates(self, ordered: Sequence[ReqInfo], ctx: AdmitContext) -> Sequence[ReqInfo]:
        """A random order of the first ``window`` HPQ requests; the LPQ head once the
        HPQ is empty (``demoted = "in_order"``: the first ``window`` requests)."""
        if self.demoted == "in_order":
            high = list(ordered[: self.window])
        else:
            high = [r for r in ordered[: self.window] if r.request_id not in self._low]
        if not high:
            return ordered[:1]
        if ctx.speed_tok_s is None:
            return high[:1]          # no profile: FCFS
        self.rng.shuffle(high)
        return high

    # ------------------------------------------------------------ admit
    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        if candidate.request_id in self._low:
            return Verdict(True, "saber: low-priority queue, best effort")
        if ctx.speed_tok_s is None:
            return Verdict(True, "saber: no speed profile, fcfs admission")
        load = len(running) + len(admitted_this_step)
        pred = ctx.speed_tok_s(load + 1)
        need = self.required_speed(candidate, ctx.now_s)
        if pred < need:
            return Verdict(False, f"saber: v({load + 1}) = {pred:.1f} tok/s < required "
                                  f"{need:.1f} tok/s")
        check = self.running_check
        if check != "off":
            refused = self._running_refusal(pred, load, (*running, *admitted_this_step), ctx)
            if refused is not None:
                return refused
        return Verdict(True, f"saber: v({load + 1}) = {pred:.1f} tok/s >= required "
                             f"{need:.1f} tok/s")

    def _running_need(self, r: ReqInfo, now_s: float) -> float:
        """The required speed line 10 reads for running request ``r``: the one recorded
        at its admission, or its current one when it has none (admitted before this
        policy was active)."""
        s = self._recorded.get(r.request_id)
        return self.required_speed(r, now_s) if s is None else s

    def _running_refusal(self, pred: float, load: int, running: Sequence[ReqInfo],
                         ctx: AdmitContext) -> Verdict | None:
        """Line 10's second clause under ``running_check``; a refusal or None."""
        now = ctx.now_s
        if self.running_check == "executed":
            # any(actReq.reqSpd) is a bool: predSpd < True is predSpd < 1
            flag = any(self._running_need(r, now) for r in running)
            if pred < flag:
                return Verdict(False, f"saber: v({load + 1}) = {pred:.1f} tok/s < "
                                      f"any(running required speeds) = {flag}")
            return None
        current = self.running_check == "current"
        # "current": a running request already behind pace at the present load would
        # miss whether or not the candidate joins; the admission does not cause it
        behind = ctx.speed_tok_s(max(load, 1)) if current else math.inf
        worst_id, worst = None, 0.0
        for r in running:
            s = self._running_need(r, now)
            if current and s > 0.0:
                s = self.required_speed(r, now)
            # a running request past its deadline has no SLA left to protect
            if s > worst and math.isfinite(s) and s <= behind:
                worst_id, worst = r.request_id, s
        if pred < worst:
            return Verdict(False, f"saber: v({load + 1}) = {pred:.1f} tok/s would break "
                                  f"running {worst_id} (needs {worst:.1f} tok/s)")
        return None

    # ------------------------------------------------------------ events
    def on_admitted(self, info: ReqInfo, now_s: float) -> None:
        super().on_admitted(info, now_s)
        self._t_demote.pop(info.request_id, None)
        if info.request_id in self._low:
            del self._low[info.request_id]
            self._recorded[info.request_id] = 0.0   # best effort: protects no SLA
        else:
            need = self.required_speed(info, now_s)
            self._recorded[info.request_id] = need if math.isfinite(need) else 0.0

    def forget(self, request_id: str) -> None:
        self._low.pop(request_id, None)
        self._recorded.pop(request_id, None)
        self._t_demote.pop(request_id, None)


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "saber", "kind": "queue", "build": "SaberPolicy", "order": 50,
    "summary": "deadline-aware two-tier admission (seed 002)",
    "options": {
        "window": {"type": "int", "default": 16, "lo": 1,
                   "doc": "waiting requests one admission attempt may try"},
        "default_deadline_s": {"type": "float", "default": 0.0, "lo": 0.0,
                               "doc": "deadline of a request without a class (0 = none)"},
        "use_predicted": {"type": "bool", "default": False,
                          "doc": "plan with the predicted output instead of max_tokens"},
        "running_check": {"type": "str", "default": "executed",
                          "choices": ["executed", "recorded", "current", "off"],
                          "doc": "how running requests' speeds are checked"},
        "demoted": {"type": "str", "default": "last", "choices": ["last", "in_order"],
                    "doc": "where demoted requests are served"},
    },
    "bench": [{"name": "tuned-saber", "kind": "tuned",
               "config": {"queue_policy": "saber", "queue_options": {}}}],
}
