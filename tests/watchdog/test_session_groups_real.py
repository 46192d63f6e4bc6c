"""Per-session memory groups on this machine's real cgroup v1 hierarchy: the demo's
process sessions, served by uvicorn inside a memory group of their own.

Needs root and a writable cgroup v1 memory hierarchy (failed, not skipped, under CI=true).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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
from kits.cgroupkit import joining, memory_group, oom_kills
from kits.processkit import Server, free_port
from kits.suitekit import MIB

INTERNAL = "a SessionGroups placed in a test's own memory group"

pytestmark = [pytest.mark.real_cgroup, pytest.mark.real_server, pytest.mark.timeout(180)]

BUDGET_MB = 64
#: The container: room for the server, three small sessions and a little more, far
#: less than the 1 GiB the offender asks for.
CONTAINER_MB = 768


@contextlib.contextmanager
def demo(group: Path, tmp_path: Path, name: str, **env: str) -> Iterator[Server]:
    """The demo served by uvicorn inside ``group`` (its own pid the process in it)."""
    port = free_port()
    argv = [*joining(group), sys.executable, "-m", "asgi_admission.cli", "demo", "--port"]
    server = Server(
        [*argv, str(port)],
        port,
        {"DEMO_SESSION_MB": "0", "ADMISSION_SHARED_DIR": "off", **env},
        tmp_path / f"{name}.log",
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _wait(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def _metric(client: httpx.Client, line_start: str) -> float | None:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    return None


def _session_groups(group: Path) -> list[str]:
    base = group / "asgi-admission"
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def _offender_run(group: Path, tmp_path: Path, mode: str) -> dict[str, Any]:
    """Three 64 MiB-budget process sessions, one of which then asks for 1 GiB at once:
    what became of each, of the server, and of the groups (also after it shut down)."""
    with (
        demo(group, tmp_path, mode, ADMISSION_SESSION_GROUPS=mode) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        opened = []
        for burst in (False, False, True):
            params = {"hold_mb": 16, "budget_mb": BUDGET_MB, "burst": int(burst)}
            response = client.post("/processes", params=params)
            assert response.status_code == 201, response.text
            opened.append(response.json())
        groups_while_open = _session_groups(group)
        offender = opened[2]["id"]
        grown = client.post(f"/processes/{offender}/grow", params={"mb": 1024})
        ended = (
            _wait(
                lambda: (
                    (b := client.get(f"/processes/{offender}").json())["halt"] is not None
                    and not b["running"]
                    and b
                )
            )
            or client.get(f"/processes/{offender}").json()
        )
        time.sleep(1.5)  # three watchdog ticks: an ended session's group is gone by then
        states = [client.get(f"/processes/{s['id']}").json() for s in opened]
        run = {
            "grow_status": grown.status_code,
            "offender": ended,
            "others_running": [s["running"] for s in states[:2]],
            "others_halted": [s["halt"] for s in states[:2]],
            "server_alive": server.proc.poll() is None and client.get("/health").status_code == 200,
            "memory_limit_halts": _metric(
                client, 'asgi_admission_sessions_halted_total{reason="memory_limit"}'
            ),
            "groups_enabled": _metric(client, "asgi_admission_session_groups_enabled"),
            "groups_while_open": groups_while_open,
            "groups_after": _session_groups(group),
            "container_oom_kills": oom_kills(group),
        }
    # The server has shut down: it ended the live sessions, and their groups went too.
    run["groups_after_shutdown"] = _session_groups(group)
    run["log"] = server.log_path.read_text()
    return run


def test_only_the_offending_session_is_killed_inside_its_own_group(tmp_path: Path) -> None:
    """With groups on, a session asking for 1 GiB at once under a 64 MiB budget is killed
    by the kernel inside its own group: the other two sessions and the server live on, the
    halt reason is memory_limit (metrics and log), its group is gone afterwards, and the
    others' go when the server shuts down."""
    with memory_group(CONTAINER_MB, "groups_on") as group:
        run = _offender_run(group, tmp_path, "auto")
    print({k: v for k, v in run.items() if k != "log"})
    assert run["groups_enabled"] == 1.0
    assert len(run["groups_while_open"]) == 3, run["groups_while_open"]
    assert run["grow_status"] in (409, 410)
    assert run["offender"]["halt"]["reason"] == "memory_limit", run["offender"]
    assert run["offender"]["running"] is False
    assert run["others_running"] == [True, True]
    assert run["others_halted"] == [None, None]
    assert run["server_alive"]
    assert run["memory_limit_halts"] == 1.0
    # The kill was the session group's own: the container's group counted none.
    assert run["container_oom_kills"] == 0
    offender_id = run["offender"]["id"]
    assert [g for g in run["groups_after"] if g.endswith(f"-{offender_id}")] == []
    assert len(run["groups_after"]) == 2, run["groups_after"]
    assert run["groups_after_shutdown"] == []
    assert "session memory groups on (cgroup v1" in run["log"]
    assert f"Session {offender_id} (pid " in run["log"]
    assert "reached the limit of its memory group" in run["log"]


