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
  (``safe_files``) and held by each worker through ``order_hold.OrderHold``, which never
  waits for a lock once open and rebuilds a bad file. A dead worker's waiters vanish
  with its slot's lock: its slot is ignored.
- Only the first waiter matters: another worker's waiter comes before a waiter of rank
  *r* arriving at *t* exactly when that worker's first does. Arrivals are
  ``time.monotonic()``, one clock for every process of a machine.
- Where the file cannot be written or read, this worker serves its own waiters in its
  own order (logged once) until it can.
- After each of this worker's passes (:meth:`SharedOrder.passed`), the worker holding
  the container's first waiter, if another, is rung (``bell``, ``order_bell.py``): its
  pass runs at once. :meth:`SharedOrder.first` is the fallback, asked by the periodic
  look of each worker with waiters (docs/configuration.md, the wait queue).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Final

from asgi_admission._admission.ledger.ledger_slots import slot_held, slot_offset
from asgi_admission._admission.scheduling.order_bell import OrderBell
from asgi_admission._admission.scheduling.order_file import ORDER_CAPACITY, ORDER_SLOT, check_of
from asgi_admission._admission.scheduling.order_hold import OrderHold

#: Where this worker has no waiter: behind every other worker's first.
_LAST: Final = (2**31 - 1, float("inf"))


class SharedOrder:
    """This worker's place in the container's waiting order (see the module notes).

    Hand it to the worker's ``WaitQueue`` (``order=``): the queue publishes its first
    waiter through :meth:`publish`, asks :meth:`ahead` before each attempt and tells
    :meth:`passed` after each pass. ``bell`` (``None``: none) wakes the other workers.
    """

    __slots__ = ("__weakref__", "_head", "_hold", "_waiting", "bell", "directory", "path")

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        capacity: int = ORDER_CAPACITY,
        bell: OrderBell | None = None,
    ) -> None:
        self._hold = hold = OrderHold(directory, capacity=capacity, bell=bell)
        self.bell = bell
        self.directory = hold.directory
        self.path = hold.path
        #: What this worker last published: its first waiter, and how many wait.
        self._head: tuple[int, float] | None = None
        self._waiting = 0
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
        hold = self._hold
        if (
            head == self._head
            and waiting == self._waiting
            and hold.row  # b"": unknown, written again
            and (hold.slot >= 0 or head is None)  # else a claim to try again
        ):
            return  # as written (a pass that admitted no one, a wake that changed nothing)
        self._head, self._waiting = head, waiting
        hold.write(head, waiting)

    def ahead(self, rank: int, arrived: float) -> bool:
        """Whether another live worker's waiter is served before a waiter of class
        ``rank`` (0: served first) that arrived at ``arrived``: one ``pread``, one
        ``fcntl`` per slot with waiters."""
        return self._ahead_slot((rank, arrived), best=False) is not None

    def tell_rings(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (the queue's wake) on the loop when another worker rings this
        one (nothing without a bell)."""
        if self.bell is not None:
            self.bell.tell_rings(callback)

    def passed(self) -> None:
        """After a pass of this worker's queue (its first waiter published): ring the
        worker whose waiter is the container's first now, if it is another's, so that its
        pass runs at once (it takes what capacity is left, or finds none)."""
        bell = self.bell
        if bell is None or self._hold.fd < 0:
            return
        slot = self._ahead_slot(self._head or _LAST, best=True)
        if slot is not None:
            bell.ring(slot)

    def _ahead_slot(self, mine: tuple[int, float], *, best: bool) -> int | None:
        """The slot of a live worker whose first waiter is served before ``mine`` (a
        class rank and an arrival), the earliest served where ``best``; ``None``: none
        is. Dead workers' slots met on the way are cleared."""
        hold = self._hold
        read = hold.read()
        if read is None:
            return None
        data, waiting = read
        own, fd = hold.slot, hold.fd
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
                hold.clear_dead(slot)
            elif not best:
                return slot
            else:
                mine, found = head, slot  # the one to beat from here on
        return found

    def first(self) -> bool:
        """Whether this worker has waiters and its first is the container's first: for
        the periodic look (``capacity_wait.FreedWatch``), which wakes the queue as it
        becomes so.

        It also claims a slot that a busy file lock put off, and follows a file deleted
        or replaced under this worker (an ``fstat``, too dear for every attempt but not
        for a sample), moving its row to the file now at the path, where the workers
        that open it from now on look."""
        self._hold.follow(self._head, self._waiting)
        head = self._head
        if head is None:
            return False
        if self._hold.slot < 0:
            self.publish(head, self._waiting)  # a claim put off by a busy file lock
        return not self.ahead(head[0], head[1])

    def leave(self) -> None:
        """Give up this worker's slot and wake socket, keeping the file open (the end of
        a lifespan): the next waiter claims a slot again, in a lifespan run later too."""
        if self._hold.leave():
            self._head, self._waiting = None, 0

    def close(self) -> None:
        """Clear this worker's slot and close the file (shutdown and tests)."""
        self._hold.close()

    def _after_fork(self) -> None:
        # The parent's waiters are not the child's: it publishes its own.
        self._head, self._waiting = None, 0
        self._hold.after_fork()


def _forked(ref: weakref.ReferenceType[SharedOrder]) -> None:
    order = ref()
    if order is not None:
        order._after_fork()
