"""The shared ledger's file as one worker holds it (its layout and slot locks:
``ledger_slots.py``).

Notes:

- One small file, ``<shared_dir>/asgi-admission.ledger``: a 16-byte header
  (magic, slot capacity, slots in use) and fixed 32-byte slots of four int64s,
  ``(pid, start_time, pending, active)``. It lives in a memory-backed directory
  (``/dev/shm``, a ``medium: Memory`` emptyDir): it never touches a disk.
- It is read and written with ``os.pread``/``os.pwrite``, not ``mmap``: a
  truncated file then gives a short read (rebuilt, with a warning) instead of a
  ``SIGBUS`` on the request path, for a little more per decision. A decision reads
  the header and the slots in use in one ``pread`` and takes every slot's pending
  and active counts with one ``unpack_from``; a worker writes its own slot only
  when the row changed (a release followed by a reservation leaves it as it was).
- Liveness: a worker holds an exclusive OFD byte-range lock (``F_OFD_SETLK``) on
  its own slot for as long as its descriptor is open, and the kernel drops it when
  the process dies, ``SIGKILL`` included; a slot with counts whose lock is free
  (``F_OFD_GETLK``) belongs to a dead worker. Pid reuse cannot fool it, and it
  costs far less per slot with counts than reading ``/proc/<pid>/stat`` to compare
  start times (``bench/ledger.py``, bench/README.md). The start time is still stored,
  for people reading the file.

:class:`LedgerFile` is one worker's hold on the file: its descriptor, its slot
and the row it wrote there; it opens, claims, reads, rebuilds and follows a
replaced file, always under the ``flock`` that ``SharedLedger``
(``shared_ledger``), which does the counting, takes for it.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import struct
import time

from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.ledger.ledger_slots import (
    FILE_NAME,
    HEADER,
    MAGIC,
    SLOT,
    claim_free_slot,
    header_problem,
    process_start_time,
    slot_held,
    slot_offset,
)
from asgi_admission._admission.ledger.safe_files import SHARED_DIR_SETTING, open_private_file

logger = logging.getLogger("asgi_admission")


class Rejoining:
    """After a fault lost the other workers' rows: whether they are all back yet.

    ``start`` counts the slots other live workers hold locks on in ``fd``; ``done`` is
    true once as many slots here have a row and a lock again, or ``max_s`` has passed.
    """

    __slots__ = ("_others", "max_s", "until")

    def __init__(self, max_s: float) -> None:
        self.max_s = max_s
        #: When the wait ends at the latest; 0.0 when there is none (every decision asks).
        self.until = 0.0
        self._others = 0

    def start(self, fd: int, capacity: int, own: int) -> None:
        self.expect(others_live(fd, capacity, own, with_rows=False))

    def expect(self, others: int) -> None:
        self._others = others
        self.until = time.monotonic() + self.max_s

    def done(self, fd: int, capacity: int, own: int) -> bool:
        if not self.until:
            return True
        if time.monotonic() < self.until and self._others > others_live(
            fd, capacity, own, with_rows=True
        ):
            return False
        self.until = 0.0
        return True


def file_problem(fd: int, capacity: int) -> str | None:
    """What is wrong with the whole file: ``""`` when it is empty (new), else as
    :func:`header_problem`, or too short for its slots."""
    header = os.pread(fd, HEADER.size, 0)
    if not header:
        return ""
    problem = header_problem(header, capacity)
    size = os.fstat(fd).st_size
    if problem is None and size < slot_offset(capacity):
        problem = f"{size} bytes, shorter than its {capacity} slots"
    return problem


def others_live(fd: int, capacity: int, own: int, *, with_rows: bool) -> int:
    """How many slots but ``own`` another live worker's lock holds (``with_rows``: and
    whose row names a process); one ``fcntl`` per slot, so only for rare moments."""
    data = os.pread(fd, slot_offset(capacity), 0)
    count = 0
    for slot in range(capacity):
        if slot == own:
            continue
        if with_rows:
            offset = slot_offset(slot)
            if len(data) < offset + SLOT.size or not SLOT.unpack_from(data, offset)[0]:
                continue
        count += slot_held(fd, slot)
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


@functools.lru_cache(maxsize=64)
def counts_layout(used: int) -> struct.Struct:
    """The pending and active fields of the first ``used`` slots, read from the end of
    the header: one ``unpack_from`` for a decision's whole view of the others."""
    return struct.Struct("=" + "16xqq" * used)


