"""The shared ledger in one process: counting, recovery, tampering and configuration."""

from __future__ import annotations

import errno
import logging
import os
import signal
import struct
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ledgerkit import SPAWN, hold_sessions, write_v2_tree

from asgi_admission import AdmissionConfig, AdmissionMiddleware, AdmissionTicket
from asgi_admission._admission.ledger import (
    shared_ledger,
)
from asgi_admission._admission.ledger.ledger import InProcessLedger, LedgerBusy, LedgerUnavailable
from asgi_admission._admission.ledger.shared_ledger import (
    FILE_NAME,
    LedgerEntry,
    SharedLedger,
    process_start_time,
    read_entries,
)
from kits.suitekit import LEDGER_HEADER, LEDGER_SLOT

#: Internal on purpose: the shared ledger's file format, locks and recovery.
INTERNAL = "the shared ledger's file format, locks and recovery"


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[str, list[SharedLedger]]]:
    """A ledger directory and a list whose ledgers are closed after the test."""
    opened: list[SharedLedger] = []
    yield str(tmp_path / "ledger"), opened
    for ledger in opened:
        ledger.close()


def open_ledger(shared: tuple[str, list[SharedLedger]], **options: int) -> SharedLedger:
    ledger = SharedLedger(shared[0], **options)
    shared[1].append(ledger)
    return ledger


def counts(ledger: SharedLedger) -> tuple[int, int]:
    with ledger.locked():
        return ledger.counts()


def guards_over(
    tmp_path: Path, shared_dir: str, max_sessions: int, *options: dict[str, Any]
) -> list[AdmissionMiddleware]:
    """One middleware per ``options`` over one shared ledger: workers of one container.

    They read a v2 tree far from any limit; their app is never called (the tests
    drive ``service.admit`` directly).
    """
    cgroup = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=4096)
    # No probing: the tests decide one session after another, synchronously.
    config = AdmissionConfig(
        shared_dir=shared_dir, cgroup_root=str(cgroup), max_sessions=max_sessions, probe_sessions=0
    )

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("not called")

    return [
        AdmissionMiddleware(app, session_routes=["POST /s"], config=config, registry=None, **each)
        for each in options
    ]


def poke(directory: str, offset: int, data: bytes) -> None:
    """Write into the ledger file behind the ledgers' backs."""
    with open(os.path.join(directory, FILE_NAME), "r+b") as file:
        file.seek(offset)
        file.write(data)


def test_two_ledgers_see_each_others_reservations(
    shared: tuple[str, list[SharedLedger]],
) -> None:
    """Reservations in one ledger are counted by another on the same directory."""
    first, second = open_ledger(shared), open_ledger(shared)
    with first.locked():
        one = first.reserve()
        two = first.reserve()
    with second.locked():
        three = second.reserve()
    assert counts(first) == counts(second) == (0, 3)
    one.activate()
    one.activate()
    assert counts(second) == (1, 2)
    one.release()
    one.release()
    one.activate()
    two.release()
    two.activate()
    assert counts(second) == (0, 1)
    three.activate()
    three.release()
    assert counts(first) == (0, 0)


