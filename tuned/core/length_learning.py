"""Output-length learning for the waiting queue: the queue's collaborator that reads a
request's client hints, predicts its output length, re-predicts when the policy plans
with another over-estimate, and learns from the requests that end normally.

The model itself is :class:`tuned.core.predictor.OutputLengthPredictor`; this class is
what the queue (:class:`tuned.core.queue.QueueCore`) asks of it, so that the queue
keeps to ordering and admission.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from tuned.core.predictor import OutputLengthPredictor, RequestHints, parse_request_hints
from tuned.core.queue_policy import ReqInfo


class LengthLearning:
    """``predictor`` (a fresh one by default) supplies the predictions;
    ``class_deadlines_s`` is the SLA table for the ``tuned_class`` hint;
    ``on_warning(request_id, text)`` receives each ignored hint (also counted in
    ``hint_warnings``)."""

    def __init__(self, predictor: OutputLengthPredictor | None = None,
                 class_deadlines_s: Mapping[str, float] | None = None,
                 on_warning: Callable[[str, str], None] | None = None) -> None:
        self.predictor = predictor if predictor is not None else OutputLengthPredictor()
        self.class_deadlines_s = dict(class_deadlines_s or {})
        self._on_warning = on_warning
        self.hint_warnings = 0

    def predict(self, request_id: str, extra_args: Mapping[str, Any] | None,
                prompt_tokens: int, max_tokens: int,
                overestimate: bool) -> tuple[RequestHints, int]:
        """A new request's hints (each malformed one reported) and its predicted
        output length, as a policy planning with ``overestimate`` wants it."""
        hints, warnings = parse_request_hints(extra_args, self.class_deadlines_s)
        for w in warnings:
            self.hint_warnings += 1
            if self._on_warning is not None:
                self._on_warning(request_id, w)
        pred = self.predictor.predict(prompt_tokens, max_tokens, hints.output_tokens,
                                      overestimate=overestimate, sla_class=hints.sla_class)
        return hints, pred

    def repredict(self, info: ReqInfo, overestimate: bool) -> ReqInfo:
        """``info`` predicted again, for a policy planning with ``overestimate``."""
        pred = self.predictor.predict(info.prompt_tokens, info.max_tokens,
                                      info.hint_output_tokens, overestimate=overestimate,
                                      sla_class=info.sla_class)
        return dataclasses.replace(info, predicted_output=pred)

    def learn(self, prompt_tokens: int, output_tokens: int, info: ReqInfo | None) -> None:
        """A request ended normally: its output length is a true sample."""
        self.predictor.observe(prompt_tokens, output_tokens,
                               predicted=info.predicted_output if info else None,
                               max_tokens=info.max_tokens if info else None,
                               sla_class=info.sla_class if info else None)

    @property
    def under_excess(self) -> float:
        """The measured under-prediction (MC-SF's reserve alpha); 0 without one."""
        return self.predictor.under_excess

    def prediction_stats(self) -> dict[str, Any]:
        """The prediction errors, for the queue's snapshot."""
        errs = self.predictor.error_stats()
        return {"prediction_count": errs.count,
                "prediction_mae_tokens": errs.mean_abs_error_tokens,
                "prediction_mean_error_tokens": errs.mean_error_tokens}
