"""One waiting order for the workers of a container: who is first, whichever worker holds it.

docs/configuration.md ("Across the workers of one container") says what it does: each
worker publishes its first waiter in ``<shared_dir>/asgi-admission.waiting``, before each
attempt asks whether another live worker's comes first (then it answers
``Verdict.FULL``), and after each pass rings the worker whose waiter is first now.

Notes:

- Only the first waiter matters: another worker's waiter comes first exactly when that
  worker's first does. Arrivals are ``time.monotonic()``, one clock for every process
  of a machine.
- Where the file cannot be written or read, this worker serves its own waiters in its
  own order (logged once) until it can; :meth:`SharedOrder.first`, asked by each
  worker's freed watch, is the fallback where a ring was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import socket
import struct
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from asgi_admission._admission.ledger.ledger import LOCK_WAIT_S
from asgi_admission._admission.ledger.safe_files import open_private_file
from asgi_admission._admission.ledger.shared_ledger import (
    HEADER,
    claim_free_slot,
    flock_by,
    header_problem,
    read_rows,
    slot_held,
    slot_lock,
    slot_offset,
    warn_once,
)
from asgi_admission._admission.ledger.shared_ledger import SLOT as LEDGER_SLOT

# --------------------------------------------------------------------------------------
# Waking another worker at once: a Unix datagram socket per slot of the waiting order
# (its name, its mode, and why a ring is harmless: docs/trust.md). Rings are drained at
# once on the event loop, one pass however many came. A ring must not come before what
# it tells of: ``flush`` writes this worker's pending ledger changes first; where the
# ledger is held elsewhere the ring is retried a few milliseconds later, a few times.

logger = logging.getLogger("asgi_admission")

#: The wake sockets' names in the shared directory: this, then the slot's number.
WAKE_PREFIX: Final = "asgi-admission.wake."
#: Rings read at most in one go; more are read on the loop's next turn.
_DRAIN: Final = 64
#: A ring put off while the ledger is held elsewhere is tried again after this, at most
#: ``_RETRIES`` times, and then sent all the same.
RETRY_S: Final = 0.002
_RETRIES: Final = 25


class OrderBell:
    """This worker's wake socket in ``directory`` and its rings to the others'.

    ``on_ring`` is called on the loop when this worker is rung; ``flush`` before each
    ring writes this worker's pending ledger changes (``False``: the ledger is busy).
    """

    __slots__ = (
        "__weakref__",
        "_bound",
        "_flush",
        "_loop",
        "_on_ring",
        "_open",
        "_pid",
        "_sender",
        "_slot",
        "_socket",
        "_warned",
        "directory",
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        on_ring: Callable[[], None] | None = None,
        flush: Callable[[], bool] | None = None,
    ) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self._flush = flush
        # The socket file this worker bound (device, inode): only that one is its to remove.
        self._bound: tuple[int, int] | None = None
        self._on_ring = on_ring
        self._socket: socket.socket | None = None
        self._sender: socket.socket | None = None
        self._slot = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = os.getpid()
        self._warned = False
        # Closed with the bell where nobody closed it, not left to the garbage collector.
        self._open: list[socket.socket] = []
        weakref.finalize(self, _close_all, self._open)

    def tell_rings(self, on_ring: Callable[[], None]) -> None:
        """Call ``on_ring`` on the loop when another worker rings this one."""
        self._on_ring = on_ring

    def path(self, slot: int) -> str:
        """The wake socket of the worker holding ``slot`` of the waiting order."""
        return os.path.join(self.directory, f"{WAKE_PREFIX}{slot}")

    def bind(self, slot: int) -> None:
        """Listen on the socket of ``slot``, just claimed, on the running loop.

        Where it cannot, it is logged once and the others' freed watches find this worker.
        """
        self.close(unlink=False)
        loop = asyncio._get_running_loop()
        if loop is None:
            return  # nothing would read it: the next claim, on a loop, binds
        path = self.path(slot)
        listener = self._new_socket()
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a dead worker's: this slot's lock is ours
            listener.bind(path)
            os.chmod(path, 0o600)
            made = os.stat(path)
            loop.add_reader(listener.fileno(), self._heard)
        except (OSError, NotImplementedError) as exc:
            self._drop(listener)
            with contextlib.suppress(OSError):
                os.unlink(path)
            if not self._warned:
                self._warned = True
                logger.warning(
                    "asgi-admission: the wake socket %s cannot be used (%s); this worker's "
                    "waiters are found by its periodic look instead (within a quarter of a "
                    "second) when capacity frees in another worker.",
                    path,
                    exc,
                )
            return
        self._socket, self._slot, self._loop = listener, slot, loop
        self._bound = (made.st_dev, made.st_ino)

    def ring(self, slot: int, tries: int = 0) -> None:
        """Wake the worker holding ``slot``: one byte, never blocking, never raising."""
        if self._flush is not None and not self._flush():
            loop = asyncio._get_running_loop()
            if loop is not None and tries < _RETRIES:
                loop.call_later(RETRY_S, self.ring, slot, tries + 1)
                return
        with contextlib.suppress(OSError):  # the freed watch serves
            sender = self._sender
            if sender is None or self._pid != os.getpid():
                self._pid = os.getpid()
                sender = self._sender = self._new_socket()
            sender.sendto(b"\0", socket.MSG_DONTWAIT, self.path(slot))

    def unlink(self, slot: int) -> None:
        """Remove the wake socket of a dead worker's ``slot`` where nobody listens on it.

        The caller holds the slot's lock, but in a file replaced meanwhile that says
        nothing of a socket a worker of the new file bound under that name.
        """
        if slot == self._slot:
            return
        path = self.path(slot)
        with (
            contextlib.suppress(OSError),
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe,
        ):
            try:
                probe.connect(path)  # a live worker's: it stays
            except ConnectionRefusedError:
                os.unlink(path)  # bound by nobody now

    def close(self, *, unlink: bool = True) -> None:
        """Stop listening; ``unlink``: remove this worker's socket file too."""
        listener, self._socket = self._socket, None
        slot, self._slot = self._slot, -1
        loop, self._loop = self._loop, None
        if listener is None:
            return
        if loop is not None and not loop.is_closed():
            loop.remove_reader(listener.fileno())
        bound, self._bound = self._bound, None
        if unlink:
            path = self.path(slot)
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if (now.st_dev, now.st_ino) == bound:  # not a file another worker made since
                    os.unlink(path)
        self._drop(listener)

    def forget(self) -> None:
        """In a forked child: leave the parent's socket alone."""
        _close_all(self._open)
        self._socket = self._sender = None
        self._slot = -1
        self._loop = None
        self._pid = os.getpid()

    def _new_socket(self) -> socket.socket:
        made = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK)
        self._open.append(made)
        return made

    def _drop(self, sock: socket.socket) -> None:
        self._open.remove(sock)
        sock.close()

    def _heard(self) -> None:
        listener = self._socket
        if listener is None:
            return
        for _ in range(_DRAIN):
            try:
                listener.recv(16)
            except OSError:  # drained (BlockingIOError) or closed meanwhile
                break
        if self._on_ring is not None:
            self._on_ring()


