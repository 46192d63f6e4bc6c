"""The pending reservations of one guard: what the service, a session's events and the
periodic sample of memory ask of them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import operator
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractContextManager
from dataclasses import InitVar, dataclass, field
from typing import Any, Final, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    derived_reserve_bytes,
)
from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.ledger.ledger import CountedSession, LedgerBusy
from asgi_admission._admission.reservations.learning import (
    KEPT,
    RouteEstimate,
    SessionLearner,
    effective_reserve,
)
from asgi_admission._admission.reservations.probing import (
    ProbeAnswer,
    Probes,
    ProbeStatus,
    ProbeStore,
    ProbeWaiters,
)
from asgi_admission._admission.reservations.settling import (
    Action,
    ExactReading,
    Learned,
    LocalSettleQueue,
    Reservation,
    SettleQueue,
    Settler,
    apply,
)
from asgi_admission._admission.reservations.shared_files import (
    LearnedStore,
    SharedProbeStore,
    SharedSettleQueue,
)
from asgi_admission._config import MIB, Learning
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._routes import RouteNames

logger = logging.getLogger("asgi_admission")

# --------------------------------------------------------------------------------------
# The app's own count of its sessions (``current_sessions``), which is the app's code.


class AppCount:
    """``current_sessions()``, or ``None`` (the ledger's own count) when it fails.

    A broken counter must not turn every session request into a 500: the memory
    latch still guards, and the count falls back to the sessions the guard
    admitted itself until the app's counter answers again (logged once each way).
    """

    __slots__ = ("_failed", "current_sessions")

    def __init__(self, current_sessions: Callable[[], int] | None) -> None:
        #: The app's own count of its sessions; ``None``: the guard counts them.
        self.current_sessions = current_sessions
        self._failed = False

    def __call__(self) -> int | None:
        current_sessions = self.current_sessions
        if current_sessions is None:
            return None
        try:
            count = operator.index(current_sessions())
        except Exception:
            if not self._failed:
                self._failed = True
                logger.exception(
                    "asgi-admission: current_sessions() failed or returned no whole number; "
                    "counting the sessions this middleware admitted until it answers again."
                )
            return None
        if self._failed:
            self._failed = False
            logger.info("asgi-admission: current_sessions() answers again.")
        return count


# --------------------------------------------------------------------------------------
# How often sessions end: the evidence for a ``Retry-After`` that means something
# (docs/reservations.md, "Retry-After from evidence").

#: Ends older than this are no evidence of the current rate.
RECENT_ENDS_S: Final = 600.0
#: At least this many recent ends before their rate is trusted.
MIN_ENDS: Final = 3
_KEEP: Final = 64


class SessionEnds:
    """Recent session ends, from successive active counts. Not thread-safe alone."""

    __slots__ = ("_ends", "_last_active", "_last_own")

    def __init__(self) -> None:
        self._ends: deque[float] = deque(maxlen=_KEEP)
        self._last_active: int | None = None
        self._last_own: int | None = None

    def own_share(self, anonymous: int, named: int, own: int | None) -> int:
        """Of ``anonymous`` ends found by a container-wide count (a shared ledger), how
        many were this worker's: as many as the app's own count ``own`` fell, less the
        ``named`` ends already told (none where the app gives no count). Called at
        every sample, with its own count."""
        last, self._last_own = self._last_own, own
        if own is None or last is None:
            return 0
        return max(0, min(anonymous, last - own - named))

    def on_active(self, active: int, now: float) -> int:
        """The active count now; each one fewer than last time is a session that ended.

        Returns how many ended.
        """
        last = self._last_active
        self._last_active = active
        if last is None or active >= last:
            return 0
        self._ends.extend([now] * min(_KEEP, last - active))
        return last - active

    def expected_wait_s(self, now: float) -> float | None:
        """Seconds until the next session end is expected; ``None`` without evidence."""
        ends = self._ends
        while ends and now - ends[0] > RECENT_ENDS_S:
            ends.popleft()
        if len(ends) < MIN_ENDS:
            return None
        # Never less than a second: clients coming back at once are only refused again.
        return max(1.0, (ends[-1] - ends[0]) / (len(ends) - 1))


# --------------------------------------------------------------------------------------
# Session events done at once or, while another worker holds the shared ledger, kept in
# order for the next sample: neither the event loop nor a response waits for another
# process, and nothing is lost (``docs/trust.md``).

#: One session event's bookkeeping, inside the critical section: what it decided.
Step = Callable[[], Sequence[Action]]


class KeptEvents(collections.deque[Step]):
    """The session events kept while another worker held the shared ledger, oldest
    first (a deque: whether any are kept is asked at every session event)."""

    __slots__ = ()

    def now_or_later(
        self,
        step: Step,
        attempt: AbstractContextManager[object],
        *,
        releases: CountedSession | None = None,
    ) -> None:
        """``step`` in the critical section (``attempt``), then what it decided; while
        another worker holds the shared ledger (or earlier events wait), kept.

        A step that ends its session (``releases``: a ticket's release, a WebSocket's
        end) gives the reservation back at once even then: the ledger's release never
        waits and never raises, and nothing that comes later may count that session
        again (an activation after it is a no-op). Only the settler's bookkeeping waits.
        """
        if not self:
            try:
                with attempt:
                    actions = step()
            except LedgerBusy:
                pass
            else:
                apply(actions)
                return
        self.append(step)
        if releases is not None:
            releases.release()

    def catch_up(self, attempt: AbstractContextManager[object]) -> None:
        """The events kept, in order, in a critical section of their own (``attempt``):
        what they decided is done even if what follows fails. ``LedgerBusy`` while
        another worker holds the shared ledger (they stay kept)."""
        if not self:
            return
        actions: list[Action] = []
        with attempt:
            while self:
                actions += self.popleft()()
        apply(actions)


# --------------------------------------------------------------------------------------
# What the decisions and settling expect of each route, from the learner's estimates and
# the probes' provisional footprints (``probing.py``). Computed once per change of what
# was learned (the learner's and the probes' versions), not on every decision.


@dataclass(slots=True, kw_only=True, eq=False)
class LearnedView:
    """Per-route estimates for one reservations (called inside the ledger's lock)."""

    learner: SessionLearner
    probes: Probes
    controller: AdmissionController
    learning: Learning
    min_reserve_bytes: int
    _learner_version: int = field(default=-1, init=False)
    _probes_version: int = field(default=-1, init=False)
    _estimates: dict[str, RouteEstimate] = field(default_factory=dict, init=False)
    #: Routes decided on an estimate (learned, or a probe's provisional footprint).
    _known: dict[str, RouteEstimate | None] = field(default_factory=dict, init=False)
    _expected: dict[tuple[str, int | None], int] = field(default_factory=dict, init=False)
    _learned: Learned | None = field(default=None, init=False)
    _estimated: dict[tuple[str, int | None], int | None] = field(default_factory=dict, init=False)

    def expected_bytes(self, route: str, limit_bytes: int | None) -> int:
        """The route's own reserve under the limit ``limit_bytes``: the one configured or
        derived from the limit, raised or replaced by what was learned of this route (a
        session smaller than it settles by its ramp). Asked on every admission."""
        self.estimates()
        key = (route, limit_bytes)
        expected = self._expected.get(key)
        if expected is None:
            estimate = self._estimates.get(route)
            base = self.controller.reserve_bytes
            expected = self._expected[key] = effective_reserve(
                derived_reserve_bytes(limit_bytes) if base is None else base,
                () if estimate is None else (estimate,),
                mode=self.mode,
                min_bytes=self.min_reserve_bytes,
            )
        return expected

    def estimated_bytes(self, route: str, limit_bytes: int | None) -> int | None:
        """:meth:`expected_bytes` of a route with an estimate (learned, or a probe's
        provisional one); ``None`` for one without. Asked on every decision."""
        self.estimates()
        key = (route, limit_bytes)
        try:
            return self._estimated[key]
        except KeyError:
            pass
        found = self.expected_bytes(route, limit_bytes) if route in self._estimates else None
        self._estimated[key] = found
        return found

    @property
    def mode(self) -> Learning:
        """How what was learned acts on the reserve: ``raise`` floors only a configured
        reserve; a reserve derived from the limit is a guess, which what was learned
        replaces (never below the minimum), as with ``adapt``."""
        if self.learning == "raise" and self.controller.reserve_bytes is None:
            return "adapt"
        return self.learning

    def learned(self) -> Learned:
        """What settling is handed: every route's footprint, and the ramps of the routes
        decided on an estimate (an open probe's is still growing)."""
        estimates = self.estimates()
        if self._learned is None:
            self._learned = Learned(
                footprint_bytes={route: e.footprint_bytes for route, e in estimates.items()},
                ramp_s={route: e.ramp_s for route, e in self._known.items() if e is not None},
            )
        return self._learned

    def estimates(self) -> dict[str, RouteEstimate]:
        """Every route's estimate: learned, else a probe's provisional one."""
        learner, probes = self.learner, self.probes
        if self._learner_version != learner.version or self._probes_version != probes.version:
            self._learner_version = learner.version
            self._probes_version = probes.version
            off = self.learning == "off"
            learned = {} if off else {e.route: e for e in learner.estimates()}
            # A probe's provisional footprint stands in until the learner has one.
            provisional = {} if off else probes.estimates()
            for route in learned:
                provisional.pop(route, None)
            self._estimates = {**learned, **provisional}
            self._known = {**probes.concluded(), **learned}
            self._expected = {}
            self._learned = None
            self._estimated = {}
        return self._estimates

    def known(self) -> dict[str, RouteEstimate | None]:
        """The routes whose sessions are decided on an estimate, not probed first."""
        self.estimates()
        return self._known

    def reserve_bytes(self) -> int | None:
        """The reserve what was learned sets (``None``: nothing learned, or learning off):
        the largest footprint, an open probe's growth past its guess included, never below
        the minimum where it replaces the reserve."""
        largest = max((e.footprint_bytes for e in self.estimates().values()), default=None)
        mode = self.mode
        if largest is None or mode == "off":
            return None
        return max(largest, self.min_reserve_bytes) if mode == "adapt" else largest

    def forget(self) -> None:
        """The configured or learned reserve changed: recompute each route's."""
        self._expected = {}
        self._estimated = {}


# --------------------------------------------------------------------------------------
# What the reservations learned, handed on: to the controller's reserve, and to the workers.
#
# With a shared directory the new observations go into the learned file every worker
# reads (``shared_files.LearnedStore``), and what the others learned is taken in every
# ``SHARED_REFRESH_S``, or at every sample while requests wait for another worker's probe.
# Everything here runs inside the ledger's critical section.

#: How often a worker takes in what the other workers learned.
SHARED_REFRESH_S: Final = 2.0


@dataclass(slots=True, kw_only=True, eq=False)
class LearnedSharing:
    """Hands on what ``learner`` and ``probes`` learned (see the notes above)."""

    learner: SessionLearner
    probes: Probes
    view: LearnedView
    controller: AdmissionController
    shared_dir: InitVar[str | None]
    probing: bool
    on_reserve: Callable[[int, int | None], None]
    clock: Callable[[], float]
    _store: LearnedStore | None = field(default=None, init=False)
    _next_refresh: float = field(default=0.0, init=False)
    #: The learner's and the probes' versions the reserve was last set from.
    _seen: tuple[int, int] = field(default=(-1, -1), init=False)

    def __post_init__(self, shared_dir: str | None) -> None:
        if shared_dir is not None:
            self._store = LearnedStore(shared_dir, keep=KEPT)
            self.learner.merge(self._store.load())
        self.update()

    def publish(self) -> None:
        """After new observations: share them (with a shared directory), update the reserve."""
        if self._versions() == self._seen:
            return
        new = self.learner.take_new()
        if self._store is not None and new:
            merged = self._store.add(new, known=self.learner.observations())
            if merged is not None:  # None: the file is unusable for now (logged once)
                self.learner.merge(merged)
        self.update()

    def refresh(self, now: float, *, urgent: bool = False) -> None:
        """Take in what the other workers learned, when it is due (``urgent``: now)."""
        store = self._store
        if store is None or not (urgent or now >= self._next_refresh):
            return
        self._next_refresh = now + SHARED_REFRESH_S
        loaded = store.refresh()
        if loaded is not None and store.moved:
            # Another file than last time (deleted and made again, or replaced): this
            # worker adds what it knows that the file lacks, before taking it in.
            loaded = store.add({}, known=self.learner.observations())
        if loaded is None:
            return  # unusable for now (logged once): this worker keeps what it learned
        self.learner.merge(loaded)
        if self._versions() != self._seen:
            self.update()

    def update(self) -> None:
        """Hand the controller what was learned: it raises or replaces the reserve; the
        probes of routes learned now are over."""
        probes = self.probes
        if self.probing:
            probes.learned(probes.watched() & self.learner.routes(), self.clock())
        self._seen = self._versions()
        self.view.forget()
        learned, controller = self.view.reserve_bytes(), self.controller
        if controller.learned(learned, replaces=self.view.mode == "adapt") and learned is not None:
            self.on_reserve(learned, controller.reserve_bytes)

    def _versions(self) -> tuple[int, int]:
        return self.learner.version, self.probes.version


# --------------------------------------------------------------------------------------
# The parts a :class:`Reservations` is made of, built together in the direction of their
# dependencies: the settling queue, the probes, the learned view over the learner and the
# probes, the settler over the queue, and the sharing, which reads all of them. With
# ``ADMISSION_SHARED_DIR`` unset nothing here opens a file.


@dataclass(frozen=True)
class ReservationParts:
    """The reservations' collaborators (see the notes above for how they depend on one another)."""

    #: The latch the reserve is set on, and the clock every part is told the time by.
    controller: AdmissionController
    clock: Callable[[], float]
    learner: SessionLearner
    queue: SettleQueue
    #: Whether routes not learned yet are probed (``probing.py``).
    probing: bool
    #: The waiters for the probes' evidence (the service's, which waits them).
    probe_waiters: ProbeWaiters
    probes: Probes
    view: LearnedView
    settler: Settler
    sharing: LearnedSharing


def reserve_logger(learning: Learning) -> Callable[[int, int | None], None]:
    """What the learned reserve's changes log: one debug line each."""

    def on_reserve(learned_bytes: int, configured_bytes: int | None) -> None:
        # Debug only: it changes with observations (the metrics show it); the latch's
        # transitions and telemetry are what the log says at INFO and above.
        logger.debug(
            "asgi-admission: one session was learned to need %.1f MiB; with learning %s "
            "that %s the reserve (%s).",
            learned_bytes / MIB,
            learning,
            "replaces" if learning == "adapt" else "sets a floor for",
            "derived from the limit"
            if configured_bytes is None
            else f"configured {configured_bytes / MIB:.1f} MiB",
        )

    return on_reserve


def build_parts(
    *,
    controller: AdmissionController,
    learning: Learning,
    min_reserve_bytes: int,
    timeout_s: float,
    request_timeout_s: float | None = None,
    shared_dir: str | None = None,
    ledger_is_current: Callable[[], bool] | None = None,
    on_reserve: Callable[[int, int | None], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    probe_sessions: int = 0,
    probe_waiters: ProbeWaiters | None = None,
    learner: SessionLearner | None = None,
) -> ReservationParts:
    """The parts of one reservations, from the guard's settings.

    ``timeout_s`` bounds a reservation past its response (``request_timeout_s`` one
    whose request is in progress); ``shared_dir`` is ``ADMISSION_SHARED_DIR``;
    ``ledger_is_current()`` whether the shared ledger's file is still the one opened;
    ``on_reserve(learned, configured)`` is told when the learned reserve changes (by
    default, a debug log line);
    ``learner`` is what learns the sessions' cost (a new one by default).
    """
    if learner is None:
        learner = SessionLearner(timeout_s=timeout_s)
    queue: SettleQueue = LocalSettleQueue()
    if shared_dir is not None:
        queue = SharedSettleQueue(shared_dir, may_follow=ledger_is_current)
    probing = probe_sessions > 0 and learning != "off"
    probe_waiters = ProbeWaiters() if probe_waiters is None else probe_waiters
    store: ProbeStore | None = None
    if shared_dir is not None and probing:
        store = SharedProbeStore(shared_dir)
    probes = Probes(
        probe_sessions=probe_sessions,
        timeout_s=timeout_s,
        store=store,
        on_wake=probe_waiters.wake,
        waiting=probe_waiters.count,
    )
    view = LearnedView(
        learner=learner,
        probes=probes,
        controller=controller,
        learning=learning,
        min_reserve_bytes=min_reserve_bytes,
    )
    settler = Settler(queue=queue, timeout_s=timeout_s, request_timeout_s=request_timeout_s)
    sharing = LearnedSharing(
        learner=learner,
        probes=probes,
        view=view,
        controller=controller,
        shared_dir=shared_dir if learning != "off" else None,
        probing=probing,
        on_reserve=reserve_logger(learning) if on_reserve is None else on_reserve,
        clock=clock,
    )
    return ReservationParts(
        controller=controller,
        clock=clock,
        learner=learner,
        queue=queue,
        probing=probing,
        probe_waiters=probe_waiters,
        probes=probes,
        view=view,
        settler=settler,
        sharing=sharing,
    )


# --------------------------------------------------------------------------------------
# The reservations' samples of memory: when one is due, what a reading settles and teaches.
#
# Notes:
#
# - Every method runs inside the ledger's critical section (the reservations enters it):
# the actions returned release or activate reservations, which take the same lock,
# so the reservations applies them after leaving it.
# - The sample reads memory only while something is unsettled, being learned or
# probed, or waits in the workers' shared queue, and the active count (for the rate
# of session ends) every time: it never blocks on anything slower than the ledger's
# lock.
# - A session end told by its route (a WebSocket that closed, a ticket released) is
# counted here, so that the active count falling for it at the next sample is not
# taken for a second, anonymous end.

#: How often the periodic sample reads memory, and the least time between two readings
#: that a stream of decisions takes for learning.
SAMPLE_INTERVAL_S: Final = 0.25


@dataclass(slots=True, kw_only=True, eq=False)
class Samples:
    """The readings behind one reservations' settling and learning (see the notes above).

    ``read`` takes an exact reading and never raises; ``active_count(own)`` is the
    container's active sessions, given the app's own count ``own``; ``ends`` records
    how often sessions end.
    """

    parts: ReservationParts
    read: Callable[[], MemoryReading]
    active_count: Callable[[int | None], int]
    ends: SessionEnds
    _learning: bool = field(init=False)
    _next_sample: float = field(default=0.0, init=False)
    _sample_reading: ExactReading | None = field(default=None, init=False)
    #: Active sessions seen ending by their route since the last sample.
    _named_ends: int = field(default=0, init=False)
    #: The memory limit of the last admission.
    limit: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._learning = self.parts.view.learning != "off"

    def named_end(self) -> None:
        """An active session ended and was told by its route."""
        self._named_ends += 1

    def due(self) -> Sequence[Action]:
        """Settle from a fresh reading when the last reading is a sample interval old.

        For decisions that read no exact working set themselves: where the app
        runs without lifespan (no periodic sample), traffic still settles.
        """
        settler = self.parts.settler
        if not settler.past_response:
            return ()
        now = self.parts.clock()
        if now < self._next_sample:
            return ()
        memory = self.read()
        if not memory.available or memory.used_bytes is None:
            return settler.settle(None, now, self.parts.view.learned())
        return self.take(memory.used_bytes, now)

    def settle_with(self, memory: MemoryReading) -> Sequence[Action]:
        """A decision's own reading settles what it shows (exact readings only).

        Used at once while sessions wait past their response; otherwise (for
        learning) at most once per sample interval, so that a stream of decisions
        costs no more than the sample would. An unavailable reading settles what is
        timed out, at most once per sample interval.
        """
        if memory.used_bytes is None or not memory.available:
            return self._timed_out()
        if not memory.exact:
            return ()
        now = self.parts.clock()
        if not self.parts.settler.past_response and now < self._next_sample:
            return ()
        return self.take(memory.used_bytes, now)

    def _timed_out(self) -> Sequence[Action]:
        # Memory unreadable: nothing shows, but what is due by time (a held ticket, a
        # request past its timeout) still ends where no periodic sample runs.
        settler = self.parts.settler
        now = self.parts.clock()
        if not settler.unsettled or now < self._next_sample:
            return ()
        self._next_sample = now + SAMPLE_INTERVAL_S
        return settler.settle(None, now, self.parts.view.learned())

    def take(self, used_bytes: int, now: float) -> list[Action]:
        """The working set ``used_bytes`` read at ``now``: teach it, settle by it."""
        parts = self.parts
        self._next_sample = now + SAMPLE_INTERVAL_S
        if self._learning:
            busy = parts.probing and parts.probes.busy
            parts.learner.on_reading(used_bytes, now, others=parts.queue.others)
            if busy:
                parts.probes.on_reading(used_bytes, now, parts.learner)
            parts.sharing.publish()
        return parts.settler.settle(used_bytes, now, parts.view.learned())

    def sample(self, own: int | None, now: float) -> list[Action]:
        """The periodic sample's step, given the app's own count ``own``."""
        parts = self.parts
        settler, learner, probes, probe_waiters = (
            parts.settler,
            parts.learner,
            parts.probes,
            parts.probe_waiters,
        )
        actions: list[Action] = []
        # Requests wait for a probe's evidence: none start waiting during the sample
        # (decisions take the same critical section), though some may be woken.
        waiting = bool(probe_waiters)
        probing = parts.probing and (probes.busy or waiting)
        ended = self.ends.on_active(self.active_count(own), now)
        # Ends whose route is known were told already; the others are the app's count
        # falling (or other workers' sessions), of a route the learner shares out.
        named, self._named_ends = self._named_ends, 0
        anonymous = max(0, ended - named)
        # The container's count has the other workers' ends in it too.
        shared = parts.queue.shared
        mine = self.ends.own_share(anonymous, named, own) if shared else anonymous
        if anonymous:
            # Found by a count: they ended since the last sample's reading.
            freed = anonymous * parts.controller.reserve_for(self.limit)
            settler.ended(freed, now, since=self._sample_reading)
        if anonymous and self._learning:
            if mine:
                learner.on_session_end(now, count=mine)
            if anonymous > mine:
                learner.on_foreign_end()
        if ended and probing:
            probes.session_ended(now)
        if settler.unsettled or learner.observing or self._queue_busy() or probing:
            memory = self.read()
            if memory.available and memory.used_bytes is not None:
                actions += self.take(memory.used_bytes, now)
            else:
                actions += settler.settle(None, now, parts.view.learned())
        self._sample_reading = settler.last_reading
        # While requests wait for another worker's probe, what it learned is read
        # again at every sample.
        parts.sharing.refresh(now, urgent=probing and bool(probe_waiters))
        if waiting:
            # Requests that may go on now: their route is known, or (another worker's
            # probe having left or concluded) a probe's slot is free.
            for route in probes.ready(probe_waiters.routes(), parts.view.known(), now):
                probe_waiters.wake(route)
        return actions

    def _queue_busy(self) -> bool:
        # Other workers' sessions in a shared queue need this worker's samples too.
        queue = self.parts.queue
        return isinstance(queue, SharedSettleQueue) and bool(queue.load()[1])


# --------------------------------------------------------------------------------------
# The reservations of one guard: settling, tickets, learning and the sample behind them.
#
# The admission service calls it on the decision path (inside the ledger's lock: cheap),
# the watched request when a response ends or a WebSocket is accepted or closed, and the
# lifespan (a periodic sample, so that settling and learning never wait for traffic).
# Tickets call it from any thread.
#
# Notes:
#
# - Every change is made inside the ledger's critical section (its
# ``threading.Lock``, and its ``flock`` when shared), and the reservations are
# released or activated after it is left: they take the same lock. A response that
# settles from this process's own state alone (nothing shared to read or write: no
# reserve waits to show, no ticket holds it, no probe) takes the lock alone
# (``attempt_own``): a session request then takes the shared ledger's ``flock`` once.
# - The critical section is only ever tried (``attempt``); events are kept while another
# worker holds it (:class:`KeptEvents`). A release (a ticket's, a WebSocket's end) still
# gives its reservation back at once; the sample catches up in a critical section of its
# own, so what the kept events decided is done even if the sample's reading then fails.
# The app's own count is asked before the critical section, never inside it.


def settles_alone(entry: Reservation, probes: dict[int, str]) -> bool:
    """Whether ``entry`` settles at its response from this process's own state: its
    memory showed, or none is expected; no ticket holds it; it is none of the ``probes``."""
    return entry.phase == "request" and entry.visible and not entry.held and entry.seq not in probes


#: Why a session request opened nothing: the app answered with an error status, or
#: its body had not arrived by ``ADMISSION_BODY_TIMEOUT_SECONDS``.
FailureCause = Literal["error_status", "body_timeout"]


class Reservations:
    """Settling, tickets and learning for one guard (see the notes above).

    ``attempt`` is the ledger's critical section, tried without waiting (it
    raises ``LedgerBusy`` while another worker holds it), and ``attempt_own``
    its part for this process's own bookkeeping (default: ``attempt``); ``read`` takes an
    exact reading and never raises; ``app_count()`` is the app's own count of
    its sessions (app code: asked outside ``attempt``; ``None``: none) and
    ``active_count(own)`` the container's active sessions with it (inside
    ``attempt``); ``route_of(scope)`` names a session's route.
    """

    def __init__(
        self,
        *,
        attempt: AbstractContextManager[object],
        attempt_own: AbstractContextManager[object] | None = None,
        read: Callable[[], MemoryReading],
        active_count: Callable[[int | None], int],
        app_count: Callable[[], int | None] = lambda: None,
        route_of: Callable[[Scope], str | None],
        parts: ReservationParts,
    ) -> None:
        self._controller = parts.controller
        self._attempt = attempt
        self._attempt_own = attempt if attempt_own is None else attempt_own
        self._read = read
        self._app_count = app_count
        #: Events kept while another worker held the shared ledger, oldest first.
        self._kept = KeptEvents()
        #: The session pattern a scope came by (``"predicate"`` when none matched).
        self.route = RouteNames(route_of)
        self.learning: Learning = parts.view.learning
        self._clock = parts.clock
        #: Session requests that opened nothing, by kind and cause, in this process.
        self.failed: dict[tuple[Kind, FailureCause], int] = {}
        self.ends = SessionEnds()
        self._samples = Samples(parts=parts, read=read, active_count=active_count, ends=self.ends)
        #: Settle from a fresh reading when the last reading is a sample interval old
        #: (``Samples.due``), for a decision that read no exact working set.
        self.due = self._samples.due
        self._queue = parts.queue
        self.learner = parts.learner
        self.probing = parts.probing
        self.probe_waiters = parts.probe_waiters
        self.probes = parts.probes
        self.view = parts.view
        self.settler = parts.settler
        self.sharing = parts.sharing
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forked(ref))

    @property
    def expired_total(self) -> int:
        """Held tickets never started that the timeout released, in this process."""
        return self.settler.expired

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
        if count is not None and settler.responded and count < settler.past_response:
            with self._attempt:  # the app counts fewer sessions than wait to settle
                ended = settler.counted(count, self.view.learned())
            apply(ended)
        if self._kept:
            self._kept.catch_up(self._attempt)
        return None if count is None else self.own_count(count)

    def expected_wait_s(self, now: float, probed: str | None = None) -> float | None:
        """How long until a session ends, at the rate they have been ending; for a route
        being ``probed``, how long its probes have been ramping (for ``Retry-After``)."""
        if probed is not None:
            return self.probes.retry_after_s(probed, now)
        return self.ends.expected_wait_s(now)

    # -- on the decision path (inside the ledger's lock) ------------------------------

    def admitted(
        self,
        reservation: CountedSession,
        kind: Kind,
        scope: Scope | None,
        used_bytes: int | None,
        limit_bytes: int | None = None,
        *,
        route: str | None = None,
        probe: bool = False,
    ) -> Reservation:
        """A reservation just made, at working set ``used_bytes`` (exact or a bound)
        under the memory limit ``limit_bytes``; ``probe``: a probe of its route (admitted
        at an exact working set)."""
        now = self._clock()
        if route is None:
            route = self.route(scope)
        if self.learning != "off":
            self.learner.on_admit(route, used_bytes, now, responded=False)
        if limit_bytes is not None:
            self._samples.limit = limit_bytes
        # Blind since this process started (nothing admitted under a limit: there is none,
        # or memory was never read), the latch measures no session's memory: there is
        # none to wait for, and the session settles at its response (or accept), by its
        # ticket or at its end.
        expected = (
            0 if self._samples.limit is None else self.view.expected_bytes(route, limit_bytes)
        )
        entry = self.settler.admit(reservation, kind, route, used_bytes, now, expected)
        if probe and used_bytes is not None:
            self.probes.add(route, entry.seq, used_bytes, expected, now)
        elif self.probing and self.probes.busy:
            self.probes.other_admitted(now)
        return entry

    def held_bytes(self, route: str | None, pending: int, limit_bytes: int) -> int:
        """What the ``pending`` sessions and one more of ``route`` hold back under
        ``limit_bytes`` (the latch's ``held_bytes``): this process's pending sessions what
        they are still expected to add, the others (other workers') a reserve each, and one
        more its route's reserve where the route is known, else the largest."""
        reserve = self._controller.reserve_for(limit_bytes)
        own, counted = self.settler.still_to_add()
        new = reserve
        if route is not None:
            expected = self.view.estimated_bytes(route, limit_bytes)
            if expected is not None and expected < reserve:
                new = expected
        return own + max(0, pending - counted) * reserve + new

    def probe_answer(self, route: str, used_bytes: int | None = None) -> ProbeAnswer:
        """How to decide one more session of ``route`` (inside the ledger's lock), at the
        exact working set ``used_bytes`` (which may conclude the probes)."""
        now = self._clock()
        if used_bytes is not None and self.probes.busy:
            self.probes.on_reading(used_bytes, now, self.learner)
            self.sharing.publish()
        if route in self.known():
            return "known"
        return self.probes.probe_answer(route, now)

    def probe_status(self) -> list[ProbeStatus]:
        """The routes being probed now (for metrics and refusals: outside the lock)."""
        if self.probes.shared:
            try:
                with self._attempt:
                    return self.probes.status(self._clock(), load=True)
            except LedgerBusy:
                pass  # as this worker last saw them
        return self.probes.status(self._clock())

    def settle_with(self, memory: MemoryReading) -> Sequence[Action]:
        """A decision's own reading settles what it shows (``Samples.settle_with``)."""
        return self._samples.settle_with(memory)

    # -- the session's events (each takes the lock) -----------------------------------

    def respond(self, entry: Reservation) -> None:
        """The response ended or the WebSocket was accepted."""
        # As ``KeptEvents.now_or_later``, written out for the session path. A request
        # that settles at its response from this process's own state reads and writes no
        # shared file: this process's lock is its whole section, without the shared
        # ledger's flock (bench/README.md, "The fourteenth session: the session path's
        # cost at the defaults"). Asked again under the lock: a ticket's hold() from
        # another thread may have come between.
        if not self._kept:
            actions: Sequence[Action] | None = None
            try:
                if settles_alone(entry, self.probes.own):
                    with self._attempt_own:
                        if settles_alone(entry, self.probes.own):
                            actions = self._responded(entry)
                if actions is None:
                    with self._attempt:
                        actions = self._responded(entry)
            except LedgerBusy:
                pass
            else:
                apply(actions)
                return
        self._kept.append(functools.partial(self._responded, entry))

    def _responded(self, entry: Reservation) -> Sequence[Action]:
        now = self._clock()
        actions = self.settler.respond(entry, now, self.view.learned())
        if self.learning != "off":
            self.learner.on_response(entry.admitted_at, now)
        probe = entry.seq in self.probes.own
        if (entry.phase == "responded" and entry.queued) or probe:
            # Work done inside the request is in the working set by now: a fresh
            # reading lets such a session settle at once (and a probe show it).
            memory = self._read()
            used = memory.used_bytes if memory.available else None
            if probe:
                self.probes.responded(entry.seq, used, now)
            if used is not None:
                actions += self._samples.take(used, now)
            else:
                # No reading to show it by: it settles by time, as any blind session.
                actions += self.settler.settle(None, now, self.view.learned())
        return actions

    def _probe_left(self, entry: Reservation, opened: bool) -> None:
        # Asked of every session's end: most are no probe, and this process has none.
        if entry.seq in self.probes.own:
            self.probes.left(entry.seq, opened=opened, now=self._clock())

    def fail(self, entry: Reservation, cause: FailureCause) -> None:
        """The request opened nothing (an error answer, a body that came too late): its
        reservation goes back whatever its ticket said, and nothing is learned from it."""
        self.count_failure(entry.kind, cause)

        def step() -> Sequence[Action]:
            self.learner.on_failed(entry.admitted_at)
            self._probe_left(entry, False)
            return self.settler.release(entry)

        self._kept.now_or_later(step, self._attempt, releases=entry.counted)

    def count_failure(self, kind: Kind, cause: FailureCause) -> None:
        """One more session request of ``kind`` that opened nothing, for the metrics."""
        self.failed[kind, cause] = self.failed.get((kind, cause), 0) + 1

    def abandon(self, entry: Reservation, *, session_over: bool = False) -> None:
        """The request failed before its response, or the session ended."""

        def step() -> Sequence[Action]:
            if session_over:
                self._ended(entry)
            elif not (entry.held or entry.phase == "started"):
                self.learner.on_failed(entry.admitted_at)
            self._probe_left(entry, entry.phase != "request")
            return self.settler.abandon(entry, session_over=session_over)

        self._kept.now_or_later(
            step, self._attempt, releases=entry.counted if session_over else None
        )

    def ticket(self, operation: str, entry: Reservation) -> bool:
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
            self._kept.now_or_later(
                lambda: self.settler.started(entry, self.view.learned()), self._attempt
            )
        else:

            def release() -> Sequence[Action]:
                self._ended(entry)
                self._probe_left(entry, entry.phase != "request")
                return self.settler.release(entry)

            self._kept.now_or_later(release, self._attempt, releases=entry.counted)
        return True

    def measured(self, entry: Reservation, own_bytes: int) -> None:
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

    def _ended(self, entry: Reservation) -> None:
        """Inside the critical section: the session of ``entry`` ended (its route known).
        Told once, however many say so (the app's release, its watchdog, a closed socket)."""
        if entry.end_told:
            return
        entry.end_told = True
        if entry.phase == "started" or (entry.phase == "done" and not entry.released):
            # It was active: the next sample sees the active count fall for it too.
            self._samples.named_end()
        now = self._clock()
        # What it frees counts for the sessions still settling (``settling.py``).
        self.settler.ended(self.view.expected_bytes(entry.route, self._samples.limit), now)
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
        return bool(self.probe_waiters) or self.probes.busy

    @property
    def kept_events(self) -> int:
        """How many session events wait for the shared ledger."""
        return len(self._kept)

    # -- the periodic sample ------------------------------------------------------------

    def sample(self) -> None:
        """One sample: settle and learn from a fresh reading, note session ends.

        Skipped (until the next) while another worker holds the shared ledger.
        """
        now = self._clock()
        try:
            # Their own critical section: done even if the reading then fails (a file replaced).
            self._kept.catch_up(self._attempt)
            # The app's count after them: an end kept for later is not also a count falling.
            own = self.own_count()
            with self._attempt:
                actions = self._samples.sample(own, now)
        except LedgerBusy:
            return
        if actions:
            apply(actions)

    def _after_fork(self) -> None:
        self.settler.after_fork()
        self.probes.after_fork()
        if isinstance(self._queue, SharedSettleQueue):
            self._queue.after_fork()


def _forked(ref: weakref.ReferenceType[Reservations]) -> None:
    reservations = ref()
    if reservations is not None:
        reservations._after_fork()


# --------------------------------------------------------------------------------------
# The reservations' periodic sample: with the app's lifespan, or while requests wait for a probe.
#
# Where the server runs no lifespan, nothing would take the readings that end a
# probe (``probing.py``); the first waiter for one starts a sample of the
# running loop, which ends once nothing waits or is probed any more.

#: The sample started for requests waiting without a lifespan, per reservations.
_helpers: weakref.WeakKeyDictionary[Reservations, asyncio.Task[None]] = weakref.WeakKeyDictionary()
#: How many periodic samples run per reservations (from a lifespan: :func:`run`).
_running: weakref.WeakKeyDictionary[Reservations, int] = weakref.WeakKeyDictionary()


async def run(reservations: Reservations, interval_s: float = SAMPLE_INTERVAL_S) -> None:
    """Sample ``reservations`` every ``interval_s`` until cancelled (the lifespan runs this)."""
    _running[reservations] = _running.get(reservations, 0) + 1
    try:
        while True:
            await sample_after(reservations, interval_s)
    finally:
        _running[reservations] -= 1


async def sample_after(reservations: Reservations, interval_s: float) -> None:
    """One sample once ``interval_s`` has passed; a failure is logged, never raised."""
    await asyncio.sleep(interval_s)
    try:
        reservations.sample()
    except Exception:
        logger.exception("asgi-admission: the reservation sample failed; trying again.")


def sampling(reservations: Reservations) -> bool:
    """Whether a periodic sample of ``reservations`` runs (from a lifespan)."""
    return _running.get(reservations, 0) > 0


async def serve_with_reservations(
    reservations: Reservations,
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    also: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Run ``app``'s lifespan with the reservations' periodic sample (and ``also``, another
    watch of the guard's) from startup to shutdown."""
    tasks: list[asyncio.Task[None]] = []

    async def send_and_track(message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete" and not tasks:
            loop = asyncio.get_running_loop()
            tasks.append(loop.create_task(run(reservations)))
            if also is not None:
                tasks.append(loop.create_task(also()))
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            await _stop(tasks)
        await send(message)

    try:
        await app(scope, receive, send_and_track)
    finally:
        await _stop(tasks)


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    while tasks:
        task = tasks.pop()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def sample_while_waiting(reservations: Reservations) -> None:
    """Requests wait for a probe: with no lifespan sampling, a task of the running loop
    samples every ``SAMPLE_INTERVAL_S`` until nothing waits or is probed any more."""
    helper = _helpers.get(reservations)
    if sampling(reservations) or (helper is not None and not helper.done()):
        return
    _helpers[reservations] = asyncio.get_running_loop().create_task(_sample_waiting(reservations))


async def _sample_waiting(reservations: Reservations) -> None:
    while not sampling(reservations) and reservations.probes_busy:
        await sample_after(reservations, SAMPLE_INTERVAL_S)
