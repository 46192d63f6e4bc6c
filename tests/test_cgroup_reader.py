"""The cgroup reader on small synthetic trees: ancestry, outcomes, faults and recovery."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from asgi_admission import CgroupMemoryReader, MemoryReading
from asgi_admission._memory.discover import discover_cgroup, parse_mountinfo, parse_proc_cgroup
from asgi_admission._memory.reading import (
    VALUE_READ_SIZE,
    KeptFile,
    available_reading,
    parse_bytes_value,
    parse_pressure_some_avg10,
    read_cgroup_memory,
)
from kits.cgroup_trees import FIXTURES, copy_files
from kits.suitekit import GIB, MIB

#: Internal on purpose: cgroup discovery, parsing and the reader cache, on fixture trees.
INTERNAL = "cgroup discovery, parsing and the reader cache, on fixture trees"

V1_UNLIMITED = "9223372036854771712"


def write(directory: Path, **files: object) -> Path:
    """Write ``memory_current=...`` style keyword files (underscores become dots) into a dir."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (directory / name.replace("_", ".", 1)).write_text(f"{content}\n")
    return directory


def stat(**counters: int) -> str:
    return "\n".join(f"{key} {value}" for key, value in counters.items())


# --- cgroup v2: walking up the ancestry, memory.high ---


def test_v2_parent_with_tighter_max_binds_and_its_usage_is_compared(tmp_path: Path) -> None:
    """A parent whose memory.max is tighter sets the limit, and the parent's usage is compared."""
    parent = write(
        tmp_path / "cg/parent",
        memory_max=GIB,
        memory_current=900 * MIB,
        memory_stat=stat(inactive_file=50 * MIB, active_file=50 * MIB),
    )
    child = write(
        parent / "child",
        memory_max=4 * GIB,
        memory_current=100 * MIB,
        memory_stat=stat(inactive_file=0, active_file=0),
    )
    reading = CgroupMemoryReader(child)()
    assert reading.limit_bytes == GIB
    assert reading.used_bytes == 800 * MIB
    assert reading.path == str(parent)
    assert reading.limit_file == str(parent / "memory.max")


def test_v2_own_limit_binds_when_parent_is_looser(tmp_path: Path) -> None:
    """With a looser (or `max`) parent, the cgroup's own limit and usage are used."""
    parent = write(tmp_path / "cg/parent", memory_max="max", memory_current=3 * GIB)
    child = write(parent / "child", memory_max=GIB, memory_current=300 * MIB, memory_high="max")
    reading = CgroupMemoryReader(child)()
    assert (reading.limit_bytes, reading.used_bytes, reading.path) == (GIB, 300 * MIB, str(child))


def test_v2_memory_high_below_max_counts_as_the_limit(tmp_path: Path) -> None:
    """memory.high lower than memory.max is the effective limit (the kernel throttles there)."""
    cg = write(tmp_path / "cg", memory_max=2 * GIB, memory_high=GIB, memory_current=512 * MIB)
    reading = CgroupMemoryReader(cg)()
    assert reading.limit_bytes == GIB
    assert reading.limit_file == str(cg / "memory.high")
    assert reading.percent == 50.0


def test_v2_memory_high_above_max_is_ignored(tmp_path: Path) -> None:
    """memory.high above memory.max leaves memory.max in charge."""
    cg = write(tmp_path / "cg", memory_max=GIB, memory_high=2 * GIB, memory_current=MIB)
    assert CgroupMemoryReader(cg)().limit_file == str(cg / "memory.max")


