"""Helpers for tests that build cgroup trees from the captures in tests/fixtures/cgroup/."""

from __future__ import annotations

import shutil
from pathlib import Path

from kits.suitekit import MIB

FIXTURES = Path(__file__).parents[1] / "fixtures" / "cgroup"
#: The captured trees of elastic/elastic-agent-system-metrics.
ELASTIC = FIXTURES / "elastic-agent-system-metrics"


def write_v2_tree(root: Path, *, used_mb: int = 100, limit_mb: int = 4096) -> Path:
    """A cgroup v2 directory whose figures never move: a deterministic reading."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.current").write_text(f"{used_mb * MIB}\n")
    (root / "memory.max").write_text(f"{limit_mb * MIB}\n")
    (root / "memory.stat").write_text("anon 0\ninactive_file 0\nactive_file 0\n")
    return root


def write_v1_tree(root: Path, *, used_mb: int = 100, limit_mb: int = 4096) -> Path:
    """A cgroup v1 memory directory whose figures never move: a deterministic reading."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.usage_in_bytes").write_text(f"{used_mb * MIB}\n")
    (root / "memory.limit_in_bytes").write_text(f"{limit_mb * MIB}\n")
    (root / "memory.stat").write_text(
        f"hierarchical_memory_limit {limit_mb * MIB}\ntotal_inactive_file 0\ntotal_active_file 0\n"
    )
    return root


def copy_files(source: Path, dest: Path, *, prefix: str = "") -> Path:
    """Copy ``source``'s files named ``<prefix>memory.*`` into ``dest`` without the prefix."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name.startswith(prefix + "memory."):
            # copyfile, not copy: the fixtures may be read-only and tests rewrite the copies.
            shutil.copyfile(path, dest / path.name[len(prefix) :])
    return dest
