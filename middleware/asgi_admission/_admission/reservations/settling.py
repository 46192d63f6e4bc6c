"""Settling: a pending reservation lasts until its session's memory shows, then it is settled.

One reservation's life (admitted, pending, then settled or released) and the ways a pending one
ends: its session's measured memory, its ticket, the working set's growth, its learned ramp,
its timeout. (docs/reservations.md)
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.ledger.ledger import CountedSession

# --------------------------------------------------------------------------------------
# A reservation: one admitted session's record (its count in the ledger and the memory
# held back for it) until it settles. The settler makes one at admission and moves it
# through its phases (docs/design.md, "A reservation's life"); the reservations and the
# session requests hold on to it to report the session's events.

#: Every reservation's number, for the whole process: two guards of one process that
#: share a settling queue (the default place is per memory group, not per guard) key
#: their rows by (pid, number) and must never take each other's. It starts at random so
#: that a worker reusing a dead worker's pid never takes the rows that one left behind.
NUMBERS: Final = itertools.count(secrets.randbits(40) + 1)

#: Where a pending session stands: its request in progress; past its response (or its
#: WebSocket's accept); past it with its ticket held; its ticket started; settled or
#: released.
Phase = Literal["request", "responded", "held", "started", "done"]
#: What settling does to a reservation: gives it back, or makes it an active session.
SettleOutcome = Literal["release", "activate"]
Action = tuple[CountedSession, SettleOutcome]
#: The phases past the response, not yet settled.
PAST_RESPONSE: Final = ("responded", "held")


@dataclass(frozen=True, slots=True)
class Learned:
    """What was learned of the routes, handed to each call of the settler that needs it:
    a route's footprint (a probe's provisional one until the learner has one) and its
    ramp (of a concluded estimate only: an open probe's is still growing)."""

    footprint_bytes: Mapping[str, int] = field(default_factory=dict)
    ramp_s: Mapping[str, float] = field(default_factory=dict)

    def settle_after_s(self, route: str) -> float | None:
        """How long after its admission a session of ``route`` settles by time: its
        learned ramp, stretched by ``RAMP_MARGIN``; ``None`` unknown."""
        ramp = self.ramp_s.get(route)
        return None if ramp is None else ramp * RAMP_MARGIN


@dataclass(slots=True, eq=False)
class Reservation:
    """One admitted session's reservation, from its admission until it settles or is
    released: its count in the ledger (``counted``) and what it still holds back.

    Owned by the ``Settler`` that made it and changed only under the ledger's lock.
    """

    seq: int
    counted: CountedSession
    kind: Kind
    route: str
    admitted_at: float
    phase: Phase = "request"
    #: Its memory showed (it left the queue's head that way).
    visible: bool = False
    #: An app's ticket holds it until ``started()`` or ``release()``.
    held: bool = False
    expired: bool = False
    #: In the settling queue (not when admitted with no reading to start from).
    queued: bool = False
    #: Its reservation was given back (settled over HTTP, expired, released).
    released: bool = False
    #: What its memory is still expected to add (its reserve, less what showed).
    remaining: int = 0
    #: What its own memory, measured (``Settler.measured``), still has to add.
    measured_left: int | None = None
    #: Its end was told to settling and learning (``Reservations``): once only.
    end_told: bool = False

    @property
    def awaiting_memory(self) -> bool:
        """Whether it still waits for its memory to show in the queue: queued, not yet
        shown, and not settled, started or released."""
        return self.queued and not self.visible and self.phase in ("request", *PAST_RESPONSE)

    @property
    def settle_outcome(self) -> SettleOutcome:
        # A WebSocket counts as active once settled, until it closes; an HTTP
        # session's count is given back (the app's count takes over; a ticket's
        # session becomes active only by ``started()``).
        return "activate" if self.kind == "websocket" else "release"


def due(
    entries: Iterable[Reservation],
    now: float,
    *,
    shortest_s: float,
    timeout_s: float,
    request_timeout_s: float,
) -> list[Reservation]:
    """Of ``entries`` (in admission order), those whose time may be up: past their
    response or held, a request past ``request_timeout_s``, a started one past
    ``timeout_s`` (``shortest_s``: the shortest of every limit, a ramp time included)."""
    # Every time limit counts from admission: past the first entry too young for the
    # shortest limit, none is due.
    horizon = now - shortest_s
    found: list[Reservation] = []
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


# --------------------------------------------------------------------------------------
# The settling queue: in one process, or shared by the workers in
# a file (``shared_files.SharedSettleQueue``), and the changes a settler makes to one
# record (docs/reservations.md, "Attribution across concurrent sessions", says why).

#: The share of its expected bytes a session's growth must show to settle.
VISIBLE_FRACTION: Final = 0.9


@dataclass(slots=True)
class QueueRecord:
    """One unsettled session in the settling queue (the file's row when shared)."""

    pid: int
    seq: int
    admitted_at: float
    base_bytes: int
    expected_bytes: int
    #: Left without showing its memory; still counts its expected bytes.
    left_early: bool = False


class SettleQueue(Protocol):
    """The settling queue: in this process, or shared by the workers in a file.

    Called only inside the ledger's critical section.
    """

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        """The working set already accounted for (``None`` while empty) and the records in
        admission order."""
        ...

    def store(self, accounted: int | None, records: list[QueueRecord]) -> None: ...

    def owner_alive(self, pid: int) -> bool:
        """Whether the worker that queued a record still runs."""
        ...

    @property
    def shared(self) -> bool:
        """Whether other workers' passes may take this worker's records off the queue."""
        ...

    @property
    def others(self) -> tuple[float, ...]:
        """When the other workers' sessions on the queue at the last load were admitted
        (``time.monotonic()``, one clock for every process of the machine)."""
        ...


class LocalSettleQueue:
    """The queue of one process."""

    __slots__ = ("_accounted", "_records")

    def __init__(self) -> None:
        self._accounted: int | None = None
        self._records: list[QueueRecord] = []

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        return self._accounted, self._records

    def store(self, accounted: int | None, records: list[QueueRecord]) -> None:
        self._accounted, self._records = accounted, records

    def owner_alive(self, pid: int) -> bool:
        return True

    shared: Final = False

    @property
    def others(self) -> tuple[float, ...]:
        return ()


def own_record(records: list[QueueRecord], pid: int, seq: int) -> QueueRecord | None:
    """The record of session ``seq`` of worker ``pid``, if it is queued."""
    # Most changes concern recent sessions: search from the newest.
    for record in reversed(records):
        if record.pid == pid and record.seq == seq:
            return record
    return None


def move_to_front(queue: SettleQueue, pid: int, seq: int, footprint: int | None) -> bool:
    """Its session left early: move the record of session ``seq`` of worker ``pid`` to
    the front of the queue (behind the others that left early), claiming the
    ``footprint`` learned of its route if less than its reserve; a claim of nothing
    leaves the queue at once. Whether it stays."""
    accounted, records = queue.load()
    record = own_record(records, pid, seq)
    if record is None:
        return False
    records.remove(record)
    if footprint is not None:
        record.expected_bytes = min(record.expected_bytes, footprint)
    if record.expected_bytes > 0:
        record.left_early = True
        # The records left early are a prefix of the queue.
        records.insert(bisect.bisect_left(records, True, key=_not_left_early), record)
    queue.store(accounted if records else None, records)
    return record.left_early


def shown_in_request(
    accounted: int | None,
    records: list[QueueRecord],
    pid: int,
    seqs: set[int],
    used_bytes: int,
) -> tuple[int | None, list[QueueRecord]]:
    """Of worker ``pid``'s sessions ``seqs``, of routes that build their memory inside the
    request, at the first reading after their response: those the working set has grown
    by ``VISIBLE_FRACTION`` of what they are expected to add since their admission have
    their memory there, and leave the queue wherever they stand (``take_shown``). What is
    accounted for, and the records taken off (``records`` is changed)."""
    taken: list[QueueRecord] = []
    if not seqs:
        return accounted, taken
    for record in list(records):
        if record.pid != pid or record.seq not in seqs:
            continue
        if used_bytes - record.base_bytes < VISIBLE_FRACTION * record.expected_bytes:
            continue
        accounted = take_shown(accounted, records, record)
        taken.append(record)
    return (accounted if records else None), taken


def take_shown(
    accounted: int | None, records: list[QueueRecord], record: QueueRecord
) -> int | None:
    """Take ``record``, whose memory showed, off the queue wherever it stands: what is
    accounted for rises by what it was expected to add (above the head's starting point),
    so that none of it counts as an older session's growth. What is accounted for now
    (``records`` is changed)."""
    records.remove(record)
    if not records:
        return None
    head = records[0].base_bytes
    return (head if accounted is None else max(accounted, head)) + record.expected_bytes


def drop_lapsed(
    records: list[QueueRecord],
    pid: int,
    now: float,
    routes: Mapping[int, str],
    seen: Iterable[str],
    learned: Learned,
) -> list[QueueRecord]:
    """``records`` less worker ``pid``'s records left early (their ``routes`` by number) whose
    claim protects no one any longer: the longest ramp (``learned``) of the routes ``seen``
    (all of them known) has passed since its admission, so every older session's memory
    has come, and the sessions still queued were admitted after its own ramp, so theirs
    is counted from a working set that held its memory. Each leaves without raising what
    is accounted for: what it claimed is in their starting points."""
    if not records or not records[0].left_early:
        return records
    ramps = [learned.settle_after_s(route) for route in seen]
    if not ramps or None in ramps:
        return records
    longest = max(r for r in ramps if r is not None)
    first = next((r.admitted_at for r in records if not r.left_early), math.inf)
    kept = []
    for record in records:
        route = routes.get(record.seq) if record.pid == pid and record.left_early else None
        ramp = None if route is None else learned.settle_after_s(route)
        lapsed = ramp is not None and first >= record.admitted_at + ramp
        if not (lapsed and now - record.admitted_at >= longest):
            kept.append(record)
    return kept


def attribute(
    accounted: int | None,
    records: list[QueueRecord],
    used: int | None,
    now: float,
    *,
    timeout_s: float,
    alive: Callable[[int], bool],
    shared: bool,
    pid: int,
) -> tuple[int | None, list[QueueRecord], list[int], tuple[int, int] | None]:
    """One pass of first-in, first-out attribution at the exact working set ``used``
    (``None``: none, only records left early past ``timeout_s`` leave): what is now
    accounted for, the records kept, the sequence numbers of worker ``pid``'s sessions
    whose memory showed (in queue order), and, where the head that stopped the pass is
    ``pid``'s, its sequence number and what it still has to add. Records of workers not
    ``alive`` are skipped at the head, and (``shared``) dropped further back too."""
    start = 0
    count = len(records)
    shown_own: list[int] = []
    head_left: tuple[int, int] | None = None
    while start < count:
        head = records[start]
        if head.pid != pid and not alive(head.pid):  # this worker runs: no need to ask
            start += 1
            continue
        base = head.base_bytes if accounted is None else max(accounted, head.base_bytes)
        shown = used is not None and used - base >= VISIBLE_FRACTION * head.expected_bytes
        if not shown and not (head.left_early and now - head.admitted_at >= timeout_s):
            accounted = base
            if head.pid == pid and used is not None:
                head_left = (head.seq, max(0, head.expected_bytes - max(0, used - base)))
            break
        accounted = base + head.expected_bytes
        start += 1
        if head.pid == pid and not head.left_early:
            shown_own.append(head.seq)
    kept = records[start:] if start else records
    if not kept:
        accounted = None
    # Dead workers' records further back are dropped too: their sessions are gone.
    if shared and any(not alive(r.pid) for r in kept if r.pid != pid):
        kept = [r for r in kept if r.pid == pid or alive(r.pid)]
    return accounted, kept, shown_own, head_left


def drop_record(queue: SettleQueue, pid: int, seq: int) -> None:
    """Take the record of session ``seq`` of worker ``pid`` off the queue, if it is there."""
    accounted, records = queue.load()
    kept = [r for r in records if not (r.pid == pid and r.seq == seq)]
    if len(kept) != len(records):
        queue.store(accounted if kept else None, kept)


def _not_left_early(record: QueueRecord) -> bool:
    return not record.left_early


# --------------------------------------------------------------------------------------
# Whether memory is still arriving: a working set growing fast holds settling by time.
#
# No session settles by its ramp time while the working set grows at least
# ``GROWING_BYTES_PER_S`` faster than what can be explained (over readings at least
# ``GROWTH_SPAN_S`` apart), nor until it has been quiet for ``GROWTH_QUIET_S``: a burst
# ramps slower than the sessions its ramp was learned from. What can be explained, and
# why churn needs it: docs/reservations.md, "Settling: with no help from the app", 2.

GROWING_BYTES_PER_S: Final = 16 * 1024 * 1024
GROWTH_SPAN_S: Final = 0.25
GROWTH_QUIET_S: Final = 1.0
#: A learned ramp time is stretched this much before it settles a reservation: under
#: CPU contention a burst ramps slower than the sessions it was learned from, and a
#: reservation held a little long costs less than one released before its memory.
#: Within the stretched ramp, a session's memory arrives at the pace of the one learned.
RAMP_MARGIN: Final = 2.0
#: A route whose learned ramp is at most this builds its sessions inside the request:
#: their memory is there at the response, which settles them (``builds_in_request``).
IN_REQUEST_RAMP_S: Final = 0.2


def builds_in_request(ramp_s: float | None) -> bool:
    """Whether a route with learned ramp ``ramp_s`` builds its sessions inside the request."""
    return ramp_s is not None and ramp_s <= IN_REQUEST_RAMP_S


def young_bytes_per_s(entries: Iterable[Reservation], learned: Learned, now: float) -> float:
    """How fast the unsettled ``entries`` still within their route's learned ramp may add
    memory: what each still adds, over that ramp. One past it has nothing left to
    explain: its memory is as late as that of the sessions waiting for their ramp time."""
    total = 0.0
    for entry in entries:
        ramp = learned.ramp_s.get(entry.route)
        if ramp is not None and not builds_in_request(ramp) and now - entry.admitted_at < ramp:
            total += entry.remaining / ramp
    return total


class Growth:
    """The working set's growth, as the exact readings settling sees show it."""

    __slots__ = ("_explained", "_growing_until", "_ref")

    def __init__(self) -> None:
        self._ref: tuple[int, float] | None = None
        self._growing_until = 0.0
        #: Growth since the reference reading that sessions built in their request made.
        self._explained = 0

    def explain(self, grown_bytes: int) -> None:
        """A session built inside its request showed ``grown_bytes`` at its response."""
        self._explained += grown_bytes

    def note(self, used_bytes: int, now: float, young_bytes_per_s: float = 0.0) -> None:
        """An exact reading of the working set, while the sessions within their ramp may
        add ``young_bytes_per_s``."""
        ref = self._ref
        if ref is not None and now - ref[1] < GROWTH_SPAN_S:
            return
        if ref is not None:
            rate = (used_bytes - ref[0] - self._explained) / (now - ref[1])
            if rate >= GROWING_BYTES_PER_S + young_bytes_per_s:
                self._growing_until = now + GROWTH_QUIET_S
        self._ref = (used_bytes, now)
        self._explained = 0

    def quiet(self, now: float) -> bool:
        """Whether no memory has been seen arriving for ``GROWTH_QUIET_S``."""
        return now >= self._growing_until


# --------------------------------------------------------------------------------------
# Memory freed by sessions that end, so that it does not hide the growth of others
# (docs/reservations.md, "Settling under churn", says what counts as freed, and why).
#
# Each end the settler is told of owes freed memory, looked for since an exact reading
# before which it cannot have ended: the last one for an end told as it happens, the
# previous sample's for one found by the app's count falling at a sample.

#: How long after its end a session's freed memory is looked for.
FREED_WITHIN_S: Final = 3.0
#: Rates of growth are taken over steps at least this long (decisions read more often).
RATE_STEP_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class ExactReading:
    """An exact reading, and what the queue accounted for once it was attributed."""

    used_bytes: int
    at: float
    accounted: int | None


@dataclass(frozen=True, slots=True)
class Freed:
    """Memory seen freed: ``bytes`` off the bases admitted by ``since.at``, and off what
    is accounted for if it is still ``since.accounted``."""

    bytes: int
    since: ExactReading


class FreedMemory:
    """What ended sessions may still free, matched against the readings' falls.

    One pool: ends told since different readings look from the oldest of them (a fall
    before an end is memory that left too, and is never counted twice)."""

    __slots__ = ("_bytes", "_last", "_rates", "_since", "_until")

    def __init__(self) -> None:
        self._bytes = 0
        self._since: ExactReading | None = None
        self._until = 0.0
        self._last: tuple[int, float] | None = None
        #: The working set's rate of change over the last two steps that fell nothing.
        self._rates = (0.0, 0.0)

    def ended(self, freed_bytes: int, since: ExactReading, now: float) -> None:
        """Sessions ended after the reading ``since``, freeing at most ``freed_bytes``."""
        if freed_bytes <= 0:
            return
        if self._bytes <= 0 or self._since is None or since.at < self._since.at:
            self._since = since
        self._bytes += freed_bytes
        self._until = now + FREED_WITHIN_S

    def step(self, used_bytes: int, now: float) -> Freed | None:
        """Each exact reading: what it shows freed since the reading looked from, if
        anything (that reading is moved on by :meth:`moved`)."""
        last = self._last
        freed = None
        since = self._since
        if self._bytes > 0 and since is not None:
            fell = since.used_bytes - used_bytes
            if fell > 0:
                # Sessions still ramping went on growing meanwhile, as slowly as in
                # either of the last steps before: that much of the fall is hidden. The
                # slower step counts less memory as freed, the safe side here (learning
                # carries the faster one on, its safe side: ``GrowthWindows.reading``).
                hidden = max(0.0, min(self._rates)) * max(0.0, now - since.at)
                taken = min(self._bytes, int(fell + hidden))
                self._bytes -= taken
                freed = Freed(taken, since)
            if now >= self._until:
                self._bytes = 0  # lapsed, after this last reading
        if last is None or now - last[1] >= RATE_STEP_S or freed is not None:
            self._last = (used_bytes, now)
            if freed is None and last is not None and used_bytes >= last[0]:
                self._rates = (self._rates[1], (used_bytes - last[0]) / (now - last[1]))
        return freed

    def moved(self, since: ExactReading) -> None:
        """What is still owed is looked for from ``since`` on."""
        if self._bytes > 0:
            self._since = since


def without_freed(
    accounted: int | None, records: Sequence[QueueRecord], freed: Freed
) -> int | None:
    """Memory freed since ``freed.since`` leaves the bases of the sessions admitted by
    then, and what is accounted for where it has not moved since; what is accounted for."""
    for record in records:
        if record.admitted_at <= freed.since.at:
            record.base_bytes = max(0, record.base_bytes - freed.bytes)
    if accounted is not None and accounted == freed.since.accounted:
        accounted = max(0, accounted - freed.bytes)
    return accounted


# --------------------------------------------------------------------------------------
# This process's unsettled sessions, their phases counted, and each way one leaves.
#
# The settler decides when a session leaves; this says what its leaving does: settled
# (released or made active by its kind), given back (released, its record left early),
# activated (a started session) or dropped (it failed or ended: its record taken off).
# Each returns the reservation changes to make once the ledger's critical section is
# left. The phase counts follow every change of phase, so reading them costs no pass
# over the entries, which are kept in admission order, the order ``due`` reads them in.


class PendingSessions:
    """The reservations of one process not yet settled, by number in admission order.

    ``queue`` is the settling queue their records are in, ``pid`` the process's.
    Changed only inside the ledger's critical section."""

    __slots__ = ("_entries", "_pid", "_queue", "past_response", "remaining", "responded")

    def __init__(self, queue: SettleQueue, pid: int) -> None:
        self._queue = queue
        self._pid = pid
        self._entries: dict[int, Reservation] = {}
        #: Sessions past their response, not held, not yet settled.
        self.responded = 0
        #: Those and the held tickets past their response, not yet started.
        self.past_response = 0
        #: What the sessions are still expected to add, together (``held``).
        self.remaining = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Reservation]:
        return iter(self._entries.values())

    def add(self, entry: Reservation, remaining: int) -> None:
        """A new session, still expected to add ``remaining``."""
        self._entries[entry.seq] = entry
        entry.remaining = remaining
        self.remaining += remaining

    def get(self, seq: int) -> Reservation | None:
        return self._entries.get(seq)

    def expect(self, entry: Reservation, remaining: int) -> None:
        """``entry`` is still expected to add ``remaining``."""
        if self._entries.get(entry.seq) is entry:
            self.remaining += remaining - entry.remaining
        entry.remaining = remaining

    def still_to_add(self) -> tuple[int, int]:
        """What the sessions are still expected to add, and how many there are; kept as
        they change, not summed at each decision."""
        return self.remaining, len(self._entries)

    def _remove(self, entry: Reservation) -> None:
        if self._entries.pop(entry.seq, None) is not None:
            self.remaining -= entry.remaining

    def oldest_responded(self, count: int) -> list[Reservation]:
        """The oldest ``count`` sessions past their response, not held (fewer if fewer are)."""
        oldest: list[Reservation] = []
        for entry in self._entries.values():
            if len(oldest) >= count:
                break
            if entry.phase == "responded":
                oldest.append(entry)
        return oldest

    def phase(self, entry: Reservation, phase: Phase) -> None:
        self.responded += (phase == "responded") - (entry.phase == "responded")
        self.past_response += (phase in PAST_RESPONSE) - (entry.phase in PAST_RESPONSE)
        entry.phase = phase

    def settle(self, entry: Reservation) -> list[Action]:
        self.phase(entry, "done")
        self._remove(entry)
        outcome = entry.settle_outcome
        entry.released = outcome == "release"
        return [(entry.counted, outcome)]

    def give_back(self, entry: Reservation, learned: Learned) -> list[Action]:
        self.leave_early(entry, learned)
        self.phase(entry, "done")
        entry.released = True
        self._remove(entry)
        return [(entry.counted, "release")]

    def activate(self, entry: Reservation) -> list[Action]:
        # A started session: active from now on, until its app releases it.
        self._remove(entry)
        return [(entry.counted, "activate")]

    def activate_started(self) -> list[Action]:
        """Every started session kept pending becomes active."""
        covering = [entry for entry in self._entries.values() if entry.phase == "started"]
        return [action for entry in covering for action in self.activate(entry)]

    def drop(self, entry: Reservation) -> list[Action]:
        # Releasing is idempotent: a settled session (an active WebSocket, a started
        # ticket) is released here too when it ends.
        entry.released = True
        if entry.phase != "done":
            self.phase(entry, "done")
            self._remove(entry)
            if entry.queued:
                drop_record(self._queue, self._pid, entry.seq)
        return [(entry.counted, "release")]

    def leave_early(self, entry: Reservation, learned: Learned) -> bool:
        """The session leaves early: its record moves to the front of the queue, claiming
        its route's ``learned`` footprint; whether it stays there (``move_to_front``)."""
        # It may have all its memory by now, ahead of older sessions still ramping: at
        # the front, growth pays for it before counting as anyone else's.
        if not entry.queued:
            return False
        footprint = learned.footprint_bytes.get(entry.route)
        return move_to_front(self._queue, self._pid, entry.seq, footprint)


