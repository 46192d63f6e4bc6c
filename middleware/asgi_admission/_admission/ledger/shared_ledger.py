"""A session ledger shared by the worker processes of one container.

Notes (the whole story, with the faults each part answers: ``docs/trust.md``):

- One small file (layout and slot locks: ``ledger_file``); a worker claims its slot
  at its first critical section (``ledger_section``), so a ledger built before a fork
  claims nothing.
- The critical section is this process's ``threading.Lock`` then an exclusive
  ``flock`` on its own open file description (a fork child reopens the file), so
  read-decide-reserve is atomic across threads and workers. No wait is unbounded:
  ``attempt()`` raises :class:`LedgerBusy` unless the lock is free now (the
  middleware retries with awaits, then refuses); ``locked()`` sleeps between tries
  for at most ``LOCK_WAIT_S``.
- Activations and releases never raise and are never lost: counts change in
  memory first. On an event loop the slot is then written by this worker's next
  critical section or, at the latest, when the loop next runs its callbacks (one
  section for every release of a loop turn, none when a decision comes first);
  off a loop, now if the lock is free. When it is not, the next heartbeat or
  critical section writes it. Meanwhile the others count this worker's released
  sessions a little longer: high, never low. A slot is written only when its row
  changed. While the file cannot be opened, decisions raise
  :class:`LedgerUnavailable` (logged once).
- A heartbeat every ``HEARTBEAT_S`` on the worker's loop writes a dirty slot,
  follows a deleted or replaced file and rewrites its row in a rebuilt one. A
  worker that finds the file rebuilt, replaced or its own row gone knows the
  others' rows are lost too: its ``reserve`` raises ``LedgerBusy`` until every
  worker that held a slot lock has a row again (at most ``SETTLE_MAX_S``).
- A slot with counts whose OFD lock is free belongs to a dead worker, ``SIGKILL``
  included: the next decision zeroes it. Negative counts in other slots count as 0.
- Files are opened through ``_admission.ledger.safe_files``: never through a symlink,
  created private, refused when another user owns them or may write to them.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Final

from asgi_admission._admission.ledger.ledger import ACTIVE, LOCK_WAIT_S, PENDING, RELEASED
from asgi_admission._admission.ledger.ledger import LedgerBusy as LedgerBusy
from asgi_admission._admission.ledger.ledger import LedgerUnavailable as LedgerUnavailable
from asgi_admission._admission.ledger.ledger_section import LockedLedgerFile
from asgi_admission._admission.ledger.ledger_slots import FILE_NAME as FILE_NAME
from asgi_admission._admission.ledger.ledger_slots import HEADER, SLOT, slot_held, slot_offset
from asgi_admission._admission.ledger.ledger_slots import LedgerEntry as LedgerEntry
from asgi_admission._admission.ledger.ledger_slots import read_entries as read_entries

# Looked up once: every activation and release calls it.
_thread_id = threading.get_ident

#: Slots in a new file: far more worker processes than one container runs.
DEFAULT_CAPACITY: Final = 256
#: After a fault lost the other workers' rows: the longest wait for them to come back.
SETTLE_MAX_S: Final = 2.0


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
        if ledger._flush_thread != _thread_id():
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
                # The app counts its own sessions and publishes them only at this
                # worker's decisions. Its response sent, this session is presumably
                # one of them now: count it as reported until the next decision
                # publishes the app's figure, so that the total other workers see
                # errs high instead of dipping below the sessions that exist.
                up = None if reported is None else reported + 1
                ledger._own = (max(0, pending - 1), active, up)
            else:
                down = None if reported is None else max(0, reported - 1)
                ledger._own = (pending, max(0, active - 1), down)
            ledger._dirty = True
        if ledger._flush_thread != _thread_id():
            ledger._changed()
        if ledger._on_change is not None:
            ledger._on_change()


class SharedLedger(LockedLedgerFile):
    """Pending and active counts of every worker process that opens ``directory``.

    ``counts()`` sums the live workers' slots; a worker that died holding
    sessions is recovered by the next call. Use it as the ``SessionLedger`` of
    every worker of one container (``AdmissionConfig(shared_dir=...)`` or
    ``ADMISSION_SHARED_DIR``); the directory should be memory-backed and local.
    """

    __slots__ = ("__weakref__", "_mem", "_on_change")

    def __init__(
        self, directory: str | os.PathLike[str], *, capacity: int = DEFAULT_CAPACITY
    ) -> None:
        super().__init__(directory, capacity=capacity, settle_s=SETTLE_MAX_S)
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

    def counts(self, own_active: int | None = None) -> tuple[int, int]:
        """``(active, pending)`` of every live worker; call inside the critical
        section (``attempt()`` or ``locked()``).

        With ``own_active`` (the app's count, ``current_sessions``) this worker
        publishes it as its active sessions instead of its own WebSocket count;
        others see it as of this worker's latest decision (erring high).
        """
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
        pending, active = own[0], own[1] if own[2] is None else own[2]
        want = self._want
        data = os.pread(self._fd, want, 0)
        if data == self._quiet:
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
            return self._add_others(fields, len(fields), active, pending)
        mine = 2 * slot
        if not data.startswith(self._row, self._offset):
            self._own_row_changed()
        elif not (any(fields[:mine]) or any(fields[mine + 2 :])):
            # Alone in the file, or the others idle: nothing to add, and nothing while
            # the file reads the same.
            self._quiet = data
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
