"""Per-session memory groups on a real cgroup v2 kernel: a delegated subtree (the server
in a leaf, its parent giving ``+memory``), a container started through the entrypoint
recipe of docs/session-groups.md, and ``require`` where nothing is delegated.

Runs in the VM of scripts/cgroup-v2 (the ``cgroup_v2`` marker).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from asgi_admission import AdmissionConfig, MemoryReading, SessionPeak, SessionWatchdog
from asgi_admission._watchdog.groups import GroupsPlace, SessionGroups
from kits.cgroupkit import (
    DEMO,
    Demo,
    container,
    demo,
    events,
    give_memory,
    joining,
    metric,
    procs,
    v2_group,
    wait_for,
)
from kits.suitekit import MIB, ROOT

INTERNAL = "a SessionGroups placed in a test's own v2 group"

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.real_server, pytest.mark.timeout(600)]

BUDGET_MB = 64
CONTAINER_MB = 768
HALTS = 'asgi_admission_sessions_halted_total{reason="memory_limit"}'


def groups_in(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def offender_run(server: Demo, base: Path) -> dict[str, Any]:
    """Three process sessions with 64 MiB budgets, one of which then asks for 1 GiB at
    once: what became of each, of the server and of the session groups in ``base``."""
    with httpx.Client(base_url=server.base_url, timeout=300) as client:
        opened = []
        for _ in range(3):
            params = {"hold_mb": 16, "budget_mb": BUDGET_MB}
            response = client.post("/processes", params=params)
            assert response.status_code == 201, response.text
            opened.append(response.json())
        while_open = groups_in(base)
        offender = opened[2]["id"]
        grown = client.post(f"/processes/{offender}/grow", params={"mb": 1024})

        def halted() -> dict[str, Any] | None:
            state: dict[str, Any] = client.get(f"/processes/{offender}").json()
            return state if state["halt"] is not None and not state["running"] else None

        ended = wait_for(halted, timeout=120)
        time.sleep(3)  # several watchdog ticks: an ended session's group is gone by then
        others = [client.get(f"/processes/{s['id']}").json() for s in opened[:2]]
        return {
            "grow_status": grown.status_code,
            "offender": ended,
            "others": [(s["running"], s["halt"]) for s in others],
            "alive": server.proc.poll() is None and client.get("/health").status_code == 200,
            "halts": metric(client, HALTS),
            "enabled": metric(client, "asgi_admission_session_groups_enabled"),
            "while_open": while_open,
            "after": groups_in(base),
            # The container's group, above the session groups.
            "events_local": events(base.parent, local=True),
            "events": events(base.parent),
        }


def assert_only_the_offender_was_killed(run: dict[str, Any]) -> None:
    assert run["enabled"] == 1.0, run
    assert len(run["while_open"]) == 3, run
    assert run["grow_status"] in (409, 410), run
    assert run["offender"]["halt"]["reason"] == "memory_limit", run
    assert run["others"] == [(True, None), (True, None)], run
    assert run["alive"], run
    assert run["halts"] == 1.0, run
    offender = run["offender"]["id"]
    assert [g for g in run["after"] if g.endswith(f"-{offender}")] == [], run
    assert len(run["after"]) == 2, run
    # The kernel killed in the session's group (all of it: memory.oom.group), once; the
    # container's own limit was never hit.
    assert (run["events_local"]["oom"], run["events_local"]["oom_kill"]) == (0, 0), run
    assert run["events"]["oom_group_kill"] == 1, run
    assert run["events"]["oom_kill"] >= 1, run


def test_in_a_delegated_subtree_only_the_offender_is_killed_and_a_dead_workers_groups_go(
    tmp_path: Path,
) -> None:
    """The server in a leaf of a 768 MiB group that gives memory to its children: its
    session groups go beside it; a session asking for 1 GiB under a 64 MiB budget is
    killed alone by the kernel (memory_limit), the others and the server live. The
    server then SIGKILLed, the next one to start removes its empty groups."""
    with v2_group(CONTAINER_MB, "groups_delegated") as group:
        give_memory(group)
        leaf = group / "server"
        leaf.mkdir()
        base = group / "asgi-admission"
        server = Demo(joining(leaf), tmp_path / "first.log", ADMISSION_SESSION_GROUPS="auto")
        try:
            server.wait_ready()
            run = offender_run(server, base)
            server.kill()  # the worker alone: its session groups stay behind
            # Its children exit once their pipes close; their groups are then empty.
            wait_for(lambda: all(not procs(base / g) for g in groups_in(base)), timeout=60)
            left = groups_in(base)
        finally:
            server.stop()
        with demo(joining(leaf), tmp_path / "next.log", ADMISSION_SESSION_GROUPS="auto") as again:
            after_restart = groups_in(base)
            log = again.log()
    print(run)
    assert_only_the_offender_was_killed(run)
    assert "session memory groups on (cgroup v2: session groups go under" in server.log()
    assert "reached the limit of its memory group" in server.log()
    assert len(left) == 2, left
    assert after_restart == [], after_restart
    assert "removed 2 empty session group(s)" in log, log


def entrypoint_recipe() -> str:
    """The entrypoint script docs/session-groups.md gives for a container on cgroup v2."""
    text = (ROOT / "docs" / "session-groups.md").read_text()
    (recipe,) = re.findall(r"```sh\n(.*?)```", text, flags=re.DOTALL)
    return str(recipe)


def test_a_container_started_through_the_entrypoint_recipe_gets_session_groups(
    tmp_path: Path,
) -> None:
    """A container's view of a 768 MiB group, the server started through the recipe of
    docs/session-groups.md: it reads the container's limit, makes its session groups
    beside its own leaf, and only the offender is killed."""
    recipe = tmp_path / "entrypoint.sh"
    recipe.write_text(entrypoint_recipe())
    with v2_group(CONTAINER_MB, "groups_recipe") as group:
        prefix = [*container(group), "sh", str(recipe)]
        with demo(prefix, tmp_path / "demo.log", ADMISSION_SESSION_GROUPS="auto") as server:
            with httpx.Client(base_url=server.base_url, timeout=60) as client:
                limit = metric(client, "asgi_admission_memory_limit_bytes")
            run = offender_run(server, group / "asgi-admission")
            in_leaf = procs(group / "server")
    print(run)
    assert limit == CONTAINER_MB * MIB
    assert server.proc.pid in in_leaf
    assert_only_the_offender_was_killed(run)
    assert "session groups go under /sys/fs/cgroup/asgi-admission" in server.log()


def test_require_where_nothing_is_delegated_fails_at_startup_saying_why(tmp_path: Path) -> None:
    """ADMISSION_SESSION_GROUPS=require in a container's view with no delegation (the
    server at the top of what it sees): the server does not start, and its log says
    what is missing."""
    log = tmp_path / "require.log"
    with v2_group(CONTAINER_MB, "groups_require") as group, log.open("wb") as out:
        env = {"PATH": "/usr/bin:/bin", "ADMISSION_SESSION_GROUPS": "require"}
        code = subprocess.run(
            [*container(group), *DEMO, "--port", "1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
            check=False,
        ).returncode
    text = log.read_text()
    assert code != 0, text
    assert (
        "ADMISSION_SESSION_GROUPS=require, but this process cannot make memory groups for its "
        "sessions: cgroup v2: the server's processes are in /sys/fs/cgroup, the top of the "
        "hierarchy it sees"
    ) in " ".join(text.split()), text


def test_a_v2_groups_memory_peak_is_the_sessions_figure() -> None:
    """A session started in a real v2 group, holding 40 MiB and ending on its own, is
    reported once with its group's memory.peak (source memory_group), learned as exact,
    and its group is removed."""
    with v2_group(CONTAINER_MB, "groups_peak") as container_group:
        give_memory(container_group)
        place = GroupsPlace("v2", str(container_group), "a test's group")
        watchdog = SessionWatchdog(
            config=AdmissionConfig(session_groups="off"),
            memory_reader=lambda: MemoryReading(
                used_bytes=100 * MIB, limit_bytes=1024 * MIB, available=True
            ),
            registry=CollectorRegistry(),
            session_groups=SessionGroups(place, mode="require"),
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
            assert child.wait(timeout=120) == 0
            kernel_peak = int((Path(group.path) / "memory.peak").read_text())
        finally:
            child.kill()
            child.wait()
        watchdog.sample_once()  # sees the process gone: the session ends
        assert not Path(group.path).exists()
    (peak,) = peaks
    assert (peak.source, peak.route, peak.halted) == ("memory_group", "POST /processes", None)
    assert peak.peak_bytes == kernel_peak
    assert 40 * MIB <= peak.peak_bytes <= BUDGET_MB * MIB, peak
    assert learned == [("POST /processes", peak.peak_bytes, True)]
