"""The registry of queue policies: name -> class, built on demand.

The interface every policy implements (:class:`QueuePolicy`, :class:`ReqInfo`,
:class:`AdmitContext`, ...) is :mod:`tuned.core.queue_policy`, re-exported here for
policy authors (``from tuned.policies.queues import QueuePolicy``).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Mapping
from typing import Any

from tuned.core.queue_policy import (AdmitContext, PolicyStats, QueuePolicy, ReqInfo,
                                     Selection, Verdict)

#: name -> "module:Class"; resolved on demand so that policy modules can import
#: this interface without an import cycle. Keys equal ``tuned.config.QUEUE_POLICIES``.
POLICIES: dict[str, str] = {
    "fcfs": "tuned.policies.fcfs:FCFSPolicy",
    "mcsf": "tuned.policies.mcsf:MCSFPolicy",
    "multibin": "tuned.policies.multibin:MultiBinPolicy",
    "bucket": "tuned.policies.bucket:BucketPolicy",
    "saber": "tuned.policies.saber:SaberPolicy",
    "sglang": "tuned.policies.sglang:SglangPolicy",
}


def policy_class(name: str) -> type[QueuePolicy]:
    """The class registered under ``name``; ``ValueError`` lists the known names."""
    try:
        target = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown queue policy {name!r} "
                         f"(known: {', '.join(POLICIES)})") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def make_policy(name: str, options: Mapping[str, Any] | None = None,
                rng_seed: int = 0) -> QueuePolicy:
    """Build the named policy from its options, with a seeded RNG (deterministic)."""
    return policy_class(name).from_options(options, rng=random.Random(rng_seed))


__all__ = ["AdmitContext", "POLICIES", "PolicyStats", "QueuePolicy", "ReqInfo", "Selection",
           "Verdict", "make_policy", "policy_class"]
