"""A session ledger shared by the worker processes of one container.

The faults each part answers, and how: docs/trust.md ("A worker stuck in the critical
section", "Releases are never lost", "A deleted, replaced, truncated or garbled file").
Notes:

- A worker claims its slot at its first critical section, so a ledger built before a
  fork claims nothing (a fork child reopens the file).
- The critical section is this process's ``threading.Lock`` then an exclusive
  ``flock`` on its own open file description: ``attempt()`` raises
  :class:`LedgerBusy` unless both are free now, ``locked()`` waits at most
  ``LOCK_WAIT_S``; ``attempt_own()`` is the thread lock alone, for bookkeeping that
  touches no shared file.
- Counts change in memory first; the slot is written (only if its row changed) by the
  next critical section, the loop's next turn or the heartbeat, so the others count
  high meanwhile, never low.
- A slot with counts whose OFD lock is free belongs to a dead worker. A decision first
  counts every other slot in without asking (``counts(high=True)``), and counts
  exactly only where that would not admit. Negative counts in other slots count as 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from asgi_admission._admission.ledger.ledger import (
    ACTIVE,
    LOCK_WAIT_S,
    PENDING,
    RELEASED,
    LedgerBusy,
    LedgerUnavailable,
)
from asgi_admission._admission.ledger.safe_files import open_private_file

# --------------------------------------------------------------------------------------
# The shared ledger file's layout and its slots' locks, and reading it from outside.
# The waiting order's file (``scheduling/shared_order.py``) has the same geometry and
# uses the same locks.

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


def slot_lock(fd: int, slot: int, lock_type: int) -> None:
    """Take (``F_WRLCK``) or drop (``F_UNLCK``) an OFD lock over one slot without waiting:
    ``OSError`` (``EAGAIN`` or ``EACCES``) where another open file description holds it."""
    request = _FLOCK.pack(lock_type, os.SEEK_SET, slot_offset(slot), SLOT.size, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)


@functools.lru_cache(maxsize=1024)
def _lock_query(slot: int) -> bytes:
    # Packed once per slot: every decision queries each busy slot's lock.
    return _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, slot_offset(slot), SLOT.size, 0)


_UNLOCKED: Final = struct.pack("h", fcntl.F_UNLCK)


def slot_held(fd: int, slot: int) -> bool:
    """Whether another open file description holds ``slot``'s lock: its worker lives."""
    return fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _lock_query(slot))[:2] != _UNLOCKED


def claim_free_slot(fd: int, capacity: int) -> int | None:
    """Lock the first of ``capacity`` slots no live worker holds and return it; ``None``
    when every slot is held. An error other than "held" is raised."""
    for slot in range(capacity):
        try:
            slot_lock(fd, slot, fcntl.F_WRLCK)
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


# --------------------------------------------------------------------------------------
# The shared ledger's file as one worker holds it.
#
# Notes (the measurements behind them: bench/README.md, "`ledger.py`: the shared
# ledger against the in-process one"):
#
# - ``<shared_dir>/asgi-admission.ledger``: a 16-byte header (magic, slot capacity,
# slots in use) and 32-byte slots of four int64s ``(pid, start_time, pending,
# active)``, in a memory-backed directory; the start time is for people reading it.
# - ``os.pread``/``os.pwrite``, not ``mmap``: a truncated file gives a short read
# (rebuilt, with a warning), never a ``SIGBUS`` on the request path.
# - Liveness: a worker holds an exclusive OFD lock (``F_OFD_SETLK``) on its own slot
# while its descriptor is open; the kernel drops it when the process dies (``SIGKILL``
# included), so a slot with counts whose lock is free (``F_OFD_GETLK``) is a dead
# worker's. Pid reuse cannot fool it.
# - :class:`SharedLedger` opens, claims, reads, rebuilds and follows a replaced file
# always under the ``flock`` of its critical section (:class:`Section`).

logger = logging.getLogger("asgi_admission")


