"""``SessionCounts``: the sessions a guard counts, for the metrics and the scrape."""

from __future__ import annotations

from asgi_admission._admission.ledger.ledger import SessionLedger
from asgi_admission._admission.reservations.pending import ReservationKeeper


class SessionCounts:
    """``(active, pending)`` sessions, waiting for the ledger's lock; active comes from
    the app's own count when it gives one (less those still pending past their response).

    With a shared ledger held by another worker this waits at most ``LOCK_WAIT_S``
    and then raises ``LedgerBusy`` (a scrape reports no counts).
    """

    __slots__ = ("_keeper", "_ledger", "_locked")

    def __init__(self, ledger: SessionLedger, keeper: ReservationKeeper) -> None:
        self._ledger = ledger
        self._keeper = keeper
        self._locked = ledger.locked()

    def __call__(self) -> tuple[int, int]:
        own = self._keeper.own_count()
        with self._locked:
            return self._ledger.counts(own)