def _close_all(sockets: list[socket.socket]) -> None:
    while sockets:
        sockets.pop().close()


# --------------------------------------------------------------------------------------
# The waiting order's file.
#
# It has the session ledger's geometry (16-byte header, 32-byte slots), so slots are
# claimed and their liveness told by the ledger's OFD lock helpers. A slot holds
# ``(pid, class rank, how many wait, the first waiter's arrival, check)``; the check (a
# hash of the rest) tells a torn or garbage row from a real one.

ORDER_FILE_NAME: Final = "asgi-admission.waiting"
ORDER_MAGIC: Final = b"ASGIWAI1"
#: Slots in a new file: far more worker processes than one container runs.
ORDER_CAPACITY: Final = 256

ORDER_SLOT: Final = struct.Struct("=qiidq")  # pid, class rank, waiting, first arrival, check
# The ledger's slot locks cover its slots' byte ranges: the same geometry here.
assert ORDER_SLOT.size == LEDGER_SLOT.size

EMPTY: Final = bytes(ORDER_SLOT.size)


def check_of(pid: int, rank: int, waiting: int, arrived: float) -> int:
    # Deterministic across processes: numbers hash without the string hash's seed.
    return hash((pid, rank, waiting, arrived))


def row_of(pid: int, rank: int, arrived: float, waiting: int) -> bytes:
    return ORDER_SLOT.pack(pid, rank, waiting, arrived, check_of(pid, rank, waiting, arrived))


