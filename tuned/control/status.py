"""The ``/decisions`` view (what `tuned status` prints): the current decision, the
recent ones, the knobs applied, the config in force, the last reload, telemetry."""

from __future__ import annotations

from typing import Any


def decisions_view(ctrl: Any, limit: int = 50) -> dict:
    """``ctrl`` is a :class:`tuned.control.controller.Controller`; ``limit`` recent decisions
    (0 to 200)."""
    obs = ctrl.last_observation
    limit = max(0, min(limit, 200))
    engine, cfg = ctrl.engine, ctrl.cfg
    running, waiting = engine.counts()
    gpu = None if ctrl.gpu is None else [g._asdict() for g in ctrl.gpu]
    recent = ctrl.recent
    return {
        "current": recent[-1] if recent else None,
        "recent": recent[-limit:] if limit else [],
        "applied": ctrl.slot.state(),
        "config": {"queue_policy": cfg.queue_policy, "profile": cfg.profile,
                   "tbt_sla_s": ctrl.sla.sla_s(cfg), "sla_source": ctrl.sla.source(cfg),
                   "derived_sla": ctrl.sla.derived,
                   "sla_statistic": cfg.sla_statistic,
                   "batch_policy": cfg.batch_policy,
                   "source_path": cfg.source_path,
                   "interval_s": cfg.interval_s,
                   "gpu_memory_floor": cfg.gpu_memory_floor},
        "last_reload": dict(ctrl.reloader.last),
        "telemetry": {"tbt_mean_s": obs.tbt_mean_s if obs else None,
                      "decode_batch_mean": obs.decode_batch_mean if obs else None,
                      "kv_usage": obs.kv_usage if obs else 0.0,
                      "kv_capacity_tokens": engine.kv_capacity_tokens,
                      "gpu": gpu, "gpu_free_fraction": obs.gpu_free_fraction if obs else None,
                      "running": running, "waiting": waiting},
        "engine": {"ceiling": engine.ceiling,
                   "max_num_batched_tokens": engine.max_num_batched_tokens,
                   "dp_rank": engine.dp_rank},
    }
