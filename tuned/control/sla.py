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
