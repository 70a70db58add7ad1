"""What the controller saw and decided, as Prometheus series (the metrics live in
:mod:`tuned.control.metrics`; this module only feeds them) and as log lines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from tuned.core import refusal

log = structlog.get_logger("tuned.controller")


class MetricsExport:
    """Feeds :class:`tuned.control.metrics.Metrics` from one controller's ticks."""

    def __init__(self, metrics: Any) -> None:
        self.m = metrics
        self._queue_last: dict = {}
        self._bound_last: dict = {}      # the queue's counts (wait bound, guard), not a policy's
        self._gpu_seen = False

    def steps(self, new_steps: Sequence) -> None:
        """Engine steps completed since the last tick."""
        m = self.m
        for s in new_steps:
            if s.num_decode:
                m.tbt.observe(s.step_s)
        m.steps.inc(len(new_steps))

    def finished(self, n: int) -> None:
        self.m.finished.inc(n)

    def gpu(self, samples: list | None) -> None:
        """NVML's devices; when NVML stops answering the series are withdrawn, not
        frozen at their last value."""
        m = self.m
        if samples is None and self._gpu_seen:
            m.gpu_used.clear()
            m.gpu_total.clear()
        self._gpu_seen = bool(samples)
        for g in samples or ():
            m.gpu_used.labels(str(g.index)).set(g.used_bytes)
            m.gpu_total.labels(str(g.index)).set(g.total_bytes)

    def engine(self, kv_usage: float) -> None:
        """The KV usage the controller read this tick (running and waiting counts are
        vLLM's own series: ``vllm:num_requests_running``, ``vllm:num_requests_waiting``)."""
        self.m.kv_usage.set(kv_usage)

    def queue(self, snap: dict | None) -> None:
        """Queue-policy counters as Prometheus counters (a policy switch restarts the
        policy's own counts; the exported totals keep growing)."""
        m = self.m
        if not snap:
            m.queue_policy.info({"policy": "fcfs", "queue": "vllm"})  # vLLM's own queue
            return
        pol = snap["policy"]
        last = self._queue_last if self._queue_last.get("policy") == pol else {}
        for key, counter in (("admitted", m.q_admitted), ("deferred", m.q_deferred),
                             ("demoted", m.q_demoted), ("prediction_count", m.pred_count)):
            delta = snap[key] - last.get(key, 0)
            if delta > 0:
                counter.labels(pol).inc(delta)
        queue_counts = [("aged", snap.get("aged", 0), m.q_aged),
                        ("newest_first", snap.get("newest_first", 0), m.q_newest),
                        ("refused", snap.get("refused", 0),
                         m.refused.labels(refusal.REASON_MAX_WAIT))]
        queue_counts += [(f"guard_held:{reason}", n, m.q_held.labels(reason))
                         for reason, n in (snap.get("guard_held") or {}).items()]
        for key, n, counter in queue_counts:
            delta = n - self._bound_last.get(key, 0)
            if delta > 0:
                counter.inc(delta)
            self._bound_last[key] = n
        m.q_bins.set(snap["bins_in_use"])
        m.q_buckets.set(snap["buckets_in_use"])
        m.pred_mae.set(snap["prediction_mae_tokens"])
        m.pred_bias.set(snap["prediction_mean_error_tokens"])
        m.queue_policy.info({"policy": pol, "queue": "tuned"})
        self._queue_last = dict(snap)

    def queue_switched(self, final: dict | None) -> None:
        """The engine is about to install another queue policy: export the outgoing
        policy's counts up to now, then start over."""
        if final:
            self.queue(final)
        self._queue_last = {}

    def tick(self, t0: float, t1: float, t2: float, t3: float) -> None:
        """One tick: its duration [t0, t3], and its phases observe [t0, t1], decide
        [t1, t2], act [t2, t3] in a histogram of their own (a sum over phases is then
        never a sum over ticks too)."""
        phase = self.m.tick_phase
        phase.labels("observe").observe(t1 - t0)
        phase.labels("decide").observe(t2 - t1)
        phase.labels("act").observe(t3 - t2)
        self.m.tick.observe(t3 - t0)

    def decision(self, dec: Any, old: Any, sla_s: float) -> None:
        """A decision was handed to the engine: its gauges and reason counter, and a
        line when the SLA turns infeasible or feasible again."""
        m = self.m
        m.target.set(dec.target)
        m.batch.set(dec.batch)
        m.lower.set(dec.lower)
        m.upper.set(dec.upper)
        if dec.b_mem is not None:
            m.b_mem.set(dec.b_mem)
        if dec.b_sla is not None:
            m.b_sla.set(dec.b_sla)
        m.decisions.labels(dec.reason).inc()
        setpoint = dec.inputs.get("sla_setpoint_s")
        if setpoint is not None:     # held to the SLA itself unless a margin is learnt
            m.sla_setpoint.set(setpoint)
            m.sla_margin.set(dec.inputs.get("sla_margin", 1.0))
        feasible = dec.inputs.get("sla_feasible")
        if feasible is not None:
            m.sla_feasible.set(1 if feasible else 0)
            was = old.inputs.get("sla_feasible") if old is not None else True
            if feasible != was:
                (log.warning if not feasible else log.info)(
                    "sla_infeasible" if not feasible else "sla_feasible_again",
                    sla_s=sla_s, why=dec.inputs.get("sla_infeasible_why"),
                    action="SLA bound set aside: memory bound and full token budget"
                    if not feasible else "SLA search resumes")

    def decision_recorded(self, dec: Any, old: Any) -> None:
        """After the decision joined the history: a line (and a count) when the cap or
        the token budget changed."""
        m = self.m
        if old is None or (old.cap, old.token_budget) != (dec.cap, dec.token_budget):
            m.decision_changes.inc()
            log.info("decision", old_cap=old.cap if old else None, new_cap=dec.cap,
                     old_token_budget=old.token_budget if old else None,
                     new_token_budget=dec.token_budget, target=dec.target, batch=dec.batch,
                     lower=dec.lower, upper=dec.upper, reason=dec.reason,
                     b_mem=dec.b_mem, b_sla=dec.b_sla, inputs=dec.inputs)
