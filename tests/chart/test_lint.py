"""helm lint --strict over every ci/ scenario, and the scenarios' coverage of the options."""

from __future__ import annotations

import subprocess

import pytest
from chartlib import CHART, SCENARIOS, Manifest, of_kind, scenario_name


@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_name)
def test_helm_lint_strict_passes(helm: str, values: object) -> None:
    """helm lint --strict reports no error or warning for the scenario."""
    proc = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "-f", str(values)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout
    assert "[ERROR]" not in proc.stdout


def test_helm_lint_fails_without_a_memory_limit(helm: str) -> None:
    """Linting with the chart's defaults alone fails, because the memory limit has no default."""
    proc = subprocess.run(
        [helm, "lint", "--strict", str(CHART)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "memory" in proc.stdout + proc.stderr


def test_scenarios_cover_every_optional_object(rendered: dict[str, list[Manifest]]) -> None:
    """Across the ci/ scenarios every optional object of the chart is rendered at least once."""
    kinds = {m["kind"] for manifests in rendered.values() for m in manifests}
    assert kinds >= {
        "Deployment",
        "Service",
        "ServiceAccount",
        "Ingress",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ScaledObject",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ConfigMap",
        "Pod",
    }
    assert any(not of_kind(m, "PodDisruptionBudget") for m in rendered.values())
    assert any(not of_kind(m, "ServiceAccount") for m in rendered.values())