def warn_once(warned: set[str], key: str, message: str, *args: object) -> None:
    """Log ``message`` at WARNING unless ``key`` is in ``warned`` already (then add it)."""
    if key not in warned:
        warned.add(key)
        logger.warning(message, *args, stacklevel=2)


#: After a fault lost the other workers' rows: the longest wait for them to come back.
REJOIN_MAX_S: Final = 2.0


class Rejoining:
    """After a fault lost the other workers' rows: whether they are all back yet.

    ``start`` counts the slots other live workers hold locks on in ``fd``; ``done`` is
    true once as many slots here have a row and a lock again, or ``REJOIN_MAX_S`` has
    passed.
    """

    __slots__ = ("_others", "until")

    def __init__(self) -> None:
        #: When the wait ends at the latest; 0.0 when there is none (every decision asks).
        self.until = 0.0
        self._others = 0

    def start(self, fd: int, capacity: int, own: int) -> None:
        self.expect(others_live(fd, capacity, own, with_rows=False))

    def expect(self, others: int) -> None:
        self._others = others
        self.until = time.monotonic() + REJOIN_MAX_S

    def done(self, fd: int, capacity: int, own: int) -> bool:
        if not self.until:
            return True
        if time.monotonic() < self.until and self._others > others_live(
            fd, capacity, own, with_rows=True
        ):
            return False
        self.until = 0.0
        return True


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


# --------------------------------------------------------------------------------------
# The shared ledger's critical section, and keeping this worker's slot written
# (the module notes, and docs/trust.md).

#: How often (at most) a worker checks that its ledger file is still the one at the path.
LINK_CHECK_INTERVAL_S: Final = 0.25
#: How often a worker's heartbeat (on its event loop) checks the file without a decision.
HEARTBEAT_S: Final = 0.25

# Looked up once: every critical section calls them.
_flock = fcntl.flock
_monotonic = time.monotonic
_running_loop = asyncio._get_running_loop  # None off a loop, where get_running_loop raises
_thread_id = threading.get_ident
_LOCK_NOW: Final = fcntl.LOCK_EX | fcntl.LOCK_NB
_UNLOCK: Final = fcntl.LOCK_UN


class Section:
    """The critical section: this process's lock, then the file's exclusive ``flock``,
    each waited for at most ``wait_s`` (0: taken only if free at once).

    Every decision enters it, so both locks are first tried without reading the
    clock, and the rest (the link check, a claim, the heartbeat) waits for its timer.
    """

    __slots__ = ("_ledger", "_wait_s")

    def __init__(self, ledger: SharedLedger, wait_s: float) -> None:
        self._ledger = ledger
        self._wait_s = wait_s

    def __enter__(self) -> None:
        ledger = self._ledger
        if not ledger._lock.acquire(False):
            ledger._enter_slowly(self._wait_s, locked=False)
            return
        try:
            _flock(ledger._fd, _LOCK_NOW)
        except (OSError, ValueError):  # held elsewhere, or no file open (-1): the slow way
            ledger._enter_slowly(self._wait_s, locked=True)
            return
        except BaseException:
            ledger._lock.release()
            raise
        if (
            ledger._slot < 0
            or ledger._broken
            or not ledger._beating
            or _monotonic() >= ledger._next_link_check
        ):
            ledger._ready()

    def __exit__(self, *exc_info: object) -> None:
        ledger = self._ledger
        if ledger._dirty:
            # A change made meanwhile (a release that found this very section taken,
            # one made on a loop that has not turned since) is ours to write.
            ledger._write_dirty()
        try:
            _flock(ledger._fd, _UNLOCK)
        except (OSError, ValueError):
            pass  # closed by a move that failed: there is no lock left to drop
        finally:
            ledger._lock.release()


