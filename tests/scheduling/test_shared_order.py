"""The waiting order the workers of a container share: its file, its liveness, its faults,
and the wait queue taking part in it (two orders opened in one process stand for two
workers: each has its own open file description, so its own slot lock)."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from queuekit import Admission, Capacity, settle

from asgi_admission._admission.ledger.shared_ledger import HEADER, slot_offset
from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue
from asgi_admission._admission.scheduling.shared_order import (
    ORDER_FILE_NAME,
    ORDER_MAGIC,
    ORDER_SLOT,
    SharedOrder,
    read_waiting,
)
from kits.requirekit import require_root

#: Internal on purpose: the shared waiting order's file, and the wait queue's order hook.
INTERNAL = "the shared waiting order's file, and the wait queue's order hook"

NOBODY = 65534


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[Path, list[SharedOrder]]]:
    directory = tmp_path / "shm"
    opened: list[SharedOrder] = []
    yield directory, opened
    for order in opened:
        order.close()


def open_order(shared: tuple[Path, list[SharedOrder]]) -> SharedOrder:
    order = SharedOrder(shared[0])
    shared[1].append(order)
    return order


def raw_row(pid: int, rank: int, waiting: int, arrived: float) -> bytes:
    return ORDER_SLOT.pack(pid, rank, waiting, arrived, hash((pid, rank, waiting, arrived)))


def test_another_workers_earlier_waiter_of_the_class_or_above_goes_first(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """A waiter is behind another worker's of a higher class, or of its class that came
    earlier; never behind its own worker's, a lower class's or a later arrival's."""
    a, b = open_order(shared), open_order(shared)
    a.publish((1, 100.0), 2)
    assert b.ahead(1, 101.0)
    assert b.ahead(2, 50.0)
    assert not b.ahead(1, 99.0)
    assert not b.ahead(0, 200.0)
    assert not a.ahead(1, 101.0)  # its own worker's waiter is its queue's business
    a.publish(None, 0)
    assert not b.ahead(2, 101.0)