def test_v2_walk_stops_at_the_mount_root(tmp_path: Path) -> None:
    """Discovery walks up to the mount point and never above it."""
    write(tmp_path / "hostfs", memory_max=MIB)  # above the mount: must be ignored
    mount = write(tmp_path / "hostfs/sys/fs/cgroup", memory_max=8 * GIB, memory_current=GIB)
    write(mount / "app.slice", memory_max="max", memory_current=GIB // 2)
    own = write(mount / "app.slice/app.service", memory_max="max", memory_current=GIB // 2)
    proc = write(tmp_path / "proc", self_cgroup="0::/app.slice/app.service")
    (tmp_path / "proc/mountinfo").write_text(
        "30 24 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    reader = CgroupMemoryReader(
        proc_self_cgroup=str(proc / "self.cgroup"),
        mountinfo=str(proc / "mountinfo"),
        hostfs=str(tmp_path / "hostfs"),
    )
    reading = reader()
    assert reader.location.v2 == (str(own), str(mount))
    assert (reading.limit_bytes, reading.path) == (8 * GIB, str(mount))


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"memory_current": "junk", "memory_max": GIB}, "usage junk"),
        ({"memory_current": -5, "memory_max": GIB}, "usage negative"),
        ({"memory_current": MIB, "memory_max": 0}, "limit 0"),
        ({"memory_current": MIB, "memory_max": "lots"}, "limit junk"),
        ({"memory_current": MIB, "memory_max": GIB, "memory_high": "?"}, "high junk"),
        ({"memory_current": MIB}, "memory.max missing"),
    ],
)
def test_v2_unusable_files_give_unavailable(
    tmp_path: Path, files: dict[str, object], why: str
) -> None:
    """Malformed or missing v2 files report available=False with the source and path."""
    cg = write(tmp_path / "cg", **files)
    reading = CgroupMemoryReader(cg)()
    assert not reading.available, why
    assert (reading.source, reading.path, reading.percent) == ("cgroup-v2", str(cg), None)


def test_v2_unusable_ancestor_gives_unavailable(tmp_path: Path) -> None:
    """An ancestor with a malformed memory.max makes the reading unavailable, not optimistic."""
    parent = write(tmp_path / "cg", memory_max="garbage", memory_current=GIB)
    child = write(parent / "child", memory_max=GIB, memory_current=MIB)
    assert not CgroupMemoryReader(child)().available


def test_v2_binding_ancestor_without_usage_gives_unavailable(tmp_path: Path) -> None:
    """A binding ancestor whose memory.current cannot be read gives available=False."""
    parent = write(tmp_path / "cg", memory_max=GIB)
    child = write(parent / "child", memory_max=4 * GIB, memory_current=MIB)
    assert not CgroupMemoryReader(child)().available


# --- cgroup v1: hierarchical limit, binding ancestor, the unlimited sentinel ---


def test_v1_hierarchical_limit_with_a_visible_binding_ancestor(tmp_path: Path) -> None:
    """A tighter hierarchical_memory_limit is found on an ancestor, whose usage is compared."""
    parent = write(
        tmp_path / "memory/parent",
        memory_limit_in_bytes=GIB,
        memory_usage_in_bytes=900 * MIB,
        memory_stat=stat(total_inactive_file=100 * MIB, total_active_file=0),
    )
    child = write(
        parent / "child",
        memory_limit_in_bytes=V1_UNLIMITED,
        memory_usage_in_bytes=200 * MIB,
        memory_stat=stat(hierarchical_memory_limit=GIB, total_inactive_file=50 * MIB),
    )
    reading = CgroupMemoryReader(child)()
    assert reading.limit_bytes == GIB
    assert reading.used_bytes == 800 * MIB
    assert reading.path == str(parent)
    assert reading.limit_file == str(parent / "memory.limit_in_bytes")


def test_v1_hierarchical_limit_without_visible_ancestor(tmp_path: Path) -> None:
    """In a container's view (no ancestor visible) the hierarchical limit still binds our usage."""
    cg = write(
        tmp_path / "cg",
        memory_limit_in_bytes=4 * GIB,
        memory_usage_in_bytes=GIB,
        memory_stat=stat(hierarchical_memory_limit=2 * GIB),
    )
    reading = CgroupMemoryReader(cg)()
    assert (reading.limit_bytes, reading.used_bytes, reading.path) == (2 * GIB, GIB, str(cg))
    assert reading.limit_file == str(cg / "memory.stat")


