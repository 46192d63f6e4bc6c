"""Fixtures for the container tests: podman ready, and the image built once per session.

They need root, podman and a cgroup v1 memory hierarchy (the development and CI
machines; ``scripts/setup`` installs podman through ``scripts/containers``). Elsewhere
they are skipped, except under ``CI=true``, where a machine that cannot run them fails.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from containerkit import HELM_TEST_IMAGE, build_image, unavailable_reason


@pytest.fixture(scope="session")
def podman_ready() -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the container tests cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def image(podman_ready: None) -> str:
    """The demo image, built (or found up to date) once per test session by scripts/image."""
    return build_image()


@pytest.fixture(scope="session")
def helm_test_image(image: str) -> str:
    """The `helm test` pod's image, tagged by scripts/image with the demo image."""
    return HELM_TEST_IMAGE
