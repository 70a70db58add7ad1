"""The queue channel: queue inputs down, a queue switch's counters up, beside a knob
slot that carries the knobs alone."""

from __future__ import annotations

from tuned.core.knobs import KnobSlot
from tuned.core.queue_channel import NO_SWITCH, QueueChannel, QueueInputs


def test_inputs_start_empty_and_a_publish_is_read_as_published():
    ch = QueueChannel()
    assert ch.inputs == QueueInputs(None, None, 0.0, 0.0, None)
    assert ch.inputs.guard == (None, 0.0, 0.0)
    qi = QueueInputs(len, "model", 0.05, 2.0, 4096)
    ch.publish(qi)
    assert ch.inputs is qi and ch.inputs.guard == ("model", 0.05, 2.0)


def test_a_switch_is_taken_once_and_a_none_snapshot_is_a_switch():
    ch = QueueChannel()
    assert ch.take_switch() is NO_SWITCH
    ch.switched({"policy": "mcsf", "admitted": 7})
    assert ch.take_switch() == {"policy": "mcsf", "admitted": 7}
    assert ch.take_switch() is NO_SWITCH
    ch.switched(None)                    # from the engine's own FCFS queue
    assert ch.take_switch() is None
    assert ch.take_switch() is NO_SWITCH


def test_the_knob_slot_carries_the_knobs_alone():
    slot = KnobSlot(8, 512, stale_after_s=1.0, fallback_cap=2, clock=lambda: 0.0)
    public = {n for n in dir(slot) if not n.startswith("_") and callable(getattr(slot, n))}
    assert public == {"configure", "offer", "mark_ok", "hold", "release", "clamp", "take",
                      "state", "clock"}
    assert not [n for n in vars(slot) if "queue" in n]
