"""Session memory groups on fixture trees: where they may go (v1, and v2 with and without
a delegated subtree), what a group is made with, and what the watchdog makes of one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from watchdogkit import FixedReader, reading

from asgi_admission import AdmissionConfig, SessionPeak, SessionWatchdog
from asgi_admission._watchdog.groups import GroupsPlace, SessionGroups, find_place
from kits.suitekit import MIB

INTERNAL = "where session groups go, and the SessionGroups that makes them"

V2_MOUNT = "0 0 0:1 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
V1_MOUNT = "0 0 0:2 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"


def _v2_tree(
    tmp_path: Path, *, parent_memory: bool = True, own: str = "/pod/server"
) -> dict[str, str]:
    """A cgroup v2 host tree under ``tmp_path``: the server in ``own``."""
    root = tmp_path / "sys/fs/cgroup"
    server = root / own.lstrip("/")
    server.mkdir(parents=True)
    (server / "cgroup.procs").write_text(f"{os.getpid()}\n")
    (server / "cgroup.subtree_control").write_text("")
    parent = server.parent
    (parent / "cgroup.subtree_control").write_text("cpu memory\n" if parent_memory else "cpu\n")
    (parent / "cgroup.procs").write_text("")
    (tmp_path / "cgroup").write_text(f"0::{own}\n")
    (tmp_path / "mountinfo").write_text(V2_MOUNT)
    return {
        "proc_self_cgroup": str(tmp_path / "cgroup"),
        "mountinfo": str(tmp_path / "mountinfo"),
        "hostfs": str(tmp_path),
    }


def test_v2_delegated_subtree_puts_groups_beside_the_server(tmp_path: Path) -> None:
    """On v2 the server's own group holds its processes, so groups go below the group
    above it, where that one gives memory to its children and lets this process in."""
    place = find_place(**_v2_tree(tmp_path))
    assert place.version == "v2"
    assert place.parent == str(tmp_path / "sys/fs/cgroup/pod")
    assert place.base == str(tmp_path / "sys/fs/cgroup/pod/asgi-admission")


def test_v2_parent_that_gives_no_memory_to_its_children_is_no_place(tmp_path: Path) -> None:
    """Without 'memory' in the parent's cgroup.subtree_control there is no delegated
    memory subtree: nothing is made, and the reason says which group lacks it."""
    place = find_place(**_v2_tree(tmp_path, parent_memory=False))
    assert place.parent is None
    assert "gives no memory controller to its children" in place.reason
    assert str(tmp_path / "sys/fs/cgroup/pod") in place.reason


def test_v2_server_at_the_top_of_its_namespace_is_never_moved(tmp_path: Path) -> None:
    """A server in the top group it sees (a container's cgroup namespace) would have to
    be moved out for groups below it: the guard does not, and says so."""
    paths = _v2_tree(tmp_path, own="/pod/server")
    (tmp_path / "cgroup").write_text("0::/\n")
    place = find_place(**paths)
    assert place.parent is None
    assert "never moves the server's processes" in place.reason


def test_v1_group_is_a_place_when_writable(tmp_path: Path) -> None:
    """On v1 the groups go below the server's own memory group."""
    own = tmp_path / "sys/fs/cgroup/memory/pod"
    own.mkdir(parents=True)
    (own / "memory.limit_in_bytes").write_text(str(512 * MIB))
    (own / "memory.use_hierarchy").write_text("1\n")
    (tmp_path / "cgroup").write_text("4:memory:/pod\n0::/\n")
    (tmp_path / "mountinfo").write_text(V1_MOUNT)
    place = find_place(
        proc_self_cgroup=str(tmp_path / "cgroup"),
        mountinfo=str(tmp_path / "mountinfo"),
        hostfs=str(tmp_path),
    )
    assert (place.version, place.parent) == ("v1", str(own))
    (own / "memory.use_hierarchy").write_text("0\n")
    flat = find_place(
        proc_self_cgroup=str(tmp_path / "cgroup"),
        mountinfo=str(tmp_path / "mountinfo"),
        hostfs=str(tmp_path),
    )
    assert flat.parent is None
    assert "memory.use_hierarchy 0" in flat.reason


def _groups(tmp_path: Path, version: str = "v2") -> SessionGroups:
    parent = tmp_path / "parent"
    parent.mkdir(exist_ok=True)
    place = GroupsPlace("v2" if version == "v2" else "v1", str(parent), "fixture")
    return SessionGroups(place, mode="auto", remove_dir=shutil.rmtree)


def test_v2_group_is_made_with_max_high_and_oom_group(tmp_path: Path) -> None:
    """A v2 session group gets memory.max = budget, memory.high a little below, and
    memory.oom.group = 1; its base gives memory to the groups below it."""
    group = _groups(tmp_path).create("p1", 64 * MIB)
    path = Path(group.path)
    assert path.parent.name == "asgi-admission"
    assert path.name == f"{os.getpid()}-1-p1"
    assert (path / "memory.max").read_text() == str(64 * MIB)
    assert (path / "memory.high").read_text() == str(60 * MIB)
    assert (path / "memory.oom.group").read_text() == "1"
    assert (path.parent / "cgroup.subtree_control").read_text() == "+memory"


def test_v1_group_is_made_with_its_limit(tmp_path: Path) -> None:
    """A v1 session group gets memory.limit_in_bytes = budget (and swap too where counted)."""
    groups = _groups(tmp_path, "v1")
    group = groups.create("s/1", 32 * MIB)
    assert Path(group.path).name == f"{os.getpid()}-1-s_1"  # no path separator in a name
    assert (Path(group.path) / "memory.limit_in_bytes").read_text() == str(32 * MIB)


def test_group_figures_come_from_the_kernels_files(tmp_path: Path) -> None:
    """OOM kills come from memory.events (v2) or memory.oom_control (v1), the peak from
    memory.peak or memory.max_usage_in_bytes; a missing peak file is None, not 0."""
    v2 = _groups(tmp_path).create("a", 8 * MIB)
    assert (v2.oom_kills(), v2.peak_bytes()) == (0, None)
    Path(v2.path, "memory.events").write_text("low 0\nhigh 3\nmax 9\noom 1\noom_kill 1\n")
    Path(v2.path, "memory.peak").write_text(f"{7 * MIB}\n")
    assert (v2.oom_kills(), v2.peak_bytes()) == (1, 7 * MIB)
    (tmp_path / "v1").mkdir()
    v1 = _groups(tmp_path / "v1", "v1").create("b", 8 * MIB)
    Path(v1.path, "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    Path(v1.path, "memory.max_usage_in_bytes").write_text(f"{5 * MIB}\n")
    assert (v1.oom_kills(), v1.peak_bytes()) == (2, 5 * MIB)


def test_command_joins_the_group_before_the_command_runs(tmp_path: Path) -> None:
    """The wrapper writes itself into cgroup.procs and then becomes the command: the pid
    written is the command's own, and a group that cannot be joined runs nothing."""
    group = _groups(tmp_path).create("p1", 8 * MIB)
    procs = Path(group.procs_file)
    procs.write_text("")
    code = "import os; print(os.getpid())"
    out = subprocess.run(
        group.command([sys.executable, "-c", code]), capture_output=True, text=True, check=True
    )
    # On a fixture tree "0" (the writer itself) stands where the kernel would put its pid.
    assert procs.read_text() == "0\n" or procs.read_text() == "0"
    assert out.stdout.strip().isdigit()
    shutil.rmtree(group.path)
    failed = subprocess.run(
        group.command([sys.executable, "-c", "print('ran')"]), capture_output=True, text=True
    )
    assert failed.returncode != 0
    assert "ran" not in failed.stdout


def test_leftovers_of_gone_workers_are_removed_only_when_empty(tmp_path: Path) -> None:
    """At start, an empty group of a worker that is gone is removed; one with processes,
    and every group of a live worker (empty or not), stays."""
    groups = _groups(tmp_path)
    base = Path(str(groups.place.base))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = os.getppid()
    layout = {
        f"{gone.pid}-1-p1": "",  # crashed worker, empty: removed
        f"{gone.pid}-2-p2": "4242\n",  # crashed worker, a process left: kept
        f"{live}-1-p1": "",  # a live worker's group about to be joined: kept
        f"{live}-2-p2": "4343\n",  # a live worker's running session: kept
    }
    for name, procs in layout.items():
        (base / name).mkdir(parents=True)
        (base / name / "cgroup.procs").write_text(procs)
    assert groups.clean_leftovers() == (1, 1)
    assert sorted(p.name for p in base.iterdir()) == sorted(list(layout)[1:])


def test_require_where_groups_cannot_be_made_fails_naming_the_setting() -> None:
    """session_groups='require' with no place for groups (here: no group of its own to
    be found) refuses to build the watchdog, naming the setting and what is missing."""
    with pytest.raises(RuntimeError) as raised:
        SessionWatchdog(
            config=AdmissionConfig(session_groups="require"),
            memory_reader=FixedReader(reading(10.0)),
            registry=None,
        )
    assert "ADMISSION_SESSION_GROUPS=require" in str(raised.value)
    assert "own memory group could not be found" in str(raised.value)


def test_bad_session_groups_value_is_refused_naming_it() -> None:
    """An unknown session_groups value is a ValueError naming the setting and its variable."""
    with pytest.raises(ValueError, match=r"session_groups \(ADMISSION_SESSION_GROUPS\)"):
        AdmissionConfig(session_groups="sometimes")  # type: ignore[arg-type]
    assert AdmissionConfig.from_env({"ADMISSION_SESSION_GROUPS": "REQUIRE"}).session_groups == (
        "require"
    )


def test_watchdog_reports_a_kill_in_the_group_as_memory_limit_with_the_exact_peak(
    tmp_path: Path,
) -> None:
    """A registered session whose group counts an OOM kill is halted with the reason
    memory_limit, counted, its group's peak (not its RSS) is the session's figure for the
    histogram and the on_session_peak hook, and its group is removed when it ends."""
    registry = CollectorRegistry()
    groups = _groups(tmp_path)
    watchdog = SessionWatchdog(
        memory_reader=FixedReader(reading(10.0)), registry=registry, session_groups=groups
    )
    peaks: list[SessionPeak] = []
    watchdog.on_session_peak = peaks.append
    learned: list[tuple[str, int, bool]] = []
    watchdog.learn_peaks_with(lambda route, peak, exact=False: learned.append((route, peak, exact)))
    assert registry.get_sample_value("asgi_admission_session_groups_enabled") == 1.0
    group = watchdog.session_group(session_id="p1", budget_bytes=64 * MIB)
    assert group is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        session = watchdog.register(
            child.pid, budget_bytes=64 * MIB, session_id="p1", route="POST /x", group=group
        )
        assert watchdog.sample_once() == ()
        Path(group.path, "memory.events").write_text("oom 1\noom_kill 1\n")
        Path(group.path, "memory.peak").write_text(f"{64 * MIB}\n")
        child.kill()
        child.wait()
        (halt,) = watchdog.sample_once()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert halt.reason == "memory_limit"
    assert halt.group_peak_bytes == 64 * MIB
    assert "memory limit of 64 MiB" in halt.message
    assert session.ended
    halted = 'asgi_admission_sessions_halted_total{reason="memory_limit"}'
    assert registry.get_sample_value(halted.split("{")[0], {"reason": "memory_limit"}) == 1.0
    assert registry.get_sample_value("asgi_admission_session_memory_bytes_sum") == 64 * MIB
    assert peaks == [
        SessionPeak(
            session_id="p1",
            route="POST /x",
            peak_bytes=64 * MIB,
            source="memory_group",
            budget_bytes=64 * MIB,
            halted="memory_limit",
        )
    ]
    assert learned == [("POST /x", 64 * MIB, True)]
    assert not Path(group.path).exists()


def test_a_group_whose_session_ends_with_processes_left_is_removed_once_they_go(
    tmp_path: Path,
) -> None:
    """Unregistering while the group still has a process keeps the group; the next tick
    after the process has gone removes it."""
    groups = _groups(tmp_path)
    watchdog = SessionWatchdog(
        memory_reader=FixedReader(reading(10.0)), registry=None, session_groups=groups
    )
    group = watchdog.session_group(session_id="p1", budget_bytes=8 * MIB)
    assert group is not None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        Path(group.procs_file).write_text(f"{child.pid}\n")
        watchdog.register(child.pid, budget_bytes=8 * MIB, group=group).unregister()
        assert Path(group.path).exists()
        assert groups.pending == (group,)
        Path(group.procs_file).write_text("")  # the kernel empties it when the process exits
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            watchdog.register(other.pid)
            watchdog.sample_once()
        finally:
            other.kill()
            other.wait()
    finally:
        child.kill()
        child.wait()
    assert not Path(group.path).exists()
    assert not groups.pending


def test_join_moves_a_session_process_and_never_the_server(tmp_path: Path) -> None:
    """join() writes the given pid to the group's cgroup.procs, and refuses the server's
    own process (or 0, which would mean the writer: the server)."""
    group = _groups(tmp_path).create("p1", 8 * MIB)
    group.join(4242)
    assert Path(group.procs_file).read_text() == "4242"
    for pid in (os.getpid(), 0):
        with pytest.raises(ValueError, match="never the server's own"):
            group.join(pid)
    assert Path(group.procs_file).read_text() == "4242"
