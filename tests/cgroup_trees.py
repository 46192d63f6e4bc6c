"""Helpers for tests that build cgroup trees from the captures in tests/fixtures/cgroup/."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"


def copy_files(source: Path, dest: Path, *, prefix: str = "") -> Path:
    """Copy ``source``'s files named ``<prefix>memory.*`` into ``dest`` without the prefix."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name.startswith(prefix + "memory."):
            # copyfile, not copy: the fixtures may be read-only and tests rewrite the copies.
            shutil.copyfile(path, dest / path.name[len(prefix) :])
    return dest
