"""One waiting order across 4 real uvicorn workers sharing their ledger, in a real memory
group: WebSocket sessions (a count cap of 4) hold every slot, waiters of two classes
arrive 80 ms apart and spread over the workers, and slots are freed one at a time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect

from asgi_admission._admission.ledger.shared_ledger import read_entries, slot_held
from asgi_admission._admission.scheduling.shared_order import (
    ORDER_FILE_NAME,
    WAKE_PREFIX,
    read_waiting,
)
from kits.cgroupkit import joining, memory_group, oom_kills
from kits.processkit import Server, free_port

#: Internal on purpose: the shared ledger's and the waiting order's files are read to know
#: which worker holds each waiter and that nothing is left behind.
INTERNAL = "the shared ledger's and waiting order's files, read beside the real workers"

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

WORKERS = 4
CAPACITY = 4
SPACING_S = 0.08
#: The waiters, in the order they arrive: (name, class).
ARRIVALS = [
    ("b0", "batch"),
    ("b1", "batch"),
    ("c0", "critical"),
    ("b2", "batch"),
    ("c1", "critical"),
    ("b3", "batch"),
    ("b4", "batch"),
    ("c2", "critical"),
    ("b5", "batch"),
    ("c3", "critical"),
    ("b6", "batch"),
    ("b7", "batch"),
    ("b8", "batch"),
    ("b9", "batch"),
]
#: By class, then arrival: the order the container must admit them in.
EXPECTED = [n for n, k in ARRIVALS if k == "critical"] + [n for n, k in ARRIVALS if k == "batch"]
#: Admissions before a worker holding the container's first waiter is SIGKILLed.
BEFORE_KILL = 6


@contextlib.contextmanager
def workers(group: Path, tmp_path: Path) -> Iterator[tuple[Server, Path, Path]]:
    """``order_app`` under ``uvicorn --workers 4`` in ``group``: the server, the shared
    directory and the events file."""
    shared = tmp_path / "shm"
    events = tmp_path / "events.jsonl"
    port = free_port()
    env = {
        "ADMISSION_SHARED_DIR": str(shared),
        "ADMISSION_MAX_SESSIONS": str(CAPACITY),
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": "60",
        "ADMISSION_PRIORITY_CLASSES": "critical=90,batch=80",
        "ADMISSION_SESSION_RESERVE_MB": "16",
        "ADMISSION_SESSION_RESERVE_LEARNING": "off",
        "ADMISSION_PROBE_SESSIONS": "0",
        "ORDER_APP_EVENTS": str(events),
    }
    argv = [
        *joining(group),
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "order_app:create",
        "--app-dir",
        str(Path(__file__).parent),
        "--workers",
        str(WORKERS),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "info",
    ]
    server = Server(argv, port, env, tmp_path / "workers.log")
    try:
        deadline = time.monotonic() + 60
        while server.log_path.read_text().count("Application startup complete") < WORKERS:
            assert time.monotonic() < deadline, server.log_path.read_text()
            assert server.proc.poll() is None, server.log_path.read_text()
            time.sleep(0.1)
        server.wait_ready()
        yield server, shared, events
    finally:
        server.stop()


@dataclass
class Session:
    """One WebSocket session: its name, the worker that admitted it, its connection."""

    name: str
    pid: int
    ws: ClientConnection


async def open_session(base: str, name: str, class_name: str) -> Session:
    """A session once admitted (its handshake waits as long as the guard makes it)."""
    ws = await connect(f"{base}/{class_name}/{name}", open_timeout=None, ping_interval=None)
    hello = json.loads(await ws.recv())
    assert hello["name"] == name
    return Session(name, int(hello["pid"]), ws)


def live_waiting(shared: Path) -> dict[int, int]:
    """How many wait in each live worker, from the order file."""
    return {e.pid: e.waiting for e in read_waiting(shared) if e.alive}


async def joined(shared: Path, before: dict[int, int]) -> tuple[int, dict[int, int]]:
    """The worker in which one more request waits than ``before``, and the counts now."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = live_waiting(shared)
        grown = [pid for pid, n in now.items() if n > before.get(pid, 0)]
        if sum(now.values()) == sum(before.values()) + 1 and len(grown) == 1:
            return grown[0], now
        await asyncio.sleep(0.002)
    raise AssertionError(f"no new waiter in the order file: {before} -> {live_waiting(shared)}")


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def inversions(admitted: list[str], expected: list[str]) -> int:
    """Pairs admitted the other way round from ``expected``."""
    rank = {name: i for i, name in enumerate(expected)}
    ranks = [rank[name] for name in admitted]
    return sum(a > b for i, a in enumerate(ranks) for b in ranks[i + 1 :])


@dataclass
class Run:
    admitted: list[str]
    where: dict[str, int]
    victim: int
    lost: list[str]
    #: For each slot freed by hand: (freed in pid, admitted in pid, seconds).
    wakes: list[tuple[int, int, float]]


