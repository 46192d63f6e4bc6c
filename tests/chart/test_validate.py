"""Rendered objects against schemas: Kubernetes' own for core kinds, ours for the CRD kinds."""

from __future__ import annotations

import json
from functools import cache

import jsonschema
import pytest
from chartlib import HERE, Manifest

# The oldest Kubernetes the chart is checked against, and the newest kubernetes-validate
# ships. That package is imported by the one test using it: its 100 MB of schemas stay
# out of the small virtualenvs the unit tests run in on the other Pythons (scripts/setup),
# which import this module and run none of its tests (they all render with helm).
KUBERNETES_VERSIONS = ("1.31.0", "latest")
CRD_SCHEMAS = {
    "ServiceMonitor": "servicemonitor.json",
    "PodMonitor": "podmonitor.json",
    "PrometheusRule": "prometheusrule.json",
    "ScaledObject": "scaledobject.json",
}


@cache
def crd_validator(kind: str) -> jsonschema.protocols.Validator:
    schema = json.loads((HERE / "schemas" / CRD_SCHEMAS[kind]).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_objects_validate_strictly(rendered: dict[str, list[Manifest]], version: str) -> None:
    """Every core object of every scenario is valid for the version, unknown fields refused."""
    import kubernetes_validate

    if version == "latest":
        version = kubernetes_validate.latest_version()
    checked = 0
    for scenario, manifests in rendered.items():
        for m in manifests:
            if m["kind"] in CRD_SCHEMAS:
                continue
            try:
                kubernetes_validate.validate(m, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{scenario}: {m['kind']} {m['metadata']['name']}: {e.message}")
            checked += 1
    assert checked >= 20


def test_crd_objects_match_their_schemas(rendered: dict[str, list[Manifest]]) -> None:
    """Every ServiceMonitor, PodMonitor, PrometheusRule and ScaledObject matches its schema."""
    seen = set()
    for scenario, manifests in rendered.items():
        for m in manifests:
            if m["kind"] not in CRD_SCHEMAS:
                continue
            errors = sorted(crd_validator(m["kind"]).iter_errors(m), key=str)
            assert not errors, f"{scenario}: {m['kind']}: " + "; ".join(e.message for e in errors)
            seen.add(m["kind"])
    assert seen == set(CRD_SCHEMAS)


@pytest.mark.parametrize(
    ("kind", "path", "bad"),
    [
        ("ServiceMonitor", ("spec", "endpoints", 0), {"intervall": "30s"}),
        ("PodMonitor", ("spec",), {"endpoints": []}),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0), {"for": "ten minutes"}),
        ("ScaledObject", ("spec", "triggers", 0, "metadata"), {"threshold": 12}),
    ],
)
def test_crd_schemas_refuse_mistakes(
    rendered: dict[str, list[Manifest]], kind: str, path: tuple[object, ...], bad: Manifest
) -> None:
    """Each CRD schema refuses a misspelt or mistyped field, so it is strict where it matters."""
    original = next(m for ms in rendered.values() for m in ms if m["kind"] == kind)
    broken = json.loads(json.dumps(original))
    node = broken
    for step in path:
        node = node[step]
    node.update(bad)
    assert not crd_validator(kind).is_valid(broken)
