"""Shared fixtures: the demo models, built locally once and reused across runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".cache" / "test-models"

# The CPU build sizes its KV cache in GiB from this; tests keep it small.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _bind_engines_to_this_workers_core() -> None:
    """Under pytest-xdist (tools/test.sh runs the ``parallel`` engine tests two at a
    time), each worker's engines compute on a core of their own: vLLM's CPU build binds
    every engine to core 0 by default, where two would share one core."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        cores = len(os.sched_getaffinity(0))
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(int(worker[2:]) % cores))


_bind_engines_to_this_workers_core()


@pytest.fixture
def logs():
    """tuned's JSON log lines, captured: call the fixture's value to read them."""
    import io
    import json

    import structlog

    from tuned.base import log as log_mod

    buf = io.StringIO()
    log_mod.configure("info", stream=buf)
    yield lambda: [json.loads(line) for line in buf.getvalue().splitlines()]
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from tuned.base.demo_model import build_demo_model

    return build_demo_model(MODEL_CACHE / "tiny", "tiny")


@pytest.fixture(scope="session")
def small_model() -> Path:
    from tuned.base.demo_model import build_demo_model

    return build_demo_model(MODEL_CACHE / "small", "small")



def pytest_report_header(config):
    from serve_harness import DTYPE_ENV, engine_dtype

    given = os.environ.get(DTYPE_ENV, "") or "unset: this CPU's choice"
    return f"engine dtype for the slow tests: {engine_dtype()} ({DTYPE_ENV}: {given})"