def test_v1_ancestor_with_unreadable_stat_falls_back_to_own_usage(tmp_path: Path) -> None:
    """A binding ancestor whose files fail leaves our own usage as the figure compared."""
    parent = write(tmp_path / "memory/parent", memory_limit_in_bytes=GIB, memory_usage_in_bytes=GIB)
    child = write(
        parent / "child",
        memory_limit_in_bytes=4 * GIB,
        memory_usage_in_bytes=100 * MIB,
        memory_stat=stat(hierarchical_memory_limit=GIB),
    )
    reading = CgroupMemoryReader(child)()
    assert (reading.limit_bytes, reading.used_bytes, reading.path) == (GIB, 100 * MIB, str(child))


def test_v1_skips_ancestors_whose_limit_does_not_match(tmp_path: Path) -> None:
    """The binding ancestor is the nearest whose own limit equals the hierarchical limit."""
    top = write(
        tmp_path / "memory/top",
        memory_limit_in_bytes=GIB,
        memory_usage_in_bytes=700 * MIB,
        memory_stat=stat(total_inactive_file=0, total_active_file=0),
    )
    middle = write(top / "middle", memory_limit_in_bytes=2 * GIB, memory_usage_in_bytes=600 * MIB)
    child = write(
        middle / "child",
        memory_limit_in_bytes=V1_UNLIMITED,
        memory_usage_in_bytes=MIB,
        memory_stat=stat(hierarchical_memory_limit=GIB),
    )
    reading = CgroupMemoryReader(child)()
    assert (reading.path, reading.used_bytes) == (str(top), 700 * MIB)


def test_v1_binding_ancestor_with_malformed_usage_is_not_used(tmp_path: Path) -> None:
    """A binding ancestor whose usage is junk is ignored in favour of our own usage."""
    parent = write(
        tmp_path / "memory/parent",
        memory_limit_in_bytes=GIB,
        memory_usage_in_bytes="junk",
        memory_stat="",
    )
    child = write(
        parent / "child",
        memory_limit_in_bytes=4 * GIB,
        memory_usage_in_bytes=5 * MIB,
        memory_stat=stat(hierarchical_memory_limit=GIB),
    )
    assert CgroupMemoryReader(child)().used_bytes == 5 * MIB


def test_v1_unlimited_sentinel_is_readable_without_a_limit(tmp_path: Path) -> None:
    """A v1 limit at or above 2**60 reads as available with no limit and no percent."""
    cg = write(tmp_path / "cg", memory_limit_in_bytes=2**60, memory_usage_in_bytes=MIB)
    reading = CgroupMemoryReader(cg)()
    assert (reading.available, reading.limit_bytes, reading.percent) == (True, None, None)
    assert reading.used_bytes == MIB


@pytest.mark.parametrize(("usage", "limit"), [("x", GIB), (MIB, "x"), (MIB, 0), (-1, GIB)])
def test_v1_malformed_pair_gives_unavailable(tmp_path: Path, usage: object, limit: object) -> None:
    """A malformed or zero v1 pair reports available=False."""
    cg = write(tmp_path / "cg", memory_usage_in_bytes=usage, memory_limit_in_bytes=limit)
    reading = CgroupMemoryReader(cg)()
    assert not reading.available
    assert reading.source == "cgroup-v1"


def test_v1_malformed_pair_in_one_location_does_not_hide_the_other(tmp_path: Path) -> None:
    """A malformed pair in <root>/memory does not hide a valid pair in <root>, and vice versa."""
    write(tmp_path / "a/memory", memory_usage_in_bytes="junk", memory_limit_in_bytes=GIB)
    write(tmp_path / "a", memory_usage_in_bytes=MIB, memory_limit_in_bytes=GIB)
    assert CgroupMemoryReader(tmp_path / "a")().used_bytes == MIB
    write(tmp_path / "b/memory", memory_usage_in_bytes=2 * MIB, memory_limit_in_bytes=GIB)
    write(tmp_path / "b", memory_usage_in_bytes=MIB, memory_limit_in_bytes=0)
    assert CgroupMemoryReader(tmp_path / "b")().used_bytes == 2 * MIB