def test_threads_release_from_anywhere_with_exact_totals(
    shared: tuple[str, list[SharedLedger]],
) -> None:
    """Threads reserving and releasing through two ledgers leave the totals exact."""
    ledgers = [open_ledger(shared), open_ledger(shared)]
    kept: list[object] = []
    kept_lock = threading.Lock()

    def work(ledger: SharedLedger) -> None:
        for i in range(300):
            with ledger.locked():
                reservation = ledger.reserve()
            if i % 3 == 0:
                reservation.activate()
            if i % 5 == 0:
                with kept_lock:
                    kept.append(reservation)
            else:
                reservation.release()

    threads = [threading.Thread(target=work, args=(ledgers[i % 2],)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Of each thread's 300, every 5th is kept; every 15th of those was activated.
    assert counts(ledgers[0]) == (6 * 20, 6 * 40)


def test_killed_worker_is_recovered_by_the_next_decision(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """A worker killed with SIGKILL stops counting at the next decision, never below zero."""
    ledger = open_ledger(shared)
    with ledger.locked():
        mine = ledger.reserve()
    ready = SPAWN.Event()
    worker = SPAWN.Process(target=hold_sessions, args=(shared[0], 3, 2, ready))
    worker.start()
    try:
        assert worker.pid is not None  # set by start()
        assert ready.wait(30)
        assert counts(ledger) == (2, 4)
        [entry] = [e for e in read_entries(shared[0]) if e.pid == worker.pid]
        assert entry == LedgerEntry(entry.slot, worker.pid, entry.start_time, 3, 2, True)
        assert entry.start_time == process_start_time(worker.pid)
    finally:
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(ledger) == (0, 1)
    assert f"worker pid {worker.pid} exited holding 3 pending and 2 active" in caplog.text
    mine.release()
    assert counts(ledger) == (0, 0)
    assert [e.pid for e in read_entries(shared[0])] == [os.getpid()]


def test_a_killed_workers_sessions_stop_counting_against_the_cap(
    shared: tuple[str, list[SharedLedger]], tmp_path: Path
) -> None:
    """A guard at its cap because of another worker's sessions admits again once that
    worker is killed: its next decision recovers the dead worker's counts."""
    ledger = open_ledger(shared)
    [guard] = guards_over(tmp_path, shared[0], 3, {})
    ready = SPAWN.Event()
    worker = SPAWN.Process(target=hold_sessions, args=(shared[0], 2, 1, ready))
    worker.start()
    try:
        assert ready.wait(30)
        with ledger.locked():
            assert ledger.counts() == (1, 2)
        refused = guard.service.admit("http")  # 3 of 3 held by the live worker
        assert isinstance(refused, tuple)
        assert refused[0].reason == "session_limit"
    finally:
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        worker.join()
    admitted = guard.service.admit("http")
    assert isinstance(admitted, AdmissionTicket)
    with ledger.locked():  # recovered for every worker
        assert ledger.counts() == (0, 1)
    admitted.release()


def dead_worker_in_slot_1(
    shared: tuple[str, list[SharedLedger]], pending: int, active: int
) -> None:
    """A worker (pid 999999) that died holding sessions in slot 1: its slot's lock is free."""
    gone = open_ledger(shared)
    with gone.locked():  # claims slot 1 (slot 0 is taken): the header counts two in use
        gone.counts()
    gone.close()
    poke(
        shared[0],
        LEDGER_HEADER.size + LEDGER_SLOT.size,
        LEDGER_SLOT.pack(999_999, 1, pending, active),
    )


def test_high_counts_take_a_dead_workers_sessions_in_until_a_count_that_asks(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """``counts(high=True)`` adds the other slots' sessions without asking whether their
    workers live, never below the exact counts; an exact count recovers the dead one's."""
    ledger = open_ledger(shared)
    with ledger.locked():
        ledger.reserve()
    dead_worker_in_slot_1(shared, 4, 1)
    with ledger.locked():
        assert ledger.counts(high=True) == (1, 5)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(ledger) == (0, 1)
    assert "worker pid 999999 exited holding 4 pending and 1 active" in caplog.text
    with ledger.locked():
        assert ledger.counts(high=True) == (0, 1)


def test_a_decision_asks_whether_the_workers_live_only_where_they_could_refuse_it(
    shared: tuple[str, list[SharedLedger]], tmp_path: Path
) -> None:
    """A decision the bound admits with a dead worker's session counted leaves that session
    for a count that asks (counting it could only refuse); one it would refuse asks, and
    admits as the exact counts do."""
    [guard] = guards_over(tmp_path, shared[0], 4, {})
    # The first decision reads memory in full, the second reads the bound: from the
    # third on, the bound is in use.
    tickets = [guard.service.admit("http"), guard.service.admit("http")]
    dead_worker_in_slot_1(shared, 1, 0)
    tickets.append(guard.service.admit("http"))  # 3 pending with the dead one's: under 4
    assert [(e.pid, e.alive) for e in read_entries(shared[0]) if e.slot == 1] == [(999_999, False)]
    tickets.append(guard.service.admit("http"))  # 4 with it: the exact count recovers it
    assert all(isinstance(ticket, AdmissionTicket) for ticket in tickets)
    assert 999_999 not in {e.pid for e in read_entries(shared[0])}
    for ticket in tickets:
        assert isinstance(ticket, AdmissionTicket)
        ticket.release()


def test_dead_slot_is_recovered_when_claimed(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """A new worker taking a dead worker's slot drops the counts it left behind."""
    directory = shared[0]
    SharedLedger(directory).close()
    poke(directory, LEDGER_HEADER.size, LEDGER_SLOT.pack(999_999, 1, 4, 1))
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        ledger = open_ledger(shared)
        assert counts(ledger) == (0, 0)
    assert "worker pid 999999 exited holding 4 pending and 1 active" in caplog.text
    assert [(e.slot, e.pid) for e in read_entries(directory)] == [(0, os.getpid())]


def test_fork_child_counts_in_its_own_slot(shared: tuple[str, list[SharedLedger]]) -> None:
    """A ledger built before a fork gives the child its own slot, lock and empty counts."""
    ledger = open_ledger(shared)
    with ledger.locked():
        inherited = ledger.reserve()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            inherited.release()  # the parent's reservation: not the child's to release
            with ledger.locked():
                before = ledger.counts()
                ledger.reserve()
                after = ledger.counts()
            os.write(write, repr((before, after)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = pipe.read()
    os.waitpid(pid, 0)
    assert report == repr(((0, 1), (0, 2)))
    # The child exited holding one reservation; the next decision drops it.
    assert counts(ledger) == (0, 1)
    inherited.release()
    assert counts(ledger) == (0, 0)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ((0, b"NOTALEDG"), "no ledger header"),
        ((8, struct.pack("=I", 7)), "7 slots where 256 were expected"),
        ((12, struct.pack("=I", 9999)), "9999 slots in use of 256"),
    ],
)
def test_corrupt_header_is_rebuilt_with_a_warning(
    shared: tuple[str, list[SharedLedger]],
    caplog: pytest.LogCaptureFixture,
    damage: tuple[int, bytes],
    problem: str,
) -> None:
    """A damaged header is rebuilt on the next decision, which still answers."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with ledger.locked():
        reservation = ledger.reserve()
    with other.locked():
        other.reserve()
    poke(shared[0], *damage)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(ledger) == (0, 1)
    assert problem in caplog.text
    assert "rebuilding" in caplog.text
    # The other worker writes its slot back at its next decision.
    assert counts(other) == (0, 2)
    assert counts(ledger) == (0, 2)
    reservation.release()
    assert counts(other) == (0, 1)


def test_truncated_file_is_rebuilt_not_crashed(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """A file cut short under running workers is rebuilt and counting goes on."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with other.locked():
        other.reserve()
    with ledger.locked():
        ledger.reserve()
    os.truncate(os.path.join(shared[0], FILE_NAME), LEDGER_HEADER.size + 8)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(ledger) == (0, 1)
    assert "shorter than its 2 slots in use" in caplog.text
    assert counts(other) == (0, 2)


def test_file_cut_to_nothing_is_rebuilt_not_read_as_the_others_idle(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """A file truncated to 0 bytes under running workers is not taken for one in which
    the others are idle (which would leave their sessions uncounted): it is rebuilt, and
    their sessions count again once they write their rows back."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with other.locked():
        for _ in range(3):
            other.reserve()
    # The ledger has decided with the other's sessions in the file: never found idle.
    assert counts(ledger) == (0, 3)
    os.truncate(os.path.join(shared[0], FILE_NAME), 0)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(ledger) == (0, 0)
    assert "rebuilding" in caplog.text
    assert counts(other) == (0, 3)
    assert counts(ledger) == (0, 3)


def test_short_or_empty_file_is_rebuilt_on_open(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """Opening a file that is too short or has half a header rebuilds it."""
    path = Path(shared[0]) / FILE_NAME
    Path(shared[0]).mkdir()
    path.write_bytes(b"ASGI")
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        open_ledger(shared).close()
    assert "a header of 4 bytes" in caplog.text
    caplog.clear()
    with path.open("r+b") as file:
        file.truncate(LEDGER_HEADER.size + LEDGER_SLOT.size)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        ledger = open_ledger(shared)
    assert "shorter than its 256 slots" in caplog.text
    assert path.stat().st_size == LEDGER_HEADER.size + 256 * LEDGER_SLOT.size
    assert counts(ledger) == (0, 0)


def test_own_slot_changed_by_someone_else_is_rewritten(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose slot was edited writes its own counts back, warning once."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with ledger.locked():
        ledger.reserve()
    [mine] = read_entries(shared[0])
    for _ in range(2):
        poke(
            shared[0],
            LEDGER_HEADER.size + mine.slot * LEDGER_SLOT.size,
            LEDGER_SLOT.pack(mine.pid, 0, -5, 9),
        )
        with caplog.at_level(logging.WARNING, logger="asgi_admission"):
            assert counts(ledger) == (0, 1)
    assert caplog.text.count("changed by someone else") == 1
    assert counts(other) == (0, 1)


def test_negative_counts_of_another_worker_count_as_zero(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """Negative counts written into a live worker's slot are clamped to zero."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with other.locked():
        other.reserve()
    with ledger.locked():
        ledger.reserve()
    [theirs] = [e for e in read_entries(shared[0]) if e.slot == 0]
    poke(shared[0], LEDGER_HEADER.size, LEDGER_SLOT.pack(theirs.pid, 0, -3, 2))
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(ledger) == (2, 1)
    assert "negative session counts (slot 0: pending -3, active 2)" in caplog.text


def test_full_ledger_counts_the_extra_worker_locally(
    shared: tuple[str, list[SharedLedger]], caplog: pytest.LogCaptureFixture
) -> None:
    """With every slot held, a further worker warns and still counts its own sessions."""
    first = open_ledger(shared, capacity=1)
    with first.locked():
        first.reserve()
    second = open_ledger(shared, capacity=1)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"), second.locked():
        reservation = second.reserve()
        assert second.counts() == (0, 2)
    assert "all 1 slots of the shared session ledger" in caplog.text
    assert counts(first) == (0, 1)
    reservation.release()
    assert counts(second) == (0, 1)


def test_close_gives_the_slot_back(shared: tuple[str, list[SharedLedger]]) -> None:
    """A closed ledger's counts vanish from the file, and using it again reopens it."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with ledger.locked():
        reservation = ledger.reserve()
    ledger.close()
    ledger.close()
    assert counts(other) == (0, 0)
    reservation.release()
    assert counts(ledger) == (0, 0)
    with ledger.locked():
        ledger.reserve()
    assert counts(other) == (0, 1)


def test_directory_is_created(tmp_path: Path) -> None:
    """A missing directory is created, parents included."""
    directory = tmp_path / "a" / "b"
    SharedLedger(directory).close()
    assert (directory / FILE_NAME).stat().st_size == LEDGER_HEADER.size + 256 * LEDGER_SLOT.size


@pytest.mark.parametrize("make", ["file", "under_file"])
def test_unusable_directory_names_the_setting(tmp_path: Path, make: str) -> None:
    """A directory that cannot be made or is a file raises a ValueError naming the variable."""
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    directory = blocker if make == "file" else blocker / "ledger"
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*blocker"):
        SharedLedger(directory)


def test_capacity_must_be_positive(tmp_path: Path) -> None:
    """A capacity below one slot is refused."""
    with pytest.raises(ValueError, match="capacity must be 1 or more"):
        SharedLedger(tmp_path, capacity=0)


def test_start_time_of_a_missing_process_is_zero() -> None:
    """The start time of a process that does not exist reads as 0."""
    assert process_start_time(2**22 + 1) == 0
    assert process_start_time() > 0


def test_two_guards_share_one_count(tmp_path: Path) -> None:
    """Two middlewares configured with one shared_dir refuse by their combined count."""
    guards = guards_over(tmp_path, str(tmp_path / "ledger"), 2, {}, {})
    first = guards[0].service.admit("http")
    second = guards[1].service.admit("http")
    third = guards[0].service.admit("http")
    assert isinstance(first, AdmissionTicket)
    assert isinstance(second, AdmissionTicket)
    assert isinstance(third, tuple)
    assert third[0].reason == "session_limit"
    assert guards[1].session_counts() == (0, 2)
    first.release()
    assert guards[1].session_counts() == (0, 1)


def test_app_reported_actives_are_published_to_every_worker(
    shared: tuple[str, list[SharedLedger]],
) -> None:
    """A worker's own active count (current_sessions) replaces its WebSocket count and
    is added to the other workers' totals, including after the worker's sessions end."""
    first, second = open_ledger(shared), open_ledger(shared)
    with first.locked():
        assert first.counts(3) == (3, 0)
        first.reserve()  # pending: no WebSocket accepted
    with second.locked():
        assert second.counts(2) == (5, 1)
    with first.locked():
        assert first.counts(0) == (2, 1)
    with second.locked():
        assert second.counts(-4) == (0, 1)  # a negative report counts as none


def test_in_process_ledger_takes_the_apps_count() -> None:
    """Without a shared ledger the app's count simply replaces the WebSocket count."""
    ledger = InProcessLedger()
    with ledger.locked():
        reservation = ledger.reserve()
    reservation.activate()  # outside the critical section, as the middleware does
    with ledger.locked():
        assert ledger.counts() == (1, 0)
        assert ledger.counts(7) == (7, 0)


def test_two_guards_share_the_apps_own_counts(tmp_path: Path) -> None:
    """max_sessions holds container-wide when each worker's app counts its own sessions."""
    own = [2, 0]
    guards = guards_over(
        tmp_path,
        str(tmp_path / "ledger"),
        3,
        {"current_sessions": lambda: own[0]},
        {"current_sessions": lambda: own[1]},
    )
    admitted = guards[0].service.admit("http")  # publishes 2 active; 1 pending
    assert isinstance(admitted, AdmissionTicket)
    refused = guards[1].service.admit("http")
    assert isinstance(refused, tuple)
    assert refused[0].reason == "session_limit"
    assert guards[1].session_counts() == (2, 1)
    admitted.release()
    own[0] = 0
    assert guards[0].session_counts() == (0, 0)
    assert not isinstance(guards[1].service.admit("http"), tuple)


def test_failed_claim_releases_the_critical_section(
    shared: tuple[str, list[SharedLedger]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error while claiming a slot is raised as LedgerUnavailable (the
    middleware refuses) and leaves the ledger usable."""
    ledger = open_ledger(shared)

    def refuse(*args: object) -> int:
        raise OSError(errno.EINVAL, "no OFD locks here")

    monkeypatch.setattr(shared_ledger, "slot_lock", refuse)
    with pytest.raises(LedgerUnavailable, match="no OFD locks"), ledger.locked():
        pass
    monkeypatch.undo()
    assert counts(ledger) == (0, 0)


def test_failed_open_closes_the_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error while checking a freshly opened file propagates without leaking it."""
    opened: list[int] = []
    real_open = os.open

    def recording_open(*args: Any, **kwargs: Any) -> int:
        fd = real_open(*args, **kwargs)
        opened.append(fd)
        return fd

    def broken(self: SharedLedger) -> None:
        raise OSError(errno.EIO, "disk on fire")

    monkeypatch.setattr(os, "open", recording_open)
    monkeypatch.setattr(SharedLedger, "_check_file", broken)
    with pytest.raises(OSError, match="disk on fire"):
        SharedLedger(tmp_path)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(opened[0])


def test_after_fork_the_ledger_starts_afresh(shared: tuple[str, list[SharedLedger]]) -> None:
    """The fork hook drops the inherited descriptor; the old slot then reads as dead."""
    ledger, other = open_ledger(shared), open_ledger(shared)
    with ledger.locked():
        ledger.reserve()
    assert counts(other) == (0, 1)
    shared_ledger._forked(weakref.ref(ledger))
    assert counts(ledger) == (0, 0)
    with ledger.locked():
        ledger.reserve()
    assert counts(other) == (0, 1)
    gone = SharedLedger(shared[0])
    ref = weakref.ref(gone)
    gone.close()
    del gone
    shared_ledger._forked(ref)  # a ledger already collected: nothing to do


@pytest.mark.parametrize("how", ["deleted", "replaced", "directory deleted"])
def test_a_deleted_or_replaced_file_is_left_for_the_new_one_with_the_counts(
    shared: tuple[str, list[SharedLedger]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """Workers whose ledger file was unlinked move to the file now at the path at their
    next decision, each with its own counts, so the container-wide count heals."""
    monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 0.0)
    first, second = open_ledger(shared), open_ledger(shared)
    with first.locked():
        first.reserve()
        first.reserve()
    with second.locked():
        second.reserve()
    assert counts(first) == (0, 3)
    path = Path(shared[0]) / FILE_NAME
    if how == "deleted":
        path.unlink()
    elif how == "replaced":
        fresh = path.with_name("fresh")
        fresh.write_bytes(b"")
        fresh.replace(path)
    else:
        path.unlink()
        Path(shared[0]).rmdir()
    newcomer = open_ledger(shared)  # a worker started after: it opens the new file
    with newcomer.locked():
        newcomer.reserve()
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert counts(first) == (0, 3)  # first moved; second has not decided since
    assert "was deleted or replaced; moving this worker's sessions (2 pending" in caplog.text
    assert counts(second) == (0, 4)  # second moved too: everyone counted again
    assert counts(newcomer) == (0, 4)
    assert sorted(e.pending for e in read_entries(shared[0])) == [1, 1, 2]


def test_the_file_is_checked_at_most_every_quarter_second(
    shared: tuple[str, list[SharedLedger]],
) -> None:
    """The unlink check (an fstat) runs at most every LINK_CHECK_INTERVAL_S, not per decision."""
    first, second = open_ledger(shared), open_ledger(shared)
    with second.locked():
        second.reserve()
    assert counts(first) == (0, 1)  # checked now
    (Path(shared[0]) / FILE_NAME).unlink()
    with open_ledger(shared).locked():
        pass  # a new file at the path
    assert counts(first) == (0, 1)  # within the interval: still the old file
    time.sleep(shared_ledger.LINK_CHECK_INTERVAL_S + 0.05)
    assert counts(first) == (0, 0)  # moved: the second worker has not followed yet


def test_own_section_takes_this_process_lock_and_never_the_flock(
    shared: tuple[str, list[SharedLedger]],
) -> None:
    """attempt_own() enters while another worker is in the critical section, and is busy
    while another thread of this worker is."""
    first, second = open_ledger(shared), open_ledger(shared)
    with first.attempt():  # holds the file's flock (and claims a slot)
        with second.attempt_own():
            pass
        with pytest.raises(LedgerBusy), second.attempt():
            pass
    with second.attempt_own():
        # This process's lock is held: neither section is reentrant.
        with pytest.raises(LedgerBusy), second.attempt():
            pass
        with pytest.raises(LedgerBusy), second.attempt_own():
            pass
    with second.attempt():
        pass  # both locks were given back