def live_rows(fd: int, capacity: int, own_slot: int) -> tuple[bytearray, int]:
    """Under the file's flock: a fresh file's bytes (header left to fill) with every
    whole row whose worker lives, and how many slots it uses; ``own_slot`` is skipped."""
    old = os.pread(fd, slot_offset(capacity), 0)
    kept = bytearray(slot_offset(capacity))
    used = 0
    for slot in range(capacity):
        offset = slot_offset(slot)
        if slot == own_slot:
            used = slot + 1
            continue
        if not slot_held(fd, slot):
            continue
        used = slot + 1
        row = old[offset : offset + ORDER_SLOT.size]
        if len(row) == ORDER_SLOT.size:
            pid, rank, waiting, arrived, check = ORDER_SLOT.unpack(row)
            if check == check_of(pid, rank, waiting, arrived):
                kept[offset : offset + ORDER_SLOT.size] = row
    return kept, used


@functools.lru_cache(maxsize=64)
def waiting_layout(used: int) -> struct.Struct:
    """The ``waiting`` field of the first ``used`` slots: one ``unpack_from`` tells
    which slots have waiters."""
    return struct.Struct("=" + "12xi16x" * used)


@dataclass(frozen=True, slots=True)
class WaitingEntry:
    """One slot of a waiting file with waiters, as :func:`read_waiting` finds it."""

    slot: int
    pid: int
    rank: int
    waiting: int
    arrived: float
    alive: bool


def read_waiting(directory: str | os.PathLike[str]) -> list[WaitingEntry]:
    """The slots with waiters of the waiting file in ``directory``, each with its
    worker's liveness; for operators and tests (it takes no lock)."""
    return [
        WaitingEntry(slot, pid, rank, waiting, arrived, alive)
        for slot, (pid, rank, waiting, arrived, _), alive in read_rows(
            os.path.join(os.fspath(directory), ORDER_FILE_NAME), ORDER_SLOT
        )
        if waiting
    ]


# --------------------------------------------------------------------------------------
# One worker's slot in the waiting order's file (its faults: docs/trust.md, "Releases
# are never lost").
#
# No blocking lock once open: a worker writes only its own slot (one ``pwrite``) and
# reads with one ``pread``. The file's ``flock`` serialises only claiming a slot and
# rebuilding, taken with ``LOCK_NB``; only the check at opening waits, at most
# ``LOCK_WAIT_S``. A fork child opens the file again: the parent's descriptor carries
# its slot lock.


