"""``AdmissionTicket``: the app's hold on its session's reservation.

The guard keeps a reservation pending until the session's memory shows (see
``docs/reservations.md``). An app that knows better when its session is up
takes the ticket from the request and says so: ``hold()`` before the response
ends keeps the reservation pending past it, ``started()`` moves it to active
(the memory is up), ``release()`` gives it back (the session failed or ended).
A held ticket never started is released after the pending timeout. ``measured()``
tells the guard the session's own memory, so that its reservation settles exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from starlette.requests import HTTPConnection

from asgi_admission._admission.reservations.settling import Reservation

if TYPE_CHECKING:
    from asgi_admission._admission.reservations.pending import Reservations

#: Where the middleware puts a guarded request's ticket in its ASGI scope.
SCOPE_KEY: Final = "asgi_admission.ticket"

TicketState = Literal["pending", "active", "released"]


class AdmissionTicket:
    """One admitted session's reservation, for the app to hold, start or release.

    Its methods are idempotent and thread-safe (a sync endpoint runs in a
    thread pool), and work across workers with the shared ledger. After
    ``started()``, call ``release()`` when the session ends (or let the app's
    ``current_sessions`` count it): the guard counts it as active until then.
    """

    __slots__ = ("_entry", "_reservations")

    def __init__(self, reservations: Reservations, entry: Reservation) -> None:
        self._reservations = reservations
        self._entry = entry

    @property
    def route(self) -> str:
        """The session route pattern this ticket was admitted by."""
        return self._entry.route

    @property
    def state(self) -> TicketState:
        """``pending`` until started or settled; then ``active`` (started, or a settled
        WebSocket) or ``released`` (given back, or an HTTP session settled by its memory,
        whose count the app's own count takes over)."""
        entry = self._entry
        if entry.released:
            return "released"
        if entry.phase in ("started", "done"):
            return "active"
        return "pending"

    def hold(self) -> bool:
        """Keep the reservation pending past the response until ``started()`` or ``release()``.

        Call it before the response ends (or the WebSocket is accepted). Returns
        ``False`` when it is too late: the reservation had already settled.
        """
        return self._reservations.ticket("hold", self._entry)

    def started(self) -> None:
        """The session's memory is up: its reservation becomes an active session."""
        self._reservations.ticket("started", self._entry)

    def release(self) -> None:
        """The session failed or ended: give its reservation back."""
        self._reservations.ticket("release", self._entry)

    def measured(self, used_bytes: int) -> None:
        """The session's own memory is ``used_bytes`` now (the memory its processes alone
        map, say): its reservation settles as soon as that shows what a session of its route
        is expected to add, even while other sessions' ends hide its growth in the
        container's working set; until then it holds only what is still to come.

        The session watchdog calls this on every sample of a process registered with
        ``ticket=``. Call it only with memory that is the session's own: a figure too
        high settles the reservation before the memory is there. Cheap once settled.
        """
        if self.awaiting_memory:
            self._reservations.measured(self._entry, used_bytes)

    @property
    def awaiting_memory(self) -> bool:
        """Whether the reservation still waits for the session's memory to show (what
        ``measured()`` acts on): not yet shown, settled, started or released."""
        return self._entry.awaiting_memory


def reservation_of(ticket: AdmissionTicket) -> Reservation:
    """The reservation ``ticket`` is the app's hold on, for the guard's own use: the run
    of the admitted request tells the reservations how it ended through it, and a waiter
    admitted as its client left gives it back. Not the app's: the ticket's methods are."""
    return ticket._entry


def admission_ticket(connection: HTTPConnection) -> AdmissionTicket | None:
    """The ticket of a request or WebSocket the guard admitted; ``None`` for any other."""
    ticket = connection.scope.get(SCOPE_KEY)
    return ticket if isinstance(ticket, AdmissionTicket) else None