def test_with_groups_off_the_watchdog_alone_faces_the_same_burst(tmp_path: Path) -> None:
    """With groups off the same burst meets only the sampling watchdog and the
    container's limit: no session group is made and no memory_limit halt is reported
    (what the kernel and the watchdog did instead is printed, for the record)."""
    with memory_group(CONTAINER_MB, "groups_off") as group:
        run = _offender_run(group, tmp_path, "off")
    print({k: v for k, v in run.items() if k != "log"})
    assert run["groups_enabled"] == 0.0
    assert run["groups_while_open"] == []
    assert run["memory_limit_halts"] == 0.0
    assert "session memory groups off (ADMISSION_SESSION_GROUPS is off)" in run["log"]


def test_a_crashed_workers_empty_groups_are_removed_and_no_group_with_processes(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed with live session groups: the next start removes its groups
    that are empty, keeps its group where a process still runs, and never touches the
    groups of another worker that is still running."""
    params = {"hold_mb": 4, "budget_mb": BUDGET_MB}
    with (
        memory_group(CONTAINER_MB, "groups_crash") as group,
        demo(group, tmp_path, "other", ADMISSION_SESSION_GROUPS="auto") as other,
    ):
        other_session = httpx.post(f"{other.base_url}/processes", params=params).json()
        sleeper: subprocess.Popen[bytes] | None = None
        with demo(group, tmp_path, "crashed", ADMISSION_SESSION_GROUPS="auto") as crashed:
            children = [
                httpx.post(f"{crashed.base_url}/processes", params=params).json()["pid"]
                for _ in range(2)
            ]
            before = _session_groups(group)
            worker = str(crashed.proc.pid)
            os.kill(crashed.proc.pid, signal.SIGKILL)  # the worker alone, groups and all
            crashed.proc.wait(timeout=10)
        try:
            # Its children exit once their pipes close; a process of its own stays in p2's.
            kept = next(g for g in before if g.startswith(f"{worker}-") and g.endswith("-p2"))
            sleeper = subprocess.Popen([*joining(group / "asgi-admission" / kept), "sleep", "600"])
            assert _wait(lambda: str(sleeper.pid) in _procs(group / "asgi-admission" / kept))
            assert _wait(lambda: not any(psutil.pid_exists(pid) for pid in children))
            with demo(group, tmp_path, "next", ADMISSION_SESSION_GROUPS="auto") as again:
                after = _session_groups(group)
                log = again.log_path.read_text()
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


def _procs(group: Path) -> list[str]:
    return (group / "cgroup.procs").read_text().split()


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


def _read_only_demo(group: Path, tmp_path: Path, mode: str) -> tuple[subprocess.Popen[bytes], Path]:
    port = free_port()
    log = tmp_path / f"read-only-{mode}.log"
    argv = [*joining(group), *READ_ONLY, sys.executable, "-m", "asgi_admission.cli", "demo"]
    env = {**os.environ, "ADMISSION_SESSION_GROUPS": mode, "DEMO_SESSION_MB": "0"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*argv, "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return proc, log


def test_require_on_a_read_only_hierarchy_fails_at_startup_naming_it(tmp_path: Path) -> None:
    """ADMISSION_SESSION_GROUPS=require where the memory hierarchy is mounted read-only:
    the server does not start, and its log names the setting and the group at fault."""
    with memory_group(CONTAINER_MB, "groups_ro_require") as group:
        proc, log = _read_only_demo(group, tmp_path, "require")
        try:
            code = proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        text = log.read_text()
    assert code != 0, text
    assert "ADMISSION_SESSION_GROUPS=require" in text, text
    assert f"cgroup v1 memory group {group} is not writable by this process" in text, text


def test_auto_on_a_read_only_hierarchy_falls_back_and_says_so(tmp_path: Path) -> None:
    """ADMISSION_SESSION_GROUPS=auto on the same read-only hierarchy: the server starts
    and says at INFO that session groups are off and why, and the watchdog does the work."""
    with memory_group(CONTAINER_MB, "groups_ro_auto") as group:
        proc, log = _read_only_demo(group, tmp_path, "auto")
        try:
            said = _wait(lambda: "session memory groups off" in log.read_text(), timeout=30)
            alive = proc.poll() is None
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        text = log.read_text()
    assert said, text
    assert alive, text
    line = next(x for x in text.splitlines() if "session memory groups off" in x)
    assert line.startswith("INFO"), line
    assert f"cgroup v1 memory group {group} is not writable" in line, line
    assert "the watchdog alone enforces session budgets" in line, line


def test_a_real_groups_exact_peak_is_the_sessions_figure(tmp_path: Path) -> None:
    """A session started in a real v1 group, holding 40 MiB and ending on its own, is
    reported once with its group's own peak (source memory_group) to on_session_peak,
    on_peak and the histogram, and its group is removed."""
    with memory_group(CONTAINER_MB, "groups_peak") as container:
        groups = SessionGroups(GroupsPlace("v1", str(container), "a test's group"), mode="require")
        registry = CollectorRegistry()
        watchdog = SessionWatchdog(
            config=AdmissionConfig(session_groups="off"),
            memory_reader=FixedReader(reading(10.0)),
            registry=registry,
            session_groups=groups,
        )
        peaks: list[SessionPeak] = []
        learned: list[tuple[str, int, bool]] = []
        watchdog.on_session_peak = peaks.append
        watchdog.learn_peaks_with(
            lambda route, peak, exact=False: learned.append((route, peak, exact))
        )
        group = watchdog.session_group(session_id="p1", budget_bytes=BUDGET_MB * MIB)
        assert group is not None
        code = "import time; b = bytearray(40 << 20); b[::4096] = b'1' * (10 << 10); time.sleep(1)"
        child = subprocess.Popen(group.command([sys.executable, "-c", code]))
        try:
            watchdog.register(child.pid, session_id="p1", route="POST /processes", group=group)
            assert str(child.pid) in _wait(lambda: _procs(Path(group.path)))
            assert child.wait(timeout=30) == 0
        finally:
            child.kill()
            child.wait()
        watchdog.sample_once()  # sees the process gone: the session ends
        assert not Path(group.path).exists()
    (peak,) = peaks
    assert (peak.source, peak.route, peak.halted) == ("memory_group", "POST /processes", None)
    assert 40 * MIB <= peak.peak_bytes <= BUDGET_MB * MIB, peak
    assert learned == [("POST /processes", peak.peak_bytes, True)]
    assert registry.get_sample_value("asgi_admission_session_memory_bytes_sum") == (peak.peak_bytes)


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

    code = "import time; b = bytearray(40 << 20); b[::4096] = b'1' * (10 << 10); time.sleep(1)"
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
            children.append(subprocess.Popen(group.command([sys.executable, "-c", code])))
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
