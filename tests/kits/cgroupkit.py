"""Real cgroup v1 memory groups for the tests and benches that need the kernel's own
counters: make one, read its working set and OOM kills, and always remove it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from asgi_admission import CgroupMemoryReader
from asgi_admission._admission.ledger import shared_place
from kits.requirekit import require_marker
from kits.suitekit import MIB, V1_MEMORY

#: Internal on purpose: where the servers it starts put their default shared place.
INTERNAL = "the default shared place's bases and directory name, for a real group"

# Bound at import: the suite's conftest replaces shared_place.default_bases for the
# guards it builds, but the servers it starts use the machine's own.
_machine_bases = shared_place.default_bases


@contextlib.contextmanager
def memory_group(limit_mb: int, name: str, *, swap_too: bool = True) -> Iterator[Path]:
    """A fresh v1 memory group ``asgi_admission_<name>_<pid>_<ns>`` limited to
    ``limit_mb`` (and its swap too, where the kernel counts swap, unless ``swap_too``
    is false); on exit its tasks are killed and it is removed, even after a failure."""
    require_marker("real_cgroup", "makes a real memory group")
    group = V1_MEMORY / f"asgi_admission_{name}_{os.getpid()}_{time.monotonic_ns()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb * MIB))
        swap = group / "memory.memsw.limit_in_bytes"
        if swap_too and swap.exists():
            swap.write_text(str(limit_mb * MIB))
        yield group
    finally:
        places = default_places(group)
        remove_group_tree(group)
        for place in places:
            shutil.rmtree(place, ignore_errors=True)


def remove_group_tree(group: Path, *, attempts: int = 200) -> None:
    """Kill every task in ``group`` and the groups below it (the session groups a guard
    made there), then remove them all, deepest first; gives up after ``attempts`` tries."""
    for _ in range(attempts):
        tree = sorted((p for p in group.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
        for member in [*tree, group]:
            with contextlib.suppress(OSError):
                for pid in (member / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        try:
            for member in [*tree, group]:
                member.rmdir()
            return
        except FileNotFoundError:
            if not group.exists():
                return
        except OSError:
            time.sleep(0.05)


def default_place_paths(group: Path) -> list[Path]:
    """Where guarded servers in ``group`` with no ``ADMISSION_SHARED_DIR`` set look for
    the directory they share, in order (under the machine's bases, as they find them)."""
    found = shared_place.group_of(CgroupMemoryReader(group))
    if found is None:
        return []
    name = shared_place.directory_name(found)
    return [Path(base, name) for base in _machine_bases() if Path(base).is_dir()]


def default_places(group: Path) -> list[Path]:
    """The directories of :func:`default_place_paths` that exist (made by the servers)."""
    return [path for path in default_place_paths(group) if path.is_dir()]


def joining(group: Path) -> list[str]:
    """The argv prefix of a command run inside ``group``: a shell moves itself into the
    group, then execs the rest, so the command and all it allocates are charged there."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group)]


def working_set_bytes(group: Path) -> int:
    """The group's usage less its file cache, as the guard computes it."""
    usage = int((group / "memory.usage_in_bytes").read_text())
    stats = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    cache = int(stats.get("total_inactive_file", 0)) + int(stats.get("total_active_file", 0))
    return max(0, usage - cache)


def oom_kills(group: Path) -> int:
    """How many processes the kernel's OOM killer has killed in ``group``."""
    for line in (group / "memory.oom_control").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    raise AssertionError(f"{group}: no oom_kill count in memory.oom_control")
