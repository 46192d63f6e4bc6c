"""Counting admitted sessions: pending (admitted, not yet established) and active.

The admission service (``_admission/service.py``) decides and reserves inside
``ledger.attempt()`` (see :class:`SessionLedger`), reading the counts, taking a
memory reading, running the latch and reserving without an ``await`` in between.
Each reservation is then activated (the session is established) or released by
the settling of reservations (``reservations/settling.py``), outside the
critical section; both are idempotent, so every place a session can end may call
them and only the first call counts. A ledger shared by several worker processes
(``shared_ledger.py``) implements the same protocol.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Final, Protocol, TypeVar

#: A reservation's states, shared by the in-process and the shared ledger.
PENDING: Final = 0
ACTIVE: Final = 1
RELEASED: Final = 2


#: How long a session decision may wait for a shared ledger before it is refused
#: (``ledger_busy``); critical sections take microseconds, so only a stuck worker
#: (stopped inside one) makes anyone wait this long.
LOCK_WAIT_S: Final = 1.0


class LedgerBusy(Exception):
    """The shared ledger's lock could not be had in time: refuse, and let the client retry."""


class LedgerUnavailable(LedgerBusy):
    """The shared ledger's file cannot be opened or repaired right now (see the log)."""


class CountedSession(Protocol):
    """One admitted session's count in the ledger: pending, then active or released."""

    def activate(self) -> None:
        """Move from pending to active; no-op unless still pending."""
        ...

    def release(self) -> None:
        """Give the slot back; only the first call has an effect."""
        ...


class SessionLedger(Protocol):
    """The pending and active counts the latch decides with."""

    def locked(self) -> AbstractContextManager[object]:
        """The critical section, waited for (a shared ledger: ``LOCK_WAIT_S``, then
        ``LedgerBusy``); not reentrant. For callers that may block (the metrics' and
        the scrape's counts); the same reusable context manager every time."""
        ...

    def attempt(self) -> AbstractContextManager[object]:
        """The critical section without waiting for another process: ``LedgerBusy``
        if it is held. The admission service decides and reserves inside it, on the
        event loop, retrying with :func:`when_free`; the same reusable context manager
        every time."""
        ...

    def attempt_own(self) -> AbstractContextManager[object]:
        """The critical section for this process's own bookkeeping alone, which reads
        and writes no shared file (settling a session that holds nothing shared): this
        process's lock alone, ``LedgerBusy`` if it is held. Not for counting or
        reserving; the same reusable context manager every time."""
        ...

    def counts(self, own_active: int | None = None, *, high: bool = False) -> tuple[int, int]:
        """``(active, pending)``; call inside the critical section for a consistent
        pair. ``own_active``, the app's count when it reports one (``current_sessions``),
        replaces this process's own count of accepted WebSockets; a shared ledger
        publishes it, so that every worker's decision sees the container-wide total.
        ``high``: a shared ledger does not ask whether the other workers live, and
        counts a dead worker's sessions until a count that asks recovers them; the
        counts are then never below the exact ones."""
        ...

    def active(self, own_active: int | None = None) -> int:
        """The active count of :meth:`counts`; call inside the critical section."""
        ...

    def reserve(self) -> CountedSession:
        """A new pending reservation; call inside the critical section, with the
        decision (``attempt()``)."""
        ...

    def tell_changes(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after any of this process's reservations is activated or
        released, outside the critical section (the multiprocess metrics republish the
        counts)."""
        ...


class _InProcessReservation:
    __slots__ = ("_ledger", "_state")

    def __init__(self, ledger: InProcessLedger) -> None:
        self._ledger = ledger
        self._state = PENDING

    def activate(self) -> None:
        ledger = self._ledger
        with ledger._lock:
            if self._state != PENDING:
                return
            self._state = ACTIVE
            ledger._pending -= 1
            ledger._active += 1
        if ledger._on_change is not None:
            ledger._on_change()

    def release(self) -> None:
        if self._state == RELEASED:
            return  # final, so seen without the lock: the middleware's later calls are free
        ledger = self._ledger
        with ledger._lock:
            if self._state == PENDING:
                ledger._pending -= 1
            elif self._state == ACTIVE:
                ledger._active -= 1
            else:
                return
            self._state = RELEASED
        if ledger._on_change is not None:
            ledger._on_change()


class InProcessLedger:
    """Counts for one process, under one ``threading.Lock``.

    A plain lock (not an asyncio one) because the critical section never awaits
    and because a sync ``current_sessions`` callable or a second event loop in
    another thread may share the middleware.
    """

    __slots__ = ("_active", "_lock", "_on_change", "_pending")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._pending = 0
        #: Called after a reservation's activation or release, outside the lock.
        self._on_change: Callable[[], None] | None = None

    def tell_changes(self, callback: Callable[[], None]) -> None:
        self._on_change = callback

    def locked(self) -> threading.Lock:
        return self._lock

    def attempt(self) -> threading.Lock:
        # Only this process's threads take it, each for microseconds and never
        # across app code or I/O: waiting for it never stalls the loop.
        return self._lock

    def attempt_own(self) -> threading.Lock:
        return self._lock

    def counts(self, own_active: int | None = None, *, high: bool = False) -> tuple[int, int]:
        return self._active if own_active is None else own_active, self._pending

    def active(self, own_active: int | None = None) -> int:
        return self._active if own_active is None else own_active

    def reserve(self) -> _InProcessReservation:
        self._pending += 1
        return _InProcessReservation(self)


_T = TypeVar("_T")


async def when_free(step: Callable[[], _T], *, tried: LedgerBusy | None = None) -> _T:
    """``step()`` (a critical section taken with ``attempt``), retried with awaits
    while the ledger is held elsewhere; ``LedgerBusy`` after ``LOCK_WAIT_S``.

    ``tried`` is what the caller's own first attempt raised (the request path tries
    once without a coroutine of its own): the retries follow at once.
    The event loop is never blocked on another worker's lock: a worker stopped
    inside its critical section costs a refusal, not a frozen server.
    """
    if tried is None:
        try:
            return step()
        except LedgerBusy as exc:
            tried = exc
    if isinstance(tried, LedgerUnavailable):
        raise tried
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.0005
    while True:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.02)
        try:
            return step()
        except LedgerBusy as exc:
            if isinstance(exc, LedgerUnavailable) or time.monotonic() >= deadline:
                raise
