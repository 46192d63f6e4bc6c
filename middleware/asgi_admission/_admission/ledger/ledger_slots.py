"""The shared ledger file's layout and its slots' locks, and reading it from outside.

``<shared_dir>/asgi-admission.ledger``: a 16-byte header (magic, slot capacity, slots
in use) and fixed 32-byte slots of four int64s, ``(pid, start_time, pending, active)``.
A worker holds an exclusive OFD byte-range lock on its own slot while its descriptor is
open; the kernel drops it when the process dies, ``SIGKILL`` included, so a slot with
counts whose lock is free belongs to a dead worker (``ledger_file.py`` has the whole
story). The waiting order's file (``scheduling/order_file.py``) has the same geometry
and uses the same locks.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import os
import struct
from dataclasses import dataclass
from typing import Any, Final

FILE_NAME: Final = "asgi-admission.ledger"
MAGIC: Final = b"ASGIADM1"

HEADER: Final = struct.Struct("=8sII")  # magic, capacity, slots in use
SLOT: Final = struct.Struct("=qqqq")  # pid, start time (clock ticks), pending, active
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


def process_start_time(pid: int | str = "self") -> int:
    """Field 22 of ``/proc/<pid>/stat``: when the process started, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return 0


def slot_offset(slot: int) -> int:
    return HEADER.size + slot * SLOT.size


def slot_lock(fd: int, slot: int, command: int, lock_type: int) -> int:
    """``fcntl`` an OFD lock over one slot; returns the lock type the kernel reports."""
    request = _FLOCK.pack(lock_type, os.SEEK_SET, slot_offset(slot), SLOT.size, 0)
    lock_type_now: int = _FLOCK.unpack(fcntl.fcntl(fd, command, request))[0]
    return lock_type_now


@functools.lru_cache(maxsize=1024)
def _probe(slot: int) -> bytes:
    # Packed once per slot: every decision probes each busy slot's lock.
    return _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot_offset(slot), SLOT.size, 0)


_UNLOCKED: Final = struct.pack("h", fcntl.F_UNLCK)


def slot_held(fd: int, slot: int) -> bool:
    """Whether another open file description holds ``slot``'s lock: its worker lives."""
    return fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _probe(slot))[:2] != _UNLOCKED


def claim_free_slot(fd: int, capacity: int) -> int | None:
    """Lock the first of ``capacity`` slots no live worker holds and return it; ``None``
    when every slot is held. An error other than "held" is raised."""
    for slot in range(capacity):
        try:
            slot_lock(fd, slot, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                continue
            raise
        return slot
    return None


def header_problem(
    header: bytes, expected_capacity: int, *, magic: bytes = MAGIC, kind: str = "ledger"
) -> str | None:
    """What is wrong with the header at the start of ``header`` (a file of this geometry:
    the ledger's, or another ``kind`` with its own ``magic``), in words for a warning;
    ``None`` when it is sound."""
    if len(header) < HEADER.size:
        return f"a header of {len(header)} bytes"
    found, capacity, used = HEADER.unpack_from(header)
    if found != magic:
        return f"no {kind} header"
    if capacity != expected_capacity:
        return f"{capacity} slots where {expected_capacity} were expected"
    if used > capacity:
        return f"{used} slots in use of {capacity}"
    return None


def read_rows(path: str, layout: struct.Struct) -> list[tuple[int, tuple[Any, ...], bool]]:
    """Every whole slot of the file at ``path`` (this geometry, rows of ``layout``): its
    number, its fields and whether a live worker holds its lock. For operators and
    tests; it takes no lock, so a row may be mid-update."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        return [
            (slot, layout.unpack_from(data, slot_offset(slot)), slot_held(fd, slot))
            for slot in range(max(0, len(data) - HEADER.size) // layout.size)
        ]
    finally:
        os.close(fd)


def read_entries(directory: str | os.PathLike[str]) -> list[LedgerEntry]:
    """The claimed slots of the ledger file in ``directory``, with each owner's liveness
    (:func:`read_rows`)."""
    return [
        LedgerEntry(slot, pid, start_time, pending, active, alive)
        for slot, (pid, start_time, pending, active), alive in read_rows(
            os.path.join(os.fspath(directory), FILE_NAME), SLOT
        )
        if pid or pending or active
    ]
