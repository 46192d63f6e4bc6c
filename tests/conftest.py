"""Fixtures shared by the whole suite (subfolders keep their own conftest files)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cgroup_trees import FIXTURES, copy_files


@pytest.fixture
def fixture_copy(tmp_path: Path) -> Callable[..., Path]:
    """Copy one captured tree's memory files into a fresh directory under ``tmp_path``."""

    def copy(name: str, *, prefix: str = "") -> Path:
        dest = tmp_path / (name.replace("/", "_") + prefix)
        return copy_files(FIXTURES / name, dest, prefix=prefix)

    return copy