def test_malformed_v2_does_not_hide_valid_v1(tmp_path: Path) -> None:
    """A malformed v2 pair gives way to a valid v1 pair in the same root."""
    cg = write(tmp_path / "cg", memory_current="junk", memory_max=GIB)
    write(cg, memory_usage_in_bytes=3 * MIB, memory_limit_in_bytes=GIB)
    reading = CgroupMemoryReader(cg)()
    assert (reading.source, reading.used_bytes) == ("cgroup-v1", 3 * MIB)


def test_nothing_readable_gives_unavailable(tmp_path: Path) -> None:
    """An empty directory gives available=False naming the root, and no error."""
    reading = CgroupMemoryReader(tmp_path)()
    assert reading == MemoryReading(
        used_bytes=None, limit_bytes=None, available=False, path=str(tmp_path)
    )


def test_missing_memory_stat_is_conservative(tmp_path: Path) -> None:
    """Without memory.stat nothing is subtracted, so the working set is the whole usage."""
    cg = write(tmp_path / "cg", memory_current=GIB, memory_max=2 * GIB)
    assert CgroupMemoryReader(cg)().used_bytes == GIB


def test_a_value_longer_than_the_first_buffer_is_read_whole(tmp_path: Path) -> None:
    """Value files are read with a small buffer first; one that fills it (padding no
    kernel writes) is read again whole, on the first reading and on kept descriptors."""
    padded = " " * 100 + str(GIB)
    for version in ("v1", "v2"):
        if version == "v2":
            cg = write(tmp_path / version, memory_current=padded, memory_max=2 * GIB)
        else:
            cg = write(
                tmp_path / version,
                memory_usage_in_bytes=padded,
                memory_limit_in_bytes=" " * 70 + str(2 * GIB),
            )
        reader = CgroupMemoryReader(cg)
        for _ in range(2):  # opened fresh, then re-read on the kept descriptors
            reading = reader()
            assert (reading.used_bytes, reading.limit_bytes) == (GIB, 2 * GIB), version


def test_a_value_with_more_digits_than_int_takes_is_unreadable(tmp_path: Path) -> None:
    """A usage of 5000 digits (past Python's int() limit) gives unavailable, not an error."""
    cg = write(tmp_path / "cg", memory_current="9" * 5000, memory_max=2 * GIB)
    reading = CgroupMemoryReader(cg)()
    assert (reading.available, reading.used_bytes) == (False, None)


@pytest.mark.parametrize(
    "content",
    [
        *("0\n", f"{GIB}\n", " " * 100 + str(GIB), "", "max\n", "-5\n", "+5\n", "1_000\n"),
        *("12 34\n", "\u0663\n", "9" * 5000),
    ],
)
@pytest.mark.parametrize("kept", ["regular", "cgroupfs"])
def test_a_kept_value_reads_as_parse_bytes_value_reads_it(
    tmp_path: Path, content: str, kept: str
) -> None:
    """``read_value`` is ``parse_bytes_value`` of ``read``: opened fresh, re-read on its
    kept descriptor (checked for unlinking as a regular file is, or not, as a cgroupfs
    file is not), and reopened when that descriptor fails under it."""
    path = tmp_path / "memory.current"
    path.write_text(content)
    expected = parse_bytes_value(KeptFile(str(path), VALUE_READ_SIZE).read())
    value = KeptFile(str(path), VALUE_READ_SIZE)
    assert value.read_value() == expected  # opened fresh
    if kept == "cgroupfs":
        value._check_unlinked = False
    assert value.read_value() == expected  # the kept descriptor
    os.close(value._fd)  # fails under it (EBADF): reopened
    assert value.read_value() == expected
    assert value.is_open
    value.close()


