"""Helpers for the ledger tests: processes driving a ledger, multi-worker servers, cgroups."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import subprocess
import sys
import time
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import httpx
import psutil

from asgi_admission._admission.ledger.ledger import CountedSession
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from kits.cgroup_trees import write_v2_tree as write_v2_tree
from kits.cgroupkit import memory_group as _memory_group
from kits.cgroupkit import oom_kills as oom_kills
from kits.processkit import free_port, stop_process_group

#: Internal on purpose: processes drive the shared ledger itself, below the middleware.
INTERNAL = "the shared ledger, driven by processes of its own"

__all__ = [
    "SPAWN",
    "Workers",
    "burst",
    "hold_sessions",
    "memory_group",
    "oom_kills",
    "random_worker",
    "release_on_a_stuck_loop",
    "write_v2_tree",
]

SPAWN = multiprocessing.get_context("spawn")


def random_worker(
    directory: str,
    seed: int,
    operations: int,
    start: Barrier,
    finish: Event,
    results: Any,
) -> None:
    """Reserve, activate and release at random, checking the counts after each step.

    Puts ``("held", active, pending, violations)`` once its operations are done,
    holds its reservations until ``finish`` is set, then releases them all and
    puts ``("released",)``.
    """
    rng = random.Random(seed)
    ledger = SharedLedger(directory)
    pending: list[CountedSession] = []
    active: list[CountedSession] = []
    violations = 0
    start.wait()
    for _ in range(operations):
        roll = rng.random()
        if roll < 0.4 or not (pending or active):
            with ledger.locked():
                pending.append(ledger.reserve())
        elif roll < 0.6 and pending:
            reservation = pending.pop(rng.randrange(len(pending)))
            reservation.activate()
            active.append(reservation)
        elif roll < 0.8 and pending:
            pending.pop(rng.randrange(len(pending))).release()
        elif active:
            reservation = active.pop(rng.randrange(len(active)))
            reservation.release()
            reservation.release()
        with ledger.locked():
            total_active, total_pending = ledger.counts()
        # Never below zero, and never less than this worker alone holds.
        if total_active < len(active) or total_pending < len(pending):
            violations += 1
    results.put(("held", len(active), len(pending), violations))
    finish.wait(60)
    for reservation in pending + active:
        reservation.release()
    ledger.close()
    results.put(("released",))


def hold_sessions(directory: str, pending: int, active: int, ready: Event) -> None:
    """Hold ``pending`` and ``active`` reservations until killed."""
    ledger = SharedLedger(directory)
    with ledger.locked():
        held = [ledger.reserve() for _ in range(pending + active)]
    for reservation in held[:active]:
        reservation.activate()
    ready.set()
    while True:
        time.sleep(1)


def release_on_a_stuck_loop(directory: str, held: int, released: int, ready: Event) -> None:
    """Reserve ``held`` sessions, release ``released`` of them on an event loop that
    then never turns again (app code stuck in a blocking call), and stay there until
    killed: the releases are made in memory, their write waits for a turn that never
    comes."""
    ledger = SharedLedger(directory)

    async def serve() -> None:
        with ledger.attempt():
            reservations = [ledger.reserve() for _ in range(held)]
        for reservation in reservations[:released]:
            reservation.release()
        ready.set()
        while True:
            time.sleep(1)  # noqa: ASYNC251 - blocks the loop on purpose: nothing runs on it

    asyncio.run(serve())


# -- real servers ----------------------------------------------------------------------


class Workers:
    """``uvicorn --workers N`` serving the demo, stopped with SIGTERM then SIGKILL."""

    def __init__(
        self, workers: int, env: dict[str, str], log: Path, *, cgroup: Path | None = None
    ) -> None:
        self.workers = workers
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "asgi_admission.demo:create_app",
            "--factory",
            "--workers",
            str(workers),
            "--port",
            str(self.port),
            "--log-level",
            "info",
        ]
        if cgroup is not None:
            # Join the group before exec, so every worker is charged to it.
            argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every worker has finished its startup and answers."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            started = self.log_path.read_text().count("Application startup complete")
            if started >= self.workers:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                        return
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log_path.read_text()}")

    def worker_pids(self) -> set[int]:
        """The worker processes (uvicorn spawns them; the resource tracker is not one)."""
        return {
            child.pid
            for child in psutil.Process(self.proc.pid).children()
            if "spawn_main" in " ".join(child.cmdline())
        }

    def stop(self) -> None:
        stop_process_group(self.proc, timeout=15)
        self._log.close()


async def burst(
    base_url: str, n: int, hold_s: float, *, stagger_s: float = 0.01
) -> list[int | str]:
    """``n`` concurrent ``POST /sessions``, each on its own connection; statuses or errors.

    The connections open ``stagger_s`` apart: workers share one listening socket,
    and the first to wake drains every connection already waiting, so an instant
    burst often lands on one worker. Staggered, idle workers race for each accept.
    All are still open together, since each is held for ``hold_s``.
    """
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:

        async def one(index: int) -> int | str:
            await asyncio.sleep(index * stagger_s)
            try:
                response = await client.post("/sessions", params={"hold_s": hold_s})
            except httpx.HTTPError as exc:
                return type(exc).__name__
            return response.status_code

        return list(await asyncio.gather(*(one(i) for i in range(n))))


def memory_group(limit_mb: int) -> contextlib.AbstractContextManager[Path]:
    """A fresh memory group for the ledger's OOM tests (see cgroupkit)."""
    return _memory_group(limit_mb, "ledger")
