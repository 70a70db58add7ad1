"""Pang et al.'s Algorithm 2, SLA-constrained dynamic batching (Pang, Li, Wang:
*Optimizing LLM Inference Throughput via Memory-aware and SLA-constrained Dynamic
Batching*): a binary search that holds the decode step time to the SLA
(:class:`SlaBound`, the paper's rule), tuned's evidence-based search over it
(:class:`EvidenceSlaBound`, with a learnt attainment margin), the feasibility check
that sets an SLA aside when even ``b_min`` misses it, and the cap a late queue lifts
to. :class:`tuned.policies.batch.BatchPolicy` combines it with the memory bound
(:mod:`tuned.policies.memory_bound`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuned.core.types import Observation, StepModel
from tuned.curves.online import provisional
from tuned.policies.catalog import SLA_STATISTICS


class SlaBound:
    """Pang et al., Algorithm 2: SLA-constrained dynamic batching (TBT binary search).

    Keeps a search interval [b_low, b_high] within [B_min, B_max]. Each tick, with
    T the recent mean decode latency and b-bar the recent mean decode batch:
      T > D_SLA + eps_D:  b_high <- max(b-bar, b_low + alpha); b_low <- max(b_low - delta, B_min)
      T < D_SLA - eps_D:  b_low <- min(b-bar, b_high - alpha); b_high <- min(b_high + delta, B_max)
      otherwise:          b_high <- min(b-bar + ceil(alpha/2), B_max); b_low <- max(b-bar - floor(alpha/2), B_min)
      b_t = floor((b_low + b_high) / 2)
    Line 15's b_t = min(max(b_t, N^d), B_max) is applied by :class:`BatchPolicy` to
    the reported batch size, not to the admission gate (module docstring). b-bar is
    rounded to the nearest integer (the paper treats it as one). The paper
    leaves implicit that the interval stays inside [B_min, B_max] and ordered; we
    clamp both ends so, which changes nothing when the paper's updates already hold.
    With no decode step in the window (idle engine), or a non-finite T or b-bar, the
    interval is kept (reason ``initial``).
    """

    def __init__(self, sla_s: float, eps_s: float, alpha: int, delta: int,
                 b_min: int, b_max: int):
        self.sla_s = sla_s
        self.eps_s = eps_s
        self.alpha = alpha
        self.delta = delta
        self.b_min = b_min
        self.b_max = b_max
        self.low = b_min
        self.high = b_max
        self.statistic = "mean"     # the paper holds the mean decode step to D_SLA
        self.margin: AttainmentMargin | None = None   # a learnt margin (attainment)

    @property
    def held(self) -> str:
        """The statistic held this tick (the decision's ``sla_statistic``)."""
        return self.statistic

    @property
    def setpoint_s(self) -> float:
        """What the measured statistic is held to: D_SLA, or the learnt margin x D_SLA."""
        return self.margin.setpoint_s if self.margin is not None else self.sla_s

    def warm_start(self, b: int) -> None:
        """Centre the interval on a prediction (e.g. a profile's b for the SLA)."""
        b = min(max(b, self.b_min), self.b_max)
        self.low = self.high = b

    def update(self, obs: Observation) -> tuple[int, str]:
        t, bbar = obs.tbt_mean_s, obs.decode_batch_mean
        # a NaN or infinite mean (a broken clock, an empty window divided) is no
        # measurement: keep the interval, as with an idle engine
        if t is None or bbar is None or not (math.isfinite(t) and math.isfinite(bbar)):
            reason = "initial"
        else:
            bb = int(math.floor(bbar + 0.5))
            if t > self.sla_s + self.eps_s:
                reason = self._fall(bb)
            elif t < self.sla_s - self.eps_s:
                self.low = min(bb, self.high - self.alpha)
                self.high = min(self.high + self.delta, self.b_max)
                reason = "sla_under"
            else:
                reason = self._narrow(bb)
        return self._midpoint(), reason

    # the paper's branches, shared with EvidenceSlaBound
    def _fall(self, bb: int) -> str:
        self.high = max(bb, self.low + self.alpha)
        self.low = max(self.low - self.delta, self.b_min)
        return "sla_over"

    def _hold_interval(self, bb: int) -> tuple[int, int]:
        """The paper's hold interval around b-bar: [b-bar - floor(alpha/2),
        b-bar + ceil(alpha/2)], unclamped."""
        return bb - self.alpha // 2, bb + math.ceil(self.alpha / 2)

    def _narrow(self, bb: int) -> str:
        low, high = self._hold_interval(bb)
        self.high = min(high, self.b_max)
        self.low = max(low, self.b_min)
        return "sla_hold"

    def _midpoint(self) -> int:
        """Clamp the interval into [B_min, B_max], ordered; its midpoint b_t."""
        self.low = min(max(self.low, self.b_min), self.b_max)
        self.high = min(max(self.high, self.low), self.b_max)
        return (self.low + self.high) // 2


#: the margin's change per finished request, as a share of the SLA: a request over the
#: SLO lowers it by this times the target, one within raises it by this times the rest
ATTAINMENT_STEP = 0.01
#: the margin's range: never above the SLO itself (then it is the mean's setpoint),
#: never below half of it
ATTAINMENT_MARGIN_RANGE = (0.5, 1.0)
#: finished requests the decision's share within the SLO is reported over
ATTAINMENT_RECENT = 100


class AttainmentMargin:
    """The margin m below the TPOT SLO at which the SLA search holds the mean decode
    step (``sla_statistic = "attainment"``): the setpoint is m x D_SLA, with m learnt
    online from finished requests' TPOT against D_SLA.

    The SLO judges each request's TPOT, and a request's TPOT is about the mean of the
    steps it decoded in; holding the mean step at D_SLA leaves about half the
    requests just over it. Each finished request's TPOT t moves m by a stochastic
    approximation of a quantile (Robbins-Monro):

        m <- m - step * (1[t > D_SLA] - (1 - q))

    with q the target share within the SLO (``sla_attainment_target``): a request
    over the SLO lowers m by step * q, one within raises it by step * (1 - q), so m
    settles where the share over is 1 - q. m stays in ``[lo, hi]``; ``hi`` = 1 makes
    the setpoint never looser than the mean's. Whatever spreads requests' TPOT around
    the mean step (prefill chunks beside them, the engine's time between steps that
    the step ring does not see, a host that drifts) is in what it learns from.

    It learns only from requests that decoded mostly at a binding cap (the
    controller filters :attr:`Observation.finished_tpot_s` so): under a cap that does
    not bind the batch is the offered load, or that of a cap the search has since
    left, and a request's TPOT says nothing of the setpoint (under a light load every
    request is within, and m would climb on no evidence; after a burst every request
    that decoded before the cap fell is over, and m would fall for the search's
    transient, not its setpoint).
    """

    def __init__(self, sla_s: float, target: float, *, step: float = ATTAINMENT_STEP,
                 lo: float = ATTAINMENT_MARGIN_RANGE[0],
                 hi: float = ATTAINMENT_MARGIN_RANGE[1]) -> None:
        if not 0.0 < target < 1.0:
            raise ValueError(f"target: must be in (0, 1), got {target!r}")
        if not 0.0 < lo <= hi:
            raise ValueError(f"margin range: must be 0 < lo <= hi, got [{lo!r}, {hi!r}]")
        self.sla_s, self.target, self.step, self.lo, self.hi = sla_s, target, step, lo, hi
        self.margin = hi
        self.learnt = 0                  # finished requests it has learnt from
        self._recent: list[bool] = []    # the last ATTAINMENT_RECENT outcomes (True: within)

    @property
    def setpoint_s(self) -> float:
        return self.margin * self.sla_s

    def learn(self, tpots: Sequence[float]) -> None:
        """Each finished request's TPOT, in order; non-finite ones are skipped."""
        m = self.margin
        for t in tpots:
            if not math.isfinite(t):
                continue
            over = t > self.sla_s
            m = min(max(m - self.step * ((1.0 if over else 0.0) - (1.0 - self.target)),
                        self.lo), self.hi)
            self.learnt += 1
            self._recent.append(not over)
        del self._recent[:-ATTAINMENT_RECENT]
        self.margin = m

    def inputs(self) -> dict:
        """What the decision says of it."""
        r = self._recent
        return {"sla_margin": round(self.margin, 4),
                "sla_attainment_target": self.target,
                "tpot_within_share": round(sum(r) / len(r), 4) if r else None,
                "tpot_samples": self.learnt}


class EvidenceSlaBound(SlaBound):
    """Algorithm 2 where its assumptions hold in a continuous-batching engine
    (``sla_mode = "evidence"``, the default; ``"paper"`` is :class:`SlaBound`).

    The paper reads the mean decode batch b-bar as the batch the system would run:
    true in its offline setting, where requests always wait. Under continuous
    batching b-bar is the *offered load* whenever nothing waits, so narrowing the
    interval around it (the hold branch) or raising the low end to it (the under
    branch) drags the cap down to the load of a quiet moment, from where it climbs
    back by delta per tick when the load returns. Here the interval moves only on
    evidence:

    * over the SLA (T > D_SLA + eps_D): the high end falls as in the paper, unless
      the decode-only steps meet the SLA (T_decode <= D_SLA - eps_D; measured, or
      predicted by the online step model when every step carried prefill) and the
      token budget is controlled: then prefill chunks, not the batch, caused the
      violation and the token budget is the knob (reason ``sla_over_prefill``,
      interval kept). ``budget_controlled`` is set by :class:`BatchPolicy` each tick
      from what its :class:`~tuned.policies.budget.TokenBudget` wrapper says:
      off where no chunk size can hold the SLA (a CPU host), since the budget is the
      full one there and acts on nothing, so the cap falls: fewer prompts per step,
      fewer decodes exposed to each prefill;
    * a fall from a cap that was not binding halves it (high <- max(b-bar, low +
      alpha, cap / 2)) rather than dropping the high end to b-bar: with nothing
      waiting at the cap b-bar is the offered load, not what the engine can run (the
      argument of the next point), and a window that long prompts pushed over the SLA
      at three decodes would set a cap of 16 to 2, where requests then queue past
      their TTFT while the search climbs back;
    * a fall that prefill caused where the budget could not act (the decode-only
      steps met the SLA, as for ``sla_over_prefill``) is undone once the prefill has
      left the window: when what prefill added to the mean step (the window's mean
      step less its decode-only mean) is at most half what it added at the fall, and
      T is under the SLA, the interval goes back to what it was before the fall
      (reason ``sla_restore``). The fall answered a load of long prompts, not the
      decodes; without the undo the cap stays where the prompts left it, and the
      chat load that follows them queues while the search climbs back by a quarter
      per binding tick. A fall the decodes caused drops the undo;
    * after a fall, ``settle_ticks`` ticks pass before the next one (reason
      ``sla_over_settling``, interval kept): the window still holds the steps that
      caused the fall, and a tick every ``interval_s`` over a ``tbt_window_s``
      window would otherwise answer one slow window several times over (the
      registry sets it to the window's length in ticks, less the tick of the fall);
    * under or within the SLA: the paper's update only on ticks where the cap was
      binding (requests waited while the cap was full for at least ``bind_share``
      of the window's steps, or wait at a full cap now); otherwise the interval is
      kept (``sla_idle``); the under branch raises the low end to b-bar, never
      lowers it;
    * under the SLA while binding, once the low end has reached the top of the
      interval (high - low <= 2 alpha + 1), the high end grows by max(delta, high / 4)
      (``sla_expand``) instead of delta: the paper's delta = 1 per tick is a noise
      correction, too slow to follow a load that doubled.

    ``statistic`` picks T: the mean step time of decode steps (the paper's), their
    90th percentile (``p90``), which holds most requests' TPOT, not only the average,
    the mean held to a margin below D_SLA learnt from finished requests' TPOT
    (``attainment``, :class:`AttainmentMargin`, aiming at ``attainment_target`` of
    them within the SLO), or ``decode_p90``: the 90th percentile of the decode steps
    that carried no prefill plus the window's mean step less their mean (what prefill
    added per step). Where a prefilling step takes several decode steps' time (a CPU
    host), the plain p90 reads a prefill step once more than a tenth of the steps
    prefill and the cap swings; a request's TPOT spreads the prefill over its steps,
    as ``decode_p90`` does. With ``decode_p90`` the decode-only steps' p90 (not their
    mean) also decides whether prefill caused a violation. ``auto`` (the default) is
    ``p90`` on ticks where the token budget acts and ``decode_p90`` where it does not
    (:attr:`held`, in the decision's ``sla_statistic``). The SLA itself stays what
    feasibility is judged against.
    The warm start seeds the midpoint and keeps an interval of width max(alpha, b)
    around it, so a wrong prediction is corrected by bisection, not by delta per tick.
    """

    def __init__(self, sla_s: float, eps_s: float, alpha: int, delta: int, b_min: int,
                 b_max: int, *, statistic: str = "mean", bind_share: float = 0.5,
                 budget_controlled: bool = True, settle_ticks: int = 0,
                 attainment_target: float = 0.9) -> None:
        super().__init__(sla_s, eps_s, alpha, delta, b_min, b_max)
        if statistic not in SLA_STATISTICS:
            raise ValueError(f"statistic: must be one of {', '.join(SLA_STATISTICS)}, "
                             f"got {statistic!r}")
        if settle_ticks < 0:
            raise ValueError(f"settle_ticks: must be >= 0, got {settle_ticks!r}")
        self.statistic = statistic
        self.bind_share = bind_share
        self.budget_controlled = budget_controlled
        self.settle_ticks = settle_ticks
        self.settling = 0       # ticks left before another fall may follow the last one
        # the interval before a prefill-caused fall, and what prefill added to the mean
        # step then (sla_restore), or None
        self.undo: tuple[int, int, float] | None = None
        self.margin = (AttainmentMargin(sla_s, attainment_target)
                       if statistic == "attainment" else None)

    def warm_start(self, b: int) -> None:
        b = min(max(b, self.b_min), self.b_max)
        w = max(self.alpha, b // 2)
        self.low = max(self.b_min, b - w)
        self.high = min(self.b_max, b + w)

    @property
    def held(self) -> str:
        """The statistic held this tick: ``auto`` is ``p90`` while the token budget
        sizes prefill chunks for the SLA (a prefilling step is then within it, and the
        p90 may read one) and ``decode_p90`` while it does not (the full budget on a
        line, a CPU host: a prefilling step is several decode steps' time, which a
        request's TPOT spreads over its steps and the p90 reads whole once a tenth of
        the steps prefill)."""
        if self.statistic == "auto":
            return "p90" if self.budget_controlled else "decode_p90"
        return self.statistic

    def measured(self, obs: Observation) -> float | None:
        held = self.held
        if held == "decode_p90" and obs.decode_only_p90_s is not None \
                and obs.decode_only_tbt_s is not None and obs.tbt_mean_s is not None:
            t = obs.decode_only_p90_s + obs.tbt_mean_s - obs.decode_only_tbt_s
        else:
            t = obs.tbt_p90_s if held == "p90" else obs.tbt_mean_s
        return t if t is not None and math.isfinite(t) else None

    def learn_lifted(self, obs: Observation) -> None:
        """While a late queue holds the cap lifted (and until the window has turned
        over), the search does not answer the window, but it keeps what the window
        proves: the lifted batch ran at b-bar and took T. Within the setpoint, b-bar
        holds the SLA, so the low end rises to it (and the high end stays above it by
        alpha); inside the band (within eps_D of the setpoint) the interval rises to
        the paper's hold interval around b-bar. Only upward: the drain after a lift
        (b-bar falling to the old cap) cannot drag the interval down, and a window
        over the SLA is left to the search once the hold ends (the paper's fall to
        b-bar from a lifted window halves the cap while the queue is late: on the
        simulator's h100-llama2-70b Azure row it took the cap from the memory bound's
        290 to 21). Without this the search comes back from every lift to the
        interval it had before it, the queue is late again within a second and the
        cap cycles between the two."""
        t, bbar = self.measured(obs), obs.decode_batch_mean
        if t is None or bbar is None or not math.isfinite(bbar):
            return
        bb = min(max(int(math.floor(bbar + 0.5)), self.b_min), self.b_max)
        setpoint = self.setpoint_s
        if t <= setpoint + self.eps_s:
            # within: b-bar holds the SLA (the paper's under branch, low <- b-bar); in
            # the band: b-bar is at it (its hold branch, the interval around b-bar)
            low, high = ((bb, bb + self.alpha) if t < setpoint - self.eps_s
                         else self._hold_interval(bb))
            if low > self.low:
                self.low = low
                self.high = max(self.high, high)
        self._midpoint()

    def update(self, obs: Observation) -> tuple[int, str]:
        # binding over the window, or now: requests wait at a full cap (a queue that
        # formed since the last tick reaches bind_share of the window's steps only a
        # window later, and the decision already says the cap binds)
        cap = (self.low + self.high) // 2     # the cap the search set last tick
        binding = obs.binding >= self.bind_share or obs.waits_at_full(cap)
        if self.margin is not None:
            self.margin.learn(obs.finished_tpot_s)
        t, bbar = self.measured(obs), obs.decode_batch_mean
        if t is None or bbar is None or not math.isfinite(bbar):
            return cap, "initial"
        bb = int(math.floor(bbar + 0.5))
        setpoint = self.setpoint_s
        settling, self.settling = self.settling, max(self.settling - 1, 0)
        added = _prefill_added(obs)
        if (self.undo is not None and not settling and t < setpoint - self.eps_s
                and added is not None and added <= self.undo[2] / 2):
            # the prompts that caused the fall have left the window: undo it, up to
            # the batch the online step model puts within the setpoint (at the
            # window's measured excess over it): a high end the search never tested
            # (the first interval's b_max, carried from restore to restore) is not
            # evidence, and back there the memory bound sets the cap while the
            # running requests grow past the SLO for a window before the next fall
            # (without a model lift_target is b_max: the interval before the fall)
            high = min(self.undo[1], lift_target(obs, obs.step_model, setpoint, self.b_max))
            self.high = max(self.high, high)
            self.low = min(max(self.low, self.undo[0]), self.high)
            self.undo = None
            return self._midpoint(), "sla_restore"
        if t > setpoint + self.eps_s:
            dec = obs.decode_only_tbt_s
            if self.held == "decode_p90" and obs.decode_only_p90_s is not None:
                dec = obs.decode_only_p90_s
            if dec is None and obs.step_model is not None:
                # every step carried prefill: what would the decodes alone take?
                dec = obs.step_model.predict_step_s(bbar, 0.0, obs.kv_tokens_resident)
            prefill_caused = dec is not None and dec <= setpoint - self.eps_s
            if self.budget_controlled and prefill_caused:
                reason = "sla_over_prefill"
            elif settling:
                reason = "sla_over_settling"
            else:
                if not prefill_caused:
                    self.undo = None
                else:
                    # every step prefilled (no decode-only mean): against the decodes'
                    # predicted step
                    was = added if added is not None else max(t - dec, 0.0)
                    # a second fall in the same episode undoes to before the first
                    self.undo = ((self.low, self.high, was) if self.undo is None
                                 else (*self.undo[:2], max(self.undo[2], was)))
                if binding:
                    reason = self._fall(bb)
                else:   # b-bar is the offered load: halve the cap instead
                    reason = self._fall(max(bb, cap // 2))
                self.settling = self.settle_ticks
        elif not binding:
            reason = "sla_idle"
        elif t < setpoint - self.eps_s:
            # b-bar held the SLA; a low end already above it stays (binding only now,
            # b-bar is the window's mean over steps before the queue formed)
            self.low = max(self.low, min(bb, self.high - self.alpha))
            if self.high - self.low <= 2 * self.alpha + 1:
                self.high = min(self.high + max(self.delta, math.ceil(self.high / 4)),
                                self.b_max)
                reason = "sla_expand"
            else:
                self.high = min(self.high + self.delta, self.b_max)
                reason = "sla_under"
        else:
            reason = self._narrow(bb)
        return self._midpoint(), reason


def _prefill_added(obs: Observation) -> float | None:
    """What prefill added to the window's mean step: its mean step less the mean of
    its decode-only steps (None without both)."""
    if obs.tbt_mean_s is None or obs.decode_only_tbt_s is None:
        return None
    added = obs.tbt_mean_s - obs.decode_only_tbt_s
    return max(added, 0.0) if math.isfinite(added) else None


class Feasibility:
    """Is the TBT SLA reachable at all? (``tuned_sla_feasible``, reason
    ``sla_infeasible``.)

    Infeasible when the step model (online fit, else the profile; not a provisional
    first fit from a few steps) predicts that even b_min decodes with no prefill
    exceed D_SLA at the current context, or when the
    decode-only steps measured at the lowest batches tried (b-bar <= b_min + alpha),
    brought down to b_min (x T(b_min) / T(b-bar) on the step model, x b_min / b-bar,
    a lower bound, without one), exceed D_SLA + eps_D on ``patience`` consecutive
    ticks (the controller's: more than one TBT window's worth of ticks,
    :func:`tuned.control.controller.feasibility_patience`, so that one slow window read by
    several ticks is not enough). An infeasible SLA is reported, not obeyed into the
    ground: the SLA bound steps aside (the memory bound decides, the token budget is
    the full one), which maximises throughput where no request can meet its TPOT
    anyway. Feasible again once the model predicts b_min within D_SLA - eps_D.
    """

    def __init__(self, sla_s: float, eps_s: float, b_min: int, alpha: int,
                 patience: int = 3) -> None:
        self.sla_s, self.eps_s, self.b_min, self.alpha = sla_s, eps_s, b_min, alpha
        self.patience = patience
        self.feasible = True
        self._strikes = 0
        self.why = ""

    def update(self, obs: Observation, model) -> bool:
        kv_seq = obs.kv_tokens_resident / obs.num_running if obs.num_running else 0.0
        t_min = (model.predict_step_s(self.b_min, 0.0, self.b_min * kv_seq)
                 if model is not None else None)
        dec, bbar = obs.decode_only_tbt_s, obs.decode_batch_mean
        low = dec is not None and bbar is not None and bbar <= self.b_min + self.alpha
        if low and bbar > self.b_min:
            # the step measured at b-bar, brought down to b_min: along the model's shape
            # (the measurement carries the host's speed, the model only the ratio), or
            # without a model by b_min / b-bar, a lower bound (a step's fixed cost does
            # not shrink with the batch). An SLA that binds at batch 3 on a host 10 %
            # slower than its profile is missed at b-bar = 2.8 and still met at b_min:
            # judged at b-bar it was set aside and the cap went to the memory bound
            t_bbar = (model.predict_step_s(bbar, 0.0, bbar * kv_seq)
                      if model is not None else 0.0)
            dec *= t_min / t_bbar if t_bbar > 0 else self.b_min / bbar
        if low and dec > self.sla_s + self.eps_s:
            self._strikes += 1
        elif low:
            self._strikes = 0
        if self.feasible:
            if t_min is not None and t_min > self.sla_s and not provisional(model):
                self.feasible = False
                self.why = (f"predicted step at b_min={self.b_min} without prefill is "
                            f"{t_min * 1e3:.1f} ms > SLA {self.sla_s * 1e3:.1f} ms")
            elif self._strikes >= self.patience:
                self.feasible = False
                self._strikes = 0
                self.why = (f"measured decode steps at batch {bbar:.1f} take "
                            f"{obs.decode_only_tbt_s * 1e3:.1f} ms, "
                            f"{dec * 1e3:.1f} ms at b_min={self.b_min} > "
                            f"SLA {self.sla_s * 1e3:.1f} ms")
        elif t_min is not None and t_min < self.sla_s - self.eps_s and self._strikes == 0:
            self.feasible = True
            self.why = ""
        return self.feasible


def lift_target(obs: Observation, model: StepModel | None, sla_s: float, b_mem: int) -> int:
    """The cap a late queue lifts to with ``late_queue = "lift_tpot"`` (what auto is
    without a refusing wait bound):
    the largest batch whose mean step the step model puts within the TPOT SLO, at the
    running requests' context and with the window's measured excess over the model's
    decode-only step (the prefill the steps carried, a host slower than the fit) taken
    off the SLO; never above the memory bound. :class:`EvidenceSlaBound` also stops a
    restore here, at its setpoint and with ``b_max`` for the memory bound.

    A request whose first token is already late is lost to goodput whatever the cap;
    lifting past this batch to drain the queue faster makes every request decoding
    meanwhile miss its TPOT as well. Up to it the queue drains as fast as the running
    requests' TPOT allows, so slower than at the memory bound (``lift``): the TTFT
    tail and the throughput may pay. It is the default because on the real engine's
    three-phase load its margin over the best static cap stood above the host's
    noise, and the simulator's rows do not move with it. Without a model
    or a measured window the lift is to the memory bound, as with ``lift``."""
    if (model is None or obs.tbt_mean_s is None
            or obs.decode_batch_mean is None or not math.isfinite(obs.tbt_mean_s)
            or not math.isfinite(obs.decode_batch_mean)):
        return b_mem
    # nothing running now (the window's steps ran before it emptied): no context
    kv_seq = obs.kv_tokens_resident / obs.num_running if obs.num_running else 0.0
    bbar = max(obs.decode_batch_mean, 1.0)
    excess = max(obs.tbt_mean_s - model.predict_step_s(bbar, 0.0, bbar * kv_seq), 0.0)
    return min(max(model.largest_batch_within(sla_s - excess, b_mem, kv_seq), 1), b_mem)
