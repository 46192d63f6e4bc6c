"""The shared waiting order across real worker processes: container-wide order by class
then arrival, and a SIGKILLed worker's waiters gone with it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import statistics
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
from orderkit import order_worker

from asgi_admission._admission.ledger.ledger import CountedSession
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from asgi_admission._admission.scheduling.shared_order import read_waiting

#: Internal on purpose: the shared ledger and the shared waiting order's file, driven and
#: read below the middleware.
INTERNAL = "the shared ledger and the shared waiting order's file, below the middleware"

pytestmark = [pytest.mark.slow]

SPAWN = multiprocessing.get_context("spawn")
WORKERS = 3
LIMIT = 5
#: The container-wide arrivals: (worker, waiter, class), in this order.
ARRIVALS = [
    (0, "b1", "batch"),
    (1, "b2", "batch"),
    (2, "c1", "critical"),
    (0, "c2", "critical"),
    (1, "b3", "batch"),
    (2, "b4", "batch"),
    (1, "c3", "critical"),
    (0, "b5", "batch"),
]


class Pool:
    """The worker processes, each with its command pipe, and the admissions they report."""

    def __init__(self, directory: Path) -> None:
        self.results: Any = SPAWN.Queue()
        self.pipes: list[Connection] = []
        self.processes: list[Any] = []
        for _ in range(WORKERS):
            mine, theirs = SPAWN.Pipe()
            process = SPAWN.Process(
                target=order_worker, args=(str(directory), LIMIT, theirs, self.results)
            )
            process.start()
            self.pipes.append(mine)
            self.processes.append(process)

    def join(self, worker: int, name: str, class_name: str) -> None:
        self.pipes[worker].send(("join", name, class_name))
        assert self.pipes[worker].poll(60), f"worker {worker} did not queue {name}"
        assert self.pipes[worker].recv() == ("joined", name)

    def admitted(self) -> tuple[str, float]:
        kind, name, at = self.results.get(timeout=20)
        assert kind == "admitted"
        return name, at

    def stop(self) -> None:
        for pipe, process in zip(self.pipes, self.processes, strict=True):
            if process.is_alive():
                pipe.send(("stop",))
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[Pool]:
    workers = Pool(tmp_path / "shm")
    yield workers
    workers.stop()


def release_one(held: list[CountedSession], ledger: SharedLedger) -> float:
    """Free one slot of the capacity; when, by the clock every process shares."""
    held.pop().release()
    with ledger.locked():
        pass  # written now, not at some later section
    return time.monotonic()


def test_workers_admit_in_container_order_and_a_killed_workers_waiters_vanish(
    tmp_path: Path, pool: Pool
) -> None:
    """Slots freed one at a time go to the container's waiters by class, then arrival,
    whichever worker holds each; after a worker holding the first waiter is SIGKILLed,
    the others' waiters are served in order and no live slot is left waiting."""
    directory = tmp_path / "shm"
    ledger = SharedLedger(directory)
    with ledger.locked():
        # The capacity, all taken.
        held: list[CountedSession] = [ledger.reserve() for _ in range(LIMIT)]
    for worker, name, class_name in ARRIVALS:
        pool.join(worker, name, class_name)
    admitted = []
    latencies = []
    for _ in range(4):
        freed = release_one(held, ledger)
        name, at = pool.admitted()
        admitted.append(name)
        latencies.append(at - freed)
    assert admitted == ["c1", "c2", "c3", "b1"]
    # Worker 1 holds the container's first waiter (b2) and b3, and c3's session.
    victim = pool.processes[1].pid
    assert {e.pid for e in read_waiting(directory) if e.alive} == {p.pid for p in pool.processes}
    os.kill(victim, signal.SIGKILL)
    pool.processes[1].join(10)
    # c3's slot comes back with its worker: b4 is served without another release, b5 next.
    name, _ = pool.admitted()
    admitted.append(name)
    freed = release_one(held, ledger)
    name, at = pool.admitted()
    admitted.append(name)
    latencies.append(at - freed)
    assert admitted == ["c1", "c2", "c3", "b1", "b4", "b5"]
    assert [e for e in read_waiting(directory) if e.alive] == []
    assert victim not in {e.pid for e in read_waiting(directory)}
    print(
        f"cross-worker wake to admission over {len(latencies)} slots: median "
        f"{statistics.median(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )
    ledger.close()
