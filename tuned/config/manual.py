"""The config's manual: the field table as `tuned check-config --explain` prints it,
then the policies' options and how a config reaches your own vLLM command line."""

from __future__ import annotations

from tuned.config.schema import FIELDS, range_text
from tuned.config.sources import ENV_PREFIX
from tuned.config.vllm_args import ENGINE_KEYS
from tuned.policies import catalog

def explain() -> str:
    """The field table, one line per key: name, type, default, range, doc."""
    lines = []
    for name, f in FIELDS.items():
        meta = f.metadata
        rng = range_text(meta)
        flag = " [restart]" if meta["restart"] else ""
        lines.append(f"{name} ({f.type}, default {meta['default']!r}{', ' + rng if rng else ''})"
                     f"{flag}: {meta['doc']}")
    lines += ["", "Policies (batch_policy, queue_policy) and their options (batch_options, "
              "queue_options):", catalog.explain(),
              "", f"Dropped into your own vLLM command line (--scheduler-cls "
              f"tuned.engines.vllm.TunedScheduler), {', '.join(ENGINE_KEYS)} are read from "
              f"vLLM's arguments (set here, they must agree with them) and every key may "
              f"also be given as {ENV_PREFIX}<KEY> or in --additional-config "
              f"'{{\"tuned\": {{...}}}}'."]
    return "\n".join(lines)