# --------------------------------------------------------------------------------------
# Settling: a session's reservation lasts until its memory shows in the working set.
#
# When a session settles and how attribution works across concurrent sessions, first in,
# first out, erring on the side of holding: docs/reservations.md, "Settling: with no help
# from the app". Here:
#
# - Readings used here are exact working sets (never the fast path's usage bound,
# which includes cache). Admission records the working set it decided with, or the
# bound where that was all it read: a higher start only holds the reservation longer.
# - A started session may be what older sessions were counted as growing (its memory
# is up, theirs perhaps not yet), and its reserve all that still covers theirs: it
# stays pending until growth has paid for every record left early (a later one's
# memory may be what paid for its own) or its timeout has passed.
# - Everything here runs inside the ledger's critical section, which also guards the
# queue when it is shared by the workers (``SharedSettleQueue``); what to do with the
# reservations (release, activate) is returned, to be done after the lock is left,
# because the reservations take the same lock. What was learned of the routes is
# handed in (``Learned``) by the calls that may settle by time: settling asks nothing
# of the reservations or of learning.

logger = logging.getLogger("asgi_admission")

DEFAULT_PENDING_TIMEOUT_S: Final = 120.0
#: A session expected to add less than this settles as one expecting nothing: memory
#: moves by more than this between readings for reasons of its own.
NOISE_BYTES: Final = 1024 * 1024