def test_working_set_is_clamped_at_zero(tmp_path: Path) -> None:
    """File cache larger than usage (an inconsistent capture) clamps the working set at 0."""
    cg = write(
        tmp_path / "cg",
        memory_current=MIB,
        memory_max=GIB,
        memory_stat=stat(inactive_file=2 * MIB, active_file=MIB),
    )
    reading = CgroupMemoryReader(cg)()
    assert (reading.used_bytes, reading.reclaimable_bytes) == (0, MIB)


# --- faults between readings, with the kept descriptors in play ---


def _healthy(reader: CgroupMemoryReader, expected: int) -> None:
    reading = reader()
    assert reading.available
    assert reading.used_bytes == expected


@pytest.mark.parametrize(
    ("fixture", "usage_file", "expected"),
    [
        ("telegraf/v2", "memory.current", 4538245120),
        ("local-firecracker-v1-hybrid", "memory.usage_in_bytes", 74948608),
    ],
    ids=["v2", "v1"],
)
@pytest.mark.parametrize("fault", ["delete", "truncate", "garbage", "replace-dir"])
def test_fault_then_recovery(
    fixture_copy: Callable[..., Path],
    fixture: str,
    usage_file: str,
    expected: int,
    fault: str,
) -> None:
    """After a fault each reading is unavailable (never raises); once repaired it recovers."""
    root = fixture_copy(fixture)
    original = (root / usage_file).read_bytes()
    reader = CgroupMemoryReader(root)
    _healthy(reader, expected)
    if fault == "delete":
        (root / usage_file).unlink()
    elif fault == "truncate":
        (root / usage_file).write_bytes(b"")
    elif fault == "garbage":
        (root / usage_file).write_bytes(b"\x00\xffnot a number\n")
    else:
        shutil.rmtree(root)
    for _ in range(3):
        assert not reader().available
    if fault == "replace-dir":
        copy_files(FIXTURES / fixture, root)
    else:
        (root / usage_file).write_bytes(original)
    _healthy(reader, expected)
    _healthy(reader, expected)


@pytest.mark.parametrize("fault", ["delete", "truncate", "garbage"])
def test_memory_stat_fault_is_conservative_then_recovers(
    fixture_copy: Callable[..., Path], fault: str
) -> None:
    """A broken memory.stat subtracts nothing (working set = usage) until it is back."""
    root = fixture_copy("telegraf/v2")
    original = (root / "memory.stat").read_bytes()
    reader = CgroupMemoryReader(root)
    _healthy(reader, 4538245120)
    if fault == "delete":
        (root / "memory.stat").unlink()
    elif fault == "truncate":
        (root / "memory.stat").write_bytes(b"")
    else:
        (root / "memory.stat").write_bytes(b"inactive_file lots\nactive_file -3\n")
    _healthy(reader, 13071106048)
    (root / "memory.stat").write_bytes(original)
    _healthy(reader, 4538245120)


def test_file_replaced_by_rename_is_reread(fixture_copy: Callable[..., Path]) -> None:
    """A file swapped for a new one (rename over it) is noticed through the kept descriptor."""
    root = fixture_copy("telegraf/v2")
    reader = CgroupMemoryReader(root)
    _healthy(reader, 4538245120)
    (root / "new").write_text("13071106048\n".replace("13071106048", str(9 * GIB)))
    os.replace(root / "new", root / "memory.current")
    _healthy(reader, 9 * GIB - 8532860928)


def test_file_first_opened_empty_is_still_watched(fixture_copy: Callable[..., Path]) -> None:
    """A file opened while empty is still re-opened when a new file replaces it."""
    root = fixture_copy("telegraf/v2")
    (root / "memory.current").write_text("")
    reader = CgroupMemoryReader(root)
    assert not reader().available
    (root / "new").write_text(str(9 * GIB))
    os.replace(root / "new", root / "memory.current")
    _healthy(reader, 9 * GIB - 8532860928)


