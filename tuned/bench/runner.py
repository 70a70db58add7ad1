"""Running contenders: one workload, one seed, many configurations, side by side.

This module turns an engine's run into :class:`~tuned.bench.metrics.RequestResult`
rows; the benchmark command builds on it.
"""

from __future__ import annotations

from tuned.bench.metrics import RequestResult


def results_from_sim(res) -> list[RequestResult]:
    """The simulated run's requests as the benchmark's per-request results."""
    failed = set(res.failed)
    return [RequestResult(r.request_id, r.arrival_time, r.num_prompt_tokens,
                          r.num_output_tokens, r.first_token_s, r.finish_s,
                          list(r.token_times) if r.token_times is not None else None,
                          r.preemptions, r.recomputed_tokens,
                          failed=r.request_id in failed,
                          error="needs more KV blocks than the cache holds"
                          if r.request_id in failed else None)
            for r in res.requests]
