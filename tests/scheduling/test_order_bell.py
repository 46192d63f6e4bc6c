"""The waiting order's wake sockets: a worker rung when capacity frees elsewhere or the
waiter ahead of its own goes, never a blocking send, and no socket file left behind."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from queuekit import Admission, Capacity, settle

from asgi_admission._admission.ledger.shared_ledger import HEADER, SharedLedger, slot_offset
from asgi_admission._admission.scheduling.queue import WaitQueue
from asgi_admission._admission.scheduling.shared_order import (
    ORDER_FILE_NAME,
    ORDER_MAGIC,
    ORDER_SLOT,
    WAKE_PREFIX,
    OrderBell,
    SharedOrder,
    read_waiting,
)
from asgi_admission._config import AdmissionConfig
from asgi_admission._factory import build_order

#: Internal on purpose: the wake sockets and the shared waiting order, below the middleware.
INTERNAL = "the waiting order's wake sockets, its file and the factory's build_order"


@pytest.fixture
def directory(tmp_path: Path) -> Path:
    made = tmp_path / "shm"
    made.mkdir(mode=0o700)
    return made


@pytest.fixture
def orders(directory: Path) -> Iterator[list[SharedOrder]]:
    opened: list[SharedOrder] = []
    yield opened
    for order in opened:
        order.close()


def sockets(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(WAKE_PREFIX))


def test_rings_wake_the_bound_worker_once_however_many_arrive(directory: Path) -> None:
    """Rings sent before the worker's loop turns are read at once and wake it once."""

    async def main() -> int:
        woken = [0]
        listener = OrderBell(directory, on_ring=lambda: woken.__setitem__(0, woken[0] + 1))
        listener.bind(3)
        other = OrderBell(directory)
        for _ in range(5):
            other.ring(3)
        for _ in range(50):
            await asyncio.sleep(0.001)
        listener.close()
        other.close()
        return woken[0]

    assert asyncio.run(main()) == 1


def test_a_ring_never_blocks_nor_raises(directory: Path) -> None:
    """A ring to a slot with no socket, or to a socket nobody reads (full), returns at
    once without an error."""

    async def main() -> float:
        listener = OrderBell(directory)
        listener.bind(0)
        other = OrderBell(directory)
        start = time.monotonic()
        for _ in range(20_000):  # far more than a datagram socket's queue holds
            other.ring(0)
        other.ring(9)  # nobody there
        took = time.monotonic() - start
        listener.close()
        other.close()
        return took

    assert asyncio.run(main()) < 2.0


def test_a_ring_waits_for_this_workers_change_to_be_in_the_ledger(directory: Path) -> None:
    """While the shared ledger is held elsewhere (what the ring tells of is not written
    yet) the ring is put off, and sent once the ledger could be written; with the ledger
    held for good, it is sent anyway after a few tries."""

    async def main() -> tuple[list[float], list[float], int, int]:
        heard: list[float] = []
        listener = OrderBell(directory, on_ring=lambda: heard.append(time.monotonic()))
        listener.bind(0)
        answers = [False, False, True]
        tries: list[float] = []

        def flush() -> bool:
            tries.append(time.monotonic())
            return answers.pop(0) if answers else False

        async def heard_one() -> None:
            # Polled, not slept: on a loaded machine the retries' timers run late.
            for _ in range(1000):
                if heard:
                    break
                await asyncio.sleep(0.005)

        other = OrderBell(directory, flush=flush)
        other.ring(0)
        await heard_one()
        first = (list(tries), list(heard))
        tries.clear()
        heard.clear()
        other.ring(0)  # never writable now
        await heard_one()
        await asyncio.sleep(0.05)  # no try comes after the ring that gave up
        listener.close()
        other.close()
        return first[0], first[1], len(tries), len(heard)

    tries, heard, held_tries, held_heard = asyncio.run(main())
    assert len(tries) == 3
    assert len(heard) == 1
    assert heard[0] > tries[2]  # sent after the write, not before
    assert (held_tries, held_heard) == (26, 1)


