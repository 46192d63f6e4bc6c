"""Fixtures for the Helm chart tests: the tools, and every ci/ scenario rendered once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from chartlib import SCENARIOS, Manifest, render, require_tool, scenario_name


@pytest.fixture(scope="session")
def helm() -> str:
    return require_tool("helm")


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, list[Manifest]]:
    """Every ci/*-values.yaml scenario, rendered once per session, by scenario name."""
    assert SCENARIOS, "charts/asgi-admission/ci/ holds no *-values.yaml scenario"
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = pool.map(
            lambda path: render(helm, scenario_name(path), "-f", str(path)), SCENARIOS
        )
        return dict(zip(map(scenario_name, SCENARIOS), results, strict=True))
