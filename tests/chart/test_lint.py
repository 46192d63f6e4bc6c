"""helm lint --strict over every ci/ scenario, and the scenarios' coverage of the options."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from chartlib import SCENARIOS, Manifest, of_kind, scenario_name

from kits.suitekit import CHART


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


# Values documented as a whole rather than key by key: probes, security contexts, resources.
OPAQUE_VALUES = {
    "livenessProbe",
    "readinessProbe",
    "startupProbe",
    "podSecurityContext",
    "securityContext",
    "resources.requests",
    "resources.limits",
    "helmTest.resources",
}


def value_paths(values: dict[str, object], prefix: str = "") -> list[str]:
    paths = []
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value and path not in OPAQUE_VALUES:
            paths += value_paths(value, path + ".")
        else:
            paths.append(path)
    return paths


def test_readme_documents_every_value() -> None:
    """The chart README has a row for every value of values.yaml, and values.yaml comments each."""
    readme = (CHART / "README.md").read_text()
    values_text = (CHART / "values.yaml").read_text()
    paths = value_paths(yaml.safe_load(values_text))
    missing = [p for p in paths if f"| `{p}` |" not in readme]
    assert not missing, f"values missing from the chart README: {missing}"
    stack: list[tuple[int, str]] = []
    previous = ""
    for line in values_text.splitlines():
        match = re.match(r"^( *)([A-Za-z]\w*):", line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            path = ".".join(key for _, key in stack)
            if path in paths:
                assert previous.lstrip().startswith("#"), f"values.yaml: {path} has no comment"
        if line.strip():
            previous = line


@pytest.mark.parametrize("values", SCENARIOS, ids=scenario_name)
def test_notes_render(helm: str, values: object) -> None:
    """NOTES.txt renders for the scenario (helm template skips it; a client dry run does not)."""
    proc = subprocess.run(
        [helm, "install", "notes", str(CHART), "-f", str(values), "--dry-run=client"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "helm test notes" in notes
    assert "<no value>" not in notes
