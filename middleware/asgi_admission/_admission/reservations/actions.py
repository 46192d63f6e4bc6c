"""Session events done at once or, while the shared ledger is held, kept for later.

A session's events (its response, its end, a ticket) change the settler's
bookkeeping inside the ledger's critical section, which is only ever tried: where
another worker holds it, :class:`KeptEvents` keeps the event, in order, for the
next sample, so neither the event loop nor a response waits for another process
and nothing is lost (``docs/trust.md``).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from asgi_admission._admission.ledger.ledger import LedgerBusy, Reservation
from asgi_admission._admission.reservations.settlement import Action, apply

#: One session event's bookkeeping, inside the critical section: what it decided.
Step = Callable[[], Sequence[Action]]


class KeptEvents:
    """The session events kept while another worker held the shared ledger, oldest first."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: collections.deque[Step] = collections.deque()

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, step: Step) -> None:
        """Keep ``step`` for the next critical section, after those kept before it."""
        self._kept.append(step)

    def now_or_later(
        self,
        step: Step,
        attempt: AbstractContextManager[object],
        *,
        releases: Reservation | None = None,
    ) -> None:
        """``step`` in the critical section (``attempt``), then what it decided; while
        another worker holds the shared ledger (or earlier events wait), kept.

        A step that ends its session (``releases``: a ticket's release, a WebSocket's
        end) gives the reservation back at once even then: the ledger's release never
        waits and never raises, and nothing that comes later may count that session
        again (an activation after it is a no-op). Only the settler's bookkeeping waits.
        """
        if not self._kept:
            try:
                with attempt:
                    actions = step()
            except LedgerBusy:
                pass
            else:
                apply(actions)
                return
        self._kept.append(step)
        if releases is not None:
            releases.release()

    def catch_up(self, attempt: AbstractContextManager[object]) -> None:
        """The events kept, in order, in a critical section of their own (``attempt``):
        what they decided is done even if what follows fails. ``LedgerBusy`` while
        another worker holds the shared ledger (they stay kept)."""
        if not self._kept:
            return
        actions: list[Action] = []
        with attempt:
            while self._kept:
                actions += self._kept.popleft()()
        apply(actions)
