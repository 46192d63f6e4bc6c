"""The shared ledger's critical section, and keeping this worker's slot written.

``LockedLedgerFile`` is a worker's hold on the ledger file (``ledger_file``) with
the section every decision enters: this process's lock, then the file's exclusive
``flock``, with the repairs due on entering (following a replaced file, claiming a
slot, the heartbeat's start). After an activation or release it writes the slot at
the next section, on the loop's next turn or by the heartbeat. ``SharedLedger``
(``shared_ledger``, whose notes tell the whole story) counts on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import threading
import time
from types import TracebackType
from typing import Final

from asgi_admission._admission.ledger.ledger import LOCK_WAIT_S, LedgerBusy, LedgerUnavailable
from asgi_admission._admission.ledger.ledger_file import LedgerFile, flock_by, published

logger = logging.getLogger("asgi_admission")

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

    def __init__(self, ledger: LockedLedgerFile, wait_s: float) -> None:
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
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


class LockedLedgerFile(LedgerFile):
    """The ledger file in ``directory`` under its critical section (see the module notes)."""

    __slots__ = (
        "_attempt",
        "_beating",
        "_broken",
        "_flush_thread",
        "_lock",
        "_locked",
        "_next_link_check",
    )

    def __init__(
        self, directory: str | os.PathLike[str], *, capacity: int, settle_s: float
    ) -> None:
        super().__init__(directory, capacity=capacity, settle_s=settle_s)
        self._lock = threading.Lock()
        self._beating = False
        self._broken = False
        #: The thread whose loop's next turn writes the changes made in it (0: none).
        self._flush_thread = 0
        self._locked = Section(self, LOCK_WAIT_S)
        self._attempt = Section(self, 0.0)
        self._next_link_check = 0.0

    # -- the critical section ------------------------------------------------------

    def locked(self) -> Section:
        """The critical section, waited for at most ``LOCK_WAIT_S`` (then ``LedgerBusy``).

        For callers off the event loop; the middleware uses :meth:`attempt`.
        """
        return self._locked

    def attempt(self) -> Section:
        """The critical section if it is free right now; ``LedgerBusy`` if not."""
        return self._attempt

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
        """After an activation or release (the counts changed in memory) in a thread
        whose loop has no write scheduled: write the slot at the next critical section,
        when this loop next turns at the latest; off a loop, now. Many releases in one
        loop turn then cost one section, and a release followed by a decision none."""
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
                if data is not None:
                    self._check_own_row(data)
        except LedgerBusy:
            pass  # held elsewhere, or unusable (logged once): the next beat tries again
        except Exception:
            logger.exception("asgi-admission: the shared session ledger's heartbeat failed")
        self._beat()
