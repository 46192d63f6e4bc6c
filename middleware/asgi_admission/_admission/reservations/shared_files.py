"""The reservation state the workers of a container share in ``ADMISSION_SHARED_DIR``.

Two small files beside the session ledger: the settling queue
(``asgi-admission.settling``, fixed binary rows) and what was learned of each
route (``asgi-admission.learned``, JSON). Both are read and written inside the
ledger's critical section (its ``flock`` serialises the workers), or, for the
learned file, under its own ``flock``.

Notes:

- They are opened as the ledger is (``safe_files.open_private_file``): relative to
  the checked directory, no symlink followed, a new file ``0600``, an existing one a
  regular file of this user that no one else may write to, else the error names
  ``ADMISSION_SHARED_DIR``.
- A malformed settling file is rebuilt empty (reservations in it then settle by
  time); a malformed learned file is replaced (what it held is learned again).
- Once the service runs, a fault never raises out of them: the directory deleted (a
  tmp cleaner, an operator's ``rm``) is recreated, as the ledger does; a settling file
  deleted or replaced is followed, its rows carried over; a learned file that cannot be
  used is logged once and retried, each worker keeping what it learned meanwhile.
  Startup still fails with the error naming ``ADMISSION_SHARED_DIR``.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

from asgi_admission._admission.ledger.ledger_section import LINK_CHECK_INTERVAL_S
from asgi_admission._admission.ledger.safe_files import (
    SHARED_DIR_SETTING,
    open_private_file,
    process_alive,
)
from asgi_admission._admission.reservations.settle_queue import QueueRecord

logger = logging.getLogger("asgi_admission")

_T = TypeVar("_T")

SETTLING_FILE: Final = "asgi-admission.settling"
LEARNED_FILE: Final = "asgi-admission.learned"
SETTLING_MAGIC: Final = b"ASGISET1"
#: Rows in the settling file: far more unsettled sessions than one container holds.
SETTLING_CAPACITY: Final = 4096

_HEADER: Final = struct.Struct("=8sIIq")  # magic, capacity, rows in use, floor (-1: none)
_ROW: Final = struct.Struct("=qqdqq?7x")  # pid, seq, admitted at, base, expected, placeholder


def open_shared(directory: str, name: str) -> int:
    """Open (or create, ``0600``) ``name`` in the shared directory, making the directory
    (``0700``) if it is missing: a deleted one is made again. ``ValueError`` naming
    ``ADMISSION_SHARED_DIR`` for what is unsafe (a symlink, not a regular file, another
    user's, writable by others), as for the ledger itself."""
    return open_private_file(directory, name, setting=SHARED_DIR_SETTING)


class SharedSettleQueue:
    """The settling queue of every worker, in one file; used inside the ledger's lock."""

    __slots__ = (
        "_broken",
        "_directory",
        "_fd",
        "_may_follow",
        "_next_check",
        "_others",
        "_pid",
        "_rows",
        "path",
    )

    def __init__(self, directory: str, *, may_follow: Callable[[], bool] | None = None) -> None:
        # Whether this worker's ledger is the file now at its path. The queue is used
        # under the ledger's lock, so it may move to a new file only once the ledger
        # has: until then the workers already in the new ledger would write the new
        # queue under a lock this worker does not hold.
        self._may_follow = may_follow
        self._directory = directory
        self.path = os.path.join(directory, SETTLING_FILE)
        self._fd = open_shared(directory, SETTLING_FILE)
        self._next_check = time.monotonic() + LINK_CHECK_INTERVAL_S
        self._broken = False
        self._pid = os.getpid()
        self._others: tuple[float, ...] | None = ()
        self._rows = b""
        with self._exclusive():
            header = os.pread(self._fd, _HEADER.size, 0)
            if not self._usable(header):
                self._reset(None if not header else "an unreadable header")

    def _usable(self, header: bytes) -> bool:
        if len(header) < _HEADER.size:
            return False
        magic, capacity, count, _floor = _HEADER.unpack(header)
        return bool(magic == SETTLING_MAGIC and capacity == SETTLING_CAPACITY and count <= capacity)

    def _reset(self, problem: str | None) -> None:
        if problem is not None:
            logger.warning(
                "asgi-admission: the shared settling queue %s was unusable (%s); starting "
                "it afresh. Sessions in it settle by time.",
                self.path,
                problem,
            )
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, _HEADER.pack(SETTLING_MAGIC, SETTLING_CAPACITY, 0, -1), 0)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        now = time.monotonic()
        if now >= self._next_check:
            # An fstat per decision would show in its cost: asked at most every
            # LINK_CHECK_INTERVAL_S, as the ledger beside it is (ledger_section.py).
            self._next_check = now + LINK_CHECK_INTERVAL_S
            if os.fstat(self._fd).st_nlink == 0:
                if self._following_allowed():
                    self._follow()
                else:
                    self._next_check = 0.0  # look again at the next load
        return self._load()

    def _following_allowed(self) -> bool:
        if self._may_follow is None:
            return True
        try:
            return self._may_follow()
        except OSError:
            return False

    def _load(self) -> tuple[int | None, list[QueueRecord]]:
        header = os.pread(self._fd, _HEADER.size, 0)
        if not self._usable(header):
            self._reset("an unreadable header")
            return None, []
        _magic, _capacity, count, floor = _HEADER.unpack(header)
        if not count:
            self._others = ()
            return None, []
        data = os.pread(self._fd, count * _ROW.size, _HEADER.size)
        rows = self._rows = data[: len(data) - len(data) % _ROW.size]
        self._others = None
        records = [
            QueueRecord(pid, seq, admitted_at, base, expected, placeholder)
            for pid, seq, admitted_at, base, expected, placeholder in _ROW.iter_unpack(rows)
        ]
        return (None if floor < 0 else floor), records

    def store(self, floor: int | None, records: list[QueueRecord]) -> None:
        if len(records) > SETTLING_CAPACITY:
            logger.warning(
                "asgi-admission: the shared settling queue %s is full; the oldest entries "
                "are dropped and settle by time.",
                self.path,
            )
            records = records[-SETTLING_CAPACITY:]
        rows = b"".join(
            _ROW.pack(r.pid, r.seq, r.admitted_at, r.base_bytes, r.expected_bytes, r.placeholder)
            for r in records
        )
        header = _HEADER.pack(
            SETTLING_MAGIC, SETTLING_CAPACITY, len(records), -1 if floor is None else floor
        )
        os.pwrite(self._fd, header + rows, 0)

    def _follow(self) -> None:
        """The file was deleted or replaced: move to the one at the path now, carrying
        over this worker's own rows (each live worker carries its own: a row another
        worker has since dropped must not come back). If it cannot be opened, the old
        file still serves this worker; logged once."""
        try:
            fd = open_shared(self._directory, SETTLING_FILE)
        except (OSError, ValueError) as exc:
            if not self._broken:
                self._broken = True
                logger.warning(
                    "asgi-admission: the shared settling queue %s was deleted and cannot be "
                    "made again (%s); this worker settles its own sessions until it can.",
                    self.path,
                    exc,
                )
            return
        floor, records = self._load()
        old, self._fd = self._fd, fd
        try:
            with self._exclusive():
                header = os.pread(fd, _HEADER.size, 0)
                if not self._usable(header):
                    self._reset(None)
                new_floor, new_records = self._load()
                known = {(r.pid, r.seq) for r in new_records}
                pid = os.getpid()
                moved = [r for r in records if r.pid == pid and (r.pid, r.seq) not in known]
                if moved:
                    # Placeholders first (they are a prefix), then in admission order.
                    merged = sorted(new_records + moved, key=_queue_order)
                    self.store(new_floor if new_floor is not None else floor, merged)
        except OSError:
            # The new file failed under us (a full disk): stay in the old one for now.
            self._fd = old
            os.close(fd)
            self._next_check = 0.0
            return
        self._broken = False
        os.close(old)
        logger.warning(
            "asgi-admission: the shared settling queue %s was deleted or replaced; this "
            "worker moved to the file now at that path.",
            self.path,
        )

    def owner_alive(self, pid: int) -> bool:
        return process_alive(pid)

    @property
    def shared(self) -> bool:
        return True

    @property
    def others(self) -> tuple[float, ...]:
        """The other workers' admission times at the last load (its bytes, not its records)."""
        if self._others is None:
            pid = self._pid
            self._others = tuple(r[2] for r in _ROW.iter_unpack(self._rows) if r[0] != pid)
        return self._others

    def after_fork(self) -> None:
        # flock belongs to the open file description: a child opens its own. Never
        # raises (a fork hook has no caller to tell): if the file cannot be opened now,
        # the child keeps the parent's and looks again at its next load.
        self._others = self.others  # made with the pid of that load: the parent's
        self._pid = os.getpid()
        try:
            fd = open_shared(self._directory, SETTLING_FILE)
        except (OSError, ValueError):
            self._next_check = 0.0
            return
        os.close(self._fd)
        self._fd = fd

    def close(self) -> None:
        os.close(self._fd)


def _queue_order(record: QueueRecord) -> tuple[bool, float]:
    return not record.placeholder, record.admitted_at
