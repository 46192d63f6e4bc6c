"""The shared ledger's file: its layout, its slot locks, and reading it from outside.

Notes:

- One small file, ``<shared_dir>/asgi-admission.ledger``: a 16-byte header
  (magic, slot capacity, slots in use) and fixed 32-byte slots of four int64s,
  ``(pid, start_time, pending, active)``. It lives in a memory-backed directory
  (``/dev/shm``, a ``medium: Memory`` emptyDir): it never touches a disk.
- It is read and written with ``os.pread``/``os.pwrite``, not ``mmap``: a
  truncated file then gives a short read (rebuilt, with a warning) instead of a
  ``SIGBUS`` on the request path, for 0.1 µs more per decision.
- Liveness: a worker holds an exclusive OFD byte-range lock (``F_OFD_SETLK``) on
  its own slot for as long as its descriptor is open, and the kernel drops it when
  the process dies, ``SIGKILL`` included; a slot with counts whose lock is free
  (``F_OFD_GETLK``) belongs to a dead worker. Pid reuse cannot fool it, and it
  costs 0.5 µs per slot with counts, against 7 µs for reading ``/proc/<pid>/stat``
  to compare start times (``bench/ledger.py``). The start time is still stored,
  for people reading the file.

``SharedLedger`` (``shared_ledger``) does the counting; this module only knows
where things are.
"""

from __future__ import annotations

import fcntl
import functools
import os
import struct
import time
from dataclasses import dataclass
from typing import Final

FILE_NAME: Final = "asgi-admission.ledger"
MAGIC: Final = b"ASGIADM1"

_HEADER: Final = struct.Struct("=8sII")  # magic, capacity, slots in use
_SLOT: Final = struct.Struct("=qqqq")  # pid, start time (clock ticks), pending, active
# struct flock on 64-bit Linux: short type, short whence, (pad), off_t start,
# off_t len, pid_t pid, (pad).
_FLOCK: Final = struct.Struct("hhqqi4x")


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One claimed slot of a ledger file, as :func:`read_entries` finds it."""

    slot: int
    pid: int
    start_time: int
    pending: int
    active: int
    alive: bool


def _start_time(pid: int | str = "self") -> int:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def _slot_offset(slot: int) -> int:
    return _HEADER.size + slot * _SLOT.size


def _slot_lock(fd: int, slot: int, command: int, lock_type: int) -> int:
    """``fcntl`` an OFD lock over one slot; returns the lock type the kernel reports."""
    request = _FLOCK.pack(lock_type, os.SEEK_SET, _slot_offset(slot), _SLOT.size, 0)
    lock_type_now: int = _FLOCK.unpack(fcntl.fcntl(fd, command, request))[0]
    return lock_type_now


@functools.lru_cache(maxsize=1024)
def _probe(slot: int) -> bytes:
    # Packed once per slot: every decision probes each busy slot's lock.
    return _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, _slot_offset(slot), _SLOT.size, 0)


_UNLOCKED: Final = struct.pack("h", fcntl.F_UNLCK)


def _held(fd: int, slot: int) -> bool:
    """Whether another open file description holds ``slot``'s lock: its worker lives."""
    return fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _probe(slot))[:2] != _UNLOCKED


class Settling:
    """After a fault lost the other workers' rows: whether they are all back yet.

    ``start`` counts the slots other live workers hold locks on in ``fd``; ``done`` is
    true once as many slots here have a row and a lock again, or ``max_s`` has passed.
    """

    __slots__ = ("_others", "_until", "max_s")

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        self._until = 0.0
        self._others = 0

    def start(self, fd: int, capacity: int, own: int) -> None:
        self.expect(others_live(fd, capacity, own, with_rows=False))

    def expect(self, others: int) -> None:
        self._others = others
        self._until = time.monotonic() + self.max_s

    def done(self, fd: int, capacity: int, own: int) -> bool:
        if not self._until:
            return True
        if time.monotonic() < self._until and self._others > others_live(
            fd, capacity, own, with_rows=True
        ):
            return False
        self._until = 0.0
        return True


def file_problem(fd: int, capacity: int) -> str | None:
    """What is wrong with the whole file: ``""`` when it is empty (new), else as
    :func:`header_problem`, or too short for its slots."""
    header = os.pread(fd, _HEADER.size, 0)
    if not header:
        return ""
    problem = header_problem(header, capacity)
    size = os.fstat(fd).st_size
    if problem is None and size < _slot_offset(capacity):
        problem = f"{size} bytes, shorter than its {capacity} slots"
    return problem


def others_live(fd: int, capacity: int, own: int, *, with_rows: bool) -> int:
    """How many slots but ``own`` another live worker's lock holds (``with_rows``: and
    whose row names a process); one ``fcntl`` per slot, so only for rare moments."""
    data = os.pread(fd, _slot_offset(capacity), 0)
    count = 0
    for slot in range(capacity):
        if slot == own:
            continue
        if with_rows:
            offset = _slot_offset(slot)
            if len(data) < offset + _SLOT.size or not _SLOT.unpack_from(data, offset)[0]:
                continue
        count += _held(fd, slot)
    return count


def flock_by(fd: int, deadline: float) -> bool:
    """Take ``fd``'s exclusive ``flock`` if it is free by ``deadline`` (``time.monotonic``).

    Never one blocking call: ``LOCK_NB`` retried after sleeps growing from 0.2 to
    5 ms, so a holder that never lets go (a stopped worker) costs a bounded wait.
    """
    delay = 0.0002
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.005)


def header_problem(header: bytes, expected_capacity: int) -> str | None:
    """What is wrong with a ledger file's header, or ``None``."""
    if len(header) < _HEADER.size:
        return f"a header of {len(header)} bytes"
    magic, capacity, used = _HEADER.unpack(header)
    if magic != MAGIC:
        return "no ledger header"
    if capacity != expected_capacity:
        return f"{capacity} slots where {expected_capacity} were expected"
    if used > capacity:
        return f"{used} slots in use of {capacity}"
    return None


def read_entries(directory: str | os.PathLike[str]) -> list[LedgerEntry]:
    """The claimed slots of the ledger file in ``directory``, with each owner's liveness.

    For operators and tests; it takes no lock, so counts may be mid-update.
    """
    path = os.path.join(os.fspath(directory), FILE_NAME)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        entries = []
        for slot in range(max(0, len(data) - _HEADER.size) // _SLOT.size):
            pid, start_time, pending, active = _SLOT.unpack_from(data, _slot_offset(slot))
            if pid or pending or active:
                entries.append(LedgerEntry(slot, pid, start_time, pending, active, _held(fd, slot)))
        return entries
    finally:
        os.close(fd)
