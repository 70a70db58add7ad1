"""Queue policies for policy authors: the interface and the registry in one import.

The interface every policy implements (:class:`QueuePolicy`, :class:`ReqInfo`,
:class:`AdmitContext`, ...) is :mod:`tuned.core.queue_policy`, re-exported here for
policy authors (``from tuned.policies.queues import QueuePolicy``).
"""

from __future__ import annotations

from typing import Any

from tuned.core.queue_policy import (AdmitContext, PolicyStats, QueuePolicy, ReqInfo,
                                     Selection, Verdict)
from tuned.policies.registry import make_policy, policy_class

__all__ = ["AdmitContext", "POLICIES", "PolicyStats", "QueuePolicy", "ReqInfo", "Selection",
           "Verdict", "make_policy", "policy_class"]


def __getattr__(name: str) -> Any:
    if name == "POLICIES":   # queue policy name -> "module:Class", from the catalog
        from tuned.policies import registry

        return registry.QUEUE_POLICIES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
