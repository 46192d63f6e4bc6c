"""``read_bound``: raw usage with the exact limit, offered only where the limit is exact.

Every check goes through :func:`bound_of`, which also holds each bound to the shape
the latch's fast path relies on: not exact, the raw usage as the working set.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from asgi_admission import CgroupMemoryReader, MemoryReading
from asgi_admission._memory import discover
from kits.suitekit import GIB

#: Internal on purpose: the reader's cgroup discovery (initial cgroup namespace), on fixture trees.
INTERNAL = "the reader's cgroup discovery (initial cgroup namespace), on fixture trees"


def bound_of(reader: CgroupMemoryReader) -> MemoryReading | None:
    """``reader.read_bound()``, checked to be marked inexact with the raw usage as used."""
    bound = reader.read_bound()
    if bound is not None:
        assert bound.exact is False
        assert bound.used_bytes == bound.usage_bytes
    return bound


def write(directory: Path, **files: int | str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, value in files.items():
        (directory / name.replace("_", ".", 1)).write_text(f"{value}\n")
    return directory


def test_v2_bound_is_the_raw_usage_with_the_same_limit(
    fixture_copy: Callable[..., Path],
) -> None:
    """On v2 the bound is memory.current and the limit of the full reading, not exact."""
    reader = CgroupMemoryReader(fixture_copy("telegraf/v2"))
    assert bound_of(reader) is None  # nothing before the first full reading
    full = reader()
    bound = bound_of(reader)
    assert bound is not None
    assert (bound.used_bytes, bound.limit_bytes) == (13071106048, full.limit_bytes)
    assert (bound.exact, full.exact) == (False, True)
    assert full.used_bytes == 4538245120  # the working set: below its bound
    assert (bound.reclaimable_bytes, bound.limit_file) == (0, full.limit_file)


def test_v2_bound_declines_when_usage_becomes_unreadable(tmp_path: Path) -> None:
    """A v2 bound needs memory.current: gone after the first reading, there is none."""
    tree = write(tmp_path / "cg", memory_current=GIB, memory_max=4 * GIB, memory_stat="anon 1")
    reader = CgroupMemoryReader(tree)
    assert reader().available
    assert bound_of(reader) is not None
    (tree / "memory.current").unlink()
    assert bound_of(reader) is None


def test_v2_unlimited_has_no_bound(fixture_copy: Callable[..., Path]) -> None:
    """Without a limit there is nothing the bound could decide: the full path handles it."""
    reader = CgroupMemoryReader(fixture_copy("elastic-agent-system-metrics/docker2-v2-dotdot"))
    assert reader().limit_bytes is None
    assert bound_of(reader) is None


def test_v2_bound_compares_the_binding_ancestor(tmp_path: Path) -> None:
    """A parent with the tighter limit binds the bound too, with the parent's usage."""
    parent = write(tmp_path / "parent", memory_current=3 * GIB, memory_max=4 * GIB)
    (parent / "memory.stat").write_text("inactive_file 0\nactive_file 0\n")
    child = write(parent / "child", memory_current=1 * GIB, memory_max=8 * GIB)
    (child / "memory.stat").write_text("inactive_file 0\nactive_file 0\n")
    reader = CgroupMemoryReader(child)
    reader()
    bound = bound_of(reader)
    assert bound is not None
    assert (bound.used_bytes, bound.limit_bytes, bound.path) == (3 * GIB, 4 * GIB, str(parent))


def test_v1_tree_outside_any_cgroup_mount_has_no_bound(
    fixture_copy: Callable[..., Path],
) -> None:
    """A v1 group whose ancestors cannot all be seen offers no bound: only memory.stat's
    hierarchical_memory_limit tells its limit exactly."""
    reader = CgroupMemoryReader(fixture_copy("elastic-agent-system-metrics/amzn2-k8s-v1"))
    assert reader().limit_bytes == 2147483648
    assert bound_of(reader) is None


