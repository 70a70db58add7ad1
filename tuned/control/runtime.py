"""The composition root: one validated :class:`~tuned.config.Config` in, a running
control core out (controller, knob slot, metrics, and optionally NVML, sd_notify
and the HTTP endpoint).

Both engines build their control core here and nowhere else: the vLLM adapter
with the production defaults (monotonic clock, NVML, the endpoint, sd_notify from
the environment `tuned serve` passes down), the simulator with its virtual clock
and none of the outside resources. Every outside resource is a parameter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from tuned.config import Config
from tuned.control.controller import Controller, EngineView
from tuned.core.knobs import KnobSlot
from tuned.core.queue_channel import QueueChannel
from tuned.control.metrics import Endpoint, Metrics

log = structlog.get_logger("tuned.engine")


@dataclass
class Runtime:
    """What an engine holds of the control core: the engine takes its knobs from
    ``slot`` and reads its queue's inputs from ``queue_channel`` (and leaves a queue
    switch there); it calls nothing on ``controller`` from its step path."""

    controller: Controller
    metrics: Metrics
    slot: KnobSlot
    queue_channel: QueueChannel
    endpoint: Endpoint | None = None
    nvml: Any = None

    def stop(self) -> None:
        self.controller.stop()
        if self.endpoint is not None:
            self.endpoint.stop()
        # NvmlSampler.stop() (nvmlShutdown); this asked for a `shutdown` method that the
        # sampler never had, so NVML was never shut down
        if self.nvml is not None and hasattr(self.nvml, "stop"):
            self.nvml.stop()


def build_runtime(cfg: Config, engine: EngineView, *,
                  clock: Callable[[], float] = time.monotonic,
                  wall: Callable[[], float] = time.time,
                  nvml: Any = None, notifier: Any = None,
                  serving: Callable[[], bool] = lambda: True,
                  endpoint: bool = False, steps_json: Callable[[int], dict] | None = None,
                  reload_token_sha256: str = "",
                  on_decision: Callable[[dict], None] | None = None) -> Runtime:
    """Build the controller (with its knob slot) and metrics for ``engine``; with
    ``endpoint`` also start the HTTP endpoint on ``cfg.metrics_host`` and
    ``cfg.metrics_port + engine.dp_rank`` (0 = any free port). Every series carries
    ``engine="<dp_rank>"``, as vLLM's own do. A port that cannot
    be bound is logged and the engine serves without the endpoint."""
    # labelled as vLLM labels its engines: the data-parallel rank
    metrics = Metrics(engine=str(engine.dp_rank))
    ctrl = Controller(cfg, engine, metrics, nvml=nvml, notifier=notifier, serving=serving,
                      clock=clock, wall=wall, on_decision=on_decision)
    rt = Runtime(ctrl, metrics, ctrl.slot, ctrl.queue_channel, nvml=nvml)
    if endpoint:
        port = cfg.metrics_port + engine.dp_rank if cfg.metrics_port else 0
        try:
            rt.endpoint = Endpoint(cfg.metrics_host, port, metrics,
                                   decisions=ctrl.decisions_json,
                                   steps=steps_json or (lambda since: {"samples": []}),
                                   reload=ctrl.reload, healthy=ctrl.healthy,
                                   admission=ctrl.admission_json,
                                   **({"reload_token_sha256": reload_token_sha256}
                                      if reload_token_sha256 else {})).start()
        except OSError as e:
            log.error("endpoint_failed", host=cfg.metrics_host, port=port, error=str(e),
                      message=(f"could not bind tuned's endpoint to {cfg.metrics_host}:{port} "
                               f"({e.strerror or e}): /metrics, /decisions (tuned status), "
                               "/steps and POST /reload (SIGHUP, systemctl reload) are off; "
                               "the engine keeps serving under the controller. Free the port "
                               "(or set metrics_port) and restart to get them back"),
                      off=["/metrics", "/decisions", "/steps", "/admission", "/healthz",
                           "POST /reload"])
    return rt


def production_runtime(cfg: Config, engine: EngineView, *, environ: Mapping[str, str],
                       serving: Callable[[], bool], steps_json: Callable[[int], dict],
                       reload_token_sha256: str = "") -> Runtime:
    """The vLLM adapter's runtime: NVML sampler, sd_notify from ``environ`` (EngineCore
    inherits NOTIFY_SOCKET / WATCHDOG_USEC from `tuned serve`), the endpoint."""
    from tuned.control import sdnotify
    from tuned.telemetry.nvml import NvmlSampler

    nvml = NvmlSampler()
    nvml.start()
    return build_runtime(cfg, engine, nvml=nvml, notifier=sdnotify.from_environ(environ),
                         serving=serving, endpoint=True, steps_json=steps_json,
                         reload_token_sha256=reload_token_sha256)
