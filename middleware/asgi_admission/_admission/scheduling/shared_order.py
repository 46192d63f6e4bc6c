"""One waiting order for the workers of a container: who is first, whichever worker holds it.

Each worker's :class:`~asgi_admission._admission.scheduling.queue.WaitQueue` serves its
own waiters by class, then arrival. With several workers sharing a ledger, a freed slot
must go to the oldest waiter of the highest class in the container, not to whichever
worker looks first: each worker publishes its first waiter here, and before each attempt
asks whether another live worker's waiter comes first (then it answers ``Verdict.FULL``
and leaves the capacity to that one).

Notes:

- One small file beside the session ledger, ``<shared_dir>/asgi-admission.waiting``
  (its rows and their slot locks: ``order_file.py``), opened as the ledger is
  (``safe_files``); a dead worker's waiters vanish with its slot's lock.
- Only the first waiter matters: another worker's waiter comes before a waiter of rank
  *r* arriving at *t* exactly when that worker's first does. Arrivals are
  ``time.monotonic()``, one clock for every process of a machine.
- No blocking lock, ever: a worker writes only its own slot (no one else writes a live
  slot), so publishing is one ``pwrite`` and asking one ``pread``. The file's ``flock``
  serialises only claiming a slot and rebuilding the file, taken with ``LOCK_NB``; when
  another worker holds it, this worker tries again at its next publish and meanwhile
  serves its own waiters in its own order.
- A dead worker's slot (waiters, its lock free) is ignored, and cleared by whoever
  first takes its lock to prove it free. A truncated or garbage file is rebuilt with a
  warning naming it; the rows that are still whole and whose worker lives are kept, and
  every worker writes its own row back at its next look if it finds it gone.
- After each of this worker's passes (:meth:`SharedOrder.passed`), the worker holding
  the container's first waiter, if another, is rung (``bell``, ``order_bell.py``): its
  pass runs at once. :meth:`SharedOrder.first` is the fallback, asked by the periodic
  look of each worker with waiters (docs/configuration.md, the wait queue).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import Final

from asgi_admission._admission.ledger.ledger import LOCK_WAIT_S
from asgi_admission._admission.ledger.ledger_file import flock_by
from asgi_admission._admission.ledger.ledger_slots import (
    HEADER,
    claim_free_slot,
    header_problem,
    slot_held,
    slot_lock,
    slot_offset,
)
from asgi_admission._admission.ledger.safe_files import open_private_file
from asgi_admission._admission.scheduling.order_bell import OrderBell
from asgi_admission._admission.scheduling.order_file import (
    DEFAULT_CAPACITY,
    FILE_NAME,
    MAGIC,
    SETTING,
    SLOT,
    live_rows,
)
from asgi_admission._admission.scheduling.order_file import EMPTY as _EMPTY
from asgi_admission._admission.scheduling.order_file import check_of as _check
from asgi_admission._admission.scheduling.order_file import row_of as _row
from asgi_admission._admission.scheduling.order_file import waiting_layout as _waiting_layout

logger = logging.getLogger("asgi_admission")

#: Where this worker has no waiter: behind every other worker's first.
_LAST: Final = (2**31 - 1, float("inf"))


class SharedOrder:
    """This worker's place in the container's waiting order (see the module notes).

    Hand it to the worker's ``WaitQueue`` (``order=``): the queue publishes its first
    waiter through :meth:`publish`, asks :meth:`ahead` before each attempt and tells
    :meth:`passed` after each pass. ``bell`` (``None``: none) wakes the other workers.
    """

    __slots__ = (
        "__weakref__",
        "_capacity",
        "_fd",
        "_head",
        "_header",
        "_layout",
        "_offset",
        "_pid",
        "_row",
        "_slot",
        "_waiting",
        "_want",
        "_warned",
        "bell",
        "directory",
        "path",
    )

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        capacity: int = DEFAULT_CAPACITY,
        bell: OrderBell | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more; got {capacity!r}.")
        self.bell = bell
        self.directory = os.path.abspath(os.fspath(directory))
        self.path = os.path.join(self.directory, FILE_NAME)
        self._capacity = capacity
        self._warned: set[str] = set()
        #: What this worker last published: its first waiter, and how many wait.
        self._head: tuple[int, float] | None = None
        self._waiting = 0
        self._fd = -1
        self._slot = -1
        self._offset = 0
        #: The row last written to this worker's slot (b"": unknown, write it).
        self._row = _EMPTY
        self._pid = os.getpid()
        self._set_used(1)
        # Opened (and checked, or rebuilt) now, so that a bad directory fails at startup
        # naming the setting; the slot is claimed by the first waiter, in the serving
        # process.
        fd = open_private_file(self.directory, FILE_NAME, setting=SETTING)
        self._fd = fd
        if flock_by(fd, time.monotonic() + LOCK_WAIT_S):
            try:
                self._check_file()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    # -- the queue's side -------------------------------------------------------------

    def now(self) -> float:
        """An arrival time: ``time.monotonic()``, the clock every worker shares."""
        return time.monotonic()

    def publish(self, head: tuple[int, float] | None, waiting: int) -> None:
        """This worker's first waiter (its class's rank, its arrival) and how many wait;
        ``None`` and 0 when none does. Never raises: a failure is logged once, and
        this worker's waiters are then served in its own order."""
        if (
            head == self._head
            and waiting == self._waiting
            and self._row  # b"": unknown, written again
            and (self._slot >= 0 or head is None)  # else a claim to try again
        ):
            return  # as written (a pass that admitted no one, a wake that changed nothing)
        self._head, self._waiting = head, waiting
        row = _EMPTY if head is None or not waiting else _row(self._pid, *head, waiting)
        if row == self._row or self._fd < 0:
            return
        try:
            if self._slot < 0 and (row is _EMPTY or not self._claim()):
                return
            os.pwrite(self._fd, row, self._offset)
            self._row = row
        except OSError as exc:
            self._row = b""  # unknown now: the next publish writes whatever it has
            self._warn_once(
                "write",
                "asgi-admission: the shared waiting order %s cannot be written (%s); this "
                "worker serves its waiters in its own order until it can.",
                self.path,
                exc,
            )

    def ahead(self, rank: int, arrived: float) -> bool:
        """Whether another live worker's waiter is served before a waiter of class
        ``rank`` (0: served first) that arrived at ``arrived``: one ``pread``, one
        ``fcntl`` per slot with waiters."""
        return self._ahead_slot((rank, arrived), best=False) is not None

    def tell_rings(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the queue's wake) on the loop when another worker rings this
        one (nothing without a bell)."""
        if self.bell is not None:
            self.bell.on_ring = callback

    def passed(self) -> None:
        """After a pass of this worker's queue (its first waiter published): ring the
        worker whose waiter is the container's first now, if it is another's, so that its
        pass runs at once (it takes what capacity is left, or finds none)."""
        bell = self.bell
        if bell is None or self._fd < 0:
            return
        slot = self._ahead_slot(self._head or _LAST, best=True)
        if slot is not None:
            bell.ring(slot)

    def _ahead_slot(self, mine: tuple[int, float], *, best: bool) -> int | None:
        """The slot of a live worker whose first waiter is served before ``mine`` (a
        class rank and an arrival), the earliest served where ``best``; ``None``: none
        is. Dead workers' slots met on the way are cleared."""
        try:
            data = self._read()
        except OSError as exc:
            self._warn_once(
                "read",
                "asgi-admission: the shared waiting order %s cannot be read (%s); this "
                "worker serves its waiters in its own order until it can.",
                self.path,
                exc,
            )
            return None
        own = self._slot
        if own >= 0 and not data.startswith(self._row, self._offset):
            self._restore_own()  # lost to a rebuild, or scribbled on
        waiting = self._layout.unpack_from(data, HEADER.size)
        found = None
        for slot, count in enumerate(waiting):
            if not count or slot == own:
                continue
            offset = slot_offset(slot)
            pid, other_rank, _, other_arrived, check = SLOT.unpack_from(data, offset)
            if check != _check(pid, other_rank, count, other_arrived):
                continue  # torn by its worker's write in this instant, or garbage
            head = (other_rank, other_arrived)
            if head >= mine:
                continue
            if not slot_held(self._fd, slot):
                self._clear_dead(slot)
            elif not best:
                return slot
            else:
                mine, found = head, slot  # the one to beat from here on
        return found

    def first(self) -> bool:
        """Whether this worker has waiters and its first is the container's first: for
        the periodic look (``room.FreedWatch``), which wakes the queue as it becomes so.

        It also claims a slot that a busy file lock put off, and follows a file deleted
        or replaced under this worker (an ``fstat``, too dear for every attempt but not
        for a sample), moving its row to the file now at the path, where the workers
        that open it from now on look."""
        try:
            if self._fd >= 0 and os.fstat(self._fd).st_nlink == 0:
                self._follow()
        except (OSError, ValueError) as exc:
            self._warn_once(
                "follow",
                "asgi-admission: the shared waiting order %s was deleted or replaced and "
                "cannot be opened again (%s); this worker serves its waiters in its own "
                "order until it can.",
                self.path,
                exc,
            )
        head = self._head
        if head is None:
            return False
        if self._slot < 0:
            self.publish(head, self._waiting)  # a claim put off by a busy file lock
        return not self.ahead(head[0], head[1])

    def leave(self) -> None:
        """Give up this worker's slot and wake socket, keeping the file open (the end of
        a lifespan): the next waiter claims a slot again, in a lifespan run later too."""
        if self._fd < 0 or self._slot < 0:
            return
        slot = self._slot
        try:
            if self.bell is not None:
                self.bell.close()  # while the slot's lock is held: the file is still ours
            os.pwrite(self._fd, _EMPTY, self._offset)
        except OSError:
            pass  # the row reads as a dead worker's once its lock is dropped below
        finally:
            self._reset_slot()
            with contextlib.suppress(OSError):
                slot_lock(self._fd, slot, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)
        self._head, self._waiting = None, 0

    def close(self) -> None:
        """Clear this worker's slot and close the file (shutdown and tests)."""
        fd, self._fd = self._fd, -1
        if fd < 0:
            return
        try:
            if self.bell is not None:
                self.bell.close()  # while the slot's lock is held: the file is still ours
            if self._slot >= 0:
                os.pwrite(fd, _EMPTY, self._offset)
        finally:
            self._reset_slot()
            os.close(fd)  # drops the slot's lock

    # -- the file -----------------------------------------------------------------------

    def _follow(self) -> None:
        fd = open_private_file(self.directory, FILE_NAME, setting=SETTING)
        logger.warning(
            "asgi-admission: the shared waiting order %s was deleted or replaced; moving "
            "this worker's waiters to the file now at that path.",
            self.path,
        )
        old, self._fd = self._fd, fd
        if self.bell is not None:
            self.bell.close(unlink=False)  # that name may be a worker's of the new file
        self._reset_slot()
        self._set_used(1)
        os.close(old)  # drops this worker's slot lock in the old file
        head, waiting = self._head, self._waiting
        self._head, self._waiting = None, 0
        self.publish(head, waiting)

    def _reset_slot(self) -> None:
        self._slot = -1
        self._offset = 0
        self._row = _EMPTY
        self._pid = os.getpid()

    def _set_used(self, used: int) -> None:
        self._want = slot_offset(used)
        self._header = HEADER.pack(MAGIC, self._capacity, used)
        self._layout = _waiting_layout(used)

    def _read(self) -> bytes:
        """The header and the slots in use, after rebuilding a bad file."""
        data = os.pread(self._fd, self._want, 0)
        if len(data) == self._want and data.startswith(self._header):
            return data
        problem = header_problem(data, self._capacity, magic=MAGIC, kind="waiting-order")
        if problem is None:
            used = HEADER.unpack_from(data)[2]
            self._set_used(used)
            data = os.pread(self._fd, self._want, 0)
            if len(data) == self._want:
                return data
            problem = f"{len(data)} bytes, shorter than its {used} slots in use"
        self._rebuild_now()
        return os.pread(self._fd, self._want, 0).ljust(self._want, b"\0")

    def _check_file(self) -> None:
        """Under the flock: rebuild an empty (new) or unusable file."""
        header = os.pread(self._fd, HEADER.size, 0)
        if not header:
            self._rebuild(None)
            return
        problem = header_problem(header, self._capacity, magic=MAGIC, kind="waiting-order")
        if problem is None:
            size = os.fstat(self._fd).st_size
            used = HEADER.unpack(header)[2]
            if size < slot_offset(used):
                problem = f"{size} bytes, shorter than its {used} slots in use"
            else:
                self._set_used(used)
        if problem is not None:
            self._rebuild(problem)

    def _rebuild_now(self) -> None:
        """Rebuild if the flock is free at once (the problem is found and named again
        under it); else another worker holds it, and the next look tries again."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        try:
            self._check_file()
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _rebuild(self, problem: str | None) -> None:
        """Under the flock: a fresh file keeping every whole row whose worker lives."""
        fd, capacity = self._fd, self._capacity
        kept, used = live_rows(fd, capacity, self._slot)
        if problem is not None:
            logger.warning(
                "asgi-admission: the shared waiting order %s was unusable (%s); rebuilding "
                "it. Each worker writes its waiters back at its next look.",
                self.path,
                problem,
            )
        used = max(used, 1)
        kept[: HEADER.size] = HEADER.pack(MAGIC, capacity, used)
        os.ftruncate(fd, len(kept))
        os.pwrite(fd, bytes(kept), 0)
        self._set_used(used)
        if self._slot >= 0:
            self._restore_own()

    def _restore_own(self) -> None:
        row, self._row = self._row, b""
        try:
            os.pwrite(self._fd, row, self._offset)
            self._row = row
        except OSError:
            pass  # the next publish tries again

    def _claim(self) -> bool:
        """Take the first slot no live worker holds, if the flock is free at once."""
        fd = self._fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            self._check_file()
            slot = claim_free_slot(fd, self._capacity)
            if slot is not None:
                self._slot, self._offset = slot, slot_offset(slot)
                self._row = b""
                if self.bell is not None:
                    self.bell.bind(slot)
                if slot >= HEADER.unpack(os.pread(fd, HEADER.size, 0))[2]:
                    os.pwrite(fd, HEADER.pack(MAGIC, self._capacity, slot + 1), 0)
                    self._set_used(slot + 1)
                return True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
        self._warn_once(
            "full",
            "asgi-admission: all %d slots of the shared waiting order %s are held by live "
            "workers; this worker serves its waiters in its own order.",
            self._capacity,
            self.path,
        )
        return False

    def _clear_dead(self, slot: int) -> None:
        """A slot with waiters whose lock is free: its worker died. Cleared while its
        lock is held here, so a worker claiming it this instant is not wiped."""
        fd = self._fd
        try:
            slot_lock(fd, slot, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
        except OSError:
            return  # claimed this instant by a live worker
        try:
            os.pwrite(fd, _EMPTY, slot_offset(slot))
            if self.bell is not None:
                self.bell.unlink(slot)
        except OSError:
            pass  # ignored while dead; the next look tries again
        finally:
            slot_lock(fd, slot, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _after_fork(self) -> None:
        # The child shares the parent's open file description, and with it the parent's
        # slot lock: it opens its own and claims afresh.
        old, self._fd = self._fd, -1
        self._reset_slot()
        self._head, self._waiting = None, 0
        if self.bell is not None:
            self.bell.forget()
        if old >= 0:
            os.close(old)
        try:
            self._fd = open_private_file(self.directory, FILE_NAME, setting=SETTING)
        except (OSError, ValueError) as exc:
            # Left at -1: publishing and asking fail, logged once, and this worker
            # serves its waiters in its own order.
            self._warn_once(
                "fork",
                "asgi-admission: the shared waiting order %s cannot be opened in this "
                "worker (%s); it serves its waiters in its own order.",
                self.path,
                exc,
            )


def _forked(ref: weakref.ReferenceType[SharedOrder]) -> None:
    order = ref()
    if order is not None:
        order._after_fork()
