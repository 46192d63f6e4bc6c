"""Fixtures shared by the whole suite (subfolders keep their own conftest files)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cgroup_trees import FIXTURES, copy_files
from requirekit import require_markers


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``real_cgroup`` tests need root and a writable cgroup v1 memory hierarchy: they
    skip without one, and fail under ``CI=true``, where a green run must include them."""
    require_markers(item)


@pytest.fixture
def fixture_copy(tmp_path: Path) -> Callable[..., Path]:
    """Copy one captured tree's memory files into a fresh directory under ``tmp_path``."""

    def copy(name: str, *, prefix: str = "") -> Path:
        dest = tmp_path / (name.replace("/", "_") + prefix)
        return copy_files(FIXTURES / name, dest, prefix=prefix)

    return copy
