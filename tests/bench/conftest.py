"""Shared fixtures of the bench tests."""

import pytest
import structlog


@pytest.fixture
def quiet_logs():
    """The simulator's controller logs each decision at info; keep stdout to the table."""
    from tuned.base import log

    old = structlog.get_config()
    log.configure("warning")
    yield
    structlog.configure(**old)