def test_a_bound_socket_is_private_replaces_a_dead_workers_and_goes_at_close(
    directory: Path,
) -> None:
    """Binding a slot replaces whatever a dead worker left at its name with a socket only
    this user may use; closing removes it, and a forked child's forgetting leaves it."""

    async def main() -> None:
        stale = directory / f"{WAKE_PREFIX}1"
        stale.write_bytes(b"")
        bell = OrderBell(directory)
        bell.bind(1)
        info = stale.stat()
        assert stat.S_ISSOCK(info.st_mode)
        assert info.st_mode & 0o777 == 0o600
        bell.close()
        assert sockets(directory) == []
        bell.bind(1)
        bell.forget()  # as a forked child does with its parent's
        assert sockets(directory) == [f"{WAKE_PREFIX}1"]

    asyncio.run(main())


def test_binding_off_a_loop_or_at_a_path_too_long_leaves_the_worker_to_its_freed_watch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No loop: nothing bound (nothing could read it); a path too long for a socket: a
    warning naming it, once, and no file left."""
    OrderBell(tmp_path).bind(0)
    assert sockets(tmp_path) == []
    deep = tmp_path / ("d" * 120)
    deep.mkdir(mode=0o700)

    async def main() -> None:
        far = OrderBell(deep)
        far.bind(0)
        far.bind(0)

    asyncio.run(main())
    assert caplog.text.count("cannot be used") == 1
    assert list(deep.iterdir()) == []


def open_order(directory: Path, orders: list[SharedOrder], on: bool = True) -> SharedOrder:
    order = SharedOrder(directory, bell=OrderBell(directory) if on else None)
    orders.append(order)
    return order


def worker_queue(order: SharedOrder) -> WaitQueue[Admission]:
    queue: WaitQueue[Admission] = WaitQueue(
        classes=("critical", "batch"), limit=8, timeout_s=5.0, order=order
    )
    order.tell_rings(queue.wake)
    return queue


def test_a_slot_freed_in_another_worker_rings_the_first_waiters_worker(
    directory: Path, orders: list[SharedOrder]
) -> None:
    """Capacity freed where a later waiter waits, then where nobody ever waited: each
    time the worker holding the container's first waiter is rung and admits it, before
    its own freed watch asks."""

    async def main() -> list[str]:
        capacity = Capacity(free=0)
        a, b, c = (worker_queue(open_order(directory, orders)) for _ in range(3))
        first = asyncio.ensure_future(
            a.wait(class_name="batch", attempt=capacity.attempt("a1"), give_back=capacity.give_back)
        )
        await settle()
        later = asyncio.ensure_future(
            b.wait(class_name="batch", attempt=capacity.attempt("b1"), give_back=capacity.give_back)
        )
        await settle()
        assert sockets(directory) == [f"{WAKE_PREFIX}0", f"{WAKE_PREFIX}1"]
        capacity.free = 1
        b.wake()  # the slot freed in b's worker: b's waiter is behind a's
        assert (await asyncio.wait_for(first, 1)).outcome == "admitted"
        capacity.free = 1
        c.wake()  # freed in a worker where nobody ever waited
        assert (await asyncio.wait_for(later, 1)).outcome == "admitted"
        assert read_waiting(directory) == []
        return capacity.admitted

    assert asyncio.run(main()) == ["a1", "b1"]


def test_the_waiter_ahead_admitted_elsewhere_rings_the_next_ones_worker(
    directory: Path, orders: list[SharedOrder]
) -> None:
    """Two slots free at once where the first waiter waits: it takes one, and its worker's
    pass, stopped at the other worker's waiter now first, rings that one, which takes the
    other."""

    async def main() -> list[str]:
        capacity = Capacity(free=0)
        a, b = (worker_queue(open_order(directory, orders)) for _ in range(2))
        waits = []
        for queue, name in ((a, "a1"), (b, "b1"), (a, "a2")):
            attempt = capacity.attempt(name)
            waits.append(
                asyncio.ensure_future(
                    queue.wait(class_name="batch", attempt=attempt, give_back=capacity.give_back)
                )
            )
            await settle()
        capacity.free = 2
        a.wake()
        for wait in waits[:2]:
            assert (await asyncio.wait_for(wait, 1)).outcome == "admitted"
        assert not waits[2].done()
        waits[2].cancel()
        return capacity.admitted

    assert asyncio.run(main()) == ["a1", "b1"]


def test_a_dead_workers_socket_is_removed_by_whoever_finds_it_dead(
    directory: Path, orders: list[SharedOrder]
) -> None:
    """A slot with waiters and no lock (its worker was killed) is cleared by the first read
    of the order that meets it, and its wake socket file goes with it; a closed worker
    removes its own."""
    a = open_order(directory, orders)
    a.publish((0, 1.0), 1)
    path = directory / ORDER_FILE_NAME
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, HEADER.pack(ORDER_MAGIC, 256, 3), 0)
        row = (999_999, 0, 5, 0.5)
        os.pwrite(fd, ORDER_SLOT.pack(*row, hash(row)), slot_offset(2))
    finally:
        os.close(fd)
    (directory / f"{WAKE_PREFIX}2").write_bytes(b"")  # what the dead worker left
    a.passed()  # nobody behind a: the read goes over every slot with waiters
    assert [e.slot for e in read_waiting(directory)] == [0]
    assert sockets(directory) == []  # a claimed off a loop: it binds none
    a.close()
    assert read_waiting(directory) == []


def test_an_order_file_that_cannot_be_used_stops_a_named_directory_not_the_automatic_one(
    directory: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A symlink at the order file's name: with ``ADMISSION_SHARED_DIR`` naming the
    directory the guard refuses to start, naming the setting; in the place found by
    default each worker serves its own waiters, with a warning; with the wait off no
    order is built at all."""
    (directory / ORDER_FILE_NAME).symlink_to(directory / "elsewhere")
    ledger = SharedLedger(directory)
    named = AdmissionConfig(shared_dir=str(directory), queue_timeout_s=5.0)
    with pytest.raises(ValueError, match="ADMISSION_SHARED_DIR"):
        build_order(named, str(directory), ledger)
    automatic = AdmissionConfig(queue_timeout_s=5.0)
    assert build_order(automatic, str(directory), ledger) is None
    assert "each worker serves its own waiters in its own order" in caplog.text
    assert build_order(AdmissionConfig(), str(directory), ledger) is None
    assert not (directory / "elsewhere").exists()
    ledger.close()


