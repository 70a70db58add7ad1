"""The controller's collaborators, each one job (STYLE.md: VPA's recommender keeps
observe, decide and act apart): live reload (:mod:`.reload`), Prometheus export
(:mod:`.export`), engine liveness and sd_notify (:mod:`.liveness`), the derived TBT
SLA (:mod:`.sla`) and the ``/decisions`` view (:mod:`.status`).
:class:`tuned.control.controller.Controller` runs the loop and composes them."""
