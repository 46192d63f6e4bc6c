"""Per-session memory groups on this machine's real cgroup v1 hierarchy: the demo's
process sessions, served by uvicorn inside a memory group of their own.

Needs root and a writable cgroup v1 memory hierarchy (failed, not skipped, under CI=true).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from watchdogkit import FixedReader, TestClient, reading

from asgi_admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionMiddleware,
    MemoryReading,
    SessionPeak,
    SessionWatchdog,
)
from asgi_admission._watchdog.groups import GroupsPlace, SessionGroups
from kits.cgroupkit import (
    BUDGET_MB,
    SESSION_GROUPS,
    Demo,
    assert_a_grouped_sessions_peak_is_reported,
    assert_only_the_offender_was_killed,
    demo,
    holding,
    joining,
    memory_group,
    offender_run,
    procs,
    session_groups_in,
)
from kits.pollkit import wait_for
from kits.suitekit import MIB

INTERNAL = "a SessionGroups placed in a test's own memory group"

pytestmark = [pytest.mark.real_cgroup, pytest.mark.real_server, pytest.mark.timeout(180)]

#: The container: room for the server, three small sessions and a little more, far
#: less than the 1 GiB the offender asks for.
CONTAINER_MB = 768


def run_in(group: Path, tmp_path: Path, mode: str) -> tuple[dict[str, Any], list[str], str]:
    """The demo inside ``group`` (its own pid the process in it) with session groups
    ``mode``, through an :func:`offender_run` whose offender bursts (with groups off, no
    halt is waited for: the kernel may kill it first): the run, the session groups left
    once the server has shut down, and its log."""
    with demo(joining(group), tmp_path / f"{mode}.log", ADMISSION_SESSION_GROUPS=mode) as server:
        base = group / SESSION_GROUPS
        run = offender_run(server, base, burst=True, halted_by_guard=mode != "off")
    print(run)
    return run, session_groups_in(group / SESSION_GROUPS), server.log()


def test_only_the_offending_session_is_killed_inside_its_own_group(tmp_path: Path) -> None:
    """With groups on, a session asking for 1 GiB at once under a 64 MiB budget is killed
    by the kernel inside its own group: the other two sessions and the server live on, the
    halt reason is memory_limit (metrics and log), its group is gone afterwards (the
    container's group counting no OOM kill of its own), and the others' go when the
    server shuts down."""
    with memory_group(CONTAINER_MB, "groups_on") as group:
        run, after_shutdown, log = run_in(group, tmp_path, "auto")
    assert_only_the_offender_was_killed(run)
    assert after_shutdown == []
    offender_id = run["offender"]["id"]
    assert "session memory groups on (cgroup v1" in log
    assert f"Session {offender_id} (pid " in log
    assert "reached the limit of its memory group" in log


def test_with_groups_off_the_watchdog_alone_faces_the_same_burst(tmp_path: Path) -> None:
    """With groups off the same burst meets only the sampling watchdog and the
    container's limit: no session group is made and no memory_limit halt is reported
    (what the kernel and the watchdog did instead is printed, for the record)."""
    with memory_group(CONTAINER_MB, "groups_off") as group:
        run, _, log = run_in(group, tmp_path, "off")
    assert run["enabled"] == 0.0
    assert run["while_open"] == []
    assert run["halts"] == 0.0
    assert "session memory groups off (ADMISSION_SESSION_GROUPS is off)" in log


def test_a_crashed_workers_empty_groups_are_removed_and_no_group_with_processes(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed with live session groups: the next start removes its groups
    that are empty, keeps its group where a process still runs, and never touches the
    groups of another worker that is still running."""
    params = {"hold_mb": 4, "budget_mb": BUDGET_MB}
    with (
        memory_group(CONTAINER_MB, "groups_crash") as group,
        demo(joining(group), tmp_path / "other.log", ADMISSION_SESSION_GROUPS="auto") as other,
    ):
        base = group / SESSION_GROUPS
        other_session = httpx.post(f"{other.base_url}/processes", params=params).json()
        sleeper: subprocess.Popen[bytes] | None = None
        crashed_log = tmp_path / "crashed.log"
        with demo(joining(group), crashed_log, ADMISSION_SESSION_GROUPS="auto") as crashed:
            children = [
                httpx.post(f"{crashed.base_url}/processes", params=params).json()["pid"]
                for _ in range(2)
            ]
            before = session_groups_in(base)
            worker = str(crashed.proc.pid)
            crashed.kill()  # the worker alone, groups and all
        try:
            # Its children exit once their pipes close; a process of its own stays in p2's.
            kept = next(g for g in before if g.startswith(f"{worker}-") and g.endswith("-p2"))
            sleeper = subprocess.Popen([*joining(base / kept), "sleep", "600"])
            wait_for(
                lambda: sleeper is not None and sleeper.pid in procs(base / kept), 20, step=0.2
            )
            wait_for(lambda: not any(psutil.pid_exists(pid) for pid in children), 20, step=0.2)
            with demo(
                joining(group), tmp_path / "next.log", ADMISSION_SESSION_GROUPS="auto"
            ) as again:
                after = session_groups_in(base)
                log = again.log()
            other_alive = httpx.get(f"{other.base_url}/processes/{other_session['id']}").json()
        finally:
            if sleeper is not None:
                sleeper.kill()
                sleeper.wait()
    assert len(before) == 3, before
    emptied = next(g for g in before if g.startswith(f"{worker}-") and g.endswith("-p1"))
    others = [g for g in before if not g.startswith(f"{worker}-")]
    assert len(others) == 1
    assert emptied not in after
    assert kept in after  # a dead worker's group, but a process still runs in it
    assert set(others) <= set(after)  # a live worker's group is never touched
    assert other_alive["running"] is True
    assert "removed 1 empty session group(s)" in log
    assert "kept 1 that still have processes" in log


#: Runs the rest with the cgroup v1 memory hierarchy mounted read-only (a mount namespace
#: of its own), as a container without a writable cgroup filesystem sees it.
READ_ONLY = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"',
    "/sys/fs/cgroup/memory",
]