def published(own: tuple[int, int, int | None]) -> int:
    """The active count a worker publishes from its ``(pending, active, reported)``:
    the app's, when it reports one."""
    return own[1] if own[2] is None else own[2]


class LedgerFile:
    """One worker's hold on the ledger file in ``directory``: the descriptor, the slot
    claimed in it and the row last written there (see the module notes)."""

    __slots__ = (
        "_capacity",
        "_dirty",
        "_fd",
        "_header",
        "_layout",
        "_offset",
        "_own",
        "_pid",
        "_quiet",
        "_rejoining",
        "_row",
        "_slot",
        "_start",
        "_used",
        "_want",
        "_warned",
        "directory",
        "path",
    )

    def __init__(
        self, directory: str | os.PathLike[str], *, capacity: int, settle_s: float
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be 1 or more; got {capacity!r}.")
        self.directory = os.path.abspath(os.fspath(directory))
        self.path = os.path.join(self.directory, FILE_NAME)
        self._capacity = capacity
        #: This worker's (pending, active, the app's reported count or None): replaced
        #: whole under the owner's lock, so read without it as one consistent snapshot.
        self._own: tuple[int, int, int | None] = (0, 0, None)
        #: Counts changed since the row was written: the next section writes them.
        self._dirty = False
        self._rejoining = Rejoining(settle_s)
        self._fd = -1
        self._slot = -1
        self._pid = os.getpid()
        self._offset = 0
        self._start = 0
        self._row = b""
        #: The file as a look found it with no other slot holding sessions and this
        #: worker's row intact, with this worker's writes since: while the file reads
        #: the same, there is nothing to add up (b"": no such look to go by).
        self._quiet = b""
        self._set_used(1)
        self._warned: set[str] = set()

    def _check_own_row(self, data: bytes) -> None:
        if self._slot >= 0 and not data.startswith(self._row, self._offset):
            self._own_row_changed()

    def _own_row_changed(self) -> None:
        self._rejoining.start(self._fd, self._capacity, self._slot)
        # Edited, or rebuilt (perhaps with fewer slots in use than this one).
        self._warn_once(
            "own",
            "asgi-admission: this worker's slot in %s was changed by someone else; "
            "rewriting it from the worker's own counts.",
            self.path,
        )
        self._restore_own()

    def _move_to_new_file(self, fd: int) -> None:
        """Leave a file that was unlinked for the one at ``path``; under the flock.

        This worker's counts move with it (claimed afresh, written by ``_claim``);
        the others follow by their next heartbeat or decision, each with its counts.
        """
        # The workers still in the old file, plus those already in the new one.
        others = others_live(fd, self._capacity, self._slot, with_rows=False)
        logger.warning(
            "asgi-admission: the shared session ledger %s was deleted or replaced; moving "
            "this worker's sessions (%d pending, %d active) to the file now at that path; "
            "the other workers follow within a heartbeat.",
            self.path,
            self._own[0],
            published(self._own),
        )
        fcntl.flock(fd, fcntl.LOCK_UN)
        self._fd = -1
        self._slot = -1
        self._row = self._quiet = b""
        os.close(fd)  # drops this worker's slot lock in the old file
        # Expected now, so that they are waited for even where this worker gets into
        # the new file only at a later section.
        self._rejoining.expect(others)
        # Made again if the directory went too. Never waited for: this is inside a
        # section, perhaps on the event loop. An error, or the new file's lock taken,
        # leaves _fd at -1, and the next critical section tries again.
        new_fd = self._open(0.0)
        self._rejoining.expect(others + others_live(new_fd, self._capacity, -1, with_rows=True))
        try:
            fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another worker is in the new file's critical section: ours is not
            # exclusive there, so give up this time (the caller refuses, busy).
            raise LedgerBusy(f"another worker holds the shared ledger {self.path}") from None

    def _open(self, deadline: float) -> int:
        """Open the file (made if missing) and check or rebuild it under the ``flock``,
        taken by ``deadline`` (``time.monotonic``) or ``LedgerBusy``: never a blocking
        wait, since a worker stopped inside its section would make it endless."""
        fd = open_private_file(self.directory, FILE_NAME, setting=SHARED_DIR_SETTING)
        try:
            if not flock_by(fd, deadline):
                raise LedgerBusy(f"another worker holds the shared ledger {self.path}")
            try:
                self._fd = fd
                self._check_file()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except BaseException:
            self._fd = -1
            os.close(fd)
            raise
        return fd

    def _check_file(self) -> None:
        problem = file_problem(self._fd, self._capacity)
        if problem is not None:
            self._rebuild(problem or None)

    def _rebuild(self, problem: str | None) -> None:
        if problem is not None:
            self._rejoining.start(self._fd, self._capacity, self._slot)
            logger.warning(
                "asgi-admission: the shared session ledger %s was unusable (%s); rebuilding "
                "it. Each worker writes its sessions back at its next heartbeat or decision.",
                self.path,
                problem,
            )
        os.ftruncate(self._fd, slot_offset(self._capacity))
        os.pwrite(self._fd, bytes(slot_offset(self._capacity)), 0)
        self._write_header(max(self._slot + 1, 0))
        if self._slot >= 0:
            self._restore_own()

    def _write_header(self, used: int) -> None:
        self._set_used(used)
        os.pwrite(self._fd, self._header, 0)

    def _set_used(self, used: int) -> None:
        self._quiet = b""
        self._used = used
        self._want = slot_offset(used)
        self._header = HEADER.pack(MAGIC, self._capacity, used)
        self._layout = counts_layout(used)

    def _read(self) -> bytes | None:
        """The header and the slots in use; ``None`` after rebuilding a bad file."""
        data = os.pread(self._fd, self._want, 0)
        if len(data) == self._want and data.startswith(self._header):
            return data
        return self._read_again(data)

    def _read_again(self, data: bytes) -> bytes | None:
        """After a read that found the header changed: ``data`` again with the slots in
        use now, or ``None`` after rebuilding a bad file."""
        fd, want = self._fd, self._want
        problem = header_problem(data[: HEADER.size], self._capacity)
        if problem is None:
            used = HEADER.unpack_from(data)[2]
            if used != self._used:
                self._set_used(used)
                want = slot_offset(used)
                data = os.pread(fd, want, 0)
            if len(data) < want:
                problem = f"{len(data)} bytes, shorter than its {used} slots in use"
        if problem is not None:
            self._rebuild(problem)
            return None
        return data

    def _claim(self) -> None:
        """Take the first slot no live worker holds; recover what a dead one left."""
        fd = self._fd
        self._check_file()
        slot = claim_free_slot(fd, self._capacity)
        if slot is not None:
            _, _, pending, active = SLOT.unpack(os.pread(fd, SLOT.size, slot_offset(slot)))
            if pending or active:
                self._recover(slot, pending, active)
            self._slot = slot
            self._offset = slot_offset(slot)
            self._start = process_start_time()
            self._restore_own()
            return
        self._warn_once(
            "full",
            "asgi-admission: all %d slots of the shared session ledger %s are held by live "
            "workers; this worker's sessions are counted by this worker alone.",
            self._capacity,
            self.path,
        )

    def _write_own(self) -> None:
        """Write this worker's slot from its counts if they changed; under the flock."""
        if self._slot >= 0:
            # Cleared before the snapshot: a change made after it marks the slot again.
            self._dirty = False
            own = self._own
            published = own[1] if own[2] is None else own[2]
            row = SLOT.pack(self._pid, self._start, own[0], published)
            if row != self._row:
                try:
                    os.pwrite(self._fd, row, self._offset)
                except BaseException:
                    self._dirty = True  # for the next section or heartbeat to try again
                    raise
                self._row = row
                quiet = self._quiet
                if quiet:  # still what the file holds, with this row in it
                    offset = self._offset
                    self._quiet = quiet[:offset] + row + quiet[offset + SLOT.size :]

    def _restore_own(self) -> None:
        """Write this worker's slot and make sure the header counts it as in use."""
        self._row = self._quiet = b""  # whatever the file held: write it
        self._write_own()
        # The file's header, not the cached one: a worker's first claim must not
        # trust the cache's initial guess of one slot in use.
        used = HEADER.unpack(os.pread(self._fd, HEADER.size, 0))[2]
        if self._slot >= used:
            self._write_header(self._slot + 1)
        else:
            self._set_used(used)

    def _recover(self, slot: int, pending: int, active: int) -> None:
        pid = SLOT.unpack(os.pread(self._fd, SLOT.size, slot_offset(slot)))[0]
        logger.warning(
            "asgi-admission: worker pid %d exited holding %d pending and %d active sessions "
            "in the shared ledger; releasing them.",
            pid,
            pending,
            active,
        )
        os.pwrite(self._fd, bytes(SLOT.size), slot_offset(slot))

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)
