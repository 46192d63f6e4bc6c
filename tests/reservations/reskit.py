"""Helpers for the reservation tests."""

from __future__ import annotations

from asgi_admission._admission.ledger.ledger import InProcessLedger
from asgi_admission._admission.reservations.settling import apply as apply

#: Internal on purpose: the reservation tests drive the reservations and ledger directly.
INTERNAL = "the reservations' apply and the in-process ledger"


def counts(ledger: InProcessLedger) -> tuple[int, int]:
    """``(active, pending)`` of an in-process ledger."""
    with ledger.locked():
        return ledger.counts()