def test_require_on_a_read_only_hierarchy_fails_at_startup_naming_it(tmp_path: Path) -> None:
    """ADMISSION_SESSION_GROUPS=require where the memory hierarchy is mounted read-only:
    the server does not start, and its log names the setting and the group at fault."""
    with memory_group(CONTAINER_MB, "groups_ro_require") as group:
        server = Demo(
            [*joining(group), *READ_ONLY],
            tmp_path / "require.log",
            ADMISSION_SESSION_GROUPS="require",
        )
        try:
            code = server.proc.wait(timeout=60)
        finally:
            server.stop()
        text = server.log()
    assert code != 0, text
    assert "ADMISSION_SESSION_GROUPS=require" in text, text
    assert f"cgroup v1 memory group {group} is not writable by this process" in text, text


def test_auto_on_a_read_only_hierarchy_falls_back_and_says_so(tmp_path: Path) -> None:
    """ADMISSION_SESSION_GROUPS=auto on the same read-only hierarchy: the server starts
    and says at INFO that session groups are off and why, and the watchdog does the work."""
    with memory_group(CONTAINER_MB, "groups_ro_auto") as group:
        server = Demo(
            [*joining(group), *READ_ONLY], tmp_path / "auto.log", ADMISSION_SESSION_GROUPS="auto"
        )
        try:
            wait_for(lambda: "session memory groups off" in server.log(), timeout=30, step=0.2)
            alive = server.proc.poll() is None
        finally:
            server.stop()
        text = server.log()
    assert alive, text
    line = next(x for x in text.splitlines() if "session memory groups off" in x)
    assert line.startswith("INFO"), line
    assert f"cgroup v1 memory group {group} is not writable" in line, line
    assert "the watchdog alone enforces session budgets" in line, line


def test_a_real_groups_exact_peak_is_the_sessions_figure() -> None:
    """A session started in a real v1 group, holding 40 MiB and ending on its own, is
    reported once with its group's own peak (memory.max_usage_in_bytes, source
    memory_group) to on_session_peak, on_peak and the histogram, and its group is
    removed."""
    with memory_group(CONTAINER_MB, "groups_peak") as container:
        assert_a_grouped_sessions_peak_is_reported(container)


def test_what_is_learned_of_grouped_sessions_is_their_groups_peaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four process sessions of about 40 MiB, opened through the guard one after another
    and each started in a real v1 group of its own, while the container's working set
    (a fake reading) rises by 60 MiB at each: the footprint the guard learns of their
    route is their groups' peaks within 5 %, not the working set's rise."""
    used = [100 * MIB]

    def working_set() -> MemoryReading:
        return MemoryReading(used_bytes=used[0], limit_bytes=4096 * MIB, available=True)

    children: list[subprocess.Popen[bytes]] = []
    with memory_group(CONTAINER_MB, "groups_learn") as container:
        groups = SessionGroups(GroupsPlace("v1", str(container), "a test's group"), mode="require")
        watchdog = SessionWatchdog(
            config=AdmissionConfig(session_groups="off"),
            memory_reader=FixedReader(reading(10.0)),
            registry=CollectorRegistry(),
            session_groups=groups,
        )
        peaks: list[SessionPeak] = []
        watchdog.on_session_peak = peaks.append

        def start(request: Request) -> Response:
            n = len(children)
            group = watchdog.session_group(session_id=f"p{n}", budget_bytes=BUDGET_MB * MIB)
            assert group is not None
            children.append(subprocess.Popen(group.command(holding(40))))
            watchdog.register(
                children[-1].pid, session_id=f"p{n}", route="POST /processes", group=group
            )
            used[0] += 60 * MIB
            return Response(status_code=201)

        monkeypatch.setenv("ADMISSION_PROBE_SESSIONS", "0")
        guard = AdmissionMiddleware(
            Starlette(routes=[Route("/processes", start, methods=["POST"])]),
            session_routes=["POST /processes"],
            controller=AdmissionController(reserve_bytes=8 * MIB, memory_reader=working_set),
            watchdog=watchdog,
            registry=None,
        )
        try:
            with TestClient(guard) as client:  # its lifespan samples the working set
                for _ in range(4):
                    assert client.post("/processes").status_code == 201
                    assert children[-1].wait(timeout=30) == 0
                    time.sleep(1.5)  # the working set stays up: the window closes
                    watchdog.sample_once()  # the session ends: its group's peak is read
        finally:
            for child in children:
                child.kill()
                child.wait()
    assert [p.source for p in peaks] == ["memory_group"] * 4
    (estimate,) = guard.reservations.estimates()
    assert estimate.route == "POST /processes"
    for peak in peaks:
        assert abs(estimate.footprint_bytes - peak.peak_bytes) <= 0.05 * peak.peak_bytes