def test_a_socket_of_that_name_made_by_another_worker_since_is_not_removed(
    directory: Path,
) -> None:
    """A worker still on a waiting-order file replaced meanwhile holds a slot another
    worker holds in the new file, under the same socket name: closing, it leaves the
    other's socket alone; and a dead slot's socket is removed only where nobody listens."""

    async def main() -> tuple[bool, int, bool, bool]:
        heard = [0]
        stale = OrderBell(directory)
        stale.bind(0)
        os.unlink(directory / f"{WAKE_PREFIX}0")  # the file replaced: its sockets with it
        live = OrderBell(directory, on_ring=lambda: heard.__setitem__(0, heard[0] + 1))
        live.bind(0)
        stale.close()
        still_there = sockets(directory) == [f"{WAKE_PREFIX}0"]
        OrderBell(directory).ring(0)
        for _ in range(50):
            await asyncio.sleep(0.001)
        finder = OrderBell(directory)
        finder.unlink(0)  # a read that took slot 0 for dead in a stale file
        kept = sockets(directory) == [f"{WAKE_PREFIX}0"]
        live.close(unlink=False)  # as a SIGKILL leaves it: the file, nobody reading it
        finder.unlink(0)
        removed = sockets(directory) == []
        return still_there, heard[0], kept, removed

    assert asyncio.run(main()) == (True, 1, True, True)
