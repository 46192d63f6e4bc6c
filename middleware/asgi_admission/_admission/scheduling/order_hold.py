"""One worker's hold on the shared waiting order's file: its descriptor, slot and row, and upkeep.

``shared_order.SharedOrder`` decides who comes first from what :class:`OrderHold` reads,
and has it write this worker's first waiter; the file's rows and their slot locks are
``order_file.py``'s, the wake socket named after the slot ``order_bell.py``'s.

Notes:

- No blocking lock, ever: a worker writes only its own slot (no one else writes a live
  slot), so writing its row is one ``pwrite`` and a read one ``pread``. The file's
  ``flock`` serialises only claiming a slot and rebuilding the file, taken with
  ``LOCK_NB``; when another worker holds it, this worker tries again at its next write
  and meanwhile serves its own waiters in its own order. Only the check at opening
  waits for it, for at most ``LOCK_WAIT_S``.
- A dead worker's slot (waiters, its lock free) is cleared by whoever first takes its
  lock to prove it free (:meth:`OrderHold.clear_dead`). A truncated or garbage file is
  rebuilt with a warning naming it; the rows that are still whole and whose worker
  lives are kept, and every worker writes its own row back at its next read if it finds
  it gone.
- A file deleted or replaced under this worker is followed (:meth:`OrderHold.follow`),
  and a fork child opens the file again: the parent's descriptor carries its slot lock.
  Each kind of failure is logged once, and this worker then serves its waiters in its
  own order.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time

from asgi_admission._admission.ledger.ledger import LOCK_WAIT_S
from asgi_admission._admission.ledger.ledger_file import flock_by
from asgi_admission._admission.ledger.ledger_slots import (
    HEADER,
    claim_free_slot,
    header_problem,
    slot_lock,
    slot_offset,
)
from asgi_admission._admission.ledger.safe_files import SHARED_DIR_SETTING, open_private_file
from asgi_admission._admission.scheduling.order_bell import OrderBell
from asgi_admission._admission.scheduling.order_file import (
    EMPTY,
    ORDER_FILE_NAME,
    ORDER_MAGIC,
    live_rows,
    row_of,
    waiting_layout,
)

logger = logging.getLogger("asgi_admission")


class OrderHold:
    """This worker's hold on the waiting file in ``directory`` (see the module notes),
    opened, and checked or rebuilt, now: a bad directory fails at startup naming the
    setting. Its slot is claimed by the first row with waiters, in the serving process;
    ``bell`` (``None``: none) is bound to it.

    ``fd`` (-1: not open), ``slot`` (-1: none) and ``row`` (what was last written to the
    slot; ``b""``: unknown, written again) are the hold's own, read by the order."""

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
        fd = open_private_file(self.directory, ORDER_FILE_NAME, setting=SHARED_DIR_SETTING)
        self.fd = fd
        if flock_by(fd, time.monotonic() + LOCK_WAIT_S):
            try:
                self._check_file()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    # -- the order's side -------------------------------------------------------------

    def write(self, head: tuple[int, float] | None, waiting: int) -> None:
        """Write this worker's row: its first waiter (its class's rank, its arrival) and
        how many wait, ``None`` and 0 when none does; the first row with waiters claims a
        slot. Never raises: a failure is logged once."""
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
            self._warn_once(
                "write",
                "asgi-admission: the shared waiting order %s cannot be written (%s); this "
                "worker serves its waiters in its own order until it can.",
                self.path,
                exc,
            )

    def read(self) -> tuple[bytes, tuple[int, ...]] | None:
        """The header and the slots in use, and how many wait in each of those slots,
        after rebuilding a bad file and writing back this worker's row where it is gone;
        ``None`` where the file cannot be read (logged once)."""
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
        if self.slot >= 0 and not data.startswith(self.row, self._offset):
            self._restore_own()  # lost to a rebuild, or scribbled on
        return data, self._layout.unpack_from(data, HEADER.size)

    def clear_dead(self, slot: int) -> None:
        """A slot with waiters whose lock is free: its worker died. Cleared while its
        lock is held here, so a worker claiming it this instant is not wiped."""
        fd = self.fd
        try:
            slot_lock(fd, slot, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
        except OSError:
            return  # claimed this instant by a live worker
        try:
            os.pwrite(fd, EMPTY, slot_offset(slot))
            if self._bell is not None:
                self._bell.unlink(slot)
        except OSError:
            pass  # ignored while dead; the next look tries again
        finally:
            slot_lock(fd, slot, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)

    def follow(self, head: tuple[int, float] | None, waiting: int) -> None:
        """Where the file was deleted or replaced under this worker (an ``fstat``): open
        the file now at the path, where the workers that open it from now on look, and
        write this worker's row there (``head`` and ``waiting`` as for :meth:`write`).
        Never raises: a failure is logged once."""
        try:
            if self.fd >= 0 and os.fstat(self.fd).st_nlink == 0:
                self._follow()
                self.write(head, waiting)
        except (OSError, ValueError) as exc:
            self._warn_once(
                "follow",
                "asgi-admission: the shared waiting order %s was deleted or replaced and "
                "cannot be opened again (%s); this worker serves its waiters in its own "
                "order until it can.",
                self.path,
                exc,
            )

    def leave(self) -> bool:
        """Give up this worker's slot and wake socket, keeping the file open; whether
        there was a slot to give up."""
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
                slot_lock(self.fd, slot, fcntl.F_OFD_SETLK, fcntl.F_UNLCK)
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
        """In a fork child: a descriptor of its own, and no slot until it claims one."""
        # The child shares the parent's open file description, and with it the parent's
        # slot lock: it opens its own and claims afresh.
        old, self.fd = self.fd, -1
        self._reset_slot()
        if self._bell is not None:
            self._bell.forget()
        if old >= 0:
            os.close(old)
        try:
            self.fd = open_private_file(self.directory, ORDER_FILE_NAME, setting=SHARED_DIR_SETTING)
        except (OSError, ValueError) as exc:
            # Left at -1: writing and reading fail, logged once, and this worker
            # serves its waiters in its own order.
            self._warn_once(
                "fork",
                "asgi-admission: the shared waiting order %s cannot be opened in this "
                "worker (%s); it serves its waiters in its own order.",
                self.path,
                exc,
            )

    # -- the file -----------------------------------------------------------------------

    def _follow(self) -> None:
        fd = open_private_file(self.directory, ORDER_FILE_NAME, setting=SHARED_DIR_SETTING)
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
        problem = header_problem(data, self._capacity, magic=ORDER_MAGIC, kind="waiting-order")
        if problem is None:
            used = HEADER.unpack_from(data)[2]
            self._set_used(used)
            data = os.pread(self.fd, self._want, 0)
            if len(data) == self._want:
                return data
            problem = f"{len(data)} bytes, shorter than its {used} slots in use"
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
        """Rebuild if the flock is free at once (the problem is found and named again
        under it); else another worker holds it, and the next look tries again."""
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
        self._warn_once(
            "full",
            "asgi-admission: all %d slots of the shared waiting order %s are held by live "
            "workers; this worker serves its waiters in its own order.",
            self._capacity,
            self.path,
        )
        return False

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)