class OwnSection:
    """The section for this worker's own bookkeeping: this process's lock alone, taken
    only if it is free at once. The shared file is neither read nor written in it, so
    another worker's ``flock`` is not needed, and a slot changed meanwhile is written
    by the next critical section or the loop's next turn, as after any release."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: SharedLedger) -> None:
        self._ledger = ledger

    def __enter__(self) -> None:
        # Looked up each time: a fork child has a lock of its own.
        if not self._ledger._lock.acquire(False):
            raise LedgerBusy("another thread of this worker holds the shared ledger")

    def __exit__(self, *exc_info: object) -> None:
        self._ledger._lock.release()


#: Slots in a new file: far more worker processes than one container runs.
DEFAULT_CAPACITY: Final = 256


class _SharedReservation:
    __slots__ = ("_ledger", "_owner", "_state")

    def __init__(self, ledger: SharedLedger) -> None:
        self._ledger = ledger
        self._owner = ledger._pid
        self._state = PENDING

    def activate(self) -> None:
        ledger = self._ledger
        with ledger._mem:
            if self._state != PENDING or self._owner != ledger._pid:
                return
            self._state = ACTIVE
            pending, active, reported = ledger._own
            # The total stays; see release for the app's reported count.
            up = None if reported is None else reported + 1
            ledger._own = (max(0, pending - 1), active + 1, up)
            ledger._dirty = True
        ledger._changed()
        if ledger._on_change is not None:
            ledger._on_change()

    def release(self) -> None:
        if self._state == RELEASED:
            return  # final, so seen without the lock: the middleware's later calls are free
        ledger = self._ledger
        with ledger._mem:
            state, self._state = self._state, RELEASED
            if state == RELEASED or self._owner != ledger._pid:
                return
            pending, active, reported = ledger._own
            if state == PENDING:
                # Its response sent, the app presumably counts it: one more reported
                # until the next decision publishes the app's figure (docs/trust.md,
                # "The app's count between decisions": high, never low).
                up = None if reported is None else reported + 1
                ledger._own = (max(0, pending - 1), active, up)
            else:
                down = None if reported is None else max(0, reported - 1)
                ledger._own = (pending, max(0, active - 1), down)
            ledger._dirty = True
        ledger._changed()
        if ledger._on_change is not None:
            ledger._on_change()


class SharedLedger:
    """Pending and active counts of every worker process that opens ``directory``.

    ``counts()`` sums the live workers' slots; a worker that died holding
    sessions is recovered by the next call. Use it as the ``SessionLedger`` of
    every worker of one container (``AdmissionConfig(shared_dir=...)`` or
    ``ADMISSION_SHARED_DIR``); the directory should be memory-backed and local.
    """

    __slots__ = (
        "__weakref__",
        "_attempt",
        "_beating",
        "_broken",
        "_capacity",
        "_dirty",
        "_fd",
        "_flush_thread",
        "_header",
        "_layout",
        "_lock",
        "_locked",
        "_mem",
        "_next_link_check",
        "_offset",
        "_on_change",
        "_own",
        "_own_section",
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
        self, directory: str | os.PathLike[str], *, capacity: int = DEFAULT_CAPACITY
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
        self._rejoining = Rejoining()
        self._fd = -1
        self._slot = -1
        self._pid = os.getpid()
        self._offset = 0
        self._start = 0
        self._row = b""
        #: The file's bytes when a read found no other slot holding sessions and this
        #: worker's row intact, with this worker's writes since: while the file reads
        #: the same, there is nothing to add up (b"": no such read to go by).
        self._quiet = b""
        self._set_used(1)
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._beating = False
        self._broken = False
        #: The thread whose loop's next turn writes the changes made in it (0: none).
        self._flush_thread = 0
        self._locked = Section(self, LOCK_WAIT_S)
        self._attempt = Section(self, 0.0)
        self._own_section = OwnSection(self)
        self._next_link_check = 0.0
        # Guards changes to the in-memory counts alone, never held across I/O: releases
        # take it from any thread without waiting for the critical section.
        self._mem = threading.Lock()
        #: Called after a reservation's activation or release, outside the lock.
        self._on_change: Callable[[], None] | None = None
        # Open (and create or check the file) now, so that a bad directory fails at
        # startup; the slot is claimed by the first decision, in the serving process.
        # A worker stuck in its section for the whole wait leaves it to that decision.
        with self._lock, contextlib.suppress(LedgerBusy):
            self._open(time.monotonic() + LOCK_WAIT_S)
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    # -- SessionLedger -------------------------------------------------------------

    def tell_changes(self, callback: Callable[[], None]) -> None:
        self._on_change = callback

    def active(self, own_active: int | None = None) -> int:
        return self.counts(own_active)[0]

    def counts(self, own_active: int | None = None, *, high: bool = False) -> tuple[int, int]:
        """``(active, pending)`` of every live worker (``SessionLedger.counts``); call
        inside the critical section (``attempt()`` or ``locked()``). ``own_active`` is
        published as this worker's active sessions (docs/trust.md, "The app's count
        between decisions")."""
        own = self._own
        if own_active != own[2]:
            with self._mem:
                # None: no app count, or it failed; then this worker's own count
                # stands, as with the in-process ledger, never the app's last figure.
                reported = None if own_active is None else max(0, own_active)
                self._own = own = (self._own[0], self._own[1], reported)
            self._write_own()
        # Taken before the file or after it alike: outside the section, this worker's
        # own counts only go down (releases) or move from pending to active.
        pending, active = own[0], published(own)
        want = self._want
        data = os.pread(self._fd, want, 0)
        if data and data == self._quiet:  # b"": no quiet file seen, or a truncated one
            return active, pending  # as found with the others idle, this worker's row in
        if len(data) != want or not data.startswith(self._header):
            checked = self._read_again(data)
            if checked is None:
                return active, pending
            data = checked
        # The pending and active fields of every slot in use, pairs in slot order, as
        # read (restoring this worker's row below may change the slots in use).
        fields = self._layout.unpack_from(data, HEADER.size)
        slot = self._slot
        if slot < 0:  # no slot of its own (all taken): every slot is another's
            mine = len(fields)
        elif not data.startswith(self._row, self._offset):
            mine = 2 * slot
            self._own_row_changed()
        else:
            mine = 2 * slot
            if not (any(fields[:mine]) or any(fields[mine + 2 :])):
                # Alone in the file, or the others idle: nothing to add, and nothing
                # while the file reads the same.
                self._quiet = data
                return active, pending
        if high and min(fields) >= 0:
            # Every other slot's counts, live or not: one probe per busy slot saved.
            pending += sum(fields[0::2]) - sum(fields[mine : mine + 1])
            active += sum(fields[1::2]) - sum(fields[mine + 1 : mine + 2])
            return active, pending
        return self._add_others(fields, mine, active, pending)

    def _add_others(
        self, fields: tuple[int, ...], mine: int, active: int, pending: int
    ) -> tuple[int, int]:
        """``active`` and ``pending`` plus the live workers' counts in ``fields``;
        releases what dead ones left."""
        fd = self._fd
        for index in range(0, len(fields), 2):
            slot_pending, slot_active = fields[index], fields[index + 1]
            if not (slot_pending or slot_active) or index == mine:
                continue
            slot = index >> 1
            if not slot_held(fd, slot):
                if os.fstat(fd).st_nlink == 0:  # not dead: moved on to a new file
                    self._next_link_check = 0.0  # so follow it now, and settle there
                    raise LedgerBusy(f"the shared ledger {self.path} was replaced")
                self._recover(slot, slot_pending, slot_active)
                continue
            if slot_pending < 0 or slot_active < 0:
                warn_once(
                    self._warned,
                    "negative",
                    "asgi-admission: %s holds negative session counts (slot %d: pending "
                    "%d, active %d); counting them as 0.",
                    self.path,
                    slot,
                    slot_pending,
                    slot_active,
                )
                slot_pending, slot_active = max(0, slot_pending), max(0, slot_active)
            pending += slot_pending
            active += slot_active
        return active, pending

    def reserve(self) -> _SharedReservation:
        """A new pending reservation in this worker's slot; call inside the critical
        section (``attempt()`` or ``locked()``)."""
        if self._rejoining.until and not self._rejoining.done(self._fd, self._capacity, self._slot):
            raise LedgerBusy(f"the shared ledger {self.path} was rebuilt; workers re-register")
        with self._mem:
            pending, active, reported = self._own
            self._own = (pending + 1, active, reported)
        self._write_own()
        return _SharedReservation(self)

    def is_current(self) -> bool:
        """Whether this worker counts in the file at the path, not in one deleted or
        replaced that it has not left yet; inside the critical section (its fd is
        open)."""
        return self._fd >= 0 and os.fstat(self._fd).st_nlink > 0

    # -- the critical section ------------------------------------------------------

    def locked(self) -> Section:
        """The critical section, waited for at most ``LOCK_WAIT_S`` (then ``LedgerBusy``).

        For callers off the event loop; the middleware uses :meth:`attempt`.
        """
        return self._locked

    def attempt(self) -> Section:
        """The critical section if it is free right now; ``LedgerBusy`` if not."""
        return self._attempt

    def attempt_own(self) -> OwnSection:
        """This worker's own bookkeeping, which touches no shared file: this process's
        lock alone, if it is free right now; ``LedgerBusy`` if not."""
        return self._own_section

    def _enter_slowly(self, wait_s: float, *, locked: bool) -> None:
        """The critical section when a lock was not free at once (``locked``: this
        process's is held already) or no file is open: waits for each until
        ``wait_s`` after the first try, then ``LedgerBusy``."""
        lock = self._lock
        deadline = _monotonic() + wait_s
        if not (locked or (wait_s > 0 and lock.acquire(timeout=wait_s))):
            raise LedgerBusy("another thread of this worker holds the shared ledger")
        try:
            fd = self._fd if self._fd >= 0 else self._reopen(deadline)
            if not flock_by(fd, deadline):
                raise LedgerBusy(
                    f"another worker held the shared ledger {self.path} for over {wait_s:g} s"
                )
        except BaseException:
            lock.release()
            raise
        self._ready()

    def _ready(self) -> None:
        """Both locks held: what is due before counting, releasing them if it fails."""
        try:
            self._repair()
            if not self._beating:
                self._beat()
        except BaseException:
            if self._fd >= 0:
                _flock(self._fd, _UNLOCK)
            self._lock.release()
            raise

    def _reopen(self, deadline: float) -> int:
        try:
            return self._open(deadline)
        except (OSError, ValueError) as exc:
            raise self._unavailable(exc) from exc

    def _repair(self) -> None:
        """Under the flock, when due: follow a replaced file, claim a slot, say that a
        ledger that was unusable is usable again."""
        now = _monotonic()
        try:
            if now >= self._next_link_check:
                # Deleted or replaced under us (a tmp cleaner, an operator's rm)? The
                # workers that open the path now would share nothing with this one.
                # An fstat per decision would show in its cost, so it is asked at most
                # every quarter second.
                self._next_link_check = now + LINK_CHECK_INTERVAL_S
                if os.fstat(self._fd).st_nlink == 0:
                    self._move_to_new_file(self._fd)
            if self._slot < 0:
                self._claim()
        except (OSError, ValueError) as exc:
            raise self._unavailable(exc) from exc
        if self._broken:
            self._broken = False
            logger.warning(
                "asgi-admission: the shared session ledger %s is usable again; this "
                "worker's sessions (%d pending, %d active) are counted in it.",
                self.path,
                self._own[0],
                published(self._own),
            )

    def _unavailable(self, exc: BaseException) -> LedgerUnavailable:
        if not self._broken:
            self._broken = True
            logger.warning(
                "asgi-admission: the shared session ledger %s is unusable (%s); this "
                "worker keeps its counts in memory and refuses new sessions until the "
                "file can be opened again.",
                self.path,
                exc,
            )
        return LedgerUnavailable(f"the shared session ledger {self.path} is unusable: {exc}")

    def _write_dirty(self) -> None:
        if self._fd >= 0:
            # If that fails, the slot stays dirty for the next section or heartbeat.
            with contextlib.suppress(OSError):
                self._write_own()

    def _changed(self) -> None:
        """After an activation or release (the counts changed in memory): write the slot
        at the next critical section, when this thread's loop next turns at the latest;
        off a loop, now. Many releases in one loop turn then cost one section, and a
        release followed by a decision none."""
        if self._flush_thread == _thread_id():
            return  # this loop's turn writes it
        loop = _running_loop()
        if loop is None:
            self._flush()
        else:
            # Marked for this thread until that turn: its loop runs no other meanwhile
            # (one whose callbacks were dropped unrun leaves this worker's slot dirty
            # for the next critical section or heartbeat, high, never low).
            self._flush_thread = _thread_id()
            loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_thread = 0
        if self._dirty:
            self._flush()

    def _flush(self) -> None:
        """Write this worker's slot now if the lock is free at once; else at the next
        heartbeat or critical section. Never raises: a release must not fail."""
        try:
            with self._attempt:
                pass  # leaving writes the dirty slot
        except LedgerBusy:
            self._beat()  # LedgerUnavailable included, logged once by _unavailable
        except Exception:
            logger.exception("asgi-admission: writing the shared session ledger failed")
            self._beat()

    def _beat(self) -> None:
        """Keep the heartbeat scheduled on this thread's event loop, if it has one."""
        if self._beating:
            return
        loop = _running_loop()
        if loop is None:
            return  # no loop here: the next critical section does the heartbeat's work
        self._beating = True
        loop.call_later(HEARTBEAT_S, self._heartbeat)

    def _heartbeat(self) -> None:
        """Write a dirty slot, follow a deleted or replaced file and put this worker's
        row back into a rebuilt or edited one, without waiting for a decision: other
        workers miss this worker's sessions for at most a heartbeat."""
        self._beating = False
        try:
            with self._attempt:
                data = self._read()
                if (
                    data is not None
                    and self._slot >= 0
                    and not data.startswith(self._row, self._offset)
                ):
                    self._own_row_changed()
        except LedgerBusy:
            pass  # held elsewhere, or unusable (logged once): the next beat tries again
        except Exception:
            logger.exception("asgi-admission: the shared session ledger's heartbeat failed")
        self._beat()

    # -- the file ------------------------------------------------------------------

    def _own_row_changed(self) -> None:
        self._rejoining.start(self._fd, self._capacity, self._slot)
        # Edited, or rebuilt (perhaps with fewer slots in use than this one).
        warn_once(
            self._warned,
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
        fd = open_private_file(self.directory, FILE_NAME)
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
        """Build a new (empty) file; rebuild an unusable one, saying why."""
        header = os.pread(self._fd, HEADER.size, 0)
        if not header:
            self._rebuild(None)
            return
        problem = header_problem(header, self._capacity)
        size = os.fstat(self._fd).st_size
        if problem is None and size < slot_offset(self._capacity):
            problem = f"{size} bytes, shorter than its {self._capacity} slots"
        if problem is not None:
            self._rebuild(problem)

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
        warn_once(
            self._warned,
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
            row = SLOT.pack(self._pid, self._start, own[0], published(own))
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

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Give this worker's slot back and close the file, dropping its counts; for
        shutdown and tests (a ledger used again after ``close`` reopens the file)."""
        with self._lock:
            with self._mem:
                self._own = (0, 0, None)
                self._dirty = False
            fd, self._fd = self._fd, -1
            if fd < 0:
                return
            try:
                if self._slot >= 0:
                    # Zeroing our own slot needs no flock (no one else writes a live
                    # slot), and shutdown must not wait for another worker.
                    os.pwrite(fd, bytes(SLOT.size), slot_offset(self._slot))
            finally:
                self._slot = -1
                os.close(fd)  # drops the flock and the slot's OFD lock

    def _after_fork(self) -> None:
        # The child shares the parent's open file description, and with it the
        # parent's flock and slot lock: it must open its own and count afresh.
        self._lock = threading.Lock()
        self._mem = threading.Lock()
        self._dirty = self._beating = False
        self._flush_thread = 0
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._slot = -1
        self._pid = os.getpid()
        self._own = (0, 0, None)
        self._row = self._quiet = b""


def _forked(ref: weakref.ReferenceType[SharedLedger]) -> None:
    ledger = ref()
    if ledger is not None:
        ledger._after_fork()
