"""Every captured cgroup tree, read through the public API: explicitly and by discovery."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from asgi_admission import CgroupMemoryReader
from asgi_admission._memory.reading import read_cgroup_memory
from kits.cgroup_trees import ELASTIC, FIXTURES, copy_files

#: Internal on purpose: the per-root reader cache behind the latch's default reader.
INTERNAL = "the per-root reader cache behind the latch's default reader"


# (fixture dir, file prefix, usage, limit, default working set, kubelet working set, source)
# The working sets are those derived in tests/fixtures/cgroup/SOURCES.md.
EXPECTED = [
    ("telegraf/v2", "", 13071106048, 103079215104, 4538245120, 10135646208, "cgroup-v2"),
    (
        "elastic-agent-system-metrics/docker2-v2-dotdot",
        "",
        10498404352,
        None,
        1876992000,
        3812655104,
        "cgroup-v2",
    ),
    (
        "elastic-agent-system-metrics/docker-hybrid",
        "v2_",
        9125888,
        None,
        8855552,
        8855552,
        "cgroup-v2",
    ),
    (
        "elastic-agent-system-metrics/amzn2-k8s-v1",
        "",
        1215860736,
        2147483648,
        1137303552,
        1137303552,
        "cgroup-v1",
    ),
    (
        "elastic-agent-system-metrics/docker-hybrid",
        "v1_",
        295997440,
        None,
        231075840,
        255889408,
        "cgroup-v1",
    ),
    (
        "elastic-agent-system-metrics/ubuntu1804-hybrid",
        "",
        9039872,
        None,
        9031680,
        9039872,
        "cgroup-v1",
    ),
    ("local-firecracker-v1-hybrid", "", 74948608, 536870912, 74948608, 74948608, "cgroup-v1"),
]
IDS = [
    name.split("/")[-1] + ("-" + prefix.rstrip("_") if prefix else "")
    for name, prefix, *_ in EXPECTED
]


@pytest.mark.parametrize(
    ("name", "prefix", "usage", "limit", "working_set", "kubelet", "source"), EXPECTED, ids=IDS
)
@pytest.mark.parametrize("reclaimable", ["file", "inactive"])
def test_fixture_read_with_explicit_root(
    fixture_copy: Callable[..., Path],
    name: str,
    prefix: str,
    usage: int,
    limit: int | None,
    working_set: int,
    kubelet: int,
    source: str,
    reclaimable: str,
) -> None:
    """Each captured tree gives the SOURCES.md working set, limit and version in both modes."""
    root = fixture_copy(name, prefix=prefix)
    reading = CgroupMemoryReader(root, reclaimable=reclaimable)()  # type: ignore[arg-type]
    expected = working_set if reclaimable == "file" else kubelet
    assert reading.available
    assert reading.used_bytes == expected
    assert reading.usage_bytes == usage
    assert reading.reclaimable_bytes == usage - expected
    assert reading.limit_bytes == limit
    assert reading.source == source
    assert reading.path == str(root)
    if limit is None:
        assert reading.percent is None
        assert reading.limit_file is None
    else:
        assert reading.percent == round(expected * 100 / limit, 2)
        limit_name = "memory.max" if source == "cgroup-v2" else "memory.limit_in_bytes"
        assert reading.limit_file == str(root / limit_name)


@pytest.mark.parametrize(
    ("name", "prefix", "usage", "limit", "working_set"), [e[:5] for e in EXPECTED], ids=IDS
)
def test_fixture_read_through_read_cgroup_memory(
    fixture_copy: Callable[..., Path],
    name: str,
    prefix: str,
    usage: int,
    limit: int | None,
    working_set: int,
) -> None:
    """read_cgroup_memory(root) agrees with the table, PSI included where present."""
    root = fixture_copy(name, prefix=prefix)
    reading = read_cgroup_memory(root)
    assert (reading.used_bytes, reading.limit_bytes, reading.available) == (
        working_set,
        limit,
        True,
    )
    has_psi = (root / "memory.pressure").exists()
    assert (reading.pressure_some_avg10 == 0.0) if has_psi else reading.pressure_some_avg10 is None


def test_v1_files_in_memory_subdirectory(tmp_path: Path) -> None:
    """With an explicit root, v1 files are found in <root>/memory as well as in <root>."""
    copy_files(ELASTIC / "amzn2-k8s-v1", tmp_path / "memory")
    reading = CgroupMemoryReader(tmp_path)()
    assert reading.used_bytes == 1137303552
    assert reading.path == str(tmp_path / "memory")


def test_psi_from_procfs_fixture(tmp_path: Path) -> None:
    """A memory.pressure with non-zero averages gives `some avg10` only when PSI is asked for."""
    root = copy_files(FIXTURES / "telegraf/v2", tmp_path / "cg")
    shutil.copyfile(FIXTURES / "procfs/proc_pressure_memory", root / "memory.pressure")
    reader = CgroupMemoryReader(root)
    assert reader().pressure_some_avg10 is None
    assert reader.read(pressure=True).pressure_some_avg10 == pytest.approx(0.10)
    assert str(root / "memory.pressure") in reader.files()


# --- discovery: the files placed where each capture's mountinfo and /proc/<pid>/cgroup say ---


def _discover(tmp_path: Path, fixture: Path, proc_cgroup: str) -> CgroupMemoryReader:
    return CgroupMemoryReader(
        proc_self_cgroup=str(fixture / proc_cgroup),
        mountinfo=str(fixture / "proc_self_mountinfo"),
        hostfs=str(tmp_path),
    )


AMZN_SCOPE = (
    "kubepods.slice/kubepods-burstable.slice/"
    "kubepods-burstable-pod7a96c459_d529_44ae_9f99_90d3798d6426.slice/"
    "cri-containerd-1d3d308a7d48a27814a68bf33a44acf4441c9c02463ca0bc1cdfdc8c0b4a8496.scope"
)


@pytest.mark.parametrize(
    ("fixture", "proc_cgroup", "prefix", "place", "working_set", "limit"),
    [
        (
            "amzn2-k8s-v1",
            "proc_493239_cgroup",
            "",
            f"testdata/amzn2/sys/fs/cgroup/memory/{AMZN_SCOPE}",
            1137303552,
            2147483648,
        ),
        (
            "amzn2-k8s-v1",
            "proc_1_cgroup",
            "",
            "testdata/amzn2/sys/fs/cgroup/memory",
            1137303552,
            2147483648,
        ),
        (
            "docker-hybrid",
            "proc_312_cgroup_v2",
            "v2_",
            "testdata/docker/sys/fs/cgroup/system.slice/"
            "docker-1c8fa019edd4b9d4b2856f4932c55929c5c118c808ed5faee9a135ca6e84b039.scope",
            8855552,
            None,
        ),
        (
            "ubuntu1804-hybrid",
            "proc_3757_cgroup",
            "",
            "sys/fs/cgroup/memory/system.slice/networkd-dispatcher.service",
            9031680,
            None,
        ),
    ],
    ids=["amzn2-container", "amzn2-host-pid1", "docker-hybrid-v2", "ubuntu1804-service"],
)
def test_discovery_resolves_capture(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    fixture: str,
    proc_cgroup: str,
    prefix: str,
    place: str,
    working_set: int,
    limit: int | None,
) -> None:
    """Discovery joins the mount point and the cgroup path relative to the mount root."""
    copy_files(ELASTIC / fixture, tmp_path / place, prefix=prefix)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        reader = _discover(tmp_path, ELASTIC / fixture, proc_cgroup)
    reading = reader()
    assert reader.location.how == "discovered"
    assert reader.location.warnings == ()
    assert caplog.records == []
    assert reading.path == str(tmp_path / place)
    assert (reading.used_bytes, reading.limit_bytes) == (working_set, limit)


def test_discovery_local_firecracker_reads_v1_and_unified_psi(tmp_path: Path) -> None:
    """On the dev machines' hybrid layout, v1 answers and PSI comes from the unified mount."""
    fixture = FIXTURES / "local-firecracker-v1-hybrid"
    copy_files(fixture, tmp_path / "sys/fs/cgroup/memory/fixture_capture")
    (tmp_path / "sys/fs/cgroup/unified").mkdir(parents=True)
    shutil.copyfile(
        fixture / "unified_memory.pressure", tmp_path / "sys/fs/cgroup/unified/memory.pressure"
    )
    reader = CgroupMemoryReader(
        proc_self_cgroup=str(fixture / "proc_self_cgroup"),
        mountinfo=str(fixture / "proc_self_mountinfo"),
        hostfs=str(tmp_path),
    )
    reading = reader.read(pressure=True)
    assert reading.source == "cgroup-v1"
    assert reading.path == str(tmp_path / "sys/fs/cgroup/memory/fixture_capture")
    assert (reading.used_bytes, reading.limit_bytes) == (74948608, 536870912)
    assert reading.pressure_some_avg10 == 0.0