def test_close_then_read_reopens(fixture_copy: Callable[..., Path]) -> None:
    """close() drops every descriptor; the next reading opens what it needs again."""
    root = fixture_copy("telegraf/v2")
    reader = CgroupMemoryReader(root)
    assert reader.read(pressure=True).pressure_some_avg10 == 0.0
    assert len(reader.files()) == 4
    reader.close()
    assert reader.files() == []
    _healthy(reader, 4538245120)


def test_psi_missing_or_unreadable_is_no_psi(tmp_path: Path) -> None:
    """A missing memory.pressure, or one that cannot be read, is simply no PSI."""
    cg = write(tmp_path / "cg", memory_current=MIB, memory_max=GIB)
    reader = CgroupMemoryReader(cg)
    assert reader.read(pressure=True).pressure_some_avg10 is None
    (cg / "memory.pressure").mkdir()  # reading a directory fails like EOPNOTSUPP would
    assert reader.read(pressure=True).pressure_some_avg10 is None
    assert reader.read(pressure=True).available


def test_reader_is_consistent_across_threads(fixture_copy: Callable[..., Path]) -> None:
    """Many threads reading one reader at once all get the same, correct reading."""
    reader = CgroupMemoryReader(fixture_copy("elastic-agent-system-metrics/amzn2-k8s-v1"))
    results: list[int | None] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(200):
            used = reader().used_bytes
            with lock:
                results.append(used)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [1137303552] * 1600


def test_invalid_reclaimable_raises_a_sentence() -> None:
    """An unknown reclaimable mode is a ValueError naming the setting."""
    with pytest.raises(
        ValueError, match=r"^reclaimable must be 'file' or 'inactive'; got 'all'\.$"
    ):
        CgroupMemoryReader("/nonexistent", reclaimable="all")  # type: ignore[arg-type]


