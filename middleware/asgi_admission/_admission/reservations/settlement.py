"""A settlement: one admitted session's state while its reservation waits to settle.

The settler (``settling.py``) makes one at admission and moves it through its phases
(the request, waiting past the response or held by a ticket, started, done); the keeper
and the session requests hold on to it to report the session's events.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterable
from typing import Final, Literal

from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.ledger.ledger import Reservation

#: Every settlement's number, for the whole process: two guards of one process that
#: share a settling queue (the default place is per memory group, not per guard) key
#: their rows by (pid, number) and must never take each other's. It starts at random so
#: that a worker reusing a dead worker's pid never takes the rows that one left behind.
NUMBERS: Final = itertools.count(secrets.randbits(40) + 1)

Phase = Literal["request", "waiting", "held", "started", "done"]
#: What settling does to a reservation: gives it back, or makes it an active session.
SettleOutcome = Literal["release", "activate"]
Action = tuple[Reservation, SettleOutcome]
#: The phases past the response, not yet settled.
PAST_RESPONSE: Final = ("waiting", "held")


class Settlement:
    """One admitted session's state, from admission until its reservation settles.

    Owned by the ``settling.Settler`` that made it and changed only under the
    ledger's lock.
    """

    __slots__ = (
        "admitted_at",
        "end_told",
        "expired",
        "held",
        "kind",
        "measured_left",
        "phase",
        "queued",
        "released",
        "remaining",
        "reservation",
        "route",
        "seq",
        "visible",
    )

    def __init__(
        self, seq: int, reservation: Reservation, kind: Kind, route: str, admitted_at: float
    ) -> None:
        self.seq = seq
        self.reservation = reservation
        self.kind = kind
        self.route = route
        self.admitted_at = admitted_at
        self.phase: Phase = "request"
        #: Its memory showed (it left the queue's head that way).
        self.visible = False
        #: An app's ticket holds it until ``started()`` or ``release()``.
        self.held = False
        self.expired = False
        #: In the attribution queue (not when admitted with no reading to start from).
        self.queued = False
        #: Its reservation was given back (settled over HTTP, expired, released).
        self.released = False
        #: What its memory is still expected to add (its reserve, less what showed).
        self.remaining = 0
        #: What its own memory, measured (``Settler.measured``), still has to add.
        self.measured_left: int | None = None
        #: Its end was told to settling and learning (``ReservationKeeper``): once only.
        self.end_told = False

    @property
    def awaiting_memory(self) -> bool:
        """Whether it still waits for its memory to show in the queue: queued, not yet
        shown, and not settled, started or released."""
        return self.queued and not self.visible and self.phase in ("request", *PAST_RESPONSE)

    @property
    def settle_outcome(self) -> SettleOutcome:
        # A WebSocket (or a ticket's session) counts as active once settled; an
        # HTTP session's slot is given back (the app's count takes over).
        return "activate" if self.kind == "websocket" else "release"


def due(
    entries: Iterable[Settlement],
    now: float,
    *,
    shortest_s: float,
    timeout_s: float,
    request_timeout_s: float,
) -> list[Settlement]:
    """Of ``entries`` (in admission order), those whose time may be up: past their
    response or held, a request past ``request_timeout_s``, a started one past
    ``timeout_s`` (``shortest_s``: the shortest of every limit, a ramp time included)."""
    # Every time limit counts from admission: past the first entry too young for the
    # shortest limit, none is due.
    horizon = now - shortest_s
    found: list[Settlement] = []
    for entry in entries:
        if entry.admitted_at > horizon:
            break
        if (
            entry.phase in PAST_RESPONSE
            or (entry.phase == "request" and now - entry.admitted_at >= request_timeout_s)
            or (entry.phase == "started" and now - entry.admitted_at >= timeout_s)
        ):
            found.append(entry)
    return found


def apply(actions: Iterable[Action]) -> None:
    """Do what the settler decided; outside the ledger's lock."""
    for reservation, outcome in actions:
        if outcome == "release":
            reservation.release()
        else:
            reservation.activate()
