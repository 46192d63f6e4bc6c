"""Settling: a session's reservation lasts until its memory shows in the working set.

A session-opening request usually answers long before its session has built its
memory (``201``, then the browser or kernel boots). The reservation made at
admission therefore stays counted as pending past the response (HTTP) or the
accept (WebSocket) until the session *settles*: its memory is visible, its
learned ramp time has passed, or the pending timeout has.

Notes:

- Attribution is aggregate and first in, first out. Unsettled sessions wait in
  admission order behind a *floor*, the working set already accounted for. The
  head's memory is visible once the working set reaches ``floor + 0.9 x its
  expected bytes``; it then leaves and the floor rises by its *whole* expected
  bytes, so the next one must show its own memory on top. A session's floor is
  never below the working set at its own admission: growth from before it
  existed is never its own. Other memory growing can only make a session look
  settled when it really is growing too, and memory freed (sessions ending) holds
  the queue longer: a reservation may be held a little long, never released early.
- Readings used here are exact working sets (never the fast path's usage bound,
  which includes cache). Admission records the working set it decided with, or the
  bound where that was all it read: a higher start only holds the reservation longer.
- A session that leaves the queue without showing its memory (its ramp time or
  the timeout passed, or its app said ``started()``) stays in the queue as a
  placeholder, still counting its expected bytes, and moves to the front: its
  memory may all be there already, ahead of older sessions still ramping, so
  growth pays for it first. It leaves once its memory shows, the timeout has passed
  since its admission, or it protects no one (``settle_queue.drop_lapsed``). A
  session that failed or ended leaves outright: no memory is expected of it.
- A session of a route built inside the request settles at the first reading after
  its response that shows its memory, wherever it stands in the queue, and its memory
  counts as no older session's growth (``settle_queue.shown_in_request``).
- A session whose app says ``started()`` while the floor stands above the working
  set it was admitted at may be what credited older sessions with growth since
  then: its memory is up, theirs perhaps not yet, and its reserve is all that still
  covers theirs. It stays pending (its ticket started) until growth has paid for
  every placeholder in the queue (a later one's memory may be what paid for its
  own) or the timeout has passed since its admission, then becomes active.
  Otherwise ``started()`` makes it active at once.
- Everything here runs inside the ledger's critical section, which also guards
  the queue when it is shared by the workers (``SharedSettleQueue``); what to do
  with the reservations (release, activate: ``pending_sessions.py``) is returned, to
  be done after the lock is left, because the reservations take the same lock.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Final

from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.ledger.ledger import Reservation
from asgi_admission._admission.reservations.freed import FreedMemory, Mark, credited
from asgi_admission._admission.reservations.growth import Growth, quick, young_bytes_per_s
from asgi_admission._admission.reservations.pending_sessions import PendingSessions
from asgi_admission._admission.reservations.settle_queue import (
    VISIBLE_FRACTION,
    LocalSettleQueue,
    QueueRecord,
    SettleQueue,
    attribute,
    drop_lapsed,
    expect_learned,
    own_record,
    shown_in_request,
    take_shown,
)
from asgi_admission._admission.reservations.settlement import (
    NUMBERS,
    Action,
    Settlement,
    due,
)

logger = logging.getLogger("asgi_admission")

DEFAULT_PENDING_TIMEOUT_S: Final = 120.0
#: A session expected to add less than this settles as one expecting nothing: memory
#: moves by more than this between readings for reasons of its own.
NOISE_BYTES: Final = 1024 * 1024


class Settler:
    """Keeps reservations pending until each session's memory shows.

    ``timeout_s`` bounds a reservation past its response and a held ticket;
    ``request_timeout_s`` (default the same) one whose request is still in progress.
    ``ramp_s(route)`` is a route's learned ramp time or ``None``. ``on_expired()`` is
    told of each held ticket the timeout released. Every method runs inside the
    ledger's critical section and returns the reservation changes to make once it is
    left."""

    __slots__ = (
        "_footprint_bytes",
        "_freed",
        "_fresh",
        "_growth",
        "_mark",
        "_on_expired",
        "_pending",
        "_pid",
        "_queue",
        "_ramp_s",
        "_routes",
        "_seen",
        "_shortest_ramp_s",
        "request_timeout_s",
        "timeout_s",
    )

    def __init__(
        self,
        *,
        queue: SettleQueue | None = None,
        timeout_s: float = DEFAULT_PENDING_TIMEOUT_S,
        request_timeout_s: float | None = None,
        ramp_s: Callable[[str], float | None] = lambda route: None,
        min_ramp_s: Callable[[], float | None] = lambda: None,
        footprint_bytes: Callable[[str], int | None] = lambda route: None,
        on_expired: Callable[[], None] = lambda: None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(
                f"ADMISSION_PENDING_TIMEOUT_SECONDS must be greater than 0; got {timeout_s!r}."
            )
        self.timeout_s = float(timeout_s)
        #: The longest a request still in progress holds its reservation (from admission).
        self.request_timeout_s = self.timeout_s if request_timeout_s is None else request_timeout_s
        self._queue = queue if queue is not None else LocalSettleQueue()
        self._ramp_s = ramp_s
        self._shortest_ramp_s = min_ramp_s
        self._footprint_bytes = footprint_bytes
        self._on_expired = on_expired
        #: The route of each of this process's sessions in the queue, placeholders too.
        self._routes: dict[int, str] = {}
        #: Every route this process admitted a session of.
        self._seen: set[str] = set()
        self._pid = os.getpid()
        self._pending = PendingSessions(self._queue, self._pid, footprint_bytes)
        self._growth = Growth()
        #: The last exact reading, and memory ended sessions may free (``freed.py``).
        self._mark: Mark | None = None
        self._freed = FreedMemory()
        #: Sessions of routes built inside the request that responded since the last reading.
        self._fresh: set[int] = set()

    @property
    def unsettled(self) -> int:
        """This process's sessions whose reservation has not settled yet."""
        return len(self._pending)

    @property
    def waiting(self) -> int:
        """This process's sessions past their response, not held, not yet settled."""
        return self._pending.waiting

    @property
    def past_response(self) -> int:
        """Those and the held tickets past their response, not yet started."""
        return self._pending.past_response

    def after_fork(self) -> None:
        """A forked worker starts with nothing of its parent's."""
        self._routes = {}
        self._fresh = set()
        self._pid = os.getpid()
        if isinstance(self._queue, LocalSettleQueue):
            self._queue = LocalSettleQueue()
        self._pending = PendingSessions(self._queue, self._pid, self._footprint_bytes)

    # -- the session's events ------------------------------------------------------

    def admit(
        self,
        reservation: Reservation,
        kind: Kind,
        route: str,
        used_bytes: int | None,
        now: float,
        expected_bytes: int,
    ) -> Settlement:
        """Queue a session just admitted, with the working set it was admitted at and
        what it is expected to add (its reserve, 0 or more)."""
        seq = next(NUMBERS)
        self._seen.add(route)
        entry = Settlement(seq, reservation, kind, route, now)
        self._pending.add(entry)
        # Less than the working set's own noise can never be told apart from it: waiting
        # for it would keep the session pending until its ramp or timeout, and a pile of
        # such sessions would cost every decision a pass over the settling queue.
        expected = entry.remaining = expected_bytes if expected_bytes >= NOISE_BYTES else 0
        if not expected:
            # Nothing to wait for (no reserve, or sessions of this route add nothing).
            entry.visible = True
            return entry
        base = used_bytes
        if base is None and self._mark is not None:
            base = self._mark.used_bytes  # the last exact reading
        if base is not None:
            floor, records = self._queue.load()
            records.append(QueueRecord(self._pid, seq, now, base, expected))
            self._queue.store(floor, records)
            entry.queued = True
            self._routes[seq] = route
        return entry

    def respond(self, entry: Settlement, now: float) -> list[Action]:
        """The response ended (HTTP) or the app accepted (WebSocket)."""
        if entry.phase != "request":
            return []
        if entry.visible and not entry.held:
            # Its memory showed already, or none was expected: from the request
            # straight to settled (as through "waiting", whose counts it would leave
            # as they were).
            return self._pending.settle(entry)
        if entry.held:
            self._pending.phase(entry, "held")
            return self._time_out(entry, now)
        self._pending.phase(entry, "waiting")
        if entry.visible:
            return self._pending.settle(entry)
        if entry.queued and quick(self._ramp_s(entry.route)):
            # Its memory is there now: the reading taken at its response shows it.
            self._fresh.add(entry.seq)
            return []
        # Not queued (no reading to start from): it settles by time alone.
        return self._time_out(entry, now)

    def abandon(self, entry: Settlement, *, session_over: bool = False) -> list[Action]:
        """The session failed before its response, or (``session_over``) it ended.

        A held ticket outlives a failed request (its app decides, or the timeout
        does), never the end of a WebSocket.
        """
        if not session_over and (entry.held or entry.phase == "started"):
            return []
        return self._pending.drop(entry)

    def hold(self, entry: Settlement) -> bool:
        """An app's ticket takes over; ``False`` once the session has settled."""
        if entry.phase in ("request", "waiting"):
            entry.held = True
            if entry.phase == "waiting":
                self._pending.phase(entry, "held")
            return True
        return entry.held and entry.phase != "done"

    def started(self, entry: Settlement) -> list[Action]:
        """The app says the session's memory is up: pending becomes active (once it
        covers no older session's memory: see the module notes)."""
        if entry.phase in ("request", "waiting", "held"):
            floor, records = self._queue.load()
            own = own_record(records, self._pid, entry.seq) if entry.queued else None
            credited = own is not None and floor is not None and floor > own.base_bytes
            self._pending.phase(entry, "started")
            if self._pending.mark_placeholder(entry) and credited:
                # It stays among the entries, its reserve held, until growth has paid
                # for every placeholder (see the module notes).
                return []
            return self._pending.activate(entry)
        return []

    def measured(self, entry: Settlement, own_bytes: int) -> list[Action]:
        """The session's own memory was measured at ``own_bytes`` (its process, by the
        watchdog): it settles once that shows what it was expected to add, wherever it
        stands in the queue (``settle_queue.take_shown``); until then it counts only what
        its own memory still has to add. Exact evidence: ends elsewhere cannot hide it."""
        if not entry.awaiting_memory:
            return []
        floor, records = self._queue.load()
        record = own_record(records, self._pid, entry.seq)
        if record is None or record.placeholder:
            return []
        # The latest measurement alone (memory that went may come back); see _attribute.
        entry.remaining = entry.measured_left = max(0, record.expected_bytes - own_bytes)
        if own_bytes < VISIBLE_FRACTION * record.expected_bytes:
            return []
        self._queue.store(take_shown(floor, records, record), records)
        self._routes.pop(entry.seq, None)
        entry.visible = True
        return self._pending.settle(entry) if entry.phase == "waiting" else []

    def release(self, entry: Settlement) -> list[Action]:
        """The app ended or gave up the session."""
        return self._pending.drop(entry)

    def held(self) -> tuple[int, int]:
        """What this process's pending sessions are still expected to add, and how many."""
        return self._pending.held()

    @property
    def mark(self) -> Mark | None:
        """The last exact reading settled with (``None`` before the first)."""
        return self._mark

    def ended(self, freed_bytes: int, now: float, *, since: Mark | None = None) -> None:
        """Sessions ended after the reading ``since`` (default: the last), freeing at
        most ``freed_bytes``: the falls seen next are credited (``freed.py``)."""
        since = self._mark if since is None else since
        if since is not None:
            self._freed.ended(freed_bytes, since, now)

    def counted(self, app_count: int) -> list[Action]:
        """The app counts ``app_count`` sessions, fewer than are waiting past their response:
        the oldest waiting ones ended before their memory showed, and settle now (as
        placeholders: their memory is still expected, in case it comes after all)."""
        actions: list[Action] = []
        for entry in self._pending.oldest_waiting(self.past_response - max(0, app_count)):
            self._pending.mark_placeholder(entry)
            actions += self._pending.settle(entry)
        return actions

    # -- the readings ----------------------------------------------------------------

    def settle(self, used_bytes: int | None, now: float) -> list[Action]:
        """Attribute the working set ``used_bytes`` (exact) and settle what it shows."""
        floor, records = self._queue.load()
        queued = bool(records)
        actions: list[Action] = []
        if used_bytes is not None:
            credit = self._freed.step(used_bytes, now)
            if credit is not None:
                floor = credited(floor, records, credit)
            # Sessions built in their request, at the first reading after their response.
            fresh, self._fresh = self._fresh, set()
            floor, taken = shown_in_request(floor, records, self._pid, fresh, used_bytes)
            for record in taken:
                self._growth.explain(record.expected_bytes)
                if (entry := self._pending.get(record.seq)) is not None:
                    entry.visible = True
                    if entry.phase == "waiting":
                        actions += self._pending.settle(entry)
            young = young_bytes_per_s(self._pending, self._ramp_s, now)
            self._growth.note(used_bytes, now, young)
        if self._routes:
            # Queued sessions expect no more than their route is now learned to add.
            self._routes, lowered = expect_learned(
                records, self._pid, self._routes, self._footprint_bytes
            )
            for seq, footprint in lowered.items():
                if (entry := self._pending.get(seq)) is not None:
                    entry.remaining = min(entry.remaining, footprint)
        if queued and self._growth.quiet(now):
            records = drop_lapsed(records, self._pid, now, self._routes, self._seen, self._ramp_s)
        if queued:
            floor, records = self._attribute(floor, records, used_bytes, now, actions)
            self._queue.store(floor, records)
        if used_bytes is not None:
            self._mark = Mark(used_bytes, now, floor if records else None)
            self._freed.moved(self._mark)
        if self._pending:
            if not records or not records[0].placeholder:
                # Growth has paid for every placeholder: the started sessions kept
                # pending cover no one any longer (see the module notes).
                actions += self._pending.activate_started()
            if self._queue.shared:
                actions += self._taken_by_others()
            for entry in due(
                self._pending,
                now,
                shortest_s=min(self.timeout_s, self._min_ramp_s()),
                timeout_s=self.timeout_s,
                request_timeout_s=self.request_timeout_s,
            ):
                actions += self._time_out(entry, now)
        return actions

    def _taken_by_others(self) -> list[Action]:
        """Own entries another worker's pass found visible and took off the shared queue."""
        known = {r.seq for r in self._queue.load()[1] if r.pid == self._pid}
        actions: list[Action] = []
        for entry in list(self._pending):
            if entry.queued and not entry.visible and entry.seq not in known:
                if entry.phase == "started":
                    continue  # its placeholder's leaving alone frees it of nothing
                entry.visible = True
                if entry.phase == "waiting":
                    actions += self._pending.settle(entry)
        return actions

    # -- internals ---------------------------------------------------------------------

    def _min_ramp_s(self) -> float:
        shortest = self._shortest_ramp_s()
        return self.timeout_s if shortest is None else shortest

    def _attribute(
        self,
        floor: int | None,
        records: list[QueueRecord],
        used: int | None,
        now: float,
        actions: list[Action],
    ) -> tuple[int | None, list[QueueRecord]]:
        floor, kept, shown, head = attribute(
            floor,
            records,
            used,
            now,
            timeout_s=self.timeout_s,
            alive=self._queue.owner_alive,
            shared=self._queue.shared,
            pid=self._pid,
        )
        for seq in shown:
            entry = self._pending.get(seq)
            if entry is not None:
                entry.visible = True
                if entry.phase == "waiting":
                    actions += self._pending.settle(entry)
        if head is not None and (own := self._pending.get(head[0])) is not None:
            left = own.measured_left
            own.remaining = head[1] if left is None else min(head[1], left)
        return floor, kept

    def _time_out(self, entry: Settlement, now: float) -> list[Action]:
        age = now - entry.admitted_at
        if entry.phase == "started":
            # Called past the timeout only: a placeholder behind others may not
            # have reached the head by then.
            return self._pending.activate(entry)
        if entry.phase == "request":
            # A request still in progress past the timeout (a response the client
            # does not read, an app that never answers) holds nothing any longer:
            # whatever memory it built is expected of it as a placeholder.
            return self._pending.give_back(entry)
        if entry.phase == "held":
            if age < self.timeout_s:
                return []
            entry.expired = True
            logger.warning(
                "asgi-admission: a session ticket (%s) was held for %.0f s and never "
                "started; releasing its reservation (ADMISSION_PENDING_TIMEOUT_SECONDS=%g).",
                entry.route,
                age,
                self.timeout_s,
            )
            self._on_expired()
            return self._pending.give_back(entry)
        if age >= self.timeout_s:
            self._pending.mark_placeholder(entry)
            return self._pending.settle(entry)
        ramp = self._ramp_s(entry.route)
        if ramp is not None and age >= ramp and self._growth.quiet(now):
            self._pending.mark_placeholder(entry)
            return self._pending.settle(entry)
        return []