class OrderFile:
    """This worker's slot in the waiting file in ``directory``, opened and checked now.

    Its slot is claimed by the first row with waiters. ``fd`` (-1: not open), ``slot``
    (-1: none) and ``row`` (last written; ``b""``: unknown) are read by the order.
    """

    __slots__ = (
        "_bell",
        "_capacity",
        "_header",
        "_layout",
        "_offset",
        "_pid",
        "_want",
        "_warned",
        "directory",
        "fd",
        "path",
        "row",
        "slot",
    )

    def __init__(
        self, directory: str | os.PathLike[str], *, capacity: int, bell: OrderBell | None
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more; got {capacity!r}.")
        self._bell = bell
        self.directory = os.path.abspath(os.fspath(directory))
        self.path = os.path.join(self.directory, ORDER_FILE_NAME)
        self._capacity = capacity
        self._warned: set[str] = set()
        self.fd = -1
        self.slot = -1
        self._offset = 0
        self.row = EMPTY
        self._pid = os.getpid()
        self._set_used(1)
        fd = open_private_file(self.directory, ORDER_FILE_NAME)
        self.fd = fd
        if flock_by(fd, time.monotonic() + LOCK_WAIT_S):
            try:
                self._check_file()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    # -- the order's side -------------------------------------------------------------

    def write(self, head: tuple[int, float] | None, waiting: int) -> None:
        """Write this worker's row (``head``: rank and arrival of its first waiter).

        Never raises: a failure is logged once.
        """
        row = EMPTY if head is None or not waiting else row_of(self._pid, *head, waiting)
        if row == self.row or self.fd < 0:
            return
        try:
            if self.slot < 0 and (row is EMPTY or not self._claim()):
                return
            os.pwrite(self.fd, row, self._offset)
            self.row = row
        except OSError as exc:
            self.row = b""  # unknown now: the next write writes whatever it has
            self._own_order("write", "cannot be written", exc)

    def read(self) -> tuple[bytes, tuple[int, ...]] | None:
        """The header and slots in use, and how many wait in each; ``None`` where the
        file cannot be read (logged once)."""
        try:
            data = self._read()
        except OSError as exc:
            self._own_order("read", "cannot be read", exc)
            return None
        if self.slot >= 0 and not data.startswith(self.row, self._offset):
            self._restore_own()  # lost to a rebuild, or scribbled on
        return data, self._layout.unpack_from(data, HEADER.size)

    def clear_dead(self, slot: int) -> None:
        """Clear a dead worker's slot, holding its lock so a new claimant is not wiped."""
        fd = self.fd
        try:
            slot_lock(fd, slot, fcntl.F_WRLCK)
        except OSError:
            return  # claimed this instant by a live worker
        try:
            os.pwrite(fd, EMPTY, slot_offset(slot))
            if self._bell is not None:
                self._bell.unlink(slot)
        except OSError:
            pass  # ignored while dead; the next attempt tries again
        finally:
            slot_lock(fd, slot, fcntl.F_UNLCK)

    def follow(self, head: tuple[int, float] | None, waiting: int) -> None:
        """Where the file was deleted or replaced under this worker, move to the one now
        at the path. Never raises: a failure is logged once."""
        try:
            if self.fd >= 0 and os.fstat(self.fd).st_nlink == 0:
                self._follow()
                self.write(head, waiting)
        except (OSError, ValueError) as exc:
            self._own_order("follow", "was deleted or replaced and cannot be opened again", exc)

    def leave(self) -> bool:
        """Give up this worker's slot and wake socket; whether there was one."""
        if self.fd < 0 or self.slot < 0:
            return False
        slot = self.slot
        try:
            if self._bell is not None:
                self._bell.close()  # while the slot's lock is held: the file is still ours
            os.pwrite(self.fd, EMPTY, self._offset)
        except OSError:
            pass  # the row reads as a dead worker's once its lock is dropped below
        finally:
            self._reset_slot()
            with contextlib.suppress(OSError):
                slot_lock(self.fd, slot, fcntl.F_UNLCK)
        return True

    def close(self) -> None:
        """Clear this worker's slot and close the file."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            if self._bell is not None:
                self._bell.close()  # while the slot's lock is held: the file is still ours
            if self.slot >= 0:
                os.pwrite(fd, EMPTY, self._offset)
        finally:
            self._reset_slot()
            os.close(fd)  # drops the slot's lock

    def after_fork(self) -> None:
        """In a fork child: a descriptor of its own (the parent's carries its slot lock)."""
        old, self.fd = self.fd, -1
        self._reset_slot()
        if self._bell is not None:
            self._bell.forget()
        if old >= 0:
            os.close(old)
        try:
            self.fd = open_private_file(self.directory, ORDER_FILE_NAME)
        except (OSError, ValueError) as exc:
            warn_once(
                self._warned,
                "fork",
                "asgi-admission: the shared waiting order %s cannot be opened in this "
                "worker (%s); it serves its waiters in its own order.",
                self.path,
                exc,
            )

    # -- the file -----------------------------------------------------------------------

    def _follow(self) -> None:
        fd = open_private_file(self.directory, ORDER_FILE_NAME)
        logger.warning(
            "asgi-admission: the shared waiting order %s was deleted or replaced; moving "
            "this worker's waiters to the file now at that path.",
            self.path,
        )
        old, self.fd = self.fd, fd
        if self._bell is not None:
            self._bell.close(unlink=False)  # that name may be a worker's of the new file
        self._reset_slot()
        self._set_used(1)
        os.close(old)  # drops this worker's slot lock in the old file

    def _reset_slot(self) -> None:
        self.slot = -1
        self._offset = 0
        self.row = EMPTY
        self._pid = os.getpid()

    def _set_used(self, used: int) -> None:
        self._want = slot_offset(used)
        self._header = HEADER.pack(ORDER_MAGIC, self._capacity, used)
        self._layout = waiting_layout(used)

    def _read(self) -> bytes:
        """The header and the slots in use, after rebuilding a bad file."""
        data = os.pread(self.fd, self._want, 0)
        if len(data) == self._want and data.startswith(self._header):
            return data
        if header_problem(data, self._capacity, magic=ORDER_MAGIC) is None:
            self._set_used(HEADER.unpack_from(data)[2])
            data = os.pread(self.fd, self._want, 0)
            if len(data) == self._want:
                return data
        # Rebuilt where the check under the flock finds it unusable (and says why).
        self._rebuild_now()
        return os.pread(self.fd, self._want, 0).ljust(self._want, b"\0")

    def _check_file(self) -> None:
        """Under the flock: rebuild an empty (new) or unusable file."""
        header = os.pread(self.fd, HEADER.size, 0)
        if not header:
            self._rebuild(None)
            return
        problem = header_problem(header, self._capacity, magic=ORDER_MAGIC, kind="waiting-order")
        if problem is None:
            size = os.fstat(self.fd).st_size
            used = HEADER.unpack(header)[2]
            if size < slot_offset(used):
                problem = f"{size} bytes, shorter than its {used} slots in use"
            else:
                self._set_used(used)
        if problem is not None:
            self._rebuild(problem)

    def _rebuild_now(self) -> None:
        """Rebuild if the flock is free at once; else the next attempt tries again."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        try:
            self._check_file()
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _rebuild(self, problem: str | None) -> None:
        """Under the flock: a fresh file keeping every whole row whose worker lives."""
        fd, capacity = self.fd, self._capacity
        kept, used = live_rows(fd, capacity, self.slot)
        if problem is not None:
            logger.warning(
                "asgi-admission: the shared waiting order %s was unusable (%s); rebuilding "
                "it. Each worker writes its waiters back at its next look.",
                self.path,
                problem,
            )
        used = max(used, 1)
        kept[: HEADER.size] = HEADER.pack(ORDER_MAGIC, capacity, used)
        os.ftruncate(fd, len(kept))
        os.pwrite(fd, bytes(kept), 0)
        self._set_used(used)
        if self.slot >= 0:
            self._restore_own()

    def _restore_own(self) -> None:
        row, self.row = self.row, b""
        try:
            os.pwrite(self.fd, row, self._offset)
            self.row = row
        except OSError:
            pass  # the next write tries again

    def _claim(self) -> bool:
        """Take the first slot no live worker holds, if the flock is free at once."""
        fd = self.fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            self._check_file()
            slot = claim_free_slot(fd, self._capacity)
            if slot is not None:
                self.slot, self._offset = slot, slot_offset(slot)
                self.row = b""
                if self._bell is not None:
                    self._bell.bind(slot)
                if slot >= HEADER.unpack(os.pread(fd, HEADER.size, 0))[2]:
                    os.pwrite(fd, HEADER.pack(ORDER_MAGIC, self._capacity, slot + 1), 0)
                    self._set_used(slot + 1)
                return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        warn_once(
            self._warned,
            "full",
            "asgi-admission: all %d slots of the shared waiting order %s are held by live "
            "workers; this worker serves its waiters in its own order.",
            self._capacity,
            self.path,
        )
        return False

    def _own_order(self, key: str, problem: str, exc: BaseException) -> None:
        warn_once(
            self._warned,
            key,
            "asgi-admission: the shared waiting order %s %s (%s); this worker serves its "
            "waiters in its own order until it can.",
            self.path,
            problem,
            exc,
        )


#: Where this worker has no waiter: behind every other worker's first.
_LAST: Final = (2**31 - 1, float("inf"))


class SharedOrder:
    """This worker's place in the container's waiting order, handed to its ``WaitQueue``.

    The queue publishes its first waiter (:meth:`publish`), asks :meth:`ahead` before
    each attempt and tells :meth:`passed` after each pass.
    """

    __slots__ = ("__weakref__", "_file", "_head", "_waiting", "bell")

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        capacity: int = ORDER_CAPACITY,
        bell: OrderBell | None = None,
    ) -> None:
        self._file = OrderFile(directory, capacity=capacity, bell=bell)
        self.bell = bell
        # What this worker last published: its first waiter, and how many wait.
        self._head: tuple[int, float] | None = None
        self._waiting = 0
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    def now(self) -> float:
        """An arrival time: ``time.monotonic()``, the clock every worker shares."""
        return time.monotonic()

    def publish(self, head: tuple[int, float] | None, waiting: int) -> None:
        """This worker's first waiter (rank, arrival) and how many wait; never raises."""
        order_file = self._file
        if (
            head == self._head
            and waiting == self._waiting
            and order_file.row  # b"": unknown, written again
            and (order_file.slot >= 0 or head is None)  # else a claim to try again
        ):
            return  # as written (a pass that admitted no one, a wake that changed nothing)
        self._head, self._waiting = head, waiting
        order_file.write(head, waiting)

    def ahead(self, rank: int, arrived: float) -> bool:
        """Whether another live worker's waiter is served before one of ``rank`` that
        arrived at ``arrived``."""
        return self._ahead_slot((rank, arrived), best=False) is not None

    def tell_rings(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the queue's wake) when another worker rings this one."""
        if self.bell is not None:
            self.bell.tell_rings(callback)

    def passed(self) -> None:
        """After a pass of this worker's queue: ring the worker whose waiter is the
        container's first now, if another's."""
        bell = self.bell
        if bell is None or self._file.fd < 0:
            return
        slot = self._ahead_slot(self._head or _LAST, best=True)
        if slot is not None:
            bell.ring(slot)

    def _ahead_slot(self, mine: tuple[int, float], *, best: bool) -> int | None:
        """The slot of a live worker whose first waiter is served before ``mine`` (the
        earliest such where ``best``). Dead workers' slots met on the way are cleared."""
        order_file = self._file
        read = order_file.read()
        if read is None:
            return None
        data, waiting = read
        own, fd = order_file.slot, order_file.fd
        found = None
        for slot, count in enumerate(waiting):
            if not count or slot == own:
                continue
            offset = slot_offset(slot)
            pid, other_rank, _, other_arrived, check = ORDER_SLOT.unpack_from(data, offset)
            if check != check_of(pid, other_rank, count, other_arrived):
                continue  # torn by its worker's write in this instant, or garbage
            head = (other_rank, other_arrived)
            if head >= mine:
                continue
            if not slot_held(fd, slot):
                order_file.clear_dead(slot)
            elif not best:
                return slot
            else:
                mine, found = head, slot  # the one to beat from here on
        return found

    def first(self) -> bool:
        """Whether this worker's first waiter is the container's first (the freed watch asks).

        It also claims a slot a busy file lock put off, and follows a replaced file (an
        ``fstat``, too dear for every attempt).
        """
        self._file.follow(self._head, self._waiting)
        head = self._head
        if head is None:
            return False
        if self._file.slot < 0:
            self.publish(head, self._waiting)  # a claim put off by a busy file lock
        return not self.ahead(head[0], head[1])

    def leave(self) -> None:
        """Give up this worker's slot and wake socket at the end of a lifespan."""
        if self._file.leave():
            self._head, self._waiting = None, 0

    def close(self) -> None:
        """Clear this worker's slot and close the file (shutdown and tests)."""
        self._file.close()

    def _after_fork(self) -> None:
        # The parent's waiters are not the child's: it publishes its own.
        self._head, self._waiting = None, 0
        self._file.after_fork()


def _forked(ref: weakref.ReferenceType[SharedOrder]) -> None:
    order = ref()
    if order is not None:
        order._after_fork()
