"""Whether the cap binds, in words: what a decision says beside its reason.

A reason names the rule that set the cap (``sla_idle``, ``memory``, ``hold_no_queue``
...), not whether the cap is what holds requests back. Under a light load the cap is
far above the running count and moving it changes nothing; under prefill-heavy load
requests can wait while the cap has room, held by the token budget, the TPOT admission
guard, the queue policy or the KV cache. An operator reading ``/decisions`` or
``tuned status`` should not have to work that out from the counts.

:func:`cap_binding` reads the tick's counts against the cap the engine will apply
(after every wrapper) and the window's ``binding`` share (steps that ended with
requests waiting at a full cap), and returns two inputs for the decision:
``cap_binds`` (bool: requests wait, at a full cap now or over most of the window) and
``cap_note`` (a sentence). :func:`explained` adds them to a policy's decision, with the
first decision's reason from the policy's build.
"""

from __future__ import annotations

import dataclasses

from tuned.core.types import Decision, Observation


#: the share of the window's steps at a full cap with requests waiting from which the
#: cap counts as binding (:class:`tuned.policies.sla_bound.EvidenceSlaBound`'s ``bind_share``)
BIND_SHARE = 0.5


#: who held admissions, in words (:func:`tuned.core.admission.holds_between`'s reasons)
HELD_WORDS = {"tpot_guard": "the admission guard's TPOT check",
              "ttft_guard": "the admission guard's TTFT check",
              "queue_policy": "the queue policy"}


def held_by(held: tuple | None) -> str:
    """What held the waiting requests while the cap had room: the holds since the
    last tick, each with its count, and the token budget or the KV cache (which hold
    admissions uncounted) when none; every candidate when unknown (vLLM's own
    queue)."""
    if held is None:
        return "the token budget, the admission guard, the queue policy or the KV cache"
    if not held:
        return ("the token budget or the KV cache (tuned's queue held no admission since "
                "the last decision)")
    parts = [f"{HELD_WORDS.get(reason, reason)} ({n} hold{'s' if n != 1 else ''})"
             for reason, n in held]
    text = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return text + " since the last decision"


def cap_binding(obs: Observation, cap: int) -> dict:
    """``{"cap_binds": bool, "cap_note": str}`` for a decision applying ``cap``.

    The counts are a snapshot between two engine steps: a request that just finished
    leaves the running count one under a small cap while many wait, and the next step
    admits one. So requests waiting under the cap count as held by the cap when the
    window says it was full with requests waiting on at least :data:`BIND_SHARE` of
    its steps."""
    r, w = obs.num_running, obs.num_waiting
    share = f"full with requests waiting on {obs.binding:.0%} of the window's steps"
    if obs.waits_at_full(cap) or (w > 0 and obs.binding >= BIND_SHARE):
        where = "at" if r >= cap else "under"
        return {"cap_binds": True,
                "cap_note": f"the cap binds: {r} running {where} cap {cap}, {w} waiting "
                            f"({share})"}
    if r >= cap:
        note = f"the cap does not bind: {r} running at cap {cap}, nothing waiting"
    elif w > 0:
        note = (f"the cap does not bind: {r} running under cap {cap} while {w} "
                f"wait, held by {held_by(obs.held)}, not by the cap")
    else:
        note = f"the cap does not bind: {r} running under cap {cap}, nothing waiting"
    return {"cap_binds": False, "cap_note": f"{note} ({share})"}


def explained(dec: object, obs: Observation, first_reason: str | None = None) -> object:
    """A policy's decision as the operator reads it: with :func:`cap_binding`'s two
    inputs, and, for the first decision (``first_reason`` given) that says only
    ``initial``, the reason its policy's build names (e.g. ``profile_initial``).
    Anything but a Decision with an integer cap is returned as it is (the controller
    counts it a fault)."""
    if not isinstance(dec, Decision) or type(dec.cap) is not int:
        return dec
    if first_reason and dec.reason == "initial":
        dec = dataclasses.replace(dec, reason=first_reason)
    # whether the cap the engine applies binds, in words (reasons name the rule)
    return dataclasses.replace(dec, inputs={**(dec.inputs or {}), **cap_binding(obs, dec.cap)})


__all__ = ["HELD_WORDS", "cap_binding", "explained", "held_by"]
