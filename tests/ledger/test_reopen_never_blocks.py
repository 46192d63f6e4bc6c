"""A worker that opens its ledger file again (after a fork or ``close``, or to follow a
deleted file) while another worker holds the lock is refused at once or after the
bounded wait, never blocked: a stopped worker must not freeze the others' event loops."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asgi_admission._admission.ledger.ledger import LOCK_WAIT_S, LedgerBusy
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, SharedLedger

#: Internal on purpose: the shared ledger's reopening, its link check and its lock.
INTERNAL = "the shared ledger's reopening, its link check and its lock"


@pytest.fixture
def directory(tmp_path: Path) -> str:
    return str(tmp_path / "ledger")


def held_elsewhere(path: str) -> int:
    """Another worker inside its critical section on the file at ``path``: its fd."""
    fd = os.open(path, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def outcome_within(seconds: float, step: Callable[[], object]) -> tuple[bool, object]:
    """``step()`` in a thread: whether it ended within ``seconds``, and what it returned
    or raised (the thread is left to end once the lock is free)."""
    result: list[object] = []

    def run() -> None:
        try:
            result.append(step())
        except Exception as exc:
            result.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), result[0] if result else None


@pytest.fixture
def ledgers() -> Iterator[list[SharedLedger]]:
    opened: list[SharedLedger] = []
    yield opened
    for ledger in opened:
        ledger.close()


def test_a_ledger_opened_again_while_another_worker_holds_the_lock_is_refused_not_blocked(
    directory: str, ledgers: list[SharedLedger]
) -> None:
    """After close (as after a fork), the next critical section opens the file again:
    tried without waiting it is refused at once, and with ``locked()`` after the
    bounded wait, while another worker holds the lock; once free it counts again."""
    ledger = SharedLedger(directory)
    ledgers.append(ledger)
    ledger.close()
    fd = held_elsewhere(os.path.join(directory, FILE_NAME))
    try:

        def attempt() -> object:
            with ledger.attempt():
                return ledger.counts()

        def locked() -> object:
            started = time.monotonic()
            try:
                with ledger.locked():
                    return ledger.counts()
            except LedgerBusy as exc:
                return exc, time.monotonic() - started

        ended, result = outcome_within(1.0, attempt)
        assert ended
        assert isinstance(result, LedgerBusy)
        ended, result = outcome_within(LOCK_WAIT_S + 2.0, locked)
        assert ended
        assert isinstance(result, tuple)
        assert isinstance(result[0], LedgerBusy)
        assert LOCK_WAIT_S * 0.9 <= result[1] < LOCK_WAIT_S + 1.0
    finally:
        os.close(fd)
    with ledger.attempt():
        assert ledger.counts() == (0, 0)


def test_following_a_deleted_file_while_another_worker_holds_the_new_one_is_refused(
    directory: str, ledgers: list[SharedLedger]
) -> None:
    """A worker whose file was deleted, moving to the new one while another worker holds
    that one's lock, is refused at once instead of blocked; once the lock is free it
    moves, and still waits for the workers of the old file to come back before it
    reserves (at most REJOIN_MAX_S), as a move that was not refused does."""
    mover, other = SharedLedger(directory), SharedLedger(directory)
    ledgers += [mover, other]
    for ledger in (mover, other):
        with ledger.locked():
            ledger.reserve()
    path = os.path.join(directory, FILE_NAME)
    os.unlink(path)
    newcomer = SharedLedger(directory)  # a worker started since: it made the new file
    ledgers.append(newcomer)
    fd = held_elsewhere(path)
    try:
        mover._next_link_check = 0.0  # its check is due: it moves at its next section

        def move() -> object:
            with mover.attempt():
                return mover.counts()

        ended, result = outcome_within(1.0, move)
        assert ended
        assert isinstance(result, LedgerBusy)
    finally:
        os.close(fd)
    with mover.attempt():
        assert mover.counts() == (0, 1)  # in the new file, with its own session only
        with pytest.raises(LedgerBusy, match="workers re-register"):
            mover.reserve()  # the other worker of the old file has not moved yet
    with other.locked():  # it follows: its check is due by now, or made due here
        pass
    other._next_link_check = 0.0
    with other.locked():
        assert other.counts() == (0, 2)
    with mover.attempt():
        mover.reserve()
        assert mover.counts() == (0, 3)
