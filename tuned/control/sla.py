"""The TBT SLA in force: the config's, or one derived on this host (``tbt_sla_auto``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import structlog

log = structlog.get_logger("tuned.controller")


def sla_from_step(factor: float, step_s: float) -> float:
    """``tbt_sla_auto``'s SLA: ``factor`` x the decode step at batch 1, to 0.1 ms."""
    return round(factor * step_s, 4)


#: how far above one decode beside the smallest prefill chunk a derived SLA must sit
#: (:func:`sla_fitting_chunk`)
CHUNK_HEADROOM = 1.2


def sla_fitting_chunk(sla_s: float, fit: dict, chunk_tokens: int,
                      headroom: float = CHUNK_HEADROOM) -> float:
    """``sla_s``, raised where needed to ``headroom`` x the step that one decode
    beside a ``chunk_tokens`` prefill chunk takes on ``fit`` (a + beta + gamma
    chunk_tokens, keys of :func:`tuned.bench.live.burst_step_fit`), to 0.1 ms.

    Below that step no chunk size holds the SLA: every step that prefills misses it,
    the token budget cannot act (``TokenBudget`` sets it aside), and each request
    that shares a step with a prompt misses its TPOT whatever the cap. That is where
    a prompt token costs several decodes' time (a CPU host without matrix units); a
    multiple of the batch-1 step lands there on some hosts and not on others. The
    headroom leaves a few decodes beside the chunk and a host that runs slower than
    the fit. ``sla_s`` unchanged without a fit."""
    try:
        a, beta, gamma = (float(fit[k]) for k in ("a", "beta", "gamma"))
    except (KeyError, TypeError, ValueError):
        return sla_s
    step = a + beta + gamma * chunk_tokens
    if not (math.isfinite(step) and step > 0):
        return sla_s
    return max(sla_s, round(headroom * step, 4))


class SlaSource:
    """``tbt_sla_auto``: once the online step fit exists, the SLA is fixed at
    ``tbt_sla_auto`` x the predicted decode step at batch 1 (no prefill, the running
    requests' mean context); until then, and whenever the config sets ``tbt_sla_s``,
    the config's value is in force."""

    def __init__(self) -> None:
        self.derived: dict | None = None   # None until derived

    def sla_s(self, cfg: Any) -> float:
        if cfg.tbt_sla_s:
            return cfg.tbt_sla_s
        return self.derived["sla_s"] if self.derived else 0.0

    def source(self, cfg: Any) -> str:
        if cfg.tbt_sla_s:
            return "config"
        if cfg.tbt_sla_auto:
            return "derived" if self.derived else "pending"
        return "none"

    def effective(self, cfg: Any) -> Any:
        """``cfg`` with the derived SLA filled in (tbt_sla_auto on, tbt_sla_s = 0)."""
        if cfg.tbt_sla_s or not cfg.tbt_sla_auto or not self.derived:
            return cfg
        sla = self.derived["sla_s"]
        return dataclasses.replace(cfg, tbt_sla_s=sla, eps_d_s=min(cfg.eps_d_s, sla / 10))

    def derive(self, cfg: Any, fit: Any, kv_tokens_resident: int, num_running: int) -> bool:
        """Derive the SLA from ``fit`` when it is due; True when it was derived now (the
        caller rebuilds its policies with :meth:`effective`)."""
        if self.derived or not cfg.tbt_sla_auto or cfg.tbt_sla_s or fit is None:
            return False
        kv_seq = kv_tokens_resident / num_running if num_running else 0.0
        t1 = fit.predict_step_s(1, 0.0, kv_seq)
        if not (math.isfinite(t1) and t1 > 0):
            return False
        sla = sla_from_step(cfg.tbt_sla_auto, t1)
        self.derived = {"sla_s": sla, "step_s_batch1": t1, "factor": cfg.tbt_sla_auto,
                        "fit": fit.to_dict()}
        log.info("sla_derived", sla_s=sla, step_s_batch1=round(t1, 5),
                 factor=cfg.tbt_sla_auto, fit_samples=fit.n_samples,
                 note="tbt_sla_auto: the TBT SLA follows this host's measured speed")
        return True
