"""Session-wide test settings: isolated Prefect home, no telemetry, no network."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Must be set before Prefect is imported anywhere in the session.
_PREFECT_HOME = tempfile.mkdtemp(prefix="telltale-prefect-home-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "60")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
os.environ.setdefault("TELLTALE_DATA_DIR", tempfile.mkdtemp(prefix="telltale-data-"))
for name in list(os.environ):
    if name.startswith("TELLTALE__"):
        del os.environ[name]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture()
def python() -> str:
    """The interpreter running the tests (for CLI subprocess tests)."""
    return sys.executable


@pytest.fixture(scope="session")
def prefect_harness():
    """Enter Prefect's test harness once per session (8-10 s), only for tests that need it."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield
