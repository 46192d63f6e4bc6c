"""Fixtures for the metrics tests."""

from __future__ import annotations

import pytest
from metricskit import tool
from prometheus_client import CollectorRegistry


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture(scope="session")
def promtool() -> str:
    return tool("promtool")


@pytest.fixture(scope="session")
def prometheus() -> str:
    return tool("prometheus")


@pytest.fixture(autouse=True)
def reservations_end_at_the_response(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests count sessions, not settling: a reservation ends with its response
    or accept, as an in-request session's does once its memory shows (the settling
    tests are tests/middleware/test_settling_guarded.py and tests/reservations/)."""
    monkeypatch.setenv("ADMISSION_PENDING_TIMEOUT_SECONDS", "1e-9")
