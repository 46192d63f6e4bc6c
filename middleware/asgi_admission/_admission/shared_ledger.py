"""A session ledger shared by the worker processes of one container.

Notes (the whole story, with the faults each part answers: ``docs/trust.md``):

- One small file (layout and slot locks: ``ledger_file``); a worker claims its slot
  at its first critical section, so a ledger built before a fork claims nothing.
- The critical section is this process's ``threading.Lock`` then an exclusive
  ``flock`` on its own open file description (a fork child reopens the file), so
  read-decide-reserve is atomic across threads and workers. No wait is unbounded:
  ``attempt()`` raises :class:`LedgerBusy` unless the lock is free now (the
  middleware retries with awaits, then refuses); ``locked()`` sleeps between tries
  for at most ``LOCK_WAIT_S``.
- Activations and releases never raise and are never lost: counts change in
  memory first; the slot is written now if the lock is free, else by the next
  heartbeat or critical section. While the file cannot be opened, decisions raise
  :class:`LedgerUnavailable` (logged once).
- A heartbeat every ``HEARTBEAT_S`` on the worker's loop writes a dirty slot,
  follows a deleted or replaced file and rewrites its row in a rebuilt one. A
  worker that finds the file rebuilt, replaced or its own row gone knows the
  others' rows are lost too: its ``reserve`` raises ``LedgerBusy`` until every
  worker that held a slot lock has a row again (at most ``SETTLE_MAX_S``).
- A slot with counts whose OFD lock is free belongs to a dead worker, ``SIGKILL``
  included: the next decision zeroes it. Negative counts in other slots count as 0.
- Files are opened through ``_admission.safe_files``: never through a symlink,
  created private, refused when another user owns them or may write to them.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from asgi_admission._admission.ledger import ACTIVE, LOCK_WAIT_S, PENDING, RELEASED, CriticalSection
from asgi_admission._admission.ledger import LedgerBusy as LedgerBusy
from asgi_admission._admission.ledger import LedgerUnavailable as LedgerUnavailable
from asgi_admission._admission.ledger_file import (
    _HEADER,
    _SLOT,
    MAGIC,
    Settling,
    _held,
    _slot_lock,
    _slot_offset,
    _start_time,
    file_problem,
    flock_by,
    header_problem,
    others_live,
)
from asgi_admission._admission.ledger_file import FILE_NAME as FILE_NAME
from asgi_admission._admission.ledger_file import LedgerEntry as LedgerEntry
from asgi_admission._admission.ledger_file import read_entries as read_entries
from asgi_admission._admission.safe_files import open_private_file

logger = logging.getLogger("asgi_admission")

#: Slots in a new file: far more worker processes than one container runs.
DEFAULT_CAPACITY: Final = 256
#: How often (at most) a worker checks that its ledger file is still the one at the path.
LINK_CHECK_INTERVAL_S: Final = 0.25
#: How often a worker's heartbeat (on its event loop) checks the file without a decision.
HEARTBEAT_S: Final = 0.25
#: After a fault lost the other workers' rows: the longest wait for them to come back.
SETTLE_MAX_S: Final = 2.0
SETTING: Final = "ADMISSION_SHARED_DIR"


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
            ledger._pending = max(0, ledger._pending - 1)
            ledger._active += 1
            if ledger._reported is not None:
                ledger._reported += 1  # see release
            ledger._dirty = True
        ledger._flush()
        if ledger.on_change is not None:
            ledger.on_change()

    def release(self) -> None:
        ledger = self._ledger
        with ledger._mem:
            state, self._state = self._state, RELEASED
            if state == RELEASED or self._owner != ledger._pid:
                return
            if state == PENDING:
                ledger._pending = max(0, ledger._pending - 1)
                if ledger._reported is not None:
                    # The app counts its own sessions and publishes them only at this
                    # worker's decisions. Its response sent, this session is presumably
                    # one of them now: count it as reported until the next decision
                    # publishes the app's figure, so that the total other workers see
                    # errs high instead of dipping below the sessions that exist.
                    ledger._reported += 1
            else:
                ledger._active = max(0, ledger._active - 1)
                if ledger._reported is not None:
                    ledger._reported = max(0, ledger._reported - 1)
            ledger._dirty = True
        ledger._flush()
        if ledger.on_change is not None:
            ledger.on_change()


class SharedLedger:
    """Pending and active counts of every worker process that opens ``directory``.

    ``counts()`` sums the live workers' slots; a worker that died holding
    sessions is recovered by the next call. Use it as the ``SessionLedger`` of
    every worker of one container (``AdmissionConfig(shared_dir=...)`` or
    ``ADMISSION_SHARED_DIR``); the directory should be memory-backed and local.
    """

    __slots__ = (
        "__weakref__",
        "_active",
        "_attempt",
        "_beating",
        "_broken",
        "_capacity",
        "_dirty",
        "_fd",
        "_header",
        "_lock",
        "_locked",
        "_mem",
        "_next_link_check",
        "_offset",
        "_pending",
        "_pid",
        "_reported",
        "_row",
        "_settling",
        "_slot",
        "_start",
        "_used",
        "_warned",
        "directory",
        "on_change",
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
        self._lock = threading.Lock()
        # Guards the in-memory counts alone, never held across I/O: releases take it
        # from any thread without waiting for the critical section.
        self._mem = threading.Lock()
        #: Called after a reservation's activation or release, outside the lock.
        self.on_change: Callable[[], None] | None = None
        self._dirty = False
        self._beating = False
        self._broken = False
        self._settling = Settling(SETTLE_MAX_S)
        self._locked = CriticalSection(functools.partial(self._enter, LOCK_WAIT_S), self._exit)
        self._attempt = CriticalSection(functools.partial(self._enter, 0.0), self._exit)
        self._next_link_check = 0.0
        self._fd = -1
        self._slot = -1
        self._pid = os.getpid()
        self._pending = 0
        self._active = 0
        self._reported: int | None = None
        self._offset = 0
        self._start = 0
        self._row = b""
        self._set_used(1)
        self._warned: set[str] = set()
        # Open (and create or check the file) now, so that a bad directory fails at
        # startup; the slot is claimed by the first decision, in the serving process.
        with self._lock:
            self._open()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    # -- the critical section ------------------------------------------------------

    def locked(self) -> CriticalSection:
        """The critical section, waited for at most ``LOCK_WAIT_S`` (then ``LedgerBusy``).

        For callers off the event loop; the middleware uses :meth:`attempt`.
        """
        return self._locked

    def attempt(self) -> CriticalSection:
        """The critical section if it is free right now; ``LedgerBusy`` if not."""
        return self._attempt

    def _enter(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        if not (self._lock.acquire(timeout=wait_s) if wait_s > 0 else self._lock.acquire(False)):
            raise LedgerBusy("another thread of this worker holds the shared ledger")
        flocked = False
        try:
            try:
                fd = self._fd if self._fd >= 0 else self._open()
            except (OSError, ValueError) as exc:
                raise self._unavailable(exc) from exc
            if not flock_by(fd, deadline):
                raise LedgerBusy(
                    f"another worker held the shared ledger {self.path} for over {wait_s:g} s"
                )
            flocked = True
            try:
                self._repair()
            except (OSError, ValueError) as exc:
                raise self._unavailable(exc) from exc
        except BaseException:
            if flocked and self._fd >= 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._lock.release()
            raise

    def _repair(self) -> None:
        """Under the flock: follow a replaced file, claim a slot, write a dirty slot."""
        now = time.monotonic()
        if now >= self._next_link_check:
            # Deleted or replaced under us (a tmp cleaner, an operator's rm)? The
            # workers that open the path now would share nothing with this one.
            # An fstat costs about 1 µs, so it is asked at most every quarter second.
            self._next_link_check = now + LINK_CHECK_INTERVAL_S
            if os.fstat(self._fd).st_nlink == 0:
                self._move_to_new_file(self._fd)
        if self._slot < 0:
            self._claim()
        elif self._dirty:
            self._write_own()
        self._beat()
        if self._broken:
            self._broken = False
            logger.warning(
                "asgi-admission: the shared session ledger %s is usable again; this "
                "worker's sessions (%d pending, %d active) are counted in it.",
                self.path,
                self._pending,
                self._own_active(),
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

    def _exit(self) -> None:
        try:
            if self._dirty and self._fd >= 0:
                # A release that found the lock taken (this very section) left it to us.
                self._write_own()
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        except OSError:
            pass  # closed by a move that failed: there is no lock left to drop
        finally:
            self._lock.release()

    def _flush(self) -> None:
        """Write this worker's slot now if the lock is free at once; else at the next
        heartbeat or critical section. Never raises: a release must not fail."""
        try:
            with self._attempt:
                pass  # entering writes the dirty slot
        except LedgerBusy:
            self._beat()  # LedgerUnavailable included, logged once by _unavailable
        except Exception:
            logger.exception("asgi-admission: writing the shared session ledger failed")
            self._beat()

    def _beat(self) -> None:
        """Keep the heartbeat scheduled on this thread's event loop, if it has one."""
        if self._beating:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
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
                if data is not None:
                    self._check_own_row(data)
        except LedgerBusy:
            pass  # held elsewhere, or unusable (logged once): the next beat tries again
        except Exception:
            logger.exception("asgi-admission: the shared session ledger's heartbeat failed")
        self._beat()

    # -- SessionLedger -------------------------------------------------------------

    def counts(self, own_active: int | None = None) -> tuple[int, int]:
        """``(active, pending)`` of every live worker; call inside ``locked()``.

        With ``own_active`` (the app's count, ``current_sessions``) this worker
        publishes it as its active sessions instead of its own WebSocket count;
        others see it as of this worker's latest decision (erring high).
        """
        with self._mem:
            changed = own_active != self._reported
            if changed:
                # None: no app count, or it failed; then this worker's own count
                # stands, as with the in-process ledger, never the app's last figure.
                self._reported = None if own_active is None else max(0, own_active)
        if changed:
            self._write_own()
        data = self._read()
        with self._mem:
            active = self._own_active()
            pending = self._pending
        if data is None:
            return active, pending
        own, fd = self._slot, self._fd
        self._check_own_row(data)
        rows = _SLOT.iter_unpack(memoryview(data)[_HEADER.size :])
        for slot, (pid, _start, slot_pending, slot_active) in enumerate(rows):
            # Idle slots (most of them) cost one test; only busy ones get a liveness check.
            if not (slot_pending or slot_active) or slot == own:
                continue
            if not _held(fd, slot):
                if os.fstat(fd).st_nlink == 0:  # not dead: moved on to a new file
                    self._next_link_check = 0.0  # so follow it now, and settle there
                    raise LedgerBusy(f"the shared ledger {self.path} was replaced")
                self._recover(slot, pid, slot_pending, slot_active)
                continue
            if slot_pending < 0 or slot_active < 0:
                self._warn_once(
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

    def _check_own_row(self, data: bytes) -> None:
        if self._slot >= 0 and not data.startswith(self._row, self._offset):
            self._settling.start(self._fd, self._capacity, self._slot)
            # Edited, or rebuilt (perhaps with fewer slots in use than this one).
            self._warn_once(
                "own",
                "asgi-admission: this worker's slot in %s was changed by someone else; "
                "rewriting it from the worker's own counts.",
                self.path,
            )
            self._restore_own()

    def reserve(self) -> _SharedReservation:
        """A new pending reservation in this worker's slot; call inside ``locked()``."""
        if not self._settling.done(self._fd, self._capacity, self._slot):
            raise LedgerBusy(f"the shared ledger {self.path} was rebuilt; workers re-register")
        with self._mem:
            self._pending += 1
        self._write_own()
        return _SharedReservation(self)

    def is_current(self) -> bool:
        """Whether this worker counts in the file at the path, not in one deleted or
        replaced that it has not left yet; inside ``locked()`` (its fd is open)."""
        return self._fd >= 0 and os.fstat(self._fd).st_nlink > 0

    def _own_active(self) -> int:
        return self._active if self._reported is None else self._reported

    # -- lifecycle -----------------------------------------------------------------

    def close(self) -> None:
        """Give this worker's slot back and close the file, dropping its counts; for
        shutdown and tests (a ledger used again after ``close`` reopens the file)."""
        with self._lock:
            with self._mem:
                self._pending = self._active = 0
                self._dirty = False
            self._reported = None
            fd, self._fd = self._fd, -1
            if fd < 0:
                return
            try:
                if self._slot >= 0:
                    # Zeroing our own slot needs no flock (no one else writes a live
                    # slot), and shutdown must not wait for another worker.
                    os.pwrite(fd, bytes(_SLOT.size), _slot_offset(self._slot))
            finally:
                self._slot = -1
                os.close(fd)  # drops the flock and the slot's OFD lock

    def _after_fork(self) -> None:
        # The child shares the parent's open file description, and with it the
        # parent's flock and slot lock: it must open its own and count afresh.
        self._lock = threading.Lock()
        self._mem = threading.Lock()
        self._dirty = self._beating = False
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._slot = -1
        self._pid = os.getpid()
        self._pending = self._active = 0
        self._reported = None
        self._row = b""

    # -- the file ------------------------------------------------------------------

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
            self._pending,
            self._own_active(),
        )
        fcntl.flock(fd, fcntl.LOCK_UN)
        self._fd = -1
        self._slot = -1
        self._row = b""
        os.close(fd)  # drops this worker's slot lock in the old file
        # Made again if the directory went too; an error leaves _fd at -1, and the
        # next critical section tries again.
        new_fd = self._open()
        self._settling.expect(others + others_live(new_fd, self._capacity, -1, with_rows=True))
        try:
            fcntl.flock(new_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another worker is in the new file's critical section: ours is not
            # exclusive there, so give up this time (the caller refuses, busy).
            raise LedgerBusy(f"another worker holds the shared ledger {self.path}") from None

    def _open(self) -> int:
        fd = open_private_file(self.directory, FILE_NAME, setting=SETTING)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
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
            self._settling.start(self._fd, self._capacity, self._slot)
            logger.warning(
                "asgi-admission: the shared session ledger %s was unusable (%s); rebuilding "
                "it. Each worker writes its sessions back at its next heartbeat or decision.",
                self.path,
                problem,
            )
        os.ftruncate(self._fd, _slot_offset(self._capacity))
        os.pwrite(self._fd, bytes(_slot_offset(self._capacity)), 0)
        self._write_header(max(self._slot + 1, 0))
        if self._slot >= 0:
            self._restore_own()

    def _write_header(self, used: int) -> None:
        self._set_used(used)
        os.pwrite(self._fd, self._header, 0)

    def _set_used(self, used: int) -> None:
        self._used = used
        self._header = _HEADER.pack(MAGIC, self._capacity, used)

    def _read(self) -> bytes | None:
        """The header and the slots in use; ``None`` after rebuilding a bad file."""
        fd = self._fd
        want = _slot_offset(self._used)
        data = os.pread(fd, want, 0)
        if len(data) == want and data.startswith(self._header):
            return data
        problem = header_problem(data[: _HEADER.size], self._capacity)
        if problem is None:
            used = _HEADER.unpack_from(data)[2]
            if used != self._used:
                self._set_used(used)
                want = _slot_offset(used)
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
        for slot in range(self._capacity):
            try:
                _slot_lock(fd, slot, fcntl.F_OFD_SETLK, fcntl.F_WRLCK)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    continue
                raise
            pid, _, pending, active = _SLOT.unpack(os.pread(fd, _SLOT.size, _slot_offset(slot)))
            if pending or active:
                self._recover(slot, pid, pending, active)
            self._slot = slot
            self._offset = _slot_offset(slot)
            self._start = _start_time()
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
        """Write this worker's slot from its counts; under the flock."""
        if self._slot >= 0:
            with self._mem:
                row = _SLOT.pack(self._pid, self._start, self._pending, self._own_active())
                self._dirty = False
            self._row = row
            os.pwrite(self._fd, row, self._offset)

    def _restore_own(self) -> None:
        """Write this worker's slot and make sure the header counts it as in use."""
        self._write_own()
        # The file's header, not the cached one: a worker's first claim must not
        # trust the cache's initial guess of one slot in use.
        used = _HEADER.unpack(os.pread(self._fd, _HEADER.size, 0))[2]
        if self._slot >= used:
            self._write_header(self._slot + 1)
        else:
            self._set_used(used)

    def _recover(self, slot: int, pid: int, pending: int, active: int) -> None:
        logger.warning(
            "asgi-admission: worker pid %d exited holding %d pending and %d active sessions "
            "in the shared ledger; releasing them.",
            pid,
            pending,
            active,
        )
        os.pwrite(self._fd, bytes(_SLOT.size), _slot_offset(slot))

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)


def _forked(ref: weakref.ReferenceType[SharedLedger]) -> None:
    ledger = ref()
    if ledger is not None:
        ledger._after_fork()