def test_first_says_whether_this_workers_first_waiter_is_the_containers(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """The sample's hook: false with no waiter or one behind another worker's, true once
    that one has left."""
    a, b = open_order(shared), open_order(shared)
    assert not b.first()
    a.publish((0, 10.0), 1)
    b.publish((0, 20.0), 3)
    assert a.first()
    assert not b.first()
    a.publish(None, 0)
    assert b.first()


def test_the_file_lists_the_live_workers_first_waiters(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """Each worker's slot holds its pid, its first waiter and how many wait; a closed
    worker's slot is cleared, and the file is private."""
    a, b = open_order(shared), open_order(shared)
    a.publish((2, 5.0), 4)
    b.publish((0, 7.5), 1)
    entries = read_waiting(shared[0])
    assert [(e.pid, e.rank, e.waiting, e.arrived, e.alive) for e in entries] == [
        (os.getpid(), 2, 4, 5.0, True),
        (os.getpid(), 0, 1, 7.5, True),
    ]
    a.close()
    assert [e.rank for e in read_waiting(shared[0])] == [0]
    assert (shared[0] / ORDER_FILE_NAME).stat().st_mode & 0o777 == 0o600


def test_a_dead_workers_waiters_are_ignored_and_cleared(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """A slot with waiters whose lock no one holds (its worker was killed) blocks nobody,
    and the first read of the order clears it."""
    a, b = open_order(shared), open_order(shared)
    a.publish((0, 1.0), 1)
    b.publish((0, 2.0), 1)
    path = shared[0] / ORDER_FILE_NAME
    fd = os.open(path, os.O_RDWR)
    try:
        # A third worker's row, its lock gone with it: slot 2, and the header counts it.
        os.pwrite(fd, HEADER.pack(ORDER_MAGIC, 256, 3), 0)
        os.pwrite(fd, raw_row(999_999, 0, 5, 0.5), slot_offset(2))
    finally:
        os.close(fd)
    assert [(e.slot, e.alive) for e in read_waiting(shared[0])][-1] == (2, False)
    assert not a.ahead(0, 1.0)
    assert b.ahead(0, 2.0)  # behind a's live waiter, not the dead one's
    assert [e.slot for e in read_waiting(shared[0])] == [0, 1]


def test_a_truncated_file_is_rebuilt_with_a_warning_and_each_worker_writes_itself_back(
    shared: tuple[Path, list[SharedOrder]], caplog: pytest.LogCaptureFixture
) -> None:
    """A file cut short is rebuilt by the next read, which says so naming it; the worker
    whose row was cut off writes it back at its own next read, so its waiter is first
    again."""
    a, b = open_order(shared), open_order(shared)
    a.publish((0, 1.0), 1)
    b.publish((0, 2.0), 1)
    path = shared[0] / ORDER_FILE_NAME
    os.truncate(path, slot_offset(1) + 4)  # a's row whole, b's cut
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert b.ahead(0, 2.0)
    assert f"the shared waiting order {path} was unusable" in caplog.text
    assert [e.slot for e in read_waiting(shared[0])] == [0, 1]  # b's restored by b
    os.truncate(path, HEADER.size)  # now both rows gone
    assert not a.ahead(0, 1.0)  # rebuilt by a, with its own row
    assert [e.slot for e in read_waiting(shared[0])] == [0]
    assert not b.first()  # the freed watch's question: b writes its row back, behind a's
    assert [e.slot for e in read_waiting(shared[0])] == [0, 1]


def test_a_garbage_header_is_rebuilt_keeping_every_live_workers_row(
    shared: tuple[Path, list[SharedOrder]], caplog: pytest.LogCaptureFixture
) -> None:
    """Garbage over the header costs no waiter its place: the rows of live workers are
    whole, and kept by the rebuild."""
    a, b = open_order(shared), open_order(shared)
    a.publish((1, 1.0), 2)
    b.publish((1, 2.0), 1)
    path = shared[0] / ORDER_FILE_NAME
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, b"garbage!" * 2, 0)  # the header alone
    finally:
        os.close(fd)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert b.ahead(1, 2.0)
    assert "no waiting-order header" in caplog.text
    assert [(e.slot, e.waiting) for e in read_waiting(shared[0])] == [(0, 2), (1, 1)]


def test_a_torn_or_garbage_row_is_ignored_and_written_back_by_its_worker(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """A row whose check does not match (torn by a write, or scribbled on) is not taken
    for a waiter; its worker's next read of the order writes it back."""
    a, b = open_order(shared), open_order(shared)
    a.publish((0, 1.0), 1)
    path = shared[0] / ORDER_FILE_NAME
    fd = os.open(path, os.O_RDWR)
    try:
        row = bytearray(os.pread(fd, ORDER_SLOT.size, slot_offset(0)))
        row[16:24] = bytes(8)  # the arrival, as if half written
        os.pwrite(fd, bytes(row), slot_offset(0))
    finally:
        os.close(fd)
    assert not b.ahead(0, 2.0)
    assert a.first()
    assert b.ahead(0, 2.0)


def test_a_claim_that_finds_the_file_busy_is_tried_again_at_the_next_sample(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """Never waiting for the file's lock: a worker that finds another in it publishes
    nothing that time, and claims its slot at its next sample."""
    a, b = open_order(shared), open_order(shared)
    fd = os.open(shared[0] / ORDER_FILE_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another worker rebuilding or claiming
        a.publish((0, 1.0), 1)
        assert not b.ahead(0, 2.0)
    finally:
        os.close(fd)
    assert a.first()  # the sample claims it, the queue having nothing new to publish
    assert b.ahead(0, 2.0)


def test_a_deleted_file_is_followed_by_the_sample_with_this_workers_waiter(
    shared: tuple[Path, list[SharedOrder]], caplog: pytest.LogCaptureFixture
) -> None:
    """A worker still in a deleted file moves its first waiter to the file now at the
    path at its next sample, saying so: a worker started since sees it again."""
    a = open_order(shared)
    a.publish((0, 1.0), 1)
    (shared[0] / ORDER_FILE_NAME).unlink()
    b = open_order(shared)
    b.publish((0, 2.0), 1)
    assert not b.ahead(0, 2.0)  # a's waiter is in the old file
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert a.first()
    assert "was deleted or replaced; moving this worker's waiters" in caplog.text
    assert b.ahead(0, 2.0)
    assert len(read_waiting(shared[0])) == 2


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (HEADER.pack(ORDER_MAGIC, 128, 1), "128 slots where 256 were expected"),
        (HEADER.pack(ORDER_MAGIC, 256, 300), "300 slots in use of 256"),
        (b"ASGI", "a header of 4 bytes"),
    ],
)
def test_a_header_this_version_cannot_use_is_rebuilt_naming_what_is_wrong(
    shared: tuple[Path, list[SharedOrder]],
    caplog: pytest.LogCaptureFixture,
    header: bytes,
    problem: str,
) -> None:
    """Another capacity, more slots in use than there are, or a header cut short: the
    file is rebuilt with a warning that says which, and the waiters in it are kept."""
    a, b = open_order(shared), open_order(shared)
    a.publish((0, 1.0), 1)
    path = shared[0] / ORDER_FILE_NAME
    if len(header) < HEADER.size:
        os.truncate(path, len(header))
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, header, 0)
    finally:
        os.close(fd)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        b.ahead(0, 2.0)
    assert f"{path} was unusable ({problem})" in caplog.text
    assert a.first()
    assert b.ahead(0, 2.0)


def test_with_every_slot_held_a_worker_serves_its_own_order_saying_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that finds no free slot says so once and publishes nothing, and still
    lets the others' waiters go first."""
    a, b = SharedOrder(tmp_path, capacity=1), SharedOrder(tmp_path, capacity=1)
    try:
        a.publish((0, 1.0), 1)
        with caplog.at_level(logging.WARNING, logger="asgi_admission"):
            b.publish((0, 2.0), 1)
        assert "all 1 slots of the shared waiting order" in caplog.text
        assert [e.waiting for e in read_waiting(tmp_path)] == [1]
        assert b.ahead(0, 2.0)
    finally:
        a.close()
        b.close()


def test_a_closed_order_answers_nobody_is_ahead_and_says_why_once(
    shared: tuple[Path, list[SharedOrder]], caplog: pytest.LogCaptureFixture
) -> None:
    """Where the file cannot be read, a worker serves its own order: nobody ahead, with
    one warning naming the file."""
    a = open_order(shared)
    a.close()
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert not a.ahead(0, 1.0)
        assert not a.ahead(0, 1.0)
        a.publish((0, 1.0), 1)
    assert caplog.text.count("cannot be read") == 1


def test_a_failed_write_is_said_once_and_made_again_by_the_next_publish(
    shared: tuple[Path, list[SharedOrder]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write that fails (a full memory-backed directory) never raises into the queue:
    one warning naming the file, and the same waiter published again is written."""
    a, b = open_order(shared), open_order(shared)
    a.publish((0, 1.0), 1)

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        a.publish((0, 1.0), 2)
        a.publish((0, 1.0), 3)
    monkeypatch.undo()
    assert caplog.text.count("cannot be written (") == 1
    assert [e.waiting for e in read_waiting(shared[0])] == [1]
    a.publish((0, 1.0), 3)
    assert [e.waiting for e in read_waiting(shared[0])] == [3]
    assert b.ahead(0, 2.0)


def test_capacity_must_be_at_least_one(tmp_path: Path) -> None:
    """A file with no slot is refused with a sentence naming the parameter."""
    with pytest.raises(ValueError, match="capacity must be 1 or more; got 0"):
        SharedOrder(tmp_path, capacity=0)


#: Run in a fresh interpreter (no threads of the test run): the child of a fork with an
#: order publishes a critical waiter; it prints what each side saw.
FORKING = """
import os, sys
from asgi_admission._admission.scheduling.shared_order import read_waiting
from asgi_admission._admission.scheduling.shared_order import SharedOrder

def live():
    return sorted(e.pid for e in read_waiting(sys.argv[1]) if e.alive)

order = SharedOrder(sys.argv[1])
order.publish((1, 1.0), 1)
told, tell = os.pipe()
resumed, resume = os.pipe()
pid = os.fork()
if pid == 0:
    order.publish((0, 2.0), 1)
    os.write(tell, b"y" if order.ahead(1, 1.5) else b"n")
    os.read(resumed, 1)
    os._exit(0)
child_saw_parent = os.read(told, 1).decode()
both = live() == sorted([os.getpid(), pid])
parent_behind = order.ahead(1, 1.5)
os.write(resume, b"x")
os.waitpid(pid, 0)
print(child_saw_parent, both, parent_behind, live() == [os.getpid()], order.ahead(1, 1.5))
"""


def test_a_forked_worker_claims_a_slot_of_its_own(tmp_path: Path) -> None:
    """A child forked from a process with an order opens its own file description: its
    waiter goes in a slot of its own, each side sees the other's, and the child's leaves
    with it."""
    out = subprocess.run(
        [sys.executable, "-c", FORKING, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert out.split() == ["y", "True", "True", "True", "False"]


def test_a_symlink_at_the_files_name_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    """A symlink planted at the waiting file's name is not followed: the error names the
    setting, and the file it points at keeps its contents."""
    directory = tmp_path / "shm"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (directory / ORDER_FILE_NAME).symlink_to(victim)
    with pytest.raises(ValueError, match=r"ADMISSION_SHARED_DIR=.*is a symlink"):
        SharedOrder(directory)
    assert victim.read_bytes() == b"precious"


def test_a_file_others_may_write_to_is_refused(tmp_path: Path) -> None:
    """An existing waiting file writable by others is refused, not trusted."""
    directory = tmp_path / "shm"
    directory.mkdir(mode=0o700)
    (directory / ORDER_FILE_NAME).write_bytes(b"")
    (directory / ORDER_FILE_NAME).chmod(0o666)
    with pytest.raises(ValueError, match="is a file that other users may write to"):
        SharedOrder(directory)


def test_another_users_file_is_refused(tmp_path: Path) -> None:
    """A waiting file someone else owns is neither trusted nor written."""
    require_root("chown to another user")
    directory = tmp_path / "shm"
    directory.mkdir(mode=0o700)
    (directory / ORDER_FILE_NAME).write_bytes(b"theirs")
    os.chown(directory / ORDER_FILE_NAME, NOBODY, NOBODY)
    with pytest.raises(ValueError, match=f"is a file owned by uid {NOBODY}"):
        SharedOrder(directory)
    assert (directory / ORDER_FILE_NAME).read_bytes() == b"theirs"


# -- the wait queue taking part -----------------------------------------------------------


def worker_queue(order: SharedOrder) -> WaitQueue[Admission]:
    return WaitQueue(classes=("critical", "batch"), limit=8, timeout_s=5.0, order=order)


def test_a_freed_slot_goes_to_the_other_workers_older_waiter(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """Two queues, one capacity: a slot freed where the later waiter waits is left to the
    earlier one of the other queue, whose pass the sample's hook runs."""

    async def main() -> None:
        capacity = Capacity(free=0)
        a_order, b_order = open_order(shared), open_order(shared)
        a, b = worker_queue(a_order), worker_queue(b_order)
        first = asyncio.ensure_future(
            a.wait(class_name="batch", attempt=capacity.attempt("a1"), give_back=capacity.give_back)
        )
        await settle()
        second = asyncio.ensure_future(
            b.wait(class_name="batch", attempt=capacity.attempt("b1"), give_back=capacity.give_back)
        )
        await settle()
        assert b.ahead("batch") == 2  # its own waiter and the other worker's
        capacity.free = 1
        b.wake()  # the slot freed in b's worker
        await settle()
        assert capacity.admitted == []
        assert a_order.first()
        assert not b_order.first()
        a.wake()  # what the sample does when first() says so
        assert (await first).outcome == "admitted"
        capacity.free = 1
        assert b_order.first()
        b.wake()
        assert (await second).outcome == "admitted"
        assert capacity.admitted == ["a1", "b1"]
        assert read_waiting(shared[0]) == []

    asyncio.run(main())


def test_a_higher_class_in_another_worker_goes_before_an_older_lower_one(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """Class first, then arrival: a later critical waiter elsewhere takes the slot before
    this worker's older batch waiter."""

    async def main() -> None:
        capacity = Capacity(free=0)
        a_order, b_order = open_order(shared), open_order(shared)
        a, b = worker_queue(a_order), worker_queue(b_order)
        old = asyncio.ensure_future(
            a.wait(
                class_name="batch", attempt=capacity.attempt("old"), give_back=capacity.give_back
            )
        )
        await settle()
        urgent = asyncio.ensure_future(
            b.wait(
                class_name="critical",
                attempt=capacity.attempt("urgent"),
                give_back=capacity.give_back,
            )
        )
        await settle()
        capacity.free = 1
        a.wake()
        await settle()
        assert capacity.admitted == []
        b.wake()
        assert (await urgent).outcome == "admitted"
        capacity.free = 1
        a.wake()
        assert (await old).outcome == "admitted"
        assert capacity.admitted == ["urgent", "old"]

    asyncio.run(main())


def test_a_deferred_waiter_does_not_hold_back_the_other_workers(
    shared: tuple[Path, list[SharedOrder]],
) -> None:
    """A waiter whose tenant holds its share is not published as first: the other
    worker's later waiter takes the capacity it could not."""

    async def main() -> None:
        capacity = Capacity(free=0)
        a_order, b_order = open_order(shared), open_order(shared)
        a, b = worker_queue(a_order), worker_queue(b_order)

        def over_share() -> Admission | Verdict:
            return Verdict.DEFERRED

        held = asyncio.ensure_future(
            a.wait(class_name="batch", attempt=over_share, give_back=capacity.give_back)
        )
        await settle()
        other = asyncio.ensure_future(
            b.wait(class_name="batch", attempt=capacity.attempt("b1"), give_back=capacity.give_back)
        )
        await settle()
        capacity.free = 1
        b.wake()
        assert (await other).outcome == "admitted"
        held.cancel()
        with pytest.raises(asyncio.CancelledError):
            await held

    asyncio.run(main())
