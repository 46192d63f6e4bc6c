"""The Pythons the package claims are the ones the gate runs its unit tests on."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys

from kits.suitekit import ROOT


def claimed() -> list[str]:
    """The ``3.X`` versions of the installed distribution's classifiers, in order."""
    classifiers = importlib.metadata.metadata("asgi-admission").get_all("Classifier") or []
    found = [re.fullmatch(r"Programming Language :: Python :: (3\.\d+)", c) for c in classifiers]
    return sorted((m.group(1) for m in found if m), key=lambda v: int(v.split(".")[1]))


def test_the_classifiers_claim_every_python_from_the_lowest_required_on() -> None:
    """The classifiers name each minor Python from Requires-Python's bound on, with no
    gap, and the Python running this test is one of them."""
    requires = importlib.metadata.metadata("asgi-admission")["Requires-Python"]
    assert requires == ">=3.10"
    versions = claimed()
    assert versions[0] == "3.10"
    assert versions == [f"3.{minor}" for minor in range(10, 10 + len(versions))]
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in versions


def test_scripts_pythons_lists_the_claimed_pythons() -> None:
    """scripts/pythons, which scripts/setup and scripts/check use, prints the claimed
    versions, one a line, as the installed metadata has them."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "pythons")], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines() == claimed()


def test_a_unit_run_leaves_out_the_tests_taking_a_tool() -> None:
    """``pytest -m unit`` (the runs on the other Pythons) collects the chart tests that
    read files and leaves out those running helm."""
    lint = ROOT / "tests" / "chart" / "test_lint.py"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--co",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "unit",
            lint,
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert "test_readme_documents_every_value" in out
    assert "test_helm_lint_strict_passes" not in out
