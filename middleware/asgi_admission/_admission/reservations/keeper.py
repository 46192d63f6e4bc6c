"""The reservations of one guard: settling, tickets, learning and the sample behind them.

``ReservationKeeper`` ties together the :class:`Settler` (how long a reservation
lasts), the :class:`SessionLearner` (what a session costs), the record of
session ends (for ``Retry-After``) and, with ``ADMISSION_SHARED_DIR``, the files
the workers share. The admission service calls it on the decision path (inside
the ledger's lock: cheap), the watched request when a response ends or a
WebSocket is accepted or closed, and the lifespan (``sampling.py``, a periodic
sample so that settling and learning never wait for traffic). Tickets call it
from any thread.

Notes:

- Every change is made inside the ledger's critical section (its
  ``threading.Lock``, and its ``flock`` when shared), and the reservations are
  released or activated after it is left: they take the same lock.
- The critical section is only ever tried (``attempt``): where another worker
  holds the shared ledger, a session's event (its response, its end, a ticket)
  is kept, in order, for the next sample, so neither the event loop nor a
  response waits for another process and nothing is lost (``actions.py``, docs/trust.md). A
  release (a ticket's, a WebSocket's end) still gives its reservation back at
  once; the sample catches up in a critical section of its own, so what the kept
  events decided is done even if the sample's look then fails. The app's own
  count is asked before the critical section, never inside it.
- The readings (a decision's own, one due after a sample interval, the periodic
  sample's) are taken by the keeper's :class:`Looks` (``looks.py``), inside the
  critical section the keeper enters for them.
- The reserve the latch uses is set from the configured reserve and what was
  learned (``learned_view.py``) whenever an observation arrives, and what was
  learned is shared with the other workers (``learned_sharing.py``).
- While a route has no learned footprint its sessions are probed
  (``probing.py``): the keeper tells the board of the probes' events and
  readings, and wakes the requests held for the probes' evidence (``holds.py``).
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Literal

from starlette.types import Scope

from asgi_admission._admission.decision.latch import HeldBytes
from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.ledger.ledger import LedgerBusy, Reservation
from asgi_admission._admission.reservations.actions import KeptEvents
from asgi_admission._admission.reservations.keeper_parts import KeeperParts
from asgi_admission._admission.reservations.learning import RouteEstimate
from asgi_admission._admission.reservations.looks import Looks
from asgi_admission._admission.reservations.probe_window import ProbeStatus
from asgi_admission._admission.reservations.probing import Gate
from asgi_admission._admission.reservations.session_ends import SessionEnds
from asgi_admission._admission.reservations.settlement import Action, Settlement, apply
from asgi_admission._admission.reservations.shared_files import SharedSettleQueue
from asgi_admission._config import Learning
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._routes import RouteNames

logger = logging.getLogger("asgi_admission")

#: Why a session request opened nothing: the app answered with an error status, or
#: its body had not arrived by ``ADMISSION_BODY_TIMEOUT_SECONDS``.
FailureCause = Literal["error_status", "body_timeout"]


class ReservationKeeper:
    """Settling, tickets and learning for one guard (see the module notes).

    ``attempt`` is the ledger's critical section, tried without waiting (it
    raises ``LedgerBusy`` while another worker holds it); ``read`` takes an
    exact reading and never raises; ``app_count()`` is the app's own count of
    its sessions (app code: asked outside ``attempt``; ``None``: none) and
    ``active_count(own)`` the container's active sessions with it (inside
    ``attempt``); ``route_of(scope)`` names a session's route.
    """

    def __init__(
        self,
        *,
        attempt: AbstractContextManager[object],
        read: Callable[[], MemoryReading],
        active_count: Callable[[int | None], int],
        app_count: Callable[[], int | None] = lambda: None,
        route_of: Callable[[Scope], str | None],
        parts: KeeperParts,
    ) -> None:
        controller = self._controller = parts.controller
        self._attempt = attempt
        self._read = read
        self._app_count = app_count
        #: Events kept while another worker held the shared ledger, oldest first.
        self._kept = KeptEvents()
        #: The session pattern a scope came by (``"predicate"`` when none matched).
        self.route = RouteNames(route_of)
        self.learning: Learning = parts.view.learning
        self._clock = parts.clock
        self._expired = parts.expired
        #: Session requests that opened nothing, by kind and cause, in this process.
        self.failed: dict[tuple[Kind, FailureCause], int] = {}
        self.ends = SessionEnds()
        self._looks = Looks(parts=parts, read=read, active_count=active_count, ends=self.ends)
        self._queue = parts.queue
        self.learner = parts.learner
        self.probing = parts.probing
        self.holds = parts.holds
        self.board = parts.board
        self.view = parts.view
        self.settler = parts.settler
        self.sharing = parts.sharing
        ref = weakref.ref(self)
        # The latch counts the pending sessions by what they still add (held_bytes),
        # through a weak reference: a guard that is gone is not kept by its controller.
        controller.held_by(_held_by(ref))
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    @property
    def expired_total(self) -> int:
        """Held tickets never started that the timeout released, in this process."""
        return self._expired.total

    # -- what settling expects ------------------------------------------------------

    def known(self) -> dict[str, RouteEstimate | None]:
        """The routes whose sessions are decided on an estimate, not probed first."""
        return self.view.known()

    def estimates(self) -> list[RouteEstimate]:
        """What was learned, per route (empty with learning off), and the provisional
        footprints of concluded probes; an open probe's growth is in :meth:`probe_status`."""
        known = self.view.known()
        return [estimate for route, estimate in self.view.estimates().items() if route in known]

    def own_count(self, count: int | None = None) -> int | None:
        """The app's count (``count``, or asked now) less its sessions pending past their
        response: those are in the app's count already, and counted once, as pending."""
        if count is None and (count := self._app_count()) is None:
            return None
        return max(0, count - self.settler.past_response)

    def reconcile(self, count: int | None) -> int | None:
        """Before a decision, outside the lock: settle what the app's ``count`` says ended
        and the events kept for later; :meth:`own_count` of ``count``. ``LedgerBusy``
        while another worker holds the shared ledger."""
        settler = self.settler
        if count is not None and settler.waiting and count < settler.past_response:
            with self._attempt:  # the app counts fewer sessions than wait to settle
                ended = settler.counted(count)
            apply(ended)
        self._kept.catch_up(self._attempt)
        return None if count is None else self.own_count(count)

    def expected_wait_s(self, now: float, probed: str | None = None) -> float | None:
        """How long until a session ends, at the rate they have been ending; for a route
        being ``probed``, how long its probes have been ramping (for ``Retry-After``)."""
        if probed is not None:
            return self.board.retry_after_s(probed, now)
        return self.ends.expected_wait_s(now)

    # -- on the decision path (inside the ledger's lock) ------------------------------

    def admitted(
        self,
        reservation: Reservation,
        kind: Kind,
        scope: Scope | None,
        used_bytes: int | None,
        limit_bytes: int | None = None,
        *,
        route: str | None = None,
        probe: bool = False,
    ) -> Settlement:
        """A reservation just made, at working set ``used_bytes`` (exact or a bound)
        under the memory limit ``limit_bytes``; ``probe``: a probe of its route (admitted
        at an exact working set)."""
        now = self._clock()
        if route is None:
            route = self.route(scope)
        if self.learning != "off":
            self.learner.on_admit(route, used_bytes, now, responded=False)
        if limit_bytes is not None:
            self._looks.note_limit(limit_bytes)
        # Blind since this process started (nothing admitted under a limit: there is none,
        # or memory was never read), the latch measures no session's memory: there is
        # none to wait for, and the session settles at its response (or accept), by its
        # ticket or at its end.
        expected = 0 if self._looks.limit is None else self.view.expected_bytes(route, limit_bytes)
        entry = self.settler.admit(reservation, kind, route, used_bytes, now, expected)
        if probe and used_bytes is not None:
            self.board.add(route, entry.seq, used_bytes, expected, now)
        elif self.probing and self.board.busy:
            self.board.other_admitted(now)
        return entry

    def held_bytes(self, route: str | None, pending: int, limit_bytes: int) -> int:
        """What the ``pending`` sessions and one more of ``route`` hold back under
        ``limit_bytes`` (the latch's ``held_bytes``): this process's pending sessions what
        they are still expected to add, the others (other workers') a reserve each, and one
        more its route's reserve where the route is known, else the largest."""
        reserve = self._controller.reserve_for(limit_bytes)
        own, counted = self.settler.held()
        new = reserve
        if route is not None and route in self.view.estimates():
            new = min(reserve, self.view.expected_bytes(route, limit_bytes))
        return own + max(0, pending - counted) * reserve + new

    def gate(self, route: str, used_bytes: int | None = None) -> Gate:
        """How to decide one more session of ``route`` (inside the ledger's lock), at the
        exact working set ``used_bytes`` (which may conclude the probes)."""
        now = self._clock()
        if used_bytes is not None and self.board.busy:
            self.board.on_reading(used_bytes, now, self.learner)
            self.sharing.publish()
        if route in self.known():
            return "known"
        return self.board.gate(route, now)

    def probe_status(self) -> list[ProbeStatus]:
        """The routes being probed now (for metrics and refusals: outside the lock)."""
        if self.board.shared:
            try:
                with self._attempt:
                    return self.board.status(self._clock(), load=True)
            except LedgerBusy:
                pass  # as this worker last saw them
        return self.board.status(self._clock())

    def due(self) -> Sequence[Action]:
        """Settle from a fresh reading when the last look is a sample interval old
        (``Looks.due``)."""
        return self._looks.due()

    def settle_with(self, memory: MemoryReading) -> Sequence[Action]:
        """A decision's own reading settles what it shows (``Looks.settle_with``)."""
        return self._looks.settle_with(memory)

    # -- the session's events (each takes the lock) -----------------------------------

    def respond(self, entry: Settlement) -> None:
        """The response ended or the WebSocket was accepted."""
        # Once a session request: now_or_later's steps, without a closure.
        if not self._kept:
            try:
                with self._attempt:
                    actions = self._responded(entry)
            except LedgerBusy:
                pass
            else:
                apply(actions)
                return
        self._kept.keep(functools.partial(self._responded, entry))

    def _responded(self, entry: Settlement) -> Sequence[Action]:
        now = self._clock()
        actions = self.settler.respond(entry, now)
        if self.learning != "off":
            self.learner.on_response(entry.admitted_at, now)
        probe = entry.seq in self.board.own
        if (entry.phase == "waiting" and entry.queued) or probe:
            # Work done inside the request is in the working set by now: a fresh
            # reading lets such a session settle at once (and a probe show it).
            memory = self._read()
            used = memory.used_bytes if memory.available else None
            if probe:
                self.board.responded(entry.seq, used, now)
            if used is not None:
                actions += self._looks.take(used, now)
            else:
                # No reading to show it by: it settles by time, as any blind session.
                actions += self.settler.settle(None, now)
        return actions

    def _probe_left(self, entry: Settlement, opened: bool) -> None:
        # Asked of every session's end: most are no probe, and this process has none.
        if entry.seq in self.board.own:
            self.board.left(entry.seq, opened=opened, now=self._clock())

    def fail(self, entry: Settlement, cause: FailureCause) -> None:
        """The request opened nothing (an error answer, a body that came too late): its
        reservation goes back whatever its ticket said, and nothing is learned from it."""
        self.count_failure(entry.kind, cause)

        def step() -> Sequence[Action]:
            self.learner.on_failed(entry.admitted_at)
            self._probe_left(entry, False)
            return self.settler.release(entry)

        self._kept.now_or_later(step, self._attempt, releases=entry.reservation)

    def count_failure(self, kind: Kind, cause: FailureCause) -> None:
        """One more session request of ``kind`` that opened nothing, for the metrics."""
        self.failed[kind, cause] = self.failed.get((kind, cause), 0) + 1

    def abandon(self, entry: Settlement, *, session_over: bool = False) -> None:
        """The request failed before its response, or the session ended."""

        def step() -> Sequence[Action]:
            if session_over:
                self._ended(entry)
            elif not (entry.held or entry.phase == "started"):
                self.learner.on_failed(entry.admitted_at)
            self._probe_left(entry, entry.phase != "request")
            return self.settler.abandon(entry, session_over=session_over)

        self._kept.now_or_later(
            step, self._attempt, releases=entry.reservation if session_over else None
        )

    def ticket(self, operation: str, entry: Settlement) -> bool:
        """``hold``, ``started`` or ``release`` for a ticket; whether hold took effect
        (``True`` for one kept for later: it is applied before anything after it)."""
        if operation == "hold":
            held: list[bool] = []

            def hold() -> Sequence[Action]:
                held.append(self.settler.hold(entry))
                return ()

            self._kept.now_or_later(hold, self._attempt)
            return held[0] if held else True
        if operation == "started":
            self._kept.now_or_later(lambda: self.settler.started(entry), self._attempt)
        else:

            def release() -> Sequence[Action]:
                self._ended(entry)
                self._probe_left(entry, entry.phase != "request")
                return self.settler.release(entry)

            self._kept.now_or_later(release, self._attempt, releases=entry.reservation)
        return True

    def measured(self, entry: Settlement, own_bytes: int) -> None:
        """A ticket's session's own memory, measured (``Settler.measured``). Skipped while
        another worker holds the shared ledger: the next measurement says as much."""
        if self._kept:
            return  # events kept for later come first; so does the next measurement
        try:
            with self._attempt:
                actions = self.settler.measured(entry, own_bytes)
        except LedgerBusy:
            return
        apply(actions)

    def _ended(self, entry: Settlement) -> None:
        """Inside the critical section: the session of ``entry`` ended (its route known).
        Told once, however many say so (the app's release, its watchdog, a closed socket)."""
        if entry.end_told:
            return
        entry.end_told = True
        if entry.phase == "started" or (entry.phase == "done" and not entry.released):
            # It was active: the next sample sees the active count fall for it too.
            self._looks.named_end()
        now = self._clock()
        # What it frees is credited to the sessions still settling (``freed.py``).
        self.settler.ended(self.view.expected_bytes(entry.route, self._looks.limit), now)
        if self.learning != "off":
            self.learner.on_session_end(now, route=entry.route, admitted_at=entry.admitted_at)

    def observe_peak(self, route: str, peak_bytes: int, *, exact: bool = False) -> None:
        """The watchdog measured a session of ``route`` at ``peak_bytes`` (RSS) at most,
        or (``exact``) its own memory group's peak."""
        if self.learning == "off":
            return

        def step() -> Sequence[Action]:
            self.learner.observe(route, footprint_bytes=peak_bytes, exact=exact)
            self.sharing.publish()
            return ()

        self._kept.now_or_later(step, self._attempt)

    @property
    def probes_busy(self) -> bool:
        """Whether requests wait for a probe's evidence, or a probe is open."""
        return bool(self.holds) or self.board.busy

    @property
    def deferred(self) -> int:
        """How many session events wait for the shared ledger (``actions.py``)."""
        return len(self._kept)

    # -- the periodic sample ------------------------------------------------------------

    def sample(self) -> None:
        """One look: settle and learn from a fresh reading, note session ends.

        Skipped (until the next) while another worker holds the shared ledger.
        """
        now = self._clock()
        try:
            # Their own critical section: done even if the look then fails (a file replaced).
            self._kept.catch_up(self._attempt)
            # The app's count after them: an end kept for later is not also a count falling.
            own = self.own_count()
            with self._attempt:
                actions = self._looks.sample(own, now)
        except LedgerBusy:
            return
        apply(actions)

    def _after_fork(self) -> None:
        self.settler.after_fork()
        self.board.after_fork()
        if isinstance(self._queue, SharedSettleQueue):
            self._queue.after_fork()


def _held_by(ref: weakref.ReferenceType[ReservationKeeper]) -> HeldBytes:
    """A keeper's :meth:`ReservationKeeper.held_bytes`, while the keeper lives."""

    def held(route: str | None, pending: int, limit: int, /) -> int | None:
        keeper = ref()
        return None if keeper is None else keeper.held_bytes(route, pending, limit)

    return held


def _forked(ref: weakref.ReferenceType[ReservationKeeper]) -> None:
    keeper = ref()
    if keeper is not None:
        keeper._after_fork()