def test_docker2_moved_cgroup_falls_back_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A /proc/<pid>/cgroup path with `..` falls back to the mount point, warning exactly once."""
    fixture = ELASTIC / "docker2-v2-dotdot"
    mount = tmp_path / "testdata/docker2/sys/fs/cgroup"
    copy_files(fixture, mount)
    # Were the path joined naively below the `/../..` mount root, it would land here;
    # the reader must not take it.
    copy_files(FIXTURES / "telegraf/v2", mount / "user-1000.slice/session-520.scope")
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        reader = _discover(tmp_path, fixture, "proc_2233801_cgroup")
        reading = reader()
        reader()
    assert reader.location.how == "discovered"
    assert len(reader.location.warnings) == 1
    assert len(caplog.records) == 1
    assert "/../../user-1000.slice/session-520.scope" in caplog.records[0].getMessage()
    assert reading.path == str(mount)
    assert (reading.used_bytes, reading.limit_bytes) == (1876992000, None)


def test_docker_hybrid_v1_outside_mount_root_falls_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v1 path that is not under its mount's root (another container's view) falls back too."""
    fixture = ELASTIC / "docker-hybrid"
    mount = tmp_path / "testdata/docker/sys/fs/cgroup/memory"
    copy_files(fixture, mount, prefix="v1_")
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        reader = _discover(tmp_path, fixture, "proc_985_cgroup_v1")
    reading = reader()
    assert len(caplog.records) == 1
    assert reading.path == str(mount)
    assert reading.used_bytes == 231075840


def test_discovery_without_proc_files_falls_back_to_sys_fs_cgroup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Unreadable /proc files make the reader use <hostfs>/sys/fs/cgroup, with a warning."""
    copy_files(FIXTURES / "telegraf/v2", tmp_path / "sys/fs/cgroup")
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        reader = CgroupMemoryReader(
            proc_self_cgroup=str(tmp_path / "missing"),
            mountinfo=str(tmp_path / "missing"),
            hostfs=str(tmp_path),
        )
    assert reader.location.how == "fallback"
    assert len(caplog.records) == 1
    assert reader().used_bytes == 4538245120


def test_discovery_with_no_usable_mount_falls_back(tmp_path: Path) -> None:
    """A cgroup named in /proc whose mounts are all absent also falls back to /sys/fs/cgroup."""
    fixture = ELASTIC / "ubuntu1804-hybrid"
    reader = _discover(tmp_path, fixture, "proc_3757_cgroup")
    reading = reader()
    assert reader.location.how == "fallback"
    assert not reading.available
    assert reading.path == str(tmp_path / "sys/fs/cgroup")
