"""The demo under ``uvicorn --workers 4``: one container-wide count, crash recovery."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from ledgerkit import Workers, burst, write_v2_tree

from asgi_admission._admission.ledger.shared_ledger import SharedLedger, read_entries
from kits.pollkit import wait_for

#: Internal on purpose: the shared ledger's file, read to check what the workers counted.
INTERNAL = "the shared ledger's file, read to check what the workers counted"

pytestmark = [pytest.mark.real_server, pytest.mark.slow]

WORKERS = 4
# Working set 100 MiB of 1000 MiB, high watermark 80%, reserve 100 MiB per pending
# session: 100 + (pending + 1) * 100 <= 800 admits while pending < 7, so K = 7.
K = 7
BURST = 28
# Long enough that the first burst's surviving sessions are still pending while the
# second burst is decided, even by a worker uvicorn restarts after the SIGKILL (whose
# imports take seconds on a loaded machine).
HOLD_S = 10.0


def serve(tmp_path: Path, name: str, *, shared_dir: Path | None) -> Workers:
    cgroup = write_v2_tree(tmp_path / f"{name}-cgroup", used_mb=100, limit_mb=1000)
    env = {
        "ADMISSION_CGROUP_ROOT": str(cgroup),
        "ADMISSION_SESSION_RESERVE_MB": "100",
        "ADMISSION_MAX_SESSIONS": "1000",
        "DEMO_SESSION_MB": "0",
        # Requests that answer after HOLD_S, longer than a probe's wait: these tests are
        # about the count, so the route is not probed first (tests/middleware/test_probing.py).
        "ADMISSION_PROBE_SESSIONS": "0",
    }
    if shared_dir is not None:
        env["ADMISSION_SHARED_DIR"] = str(shared_dir)
    server = Workers(WORKERS, env, tmp_path / f"{name}.log")
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def start_burst(pool: ThreadPoolExecutor, server: Workers, n: int) -> Future[list[int | str]]:
    return pool.submit(asyncio.run, burst(server.base_url, n, HOLD_S))


def total_pending(directory: Path) -> int:
    return sum(entry.pending for entry in read_entries(directory) if entry.alive)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def test_shared_ledger_admits_exactly_k_and_survives_a_killed_worker(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """A burst over 4 workers admits exactly K; a SIGKILLed worker's sessions free up at once."""
    shared_dir = tmp_path / "shm"
    server = serve(tmp_path, "shared", shared_dir=shared_dir)
    try:
        workers = server.worker_pids()
        assert len(workers) == WORKERS
        first = start_burst(pool, server, BURST)
        wait_for(lambda: total_pending(shared_dir) == K, 20, f"{K} pending sessions")
        # Let the refusals of the burst reach their clients before a worker dies.
        time.sleep(1.0)
        assert total_pending(shared_dir) == K
        holders = {e.pid: e.pending for e in read_entries(shared_dir) if e.pending}
        # The burst really was spread: more than one worker process admitted sessions.
        assert len(holders) > 1, holders
        assert set(holders) <= workers

        # Kill the worker holding the most admitted sessions; they must be freed by the
        # very next decisions, so a second burst admits exactly that many again.
        victim, freed = max(holders.items(), key=lambda item: item[1])
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{victim}/stat"), 10, "the worker to die")
        second = start_burst(pool, server, BURST)
        statuses = first.result(timeout=60)
        assert statuses.count(503) == BURST - K
        assert statuses.count(201) == K - freed  # the victim's clients lost their connection
        again = second.result(timeout=60)
        assert again.count(201) == freed, again
        assert again.count(503) == BURST - freed

        entries = read_entries(shared_dir)
        assert all(e.pending >= 0 and e.active >= 0 for e in entries)
        assert victim not in {e.pid for e in entries if e.pending or e.active}
        # Nothing is left pending; the sessions the workers still hold are active. Each
        # worker publishes its own count (current_sessions) from its periodic sample, so
        # the sessions stored after the last decision are counted too.
        ledger = SharedLedger(shared_dir)

        def counts() -> tuple[int, int]:
            with ledger.locked():
                return ledger.counts()

        # No pending left; the K sessions the surviving workers' apps hold (the demo
        # keeps them until deleted) count as active, container-wide: within a few
        # samples (a loaded machine runs them late).
        deadline = time.monotonic() + 5.0
        while counts() != (K, 0) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts() == (K, 0)
        ledger.close()
    finally:
        server.stop()


def test_without_the_shared_ledger_workers_over_admit(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """The contrast: each worker counts alone, so the same burst admits more than K."""
    server = serve(tmp_path, "per-worker", shared_dir=None)
    try:
        started = time.monotonic()
        statuses = start_burst(pool, server, BURST).result(timeout=60)
        assert time.monotonic() - started >= HOLD_S
    finally:
        server.stop()
    assert statuses.count(201) > K, statuses
    assert statuses.count(201) + statuses.count(503) == BURST