def v1_hierarchy(tmp_path: Path, *, mount_root: str = "/") -> tuple[Path, Path, Path]:
    """A v1 memory mount at <hostfs>/sys/fs/cgroup/memory with /pod (1 GiB) and
    /pod/app (2 GiB); returns (hostfs, proc_self_cgroup, mountinfo)."""
    hostfs = tmp_path / "host"
    mount = write(hostfs / "sys/fs/cgroup/memory", memory_usage_in_bytes=GIB // 2)
    (mount / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    pod = write(mount / "pod", memory_usage_in_bytes=900 * 2**20, memory_limit_in_bytes=GIB)
    app = write(pod / "app", memory_usage_in_bytes=300 * 2**20, memory_limit_in_bytes=2 * GIB)
    for level in (mount, pod, app):
        (level / "memory.stat").write_text(
            "hierarchical_memory_limit 1073741824\ntotal_inactive_file 0\ntotal_active_file 0\n"
        )
    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("4:memory:/pod/app\n0::/\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"35 31 0:32 {mount_root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    )
    return hostfs, proc_cgroup, mountinfo


def discovered(
    hostfs: Path, proc_cgroup: Path, mountinfo: Path, namespace: Path
) -> CgroupMemoryReader:
    """A reader that finds its cgroup in the tree ``v1_hierarchy`` built."""
    return CgroupMemoryReader(
        proc_self_cgroup=str(proc_cgroup),
        mountinfo=str(mountinfo),
        hostfs=str(hostfs),
        cgroup_namespace=str(namespace),
    )


@pytest.fixture
def initial_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file standing in for /proc/self/ns/cgroup of the initial cgroup namespace."""
    namespace = tmp_path / "ns-cgroup"
    namespace.write_text("")
    monkeypatch.setattr(discover, "INITIAL_CGROUP_NAMESPACE_INODE", os.stat(namespace).st_ino)
    return namespace


def test_v1_whole_hierarchy_bound_reads_the_ancestors_limits(
    tmp_path: Path, initial_namespace: Path
) -> None:
    """Seeing the whole hierarchy, the bound takes the least limit along the ancestry and
    that level's usage: what hierarchical_memory_limit and the full reading give."""
    hostfs, proc_cgroup, mountinfo = v1_hierarchy(tmp_path)
    reader = discovered(hostfs, proc_cgroup, mountinfo, initial_namespace)
    assert reader.location.v1_whole_chain
    full = reader()
    bound = bound_of(reader)
    assert bound is not None
    assert (full.limit_bytes, full.path) == (GIB, str(hostfs / "sys/fs/cgroup/memory/pod"))
    assert (bound.used_bytes, bound.limit_bytes, bound.path) == (900 * 2**20, GIB, full.path)
    assert bound.exact is False
    # An ancestor that cannot be read (or is missing its limit) means no bound.
    (hostfs / "sys/fs/cgroup/memory/pod/memory.limit_in_bytes").write_text("junk\n")
    assert bound_of(reader) is None


def test_v1_walk_that_stops_short_of_the_root_gives_no_bound(
    tmp_path: Path, initial_namespace: Path
) -> None:
    """If an intermediate level has no limit file, not every ancestor was seen: no bound."""
    hostfs, proc_cgroup, mountinfo = v1_hierarchy(tmp_path)
    (hostfs / "sys/fs/cgroup/memory/pod/memory.limit_in_bytes").unlink()
    reader = discovered(hostfs, proc_cgroup, mountinfo, initial_namespace)
    reader()
    assert bound_of(reader) is None


@pytest.mark.parametrize("why", ["cgroup namespace", "mount shows part of the hierarchy"])
def test_v1_hidden_ancestors_mean_no_bound(
    tmp_path: Path, why: str, request: pytest.FixtureRequest
) -> None:
    """In a cgroup namespace, or where the mount root is a sub-hierarchy, ancestors are
    hidden and the v1 fast path is off (each case with the other condition met)."""
    if why == "cgroup namespace":
        hostfs, proc_cgroup, mountinfo = v1_hierarchy(tmp_path)
        namespace = tmp_path / "other-ns"
        namespace.write_text("")
    else:
        # The mount shows /pod's subtree at the mount point, in the initial namespace.
        hostfs, proc_cgroup, mountinfo = v1_hierarchy(tmp_path, mount_root="/pod")
        proc_cgroup.write_text("4:memory:/pod/pod/app\n")
        namespace = request.getfixturevalue("initial_namespace")
    reader = discovered(hostfs, proc_cgroup, mountinfo, namespace)
    assert reader.location.warnings == ()
    assert reader.location.v1 is not None
    assert reader.location.v1[0].endswith("pod/app")
    assert not reader.location.v1_whole_chain
    assert reader().limit_bytes == GIB
    assert bound_of(reader) is None


def test_explicit_root_inside_a_whole_mount_gets_the_bound(
    tmp_path: Path, initial_namespace: Path
) -> None:
    """ADMISSION_CGROUP_ROOT under a v1 mount showing the whole hierarchy is eligible too."""
    hostfs, _, mountinfo = v1_hierarchy(tmp_path)
    app = hostfs / "sys/fs/cgroup/memory/pod/app"
    reader = CgroupMemoryReader(
        app, mountinfo=str(mountinfo), hostfs=str(hostfs), cgroup_namespace=str(initial_namespace)
    )
    reader()
    bound = bound_of(reader)
    assert bound is not None
    assert (bound.limit_bytes, bound.used_bytes) == (GIB, 900 * 2**20)


def test_initial_namespace_check_tolerates_a_missing_file(tmp_path: Path) -> None:
    """An unreadable namespace link counts as a namespace: no fast path on v1."""
    assert discover.in_initial_cgroup_namespace(str(tmp_path / "missing")) is False


@pytest.mark.parametrize(
    ("level", "name", "content"),
    [
        ("pod/app", "memory.usage_in_bytes", "junk"),  # our own usage unusable
        ("pod", "memory.usage_in_bytes", "junk"),  # the binding level's usage unusable
        ("pod", "memory.usage_in_bytes", None),  # ... or gone
        ("pod", "memory.limit_in_bytes", "9223372036854771712"),  # nothing binds: unlimited
    ],
)
def test_v1_bound_declines_on_anything_odd(
    tmp_path: Path, initial_namespace: Path, level: str, name: str, content: str | None
) -> None:
    """Any unusable or missing figure, or no limit at all, means no bound (full reading)."""
    hostfs, proc_cgroup, mountinfo = v1_hierarchy(tmp_path)
    reader = discovered(hostfs, proc_cgroup, mountinfo, initial_namespace)
    reader()
    assert bound_of(reader) is not None
    target = hostfs / "sys/fs/cgroup/memory" / level / name
    if name == "memory.limit_in_bytes":
        (target.parent / "app" / name).write_text(f"{content}\n")  # and the child's too
    if content is None:
        target.unlink()
    else:
        target.write_text(f"{content}\n")
    assert bound_of(reader) is None


def test_explicit_root_without_a_mount_table_gets_no_bound(tmp_path: Path) -> None:
    """An unreadable mountinfo proves nothing about the ancestors: no v1 fast path."""
    hostfs, _, _ = v1_hierarchy(tmp_path)
    reader = CgroupMemoryReader(
        hostfs / "sys/fs/cgroup/memory/pod/app", mountinfo=str(tmp_path / "missing")
    )
    assert reader().limit_bytes == GIB
    assert bound_of(reader) is None


def test_explicit_root_in_a_cgroup_namespace_gets_no_bound(tmp_path: Path) -> None:
    """Inside a cgroup namespace even a mount root of / hides ancestors: no v1 fast path."""
    hostfs, _, mountinfo = v1_hierarchy(tmp_path)
    other = tmp_path / "other-ns"
    other.write_text("")
    reader = CgroupMemoryReader(
        hostfs / "sys/fs/cgroup/memory/pod/app",
        mountinfo=str(mountinfo),
        hostfs=str(hostfs),
        cgroup_namespace=str(other),
    )
    assert reader().limit_bytes == GIB
    assert bound_of(reader) is None