class Settler:
    """Keeps reservations pending until each session's memory shows.

    ``timeout_s`` bounds a reservation past its response and a held ticket;
    ``request_timeout_s`` (default the same) one whose request is still in progress.
    The methods that may settle by time are handed what was ``learned`` of the routes.
    Every method runs inside the ledger's critical section and returns the reservation
    changes to make once it is left."""

    __slots__ = (
        "_freed",
        "_fresh",
        "_growth",
        "_last_reading",
        "_pending",
        "_pid",
        "_queue",
        "_routes",
        "_seen",
        "expired",
        "request_timeout_s",
        "timeout_s",
    )

    def __init__(
        self,
        *,
        queue: SettleQueue | None = None,
        timeout_s: float = DEFAULT_PENDING_TIMEOUT_S,
        request_timeout_s: float | None = None,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(
                f"ADMISSION_PENDING_TIMEOUT_SECONDS must be greater than 0; got {timeout_s!r}."
            )
        self.timeout_s = float(timeout_s)
        #: The longest a request still in progress holds its reservation (from admission).
        self.request_timeout_s = self.timeout_s if request_timeout_s is None else request_timeout_s
        self._queue = queue if queue is not None else LocalSettleQueue()
        #: Held tickets never started that the timeout released, in this process.
        self.expired = 0
        #: The route of each of this process's sessions in the queue, left early too.
        self._routes: dict[int, str] = {}
        #: Every route this process admitted a session of.
        self._seen: set[str] = set()
        self._pid = os.getpid()
        self._pending = PendingSessions(self._queue, self._pid)
        self._growth = Growth()
        #: The last exact reading, and memory ended sessions may free.
        self._last_reading: ExactReading | None = None
        self._freed = FreedMemory()
        #: Sessions of routes built inside the request that responded since the last reading.
        self._fresh: set[int] = set()

    @property
    def unsettled(self) -> int:
        """This process's sessions whose reservation has not settled yet."""
        return len(self._pending)

    @property
    def responded(self) -> int:
        """This process's sessions past their response, not held, not yet settled."""
        return self._pending.responded

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
        self._pending = PendingSessions(self._queue, self._pid)

    # -- the session's events ------------------------------------------------------

    def admit(
        self,
        reservation: CountedSession,
        kind: Kind,
        route: str,
        used_bytes: int | None,
        now: float,
        expected_bytes: int,
    ) -> Reservation:
        """Queue a session just admitted, with the working set it was admitted at and
        what it is expected to add (its reserve, 0 or more)."""
        seq = next(NUMBERS)
        self._seen.add(route)
        entry = Reservation(seq, reservation, kind, route, now)
        # Less than the working set's own noise can never be told apart from it: waiting
        # for it would keep the session pending until its ramp or timeout, and a pile of
        # such sessions would cost every decision a pass over the settling queue.
        expected = expected_bytes if expected_bytes >= NOISE_BYTES else 0
        self._pending.add(entry, expected)
        if not expected:
            # Nothing to wait for (no reserve, or sessions of this route add nothing).
            entry.visible = True
            return entry
        base = used_bytes
        if base is None and self._last_reading is not None:
            base = self._last_reading.used_bytes  # the last exact reading
        if base is not None:
            accounted, records = self._queue.load()
            records.append(QueueRecord(self._pid, seq, now, base, expected))
            self._queue.store(accounted, records)
            entry.queued = True
            self._routes[seq] = route
        return entry

    def respond(self, entry: Reservation, now: float, learned: Learned) -> list[Action]:
        """The response ended (HTTP) or the app accepted (WebSocket)."""
        if entry.phase != "request":
            return []
        if entry.visible and not entry.held:
            # Its memory showed already, or none was expected: from the request
            # straight to settled (as through "responded", whose counts it would leave
            # as they were).
            return self._pending.settle(entry)
        if entry.held:
            self._pending.phase(entry, "held")
            return self._time_out(entry, now, learned)
        self._pending.phase(entry, "responded")
        if entry.visible:
            return self._pending.settle(entry)
        if entry.queued and builds_in_request(learned.ramp_s.get(entry.route)):
            # Its memory is there now: the reading taken at its response shows it.
            self._fresh.add(entry.seq)
            return []
        # Not queued (no reading to start from): it settles by time alone.
        return self._time_out(entry, now, learned)

    def abandon(self, entry: Reservation, *, session_over: bool = False) -> list[Action]:
        """The session failed before its response, or (``session_over``) it ended.

        A held ticket outlives a failed request (its app decides, or the timeout
        does), never the end of a WebSocket.
        """
        if not session_over and (entry.held or entry.phase == "started"):
            return []
        return self._pending.drop(entry)

    def hold(self, entry: Reservation) -> bool:
        """An app's ticket takes over; ``False`` once the session has settled."""
        if entry.phase in ("request", "responded"):
            entry.held = True
            if entry.phase == "responded":
                self._pending.phase(entry, "held")
            return True
        return entry.held and entry.phase != "done"

    def started(self, entry: Reservation, learned: Learned) -> list[Action]:
        """The app says the session's memory is up: pending becomes active (once it
        covers no older session's memory: see the settler's notes)."""
        if entry.phase in ("request", "responded", "held"):
            accounted, records = self._queue.load()
            own = own_record(records, self._pid, entry.seq) if entry.queued else None
            covers_older = own is not None and accounted is not None and accounted > own.base_bytes
            self._pending.phase(entry, "started")
            if self._pending.leave_early(entry, learned) and covers_older:
                # It stays among the entries, its reserve held, until growth has paid
                # for every record left early (see the settler's notes).
                return []
            return self._pending.activate(entry)
        return []

    def measured(self, entry: Reservation, own_bytes: int) -> list[Action]:
        """The session's own memory was measured at ``own_bytes`` (its process, by the
        watchdog): it settles once that shows what it was expected to add, wherever it
        stands in the queue (``take_shown``); until then it counts only what
        its own memory still has to add. Exact evidence: ends elsewhere cannot hide it."""
        if not entry.awaiting_memory:
            return []
        accounted, records = self._queue.load()
        record = own_record(records, self._pid, entry.seq)
        if record is None or record.left_early:
            return []
        # The latest measurement alone (memory that went may come back); see _attribute.
        entry.measured_left = max(0, record.expected_bytes - own_bytes)
        self._pending.expect(entry, entry.measured_left)
        if own_bytes < VISIBLE_FRACTION * record.expected_bytes:
            return []
        self._queue.store(take_shown(accounted, records, record), records)
        self._routes.pop(entry.seq, None)
        return self._shown(entry)

    def release(self, entry: Reservation) -> list[Action]:
        """The app ended or gave up the session."""
        return self._pending.drop(entry)

    def still_to_add(self) -> tuple[int, int]:
        """What this process's pending sessions are still expected to add, and how many."""
        return self._pending.still_to_add()

    @property
    def last_reading(self) -> ExactReading | None:
        """The last exact reading settled with (``None`` before the first)."""
        return self._last_reading

    def ended(self, freed_bytes: int, now: float, *, since: ExactReading | None = None) -> None:
        """Sessions ended after the reading ``since`` (default: the last), freeing at
        most ``freed_bytes``: the falls seen next count as freed."""
        since = self._last_reading if since is None else since
        if since is not None:
            self._freed.ended(freed_bytes, since, now)

    def counted(self, app_count: int, learned: Learned) -> list[Action]:
        """The app counts ``app_count`` sessions, fewer than are past their response:
        the oldest responded ones ended before their memory showed, and settle now (left
        early: their memory is still expected, in case it comes after all)."""
        actions: list[Action] = []
        for entry in self._pending.oldest_responded(self.past_response - max(0, app_count)):
            self._pending.leave_early(entry, learned)
            actions += self._pending.settle(entry)
        return actions

    # -- the readings ----------------------------------------------------------------

    def settle(self, used_bytes: int | None, now: float, learned: Learned) -> list[Action]:
        """Attribute the working set ``used_bytes`` (exact) and settle what it shows."""
        accounted, records = self._queue.load()
        queued = bool(records)
        actions: list[Action] = []
        if used_bytes is not None:
            freed = self._freed.step(used_bytes, now)
            if freed is not None:
                accounted = without_freed(accounted, records, freed)
            # Sessions built in their request, at the first reading after their response.
            fresh, self._fresh = self._fresh, set()
            accounted, taken = shown_in_request(accounted, records, self._pid, fresh, used_bytes)
            for record in taken:
                self._growth.explain(record.expected_bytes)
                if (entry := self._pending.get(record.seq)) is not None:
                    actions += self._shown(entry)
            young = young_bytes_per_s(self._pending, learned, now)
            self._growth.note(used_bytes, now, young)
        if self._routes:
            # The routes of this worker's sessions still queued, for ``drop_lapsed``.
            own = {record.seq for record in records if record.pid == self._pid}
            self._routes = {seq: route for seq, route in self._routes.items() if seq in own}
        if queued and self._growth.quiet(now):
            records = drop_lapsed(records, self._pid, now, self._routes, self._seen, learned)
        if queued:
            accounted, records = self._attribute(accounted, records, used_bytes, now, actions)
            self._queue.store(accounted, records)
        if used_bytes is not None:
            self._last_reading = ExactReading(used_bytes, now, accounted if records else None)
            self._freed.moved(self._last_reading)
        if self._pending:
            if not records or not records[0].left_early:
                # Growth has paid for every record left early: the started sessions kept
                # pending cover no one any longer (see the settler's notes).
                actions += self._pending.activate_started()
            if self._queue.shared:
                actions += self._taken_by_others()
            ramps = (ramp * RAMP_MARGIN for ramp in learned.ramp_s.values())
            for entry in due(
                self._pending,
                now,
                shortest_s=min([self.timeout_s, *ramps]),
                timeout_s=self.timeout_s,
                request_timeout_s=self.request_timeout_s,
            ):
                actions += self._time_out(entry, now, learned)
        return actions

    def _taken_by_others(self) -> list[Action]:
        """Own entries another worker's pass found visible and took off the shared queue."""
        known = {r.seq for r in self._queue.load()[1] if r.pid == self._pid}
        actions: list[Action] = []
        for entry in list(self._pending):
            if entry.queued and not entry.visible and entry.seq not in known:
                if entry.phase == "started":
                    continue  # its record left early leaving alone frees it of nothing
                actions += self._shown(entry)
        return actions

    # -- internals ---------------------------------------------------------------------

    def _shown(self, entry: Reservation) -> list[Action]:
        # Its memory showed: it settles now if it waits past its response; in its request,
        # at its response; held or started, by its ticket.
        entry.visible = True
        return self._pending.settle(entry) if entry.phase == "responded" else []

    def _attribute(
        self,
        accounted: int | None,
        records: list[QueueRecord],
        used: int | None,
        now: float,
        actions: list[Action],
    ) -> tuple[int | None, list[QueueRecord]]:
        accounted, kept, shown, head = attribute(
            accounted,
            records,
            used,
            now,
            timeout_s=self.timeout_s,
            alive=self._queue.owner_alive,
            shared=self._queue.shared,
            pid=self._pid,
        )
        for seq in shown:
            if (entry := self._pending.get(seq)) is not None:
                actions += self._shown(entry)
        if head is not None and (own := self._pending.get(head[0])) is not None:
            left = own.measured_left
            self._pending.expect(own, head[1] if left is None else min(head[1], left))
        return accounted, kept

    def _time_out(self, entry: Reservation, now: float, learned: Learned) -> list[Action]:
        age = now - entry.admitted_at
        if entry.phase == "started":
            # Called past the timeout only: a record left early behind others may not
            # have reached the head by then.
            return self._pending.activate(entry)
        if entry.phase == "request":
            # A request still in progress past the timeout (a response the client
            # does not read, an app that never answers) holds nothing any longer:
            # whatever memory it built is still expected of its record, left early.
            return self._pending.give_back(entry, learned)
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
            self.expired += 1
            return self._pending.give_back(entry, learned)
        if age >= self.timeout_s:
            self._pending.leave_early(entry, learned)
            return self._pending.settle(entry)
        ramp = learned.settle_after_s(entry.route)
        if ramp is not None and age >= ramp and self._growth.quiet(now):
            self._pending.leave_early(entry, learned)
            return self._pending.settle(entry)
        return []