@pytest.mark.parametrize("variable", ["ADMISSION_CGROUP_ROOT", "CODA_CGROUP_V2_ROOT"])
def test_read_cgroup_memory_takes_root_from_environment(
    fixture_copy: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    """Without a root argument, ADMISSION_CGROUP_ROOT (or the legacy name) names the cgroup."""
    root = fixture_copy("telegraf/v2")
    monkeypatch.delenv("ADMISSION_CGROUP_ROOT", raising=False)
    monkeypatch.setenv(variable, str(root))
    assert read_cgroup_memory().used_bytes == 4538245120
    assert read_cgroup_memory(reclaimable="inactive").used_bytes == 10135646208


def test_available_reading_matches_the_dataclass_constructor() -> None:
    """The request-path constructor sets every field exactly as MemoryReading(...) does."""
    fast = available_reading(1, 2, 3, 4, "cgroup-v1", "/p", "/p/f")
    slow = MemoryReading(
        used_bytes=1,
        limit_bytes=2,
        available=True,
        usage_bytes=3,
        reclaimable_bytes=4,
        source="cgroup-v1",
        path="/p",
        limit_file="/p/f",
    )
    assert fast == slow
    assert type(fast) is MemoryReading
    assert hash(fast) == hash(slow)
    assert pickle.loads(pickle.dumps(fast)) == slow
    assert [f.name for f in dataclasses.fields(MemoryReading)] == [
        "used_bytes",
        "limit_bytes",
        "available",
        "usage_bytes",
        "reclaimable_bytes",
        "source",
        "path",
        "limit_file",
        "pressure_some_avg10",
        "exact",
    ]
    bound = available_reading(1, 2, 1, 0, "cgroup-v1", "/p", "/p/f", exact=False)
    assert bound == dataclasses.replace(slow, usage_bytes=1, reclaimable_bytes=0, exact=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.used_bytes = 5  # type: ignore[misc]


# --- parsing /proc files ---


def test_parse_proc_cgroup_picks_unified_and_memory_lines() -> None:
    """The unified `0::` line and the v1 line naming the memory controller are picked out."""
    text = "12:cpu,cpuacct:/a\nbroken line\n4:memory,hugetlb:/m\n0::/u\n"
    assert parse_proc_cgroup(text) == ("/u", "/m")


def test_parse_mountinfo_unescapes_and_filters() -> None:
    """Only cgroup mounts are kept, with octal escapes in paths decoded."""
    text = (
        "31 30 0:26 / /sys/fs/cgroup/my\\040dir rw - cgroup2 cgroup2 rw\n"
        "32 30 0:27 /a\\134b /sys/fs/cgroup/memory rw shared:1 - cgroup cgroup rw,memory\n"
        "33 30 0:28 / /proc rw - proc proc rw\n"
        "garbage\n"
        "34 30 0:29 / /x rw -\n"
    )
    mounts = parse_mountinfo(text)
    assert [(m.root, m.mount_point, m.fstype) for m in mounts] == [
        ("/", "/sys/fs/cgroup/my dir", "cgroup2"),
        ("/a\\b", "/sys/fs/cgroup/memory", "cgroup"),
    ]
    assert "memory" in mounts[1].super_options


def test_discover_ignores_v1_mounts_without_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A v1 memory path with only non-memory v1 mounts finds nothing and falls back."""
    (tmp_path / "cgroup").write_text("3:memory:/x\n")
    (tmp_path / "mountinfo").write_text(
        "32 30 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
    )
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        location = discover_cgroup(
            proc_self_cgroup=str(tmp_path / "cgroup"),
            mountinfo=str(tmp_path / "mountinfo"),
            hostfs=str(tmp_path),
        )
    assert location.how == "fallback"
    assert location.v1 is None
    assert caplog.records == []  # discover_cgroup reports; only the reader logs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"12345\n", 12345),
        (b"  0 ", 0),
        (b"max\n", None),
        (b"-1", None),
        (b"+5", None),
        (b"1_000", None),
        ("١٢".encode(), None),
        (b"", None),
        (b"9" * 5000, None),
    ],
)
def test_parse_bytes_value_table(text: bytes, expected: int | None) -> None:
    """Only plain non-negative base-10 integers parse; `max` and junk are None, never raised."""
    assert parse_bytes_value(text) == expected


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"some avg10=1.50 avg60=0.00 avg300=0.00 total=9\nfull avg10=9.00\n", 1.5),
        (b"full avg10=9.00\nsome avg60=1.00 avg10=2.25\n", 2.25),
        (b"some avg10=oops total=1\n", None),
        (b"some avg10=250.0\n", None),
        (b"some avg60=1.0 total=3\n", None),
        (b"full avg10=1.0\n", None),
        (b"", None),
    ],
)
def test_parse_pressure_table(data: bytes, expected: float | None) -> None:
    """`some avg10` is found wherever it sits on the `some` line; junk or out of range is None."""
    assert parse_pressure_some_avg10(data) == expected


def test_v1_hierarchical_limit_in_the_unlimited_range_is_no_limit(tmp_path: Path) -> None:
    """A hierarchical limit below our own but still at the unlimited sentinel means no limit."""
    cg = write(
        tmp_path / "cg",
        memory_limit_in_bytes=2**63,
        memory_usage_in_bytes=MIB,
        memory_stat=stat(hierarchical_memory_limit=2**62),
    )
    reading = CgroupMemoryReader(cg)()
    assert (reading.available, reading.limit_bytes, reading.limit_file) == (True, None, None)


def test_read_cgroup_memory_reuses_one_reader_per_root(fixture_copy: Callable[..., Path]) -> None:
    """Repeated calls for one root share a reader (kept descriptors), and follow file changes."""
    root = fixture_copy("telegraf/v2")
    assert read_cgroup_memory(root).used_bytes == 4538245120
    (root / "memory.current").write_text(str(9 * GIB))
    assert read_cgroup_memory(str(root)).used_bytes == 9 * GIB - 8532860928


def test_read_without_pressure_leaves_psi_out(fixture_copy: Callable[..., Path]) -> None:
    """read() without pressure=True does not read memory.pressure."""
    reader = CgroupMemoryReader(fixture_copy("telegraf/v2"))
    assert reader.read().pressure_some_avg10 is None
    assert not any(path.endswith("memory.pressure") for path in reader.files())
