"""A change made on an event loop (an activation, a release) is written by the worker's
next critical section or when its loop next turns, never lost, and never counted low."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import signal
from pathlib import Path

import pytest
from ledgerkit import SPAWN, release_on_a_stuck_loop

from asgi_admission._admission.ledger import shared_ledger
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, SharedLedger, read_entries

#: Internal on purpose: the shared ledger's file, read between a change and its write.
INTERNAL = "the shared ledger's file, read between a change and its write"


@pytest.fixture
def directory(tmp_path: Path) -> str:
    return str(tmp_path / "ledger")


def written(directory: str) -> tuple[int, int]:
    """Slot 0's row as the file holds it, (pending, active): the ledger under test's,
    whose first critical section comes before the other's in every test here."""
    [row] = [(e.pending, e.active) for e in read_entries(directory) if e.slot == 0]
    return row


def test_a_release_on_the_loop_is_written_when_the_loop_turns(directory: str) -> None:
    """Releases made on a loop cost no critical section of their own: the file has them
    once the loop turns, with no decision in between, and the other workers count them."""
    ledger, other = SharedLedger(directory), SharedLedger(directory)

    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        with ledger.attempt():
            first, second = ledger.reserve(), ledger.reserve()
        second.activate()
        first.release()
        second.release()
        before = written(directory)
        await asyncio.sleep(0)
        return before, written(directory)

    try:
        before, after = asyncio.run(scenario())
        assert before == (2, 0)  # in memory only, until the loop turned
        assert after == (0, 0)
        with other.locked():
            assert other.counts() == (0, 0)
    finally:
        ledger.close()
        other.close()


def test_a_release_before_the_next_decision_is_written_by_that_decision(directory: str) -> None:
    """A decision made before the loop turns writes the release first: the other workers
    see it as soon as that decision's critical section ends."""
    ledger, other = SharedLedger(directory), SharedLedger(directory)

    async def scenario() -> tuple[int, int]:
        with ledger.attempt():
            first, _ = ledger.reserve(), ledger.reserve()
        first.release()
        with ledger.attempt():
            assert ledger.counts() == (0, 1)
        return written(directory)  # no await since the release

    try:
        assert asyncio.run(scenario()) == (1, 0)
        with other.locked():
            assert other.counts() == (0, 1)
    finally:
        ledger.close()
        other.close()


def test_a_release_while_another_worker_holds_the_lock_is_written_by_the_heartbeat(
    directory: str,
) -> None:
    """When the loop's turn finds the ledger held by another worker, the release stays
    counted (high, never low) and the heartbeat writes it once the lock is free."""
    ledger = SharedLedger(directory)

    async def scenario() -> list[tuple[int, int]]:
        with ledger.attempt():
            reservation = ledger.reserve()
        fd = os.open(os.path.join(directory, FILE_NAME), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another worker inside its critical section
            reservation.release()
            await asyncio.sleep(0)  # the turn's write finds the lock taken
            rows = [written(directory)]
        finally:
            os.close(fd)
        await asyncio.sleep(3 * shared_ledger.HEARTBEAT_S)
        return [*rows, written(directory)]

    try:
        assert asyncio.run(scenario()) == [(1, 0), (0, 0)]
    finally:
        ledger.close()


def test_a_release_whose_loop_stopped_before_turning_is_written_by_the_next_section(
    directory: str,
) -> None:
    """A loop that stops with the write still scheduled drops it; the release is still
    counted in memory, and the worker's next critical section writes it."""
    ledger, other = SharedLedger(directory), SharedLedger(directory)
    loop = asyncio.new_event_loop()

    async def release_and_stop() -> None:
        with ledger.attempt():
            reservation = ledger.reserve()
        reservation.release()
        loop.stop()  # this turn is the last: the write scheduled for the next is dropped

    try:
        task = loop.create_task(release_and_stop())
        loop.run_forever()
        assert task.done()
        loop.close()
        assert written(directory) == (1, 0)
        with other.locked():
            assert other.counts() == (0, 1)  # high, never low
        with ledger.locked():
            assert ledger.counts() == (0, 0)
        assert written(directory) == (0, 0)
    finally:
        ledger.close()
        other.close()


def test_a_killed_worker_whose_releases_were_never_written_is_recovered(
    directory: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker killed (SIGKILL) on a loop that never turned after its releases was
    counted high meanwhile, with the sessions as last written, and the next decision
    releases its whole slot: nothing it held stays counted."""
    ledger = SharedLedger(directory)
    ready = SPAWN.Event()
    worker = SPAWN.Process(target=release_on_a_stuck_loop, args=(directory, 3, 2, ready))
    worker.start()
    try:
        assert ready.wait(30)
        with ledger.locked():
            assert ledger.counts() == (0, 3)  # 1 held, 2 released but not yet written
    finally:
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
    try:
        with caplog.at_level(logging.WARNING, logger="asgi_admission"), ledger.locked():
            assert ledger.counts() == (0, 0)
        assert f"worker pid {worker.pid} exited holding 3 pending" in caplog.text
        assert [e.pid for e in read_entries(directory)] == [os.getpid()]
    finally:
        ledger.close()
