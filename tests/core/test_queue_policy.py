"""What a queue policy reads about a request (``ReqInfo``)."""

from __future__ import annotations

import dataclasses

from tuned.core.queue_policy import ReqInfo


def test_with_progress_keeps_every_other_field():
    # with_progress builds the view field by field (the queue calls it at every
    # admission gate); a field added to ReqInfo must come through it unchanged
    info = ReqInfo("r1", 1.5, 100, 200, 150, output_tokens=3, started_s=2.0,
                   hint_output_tokens=120, deadline_s=9.0, priority=2, sla_class="gold")
    assert {f.name for f in dataclasses.fields(ReqInfo)} - {"output_tokens", "started_s"} \
        == {"request_id", "arrival_s", "prompt_tokens", "max_tokens", "predicted_output",
            "hint_output_tokens", "deadline_s", "priority", "sla_class"}
    assert info.with_progress(40, 3.5) == dataclasses.replace(info, output_tokens=40,
                                                              started_s=3.5)
    assert info.with_progress(40, None) == dataclasses.replace(info, output_tokens=40,
                                                               started_s=None)
