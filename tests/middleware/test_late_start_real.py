"""A route whose sessions start late, in a real 512 MiB memory group under uvicorn.

Each session's child process waits 2 s before it allocates its 48 MiB (a process slow
to start, on a loaded machine): its route's probe sees the interpreter's few MiB, then
nothing for longer than a quiet spell. The probe must wait for the session's memory
to arrive before it concludes (docs/reservations.md, "Probing a route nothing is known
of"), so that what the guard learns from the first session is what a session costs,
and a burst, on a fresh service or after that session, is cut at capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kits.cgroupkit import joining, memory_group, oom_kills, working_set_bytes
from kits.processkit import Server, free_port
from kits.suitekit import MIB

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

LIMIT_MB = 512
#: The high watermark at its default, 80 %.
CEILING = LIMIT_MB * MIB * 80 // 100
HOLD_MB = 48
DELAY_S = 2.0
SESSIONS = 10
FOOTPRINT = 'asgi_admission_session_footprint_bytes{route="POST /sessions"}'
PARAMS = {"hold_mb": HOLD_MB, "delay_s": DELAY_S}


@contextlib.contextmanager
def served(group: Path, tmp_path: Path, **settings: str) -> Iterator[Server]:
    """``late_start_app`` under uvicorn inside ``group``, with ``settings``."""
    port = free_port()
    argv = [
        *joining(group),
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "late_start_app:create",
        "--app-dir",
        str(Path(__file__).parent),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    server = Server(
        argv, port, {"ADMISSION_CGROUP_ROOT": str(group), **settings}, tmp_path / "late.log"
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def learned_bytes(client: httpx.Client) -> float | None:
    """The footprint the guard learned of the route, from its metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(FOOTPRINT):
            return float(line.rsplit(" ", 1)[1])
    return None


def first_session(client: httpx.Client, group: Path) -> tuple[int, float | None]:
    """One session opened and left to start: (what it added to the working set once its
    memory was all there, the first footprint the guard learned of its route)."""
    before = working_set_bytes(group)
    opened = client.post("/sessions", params=PARAMS)
    assert opened.status_code == 201, opened.text
    opened_at = time.monotonic()
    learned = None
    while learned is None and time.monotonic() < opened_at + DELAY_S + 15:
        time.sleep(0.25)
        learned = learned_bytes(client)
    # The child's memory is all there (it started DELAY_S after the response).
    time.sleep(max(0.0, opened_at + DELAY_S + 2 - time.monotonic()))
    return working_set_bytes(group) - before, learned


async def burst(base_url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=SESSIONS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:
        return await asyncio.gather(
            *(client.post("/sessions", params=PARAMS) for _ in range(SESSIONS))
        )


@pytest.mark.parametrize("reserve_mb", [None, 4])
def test_a_late_starting_session_is_learned_whole(tmp_path: Path, reserve_mb: int | None) -> None:
    """At the defaults, and with a reserve 12x too small: the first session's probe waits
    for its late memory, the guard learns its footprint within 15 %, and a burst of ten
    after it is cut at capacity (within one) with no OOM kill."""
    settings = {} if reserve_mb is None else {"ADMISSION_SESSION_RESERVE_MB": str(reserve_mb)}
    with (
        memory_group(LIMIT_MB, "late_start") as group,
        served(group, tmp_path, **settings) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        footprint, learned = first_session(client, group)
        figures = {"footprint_mb": footprint / MIB, "learned_mb": (learned or 0) / MIB}
        print(figures)  # for the record (pytest -s)
        assert learned is not None, figures
        assert abs(learned - footprint) <= 0.15 * footprint, figures
        capacity = math.floor((CEILING - working_set_bytes(group)) / footprint)
        statuses = [r.status_code for r in asyncio.run(burst(server.base_url))]
        time.sleep(DELAY_S + 3)  # every admitted session's memory arrives
        figures |= {"capacity": capacity, "admitted": statuses.count(201)}
        figures |= {"oom_kills": oom_kills(group)}
        print(figures)
        assert figures["oom_kills"] == 0, figures
        assert capacity - 1 <= statuses.count(201) <= capacity + 1, figures


@pytest.mark.parametrize("reserve_mb", [None, 4])
def test_a_first_burst_of_late_starting_sessions_is_cut_at_capacity(
    tmp_path: Path, reserve_mb: int | None
) -> None:
    """A burst of ten on a fresh service, at the defaults and with a reserve 12x too small:
    the probe waits for its session's late memory, and the requests held for it are
    decided on it (none runs out of its wait): capacity within one, no OOM kill."""
    settings = {} if reserve_mb is None else {"ADMISSION_SESSION_RESERVE_MB": str(reserve_mb)}
    with (
        memory_group(LIMIT_MB, "late_burst") as group,
        served(group, tmp_path, **settings) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
    ):
        baseline = working_set_bytes(group)
        responses = asyncio.run(burst(server.base_url))
        time.sleep(DELAY_S + 3)  # every admitted session's memory arrives
        statuses = [r.status_code for r in responses]
        admitted = statuses.count(201)
        assert admitted >= 1, statuses
        footprint = (working_set_bytes(group) - baseline) / admitted
        capacity = math.floor((CEILING - baseline) / footprint)
        reasons = sorted(r.json()["reason"] for r in responses if r.status_code == 503)
        kills = oom_kills(group)
        figures = (
            f"{footprint / MIB:.1f} MiB each, capacity {capacity}, admitted {admitted}, "
            f"refused {reasons}, {kills} OOM kills, learned {learned_bytes(client)} bytes"
        )
        print(figures)  # for the record (pytest -s)
        assert kills == 0, figures
        assert "probing" not in reasons, figures
        assert capacity - 1 <= admitted <= capacity + 1, figures
