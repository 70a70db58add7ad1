"""SABER admission control (Chang et al., Algorithm 1 and Section IV-C).

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
profile's ``speed_tok_s`` (a USL fit, SABER's offline phase).

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

The authors' code (public replication package ``saber270/Saber``, ``saber.py``) runs
Algorithm 1 as a client-side dispatcher in front of vLLM; each of its mechanisms is an
option here, all off by default (``docs/papers.md``, saber, has which carries what):

* ``pace_s``: one admission attempt per dispatcher cycle (the code: 0.1 s), on one
  candidate drawn at random from the first ``window`` high-priority requests (the
  code: 20); with nothing running or admitted, the attempt is not held back.
* ``refused = "tail"``: a refused candidate goes back to the tail of the HPQ.
* ``speed_limit_tok_s``: a candidate whose required speed is above it when it is
  tried is demoted (the code: 100); the demotion test against v(1) is then off.
* ``expiry_check_s``: requests whose deadline passed are demoted only at this period
  (the code: every 10 cycles, 1 s); 0 demotes them at once.
* ``load = "doubled"``: the speed is predicted at a load of 2 H + 1, H the running
  requests admitted from the HPQ (the code adds the running count twice); demoted
  requests do not count.
* ``speed_curve``: the per-request speed a / (1 + s L + k L²) with the code's
  coefficients (``"authors_code"``: 102.55, 0.003, -0.001; the denominator crosses
  zero near L = 33, past which the prediction is negative and every candidate
  refused) or those the package's fit reports (``"authors_fit"``: 102.55, 0.0300,
  -0.0001), instead of the profile's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from tuned.core.queue_policy import AdmitContext, QueuePolicy, ReqInfo, Selection, Verdict


class SaberPolicy(QueuePolicy):
    """Two-tier queue with speed-based admission; see the module doc.

    Options: ``window`` (head requests sampled per attempt, Algorithm 1's windowSize;
    the paper gives no value, 16 reproduces its direction on the saber scenario),
    ``default_deadline_s`` (relative deadline for requests without one; 0 = none),
    ``use_predicted``, ``running_check`` (the reading of line 10's second clause:
    ``"executed"``, ``"recorded"``, ``"current"`` or ``"off"``; see the module doc),
    ``demoted`` (``"last"``, the paper's two-tier queue, or ``"in_order"``, a
    diagnostic); the authors' code's mechanisms ``pace_s``, ``refused``,
    ``speed_limit_tok_s``, ``expiry_check_s``, ``load`` and ``speed_curve`` (module doc).
    """

    name = "saber"
    uses_running_progress = True     # running_check = "current" reads output_tokens
    RUNNING_CHECKS = ("executed", "recorded", "current", "off")
    DEMOTED = ("last", "in_order")
    REFUSED = ("stay", "tail")
    LOADS = ("next", "doubled")
    #: per-request speed a / (1 + s L + k L^2): (a, s, k) from the authors' code
    #: (saber.py, estimate_generation_speed) and from the fit their package reports
    #: (estimation_function/model_comparison_summary.txt)
    SPEED_CURVES = {"authors_code": (102.55, 0.003, -0.001),
                    "authors_fit": (102.55, 0.0300, -0.0001)}
    #: the default window (module doc; docs/papers.md, saber: the window sweep)
    WINDOW = 16

    def __init__(self, *, window: int = WINDOW, default_deadline_s: float = 0.0,
                 use_predicted: bool = False, running_check: str = "executed",
                 demoted: str = "last", pace_s: float = 0.0, refused: str = "stay",
                 speed_limit_tok_s: float = 0.0, expiry_check_s: float = 0.0,
                 load: str = "next", speed_curve: str = "profile", rng=None) -> None:
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
        for key, val in (("pace_s", pace_s), ("speed_limit_tok_s", speed_limit_tok_s),
                         ("expiry_check_s", expiry_check_s)):
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not (
                    0 <= val < math.inf):
                raise ValueError(f"saber: {key} must be a number >= 0, got {val!r}")
        for key, val, allowed in (("refused", refused, self.REFUSED),
                                  ("load", load, self.LOADS),
                                  ("speed_curve", speed_curve,
                                   ("profile", *self.SPEED_CURVES))):
            if val not in allowed:
                raise ValueError(f"saber: {key} must be one of {', '.join(allowed)}, "
                                 f"got {val!r}")
        self.pace_s = float(pace_s)
        self.refused = refused
        self.speed_limit_tok_s = float(speed_limit_tok_s)
        self.expiry_check_s = float(expiry_check_s)
        self.load = load
        self.speed_curve = speed_curve
        self._curve = (None if speed_curve == "profile"
                       else self._usl_speed(*self.SPEED_CURVES[speed_curve]))
        self._next_attempt_s = -math.inf
        self._next_expiry_s = -math.inf
        self._expiry_due = False
        self._now_s = 0.0
        self._reorder = False
        self._requeued: dict[str, float] = {}   # HPQ request id -> time it went to the tail
        self._high: set[str] = set()            # running ids admitted from the HPQ
        self._refusal_kind: dict[str, str] = {}
        #: refusals by what refused them: "speed" (line 10's first clause), "negative"
        #: (a prediction <= 0), "running" (its second clause), "demoted" (above
        #: speed_limit_tok_s); a diagnostic of which test binds
        self.refusals = {"speed": 0, "negative": 0, "running": 0, "demoted": 0}
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
    @staticmethod
    def _usl_speed(a: float, s: float, k: float):
        def speed(load: int) -> float:
            return a / (1.0 + s * load + k * load * load)
        return speed

    def _fn(self, ctx: AdmitContext):
        """The speed curve admission reads: ``speed_curve``'s, else the profile's."""
        return self._curve if self._curve is not None else ctx.speed_tok_s

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
        """v(1) for the demotion test; None (deadlines only) under a speed limit."""
        if self.speed_limit_tok_s or self._speed_fn is None:
            return None
        return self._speed_fn(1)

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
            return (0, self._requeued.get(info.request_id, info.arrival_s))
        return (1, float(seq))

    def observe_arrival(self, info: ReqInfo) -> None:
        # a newcomer may already be infeasible: make the next refresh reorder
        self._next_demote_s = min(self._next_demote_s, self._demote_at(info))

    def order(self, waiting: Sequence[ReqInfo], now_s: float,
              ctx: AdmitContext | None = None) -> list[ReqInfo]:
        """HPQ in arrival order, then LPQ in demotion order; demotes infeasible requests
        (each request's demotion time is computed once, then compared)."""
        if ctx is not None and self._fn(ctx) != self._speed_fn:
            self._speed_fn = self._fn(ctx)
            self._t_demote.clear()
        v1 = self._v1()
        due = not self.expiry_check_s or self._expiry_due
        self._expiry_due = False
        next_demote = math.inf
        for r in sorted(waiting, key=lambda r: r.arrival_s):
            if r.request_id in self._low:
                continue
            t = self._demote_at(r)
            if due and now_s >= t and self._demote_reason(r, now_s, v1) is not None:
                self._demote_seq += 1
                self._low[r.request_id] = self._demote_seq
                self.stats.demoted += 1
                continue
            next_demote = min(next_demote, t if t > now_s else now_s)
        self._next_demote_s = next_demote
        return sorted(waiting, key=self.order_key)

    def refresh(self, waiting: Collection[ReqInfo], ctx: AdmitContext) -> bool:
        # != rather than `is not`: a bound method is a new object at every access
        if self._fn(ctx) != self._speed_fn:
            self._speed_fn = self._fn(ctx)
            self._t_demote.clear()
            return True
        if self._reorder:
            self._reorder = False
            return True
        if self.expiry_check_s:
            if ctx.now_s < self._next_expiry_s:
                return False
            self._next_expiry_s = ctx.now_s + self.expiry_check_s
            self._expiry_due = ctx.now_s >= self._next_demote_s
            return self._expiry_due
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
        if self._fn(ctx) is None:
            return high[:1]          # no profile: FCFS
        if self.pace_s:
            return [self.rng.choice(high)]   # the dispatcher's one draw per cycle
        self.rng.shuffle(high)
        return high

    def select(self, ordered: Sequence[ReqInfo], running: Sequence[ReqInfo],
               admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Selection:
        """With ``pace_s``, at most one attempt per cycle (the next cycle's time is the
        one state this keeps); an idle engine is not held back, or the simulator would
        jump to the next arrival instead of the next cycle."""
        self._now_s = ctx.now_s
        if self.pace_s:
            if (running or admitted_this_step) and ctx.now_s < self._next_attempt_s:
                return Selection(None, Verdict(False, "saber: waiting for the next "
                                                      "dispatch cycle"), ())
            self._next_attempt_s = ctx.now_s + self.pace_s
        return super().select(ordered, running, admitted_this_step, ctx)

    # ------------------------------------------------------------ admit
    def admit(self, candidate: ReqInfo, running: Sequence[ReqInfo],
              admitted_this_step: Sequence[ReqInfo], ctx: AdmitContext) -> Verdict:
        rid = candidate.request_id
        if rid in self._low:
            return Verdict(True, "saber: low-priority queue, best effort")
        need = self.required_speed(candidate, ctx.now_s)
        if self.speed_limit_tok_s and math.isfinite(need) and need > self.speed_limit_tok_s:
            self._refusal_kind[rid] = "demoted"
            return Verdict(False, f"saber: required {need:.1f} tok/s > limit "
                                  f"{self.speed_limit_tok_s:g} tok/s: demoted")
        fn = self._fn(ctx)
        if fn is None:
            return Verdict(True, "saber: no speed profile, fcfs admission")
        load = len(running) + len(admitted_this_step)
        at = load + 1
        if self.load == "doubled":
            high = (sum(1 for r in running if r.request_id in self._high)
                    + sum(1 for r in admitted_this_step if r.request_id not in self._low))
            at = 2 * high + 1
        pred = fn(at)
        if pred < need:
            self._refusal_kind[rid] = "negative" if pred <= 0 else "speed"
            return Verdict(False, f"saber: v({at}) = {pred:.1f} tok/s < required "
                                  f"{need:.1f} tok/s")
        check = self.running_check
        if check != "off":
            refused = self._running_refusal(pred, at - 1, (*running, *admitted_this_step),
                                            ctx)
            if refused is not None:
                self._refusal_kind[rid] = "running"
                return refused
        return Verdict(True, f"saber: v({at}) = {pred:.1f} tok/s >= required "
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
        behind = self._fn(ctx)(max(load, 1)) if current else math.inf
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
    def on_deferred(self, info: ReqInfo, verdict: Verdict) -> None:
        """A refused candidate: counted by what refused it; demoted when above
        ``speed_limit_tok_s``, else sent to the HPQ's tail under ``refused = "tail"``."""
        super().on_deferred(info, verdict)
        rid = info.request_id
        kind = self._refusal_kind.pop(rid, None)
        if kind is None or rid in self._low:
            return
        self.refusals[kind] += 1
        if kind == "demoted":
            self._demote_seq += 1
            self._low[rid] = self._demote_seq
            self._requeued.pop(rid, None)
            self.stats.demoted += 1
            self._reorder = True
        elif self.refused == "tail":
            self._requeued[rid] = self._now_s
            self._reorder = True

    def on_admitted(self, info: ReqInfo, now_s: float) -> None:
        super().on_admitted(info, now_s)
        self._t_demote.pop(info.request_id, None)
        self._requeued.pop(info.request_id, None)
        self._refusal_kind.pop(info.request_id, None)
        if info.request_id in self._low:
            del self._low[info.request_id]
            self._recorded[info.request_id] = 0.0   # best effort: protects no SLA
        else:
            self._high.add(info.request_id)
            need = self.required_speed(info, now_s)
            self._recorded[info.request_id] = need if math.isfinite(need) else 0.0

    def forget(self, request_id: str) -> None:
        self._low.pop(request_id, None)
        self._recorded.pop(request_id, None)
        self._t_demote.pop(request_id, None)
        self._requeued.pop(request_id, None)
        self._high.discard(request_id)
        self._refusal_kind.pop(request_id, None)


#: what tuned knows of this policy without importing it (tuned.policies.catalog)
POLICY = {
    "name": "saber", "kind": "queue", "build": "SaberPolicy", "order": 50,
    "summary": "deadline-aware two-tier admission (SABER)",
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
        "pace_s": {"type": "float", "default": 0.0, "lo": 0.0,
                   "doc": "one admission attempt per this many seconds (0 = every step)"},
        "refused": {"type": "str", "default": "stay", "choices": ["stay", "tail"],
                    "doc": "where a refused request goes: its place, or the queue's tail"},
        "speed_limit_tok_s": {"type": "float", "default": 0.0, "lo": 0.0,
                              "doc": "demote a request needing more than this when tried "
                                     "(0 = demote when one request alone is too slow)"},
        "expiry_check_s": {"type": "float", "default": 0.0, "lo": 0.0,
                           "doc": "demote requests past their deadline every this many "
                                  "seconds (0 = at once)"},
        "load": {"type": "str", "default": "next", "choices": ["next", "doubled"],
                 "doc": "load the speed is predicted at: running + 1, or the authors' "
                        "code's 2 x high-priority running + 1"},
        "speed_curve": {"type": "str", "default": "profile",
                        "choices": ["profile", "authors_code", "authors_fit"],
                        "doc": "speed curve: the profile's, or the authors' coefficients"},
    },
    "bench": [{"name": "tuned-saber", "kind": "tuned",
               "config": {"queue_policy": "saber", "queue_options": {}}}],
}
