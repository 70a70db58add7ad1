"""One controller per data-parallel rank, observable as one fleet.

In one process: two real vLLM schedulers (``TunedScheduler``), ranks 0 and 1 as vLLM
0.32 builds them for a dense model (``data_parallel_rank`` 0 in both, the rank in
``data_parallel_index``). Slow: a real ``tuned serve -- --data-parallel-size 2`` on the
CPU build, each rank's endpoint on ``metrics_port + rank``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes import make_scheduler, requests, step
from tuned.base.netutil import free_port


def port_pair() -> int:
    """A port ``p`` with ``p`` and ``p + 1`` both free now."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise AssertionError("no two adjacent free ports")


def scrape(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.read().decode()


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_rank_is_vllms_data_parallel_index_not_its_rank():
    from vllm.config import ParallelConfig

    from tuned.engines.vllm import dp_rank

    pc = ParallelConfig()
    assert dp_rank(pc) == 0
    pc.data_parallel_index = 3      # what run_engine_core sets in rank 3 of a dense model
    assert pc.data_parallel_rank == 0
    assert dp_rank(pc) == 3


def test_two_ranks_two_controllers_two_endpoints(tiny_model, logs):
    """Ranks 0 and 1 in one process: each has its own controller, its endpoint on
    base + rank (no port clash), and labels every series with its engine."""
    base = port_pair()
    scheds = []
    try:
        for rank in (0, 1):
            scheds.append(make_scheduler(str(tiny_model), False, dp_index=rank,
                                         metrics_port=base))
        r0, r1 = scheds
        assert (r0.dp_rank, r1.dp_rank) == (0, 1)
        assert [s.parallel_config.data_parallel_rank for s in scheds] == [0, 0]
        assert (r0.endpoint.port, r1.endpoint.port) == (base, base + 1)
        assert r0.controller is not r1.controller
        assert r0.controller.slot is not r1.controller.slot
        assert not [e for e in logs() if e["event"] == "endpoint_failed"]
        # each rank's controller decides from its own engine: load rank 1 only
        for r in requests(3):
            r1.add_request(r)
        for _ in range(40):
            if not r1.has_requests():
                break
            step(r1)
        for s in scheds:
            s.controller.run_once()
        d0 = json.loads(scrape(base, "/decisions?limit=1"))
        d1 = json.loads(scrape(base + 1, "/decisions?limit=1"))
        assert (d0["engine"]["dp_rank"], d1["engine"]["dp_rank"]) == (0, 1)
        v0, v1 = samples(scrape(base, "/metrics")), samples(scrape(base + 1, "/metrics"))
        # every sample of rank r carries engine="r", as vLLM labels its engines
        assert {dict(lb).get("engine") for _, lb in v0} == {"0"}
        assert {dict(lb).get("engine") for _, lb in v1} == {"1"}
        assert v0[("tuned_requests_finished_total", (("engine", "0"),))] == 0
        assert v1[("tuned_requests_finished_total", (("engine", "1"),))] == 3
        # one tick series, and one per phase with as many observations (no "total"
        # phase for a sum over phases to count twice)
        for r, v in enumerate((v0, v1)):
            e = ("engine", str(r))
            ticks = v[("tuned_controller_tick_seconds_count", (e,))]
            assert ticks >= 1
            assert {dict(lb)["phase"]: val for (n, lb), val in v.items()
                    if n == "tuned_controller_tick_phase_seconds_count"} == \
                {"observe": ticks, "decide": ticks, "act": ticks}
    finally:
        for s in scheds:
            s.shutdown()


@pytest.mark.slow   # a real vLLM server with two data-parallel engines
def test_tuned_serve_with_two_data_parallel_ranks(tmp_path, tiny_model):
    """``tuned serve -- --data-parallel-size 2``: two EngineCore processes, one
    controller each, endpoints on metrics_port and metrics_port + 1; vLLM's own
    /metrics labels the same two engines."""
    from serve_harness import Load, _wait_ready, get_json, start_server, stop

    base = port_pair()
    text = (f'model = "{tiny_model}"\nmax_num_seqs = 8\nmax_num_batched_tokens = 256\n'
            f'max_model_len = 256\ninterval_s = 0.25\n'
            f'vllm_args = ["--data-parallel-size", "2"]\n')
    srv = start_server(tmp_path, text, {"VLLM_CPU_KVCACHE_SPACE": "1", **os.environ},
                       metrics_port=base)
    try:
        assert _wait_ready(srv, 600, last_try=True)
        ranks = {}
        for rank in (0, 1):
            deadline = time.monotonic() + 120
            while True:
                try:
                    ranks[rank] = get_json(f"http://127.0.0.1:{base + rank}/decisions?limit=0")
                    if ranks[rank]["current"]:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, srv.log_tail()
                time.sleep(0.5)
        assert [ranks[r]["engine"]["dp_rank"] for r in (0, 1)] == [0, 1]
        load = Load(srv, concurrency=4).start()
        try:
            time.sleep(5)
        finally:
            load.stop()
        assert load.errors == [] and load.completed == load.sent > 0
        deadline = time.monotonic() + 30
        while True:   # each controller exports its engine's departures at its next tick
            tuned = [samples(scrape(base + r, "/metrics")) for r in (0, 1)]
            finished = [tuned[r][("tuned_requests_finished_total", (("engine", str(r)),))]
                        for r in (0, 1)]
            if sum(finished) >= load.completed or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        for r in (0, 1):
            assert {dict(lb).get("engine") for _, lb in tuned[r]} == {str(r)}
        # vLLM spread the requests over both engines; each controller saw its own share
        assert sum(finished) == load.completed and min(finished) > 0, finished
        vllm = samples(urllib.request.urlopen(srv.base + "/metrics", timeout=5).read().decode())
        engines = {dict(lb)["engine"] for n, lb in vllm if n == "vllm:num_requests_running"}
        assert engines == {"0", "1"}
        assert '"event": "endpoint_failed"' not in srv.log_path.read_text()
    finally:
        stop(srv.proc)