async def scenario(base: str, shared: Path, events: Path) -> Run:
    held = [await open_session(base, f"h{i}", "batch") for i in range(CAPACITY)]
    where: dict[str, int] = {}
    pending: dict[asyncio.Task[Session], str] = {}
    counts: dict[int, int] = {}
    for name, class_name in ARRIVALS:
        started = time.monotonic()
        pending[asyncio.create_task(open_session(base, name, class_name))] = name
        where[name], counts = await joined(shared, counts)
        await asyncio.sleep(max(0.0, SPACING_S - (time.monotonic() - started)))
    admitted: list[str] = []
    freed_by: list[tuple[str, str]] = []  # (session ended, waiter admitted)

    async def admissions(count: int) -> list[Session]:
        """The next ``count`` waiters admitted (within 5 s), then a check that nobody
        else is (capacity is back to none)."""
        sessions: list[Session] = []
        deadline = time.monotonic() + 5
        while len(sessions) < count:
            left = deadline - time.monotonic()
            done, _ = await asyncio.wait(pending, timeout=left, return_when="FIRST_COMPLETED")
            assert done, f"nobody admitted within 5 s; waiting: {sorted(pending.values())}"
            for task in done:
                pending.pop(task)
                sessions.append(task.result())
        await asyncio.sleep(0.05)
        assert not [name for task, name in pending.items() if task.done()]
        held.extend(sessions)
        # Slots freed at once are taken at once: their order among them is not defined.
        admitted.extend(sorted((s.name for s in sessions), key=EXPECTED.index))
        return sessions

    async def free_one() -> None:
        gone = held.pop(0)
        await gone.ws.close()
        (session,) = await admissions(1)
        freed_by.append((gone.name, session.name))

    for _ in range(BEFORE_KILL):
        await free_one()
    # The worker holding the container's first waiter now, killed with its waiters.
    first = next(name for name in EXPECTED if name not in admitted)
    victim = where[first]
    lost = [name for name in EXPECTED if where[name] == victim and name not in admitted]
    freed_by_death = [s for s in held if s.pid == victim]
    os.kill(victim, signal.SIGKILL)
    for task, name in list(pending.items()):
        if name in lost:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 10)  # its connection drops with the worker
            pending.pop(task)
    # The sessions it held come back as capacity: the next waiters are served without a
    # release, and none waits behind the dead worker's waiters.
    held = [s for s in held if s.pid != victim]
    await admissions(min(len(freed_by_death), len(pending)))
    while pending:
        await free_one()
    for session in held:
        await session.ws.close()
    by_name = {(e["event"], e["name"]): e for e in read_events(events)}
    wakes = []
    for ended, waiter in freed_by:
        end, admission = by_name["ended", ended], by_name["admitted", waiter]
        wakes.append((end["pid"], admission["pid"], admission["at"] - end["at"]))
    return Run(admitted, where, victim, lost, wakes)


def test_four_workers_admit_in_container_order_and_a_killed_workers_waiters_vanish(
    tmp_path: Path,
) -> None:
    """Waiters spread over 4 workers are admitted by class, then in container-wide arrival
    order, each within milliseconds of a slot freeing in another worker; a worker SIGKILLed
    with the container's first waiter leaves no phantom waiter (the others are served),
    and at quiesce the counts are zero, no live slot of the order has waiters and no wake
    socket is left."""
    with memory_group(1024, "order") as group:
        with workers(group, tmp_path) as (server, shared, events):
            base = server.base_url.replace("http://", "ws://", 1)
            run = asyncio.run(scenario(base, shared, events))
            deadline = time.monotonic() + 5
            while (counts := httpx.get(server.base_url + "/counts").json()) != [0, 0]:
                assert time.monotonic() < deadline, counts
                time.sleep(0.05)
            assert all(e.pending == 0 == e.active for e in read_entries(shared) if e.alive)
            assert [e for e in read_waiting(shared) if e.alive] == []
            assert run.victim not in {e.pid for e in read_waiting(shared)}
            # Every wake socket left belongs to a live worker's slot.
            fd = os.open(shared / ORDER_FILE_NAME, os.O_RDONLY)
            try:
                sockets = sorted(p.name for p in shared.glob(WAKE_PREFIX + "*"))
                assert all(slot_held(fd, int(n.removeprefix(WAKE_PREFIX))) for n in sockets), (
                    sockets
                )
            finally:
                os.close(fd)
        assert list(shared.glob(WAKE_PREFIX + "*")) == []  # each worker removed its own
        assert oom_kills(group) == 0
    spread = {
        pid: sum(1 for p in run.where.values() if p == pid) for pid in set(run.where.values())
    }
    expected = [name for name in EXPECTED if name not in run.lost]
    wrong = inversions(run.admitted, expected)
    cross = [s for freed, got, s in run.wakes if freed != got]
    same = [s for freed, got, s in run.wakes if freed == got]
    print(
        f"\nwaiters per worker {sorted(spread.values())}; killed {run.victim} with "
        f"{run.lost}; admitted {run.admitted}; {wrong} inversions"
    )
    for label, figures in (("another worker", cross), ("the same worker", same)):
        if figures:
            print(
                f"slot freed in {label} -> admitted: {len(figures)} wakes, median "
                f"{statistics.median(figures) * 1000:.2f} ms, max {max(figures) * 1000:.2f} ms"
            )
    assert len(spread) >= 2, spread  # the waiters were spread over the workers
    assert run.lost, run  # the victim held waiters
    assert wrong == 0, (run.admitted, expected)
    assert run.admitted == expected
    assert len(cross) >= 3, run.wakes
    # The freed watch alone (before the ring) took a quarter of a second at most, about
    # an eighth in the median.
    assert statistics.median(cross) < 0.05, cross
