"""Helpers for the Helm chart tests: paths, running helm, picking objects out of a render."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kits.suitekit import CHART

SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
HERE = Path(__file__).resolve().parent

Manifest = dict[str, Any]


def scenario_name(path: Path) -> str:
    """The scenario's short name, also used as its release name: ci/full-values.yaml -> full."""
    return path.name.removesuffix("-values.yaml")


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not on PATH: run scripts/setup (it installs helm into .tools/bin and "
            f"promtool from Debian's prometheus package) and put .tools/bin on PATH.",
            pytrace=False,
        )
    return path


def helm_template(
    helm: str, release: str, *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Runs `helm template` on the chart; extra args are values files and flags."""
    proc = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", "shop", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"helm template {release} {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def parse_manifests(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def render(helm: str, release: str, *args: str) -> list[Manifest]:
    return parse_manifests(helm_template(helm, release, *args).stdout)


def scenario_values(name: str) -> dict[str, Any]:
    """The values file of a scenario, as written (without the chart's defaults)."""
    loaded: dict[str, Any] = yaml.safe_load((CHART / "ci" / f"{name}-values.yaml").read_text())
    return loaded


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[Manifest], kind: str) -> Manifest:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def server_container(manifests: list[Manifest]) -> Manifest:
    containers: list[Manifest] = one(manifests, "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    assert len(containers) == 1
    return containers[0]


def env_of(container: Manifest) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}
