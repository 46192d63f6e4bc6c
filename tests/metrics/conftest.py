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
