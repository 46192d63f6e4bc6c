"""``kits.cgroupkit`` reads each figure from its version's file, and a file it cannot use
fails the test naming that file (on small trees written here, no kernel needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kits.cgroupkit import (
    container,
    event,
    events,
    give_memory,
    oom_kills,
    peak_bytes,
    procs,
    version,
    working_set_bytes,
)
from kits.suitekit import MIB


def write(group: Path, files: dict[str, str]) -> Path:
    group.mkdir()
    for name, text in files.items():
        (group / name).write_text(text)
    return group


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return write(
        tmp_path / "v1",
        {
            "memory.limit_in_bytes": str(512 * MIB),
            "memory.usage_in_bytes": str(300 * MIB),
            "memory.max_usage_in_bytes": str(400 * MIB),
            "memory.stat": (
                f"cache 1\ntotal_inactive_file {50 * MIB}\ntotal_active_file {30 * MIB}\n"
            ),
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
            "cgroup.procs": "12\n34\n",
        },
    )


@pytest.fixture
def v2(tmp_path: Path) -> Path:
    return write(
        tmp_path / "v2",
        {
            "cgroup.controllers": "memory\n",
            "memory.max": "max\n",
            "memory.current": str(200 * MIB),
            "memory.peak": str(250 * MIB),
            "memory.stat": f"file 1\ninactive_file {20 * MIB}\nactive_file {10 * MIB}\n",
            "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 1\n",
            "memory.events.local": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
            "cgroup.procs": "",
        },
    )


def test_each_version_is_read_from_its_own_files(v1: Path, v2: Path) -> None:
    """The working set, peak, OOM kills and processes of a v1 and a v2 group."""
    assert (version(v1), version(v2)) == ("v1", "v2")
    assert (working_set_bytes(v1), working_set_bytes(v2)) == (220 * MIB, 170 * MIB)
    assert (peak_bytes(v1), peak_bytes(v2)) == (400 * MIB, 250 * MIB)
    assert (oom_kills(v1), oom_kills(v1, local=True)) == (2, 2)
    assert (oom_kills(v2), oom_kills(v2, local=True)) == (1, 0)
    assert (procs(v1), procs(v2)) == ([12, 34], [])
    assert events(v2)["oom_group_kill"] == 1
    assert (event(v2, "oom_group_kill"), event(v2, "oom", local=True)) == (1, 0)


def test_what_v1_has_not_fails_naming_the_file(v1: Path) -> None:
    """memory.events, cgroup.subtree_control and a cgroup2 container's view are v2's."""
    with pytest.raises(AssertionError, match=rf"{v1}/memory.events.local: a cgroup v1"):
        events(v1, local=True)
    with pytest.raises(AssertionError, match=rf"{v1}/memory.events: a cgroup v1"):
        event(v1, "oom_kill")
    with pytest.raises(AssertionError, match=rf"{v1}/cgroup.subtree_control: a cgroup v1"):
        give_memory(v1)
    with pytest.raises(AssertionError, match="mounts cgroup2, not this v1 group"):
        container(v1)


def test_a_missing_or_odd_file_fails_naming_it(v1: Path, v2: Path, tmp_path: Path) -> None:
    """A directory that is no memory group, a file missing, a key missing, a line or a
    number that is not one: each error names the file at fault."""
    with pytest.raises(AssertionError, match=rf"{tmp_path} is no memory group: neither"):
        version(tmp_path)
    (v2 / "memory.peak").unlink()
    with pytest.raises(AssertionError, match=rf"cannot read {v2}/memory.peak"):
        peak_bytes(v2)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\n")
    with pytest.raises(AssertionError, match=rf"{v1}/memory.oom_control has no oom_kill line"):
        oom_kills(v1)
    (v1 / "memory.stat").write_text(f"total_inactive_file {MIB}\n")
    with pytest.raises(AssertionError, match=rf"{v1}/memory.stat has no total_active_file line"):
        working_set_bytes(v1)
    (v1 / "memory.usage_in_bytes").write_text("lots\n")
    with pytest.raises(AssertionError, match=rf"{v1}/memory.usage_in_bytes holds 'lots'"):
        working_set_bytes(v1)
    (v2 / "memory.events").write_text("oom 0\noom_kill 0\n")
    with pytest.raises(AssertionError, match=rf"{v2}/memory.events has no oom_group_kill line"):
        event(v2, "oom_group_kill")
    (v2 / "memory.stat").write_text("inactive_file\n")
    with pytest.raises(AssertionError, match=rf"{v2}/memory.stat: the line 'inactive_file'"):
        working_set_bytes(v2)
