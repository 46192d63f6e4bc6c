"""Per-session memory groups on a real cgroup v2 kernel: a delegated subtree (the server
in a leaf, its parent giving ``+memory``), a container started through the entrypoint
recipe of docs/session-groups.md, and ``require`` where nothing is delegated.

Runs in the VM of scripts/cgroup-v2 (the ``cgroup_v2`` marker).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kits.cgroupkit import (
    DEMO,
    SESSION_GROUPS,
    Demo,
    assert_a_grouped_sessions_peak_is_reported,
    assert_only_the_offender_was_killed,
    container,
    demo,
    event,
    give_memory,
    joining,
    metric,
    offender_run,
    procs,
    session_groups_in,
    v2_group,
)
from kits.pollkit import wait_for
from kits.suitekit import MIB, ROOT

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.real_server, pytest.mark.timeout(600)]

CONTAINER_MB = 768


def run_with_events(server: Demo, base: Path) -> dict[str, Any]:
    """An :func:`offender_run`, and the OOM events of the group above the session groups
    (the container's): its own (``memory.events.local``), and counting theirs too
    (``memory.events``)."""
    run = offender_run(server, base)
    above = base.parent
    run["events_local"] = {key: event(above, key, local=True) for key in ("oom", "oom_kill")}
    run["events"] = {key: event(above, key) for key in ("oom_kill", "oom_group_kill")}
    print(run)
    return run


def assert_killed_alone_by_its_group(run: dict[str, Any]) -> None:
    """:func:`assert_only_the_offender_was_killed`, and more v2 tells: the kernel killed
    in the session's group (all of it: memory.oom.group), once; the container's own limit
    was never hit."""
    assert_only_the_offender_was_killed(run)
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
        base = group / SESSION_GROUPS
        server = Demo(joining(leaf), tmp_path / "first.log", ADMISSION_SESSION_GROUPS="auto")
        try:
            server.wait_ready()
            run = run_with_events(server, base)
            server.kill()  # the worker alone: its session groups stay behind
            # Its children exit once their pipes close; their groups are then empty.
            wait_for(
                lambda: all(not procs(base / g) for g in session_groups_in(base)),
                timeout=60,
                step=0.2,
            )
            left = session_groups_in(base)
        finally:
            server.stop()
        with demo(joining(leaf), tmp_path / "next.log", ADMISSION_SESSION_GROUPS="auto") as again:
            after_restart = session_groups_in(base)
            log = again.log()
    assert_killed_alone_by_its_group(run)
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
            with server.client(timeout=60) as client:
                limit = metric(client, "asgi_admission_memory_limit_bytes")
            run = run_with_events(server, group / SESSION_GROUPS)
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
    reported once with its group's memory.peak (source memory_group) to on_session_peak
    and the histogram, learned as exact, and its group is removed."""
    with v2_group(CONTAINER_MB, "groups_peak") as container_group:
        give_memory(container_group)
        assert_a_grouped_sessions_peak_is_reported(container_group)
