"""Probing: a route whose footprint is unknown is admitted a few sessions at a time.

The others wait, reserving nothing, until the probes' memory has stopped growing.
(docs/reservations.md)
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable, Callable, Container, Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any, Final, Literal, Protocol, TypeVar

from asgi_admission._admission.reservations.learning import (
    HORIZON_S,
    QUIET_S,
    RouteEstimate,
    SessionLearner,
)
from asgi_admission._admission.reservations.settling import VISIBLE_FRACTION

# --------------------------------------------------------------------------------------
# Waiters for a probe's evidence, and what wakes them.
#
# A session request of a route being probed waits until the probes' evidence is in, a
# probe's slot is free, or its own deadline (``ADMISSION_PROBE_WAIT_SECONDS``) passes,
# and is then decided again. Waiting for capacity is the wait queue's
# (``scheduling/queue.py``), apart from this.
#
# Notes:
#
# - No polling: a waiter awaits one future, which the reservations resolves when something
# happens that may let it go on (under the ledger's lock, from whichever thread
# told it: a ticket's ``release()`` may come from a thread pool), or the loop's
# timer for its deadline fires.
# - A waiter that is woken leaves the registry; decided again, it either goes on or is
# registered anew, so the count of waiters is of requests actually waiting.


class ProbeWaiter:
    """One request waiting for a probe's evidence: its route, its deadline
    (``time.monotonic()``), its wake-up.

    Made inside the decision (with or without a running loop); the waiter's loop is
    taken when it first awaits :attr:`future`.
    """

    __slots__ = ("_future", "_lock", "_loop", "_woken", "deadline", "route")

    def __init__(self, route: str, deadline: float) -> None:
        self.route = route
        self.deadline = deadline
        self._lock = threading.Lock()
        self._woken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[None] | None = None

    def rearm(self) -> None:
        """Ready for another wait (it was woken and must wait again)."""
        with self._lock:
            self._woken = False
            self._future = None

    def wake(self) -> None:
        """Let the waiter go on; from any thread."""
        with self._lock:
            self._woken = True
            future, loop = self._future, self._loop
        if future is None or loop is None:
            return  # its waiter finds it woken when it first looks
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            _resolve(future)
        else:
            loop.call_soon_threadsafe(_resolve, future)

    @property
    def future(self) -> asyncio.Future[None]:
        """Done once the waiter is woken; on its loop."""
        with self._lock:
            if self._future is None:
                self._loop = asyncio.get_running_loop()
                self._future = self._loop.create_future()
                if self._woken:
                    self._future.set_result(None)
            return self._future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ProbeWaiters:
    """The probe waiters of one process, per route; thread-safe."""

    __slots__ = ("_lock", "_on_wake", "_waiters")

    def __init__(self) -> None:
        self._waiters: dict[str, list[ProbeWaiter]] = {}
        self._lock = threading.Lock()
        self._on_wake: Callable[[], None] | None = None

    def tell_wakes(self, on_wake: Callable[[], None]) -> None:
        """Call ``on_wake`` whenever a route's requests may go on, from any thread: for a
        registry built before what it wakes (the wait queue, whose requests past their
        probe's wait may go on too, is built after the reservations these waiters are
        part of)."""
        self._on_wake = on_wake

    def __bool__(self) -> bool:
        return bool(self._waiters)

    def add(self, route: str, deadline: float, again: ProbeWaiter | None = None) -> ProbeWaiter:
        """Register a request of ``route`` to wait until ``deadline`` (``again``: the waiter
        it waited as before, which keeps its deadline)."""
        if again is None:
            waiter = ProbeWaiter(route, deadline)
        else:
            waiter = again
            waiter.rearm()
        with self._lock:
            self._waiters.setdefault(route, []).append(waiter)
        return waiter

    def wake(self, route: str) -> None:
        """Every request waiting for ``route`` goes on to be decided again."""
        with self._lock:
            woken = self._waiters.pop(route, ())
        for waiter in woken:
            waiter.wake()
        if self._on_wake is not None:
            self._on_wake()

    def leave(self, waiter: ProbeWaiter) -> None:
        """``waiter`` waits no longer (decided, timed out, or its client left)."""
        with self._lock:
            waiters = self._waiters.get(waiter.route)
            if waiters is not None and waiter in waiters:
                waiters.remove(waiter)
                if not waiters:
                    del self._waiters[waiter.route]

    def count(self, route: str) -> int:
        """How many requests of ``route`` wait here."""
        with self._lock:
            return len(self._waiters.get(route, ()))

    def routes(self) -> list[str]:
        """The routes with requests waiting here."""
        with self._lock:
            return list(self._waiters)

    def total(self) -> int:
        with self._lock:
            return sum(len(waiters) for waiters in self._waiters.values())


# --------------------------------------------------------------------------------------
# A probe trial: one route's probes from the first one's admission until their evidence
# is in, and how an open one is reported.

#: How long after the probes' responses memory already visible must stay without a
#: new peak before it counts as all there: one periodic sample.
CONFIRM_S: Final = 0.25
#: A new peak must beat the last by this share of the growth so far (or 256 KiB).
_PEAK_STEP: Final = 0.01
_MIN_STEP: Final = 256 * 1024
#: The peaks kept per trial for its ramp time (halved when full).
_MAX_PEAKS: Final = 64


@dataclass(slots=True)
class Probe:
    """One probe session: its worker, its sequence number there, whether it answered."""

    pid: int
    seq: int
    responded: bool = False


@dataclass(slots=True)
class ProbeTrial:
    """A route's probes from the first one's admission until their evidence is in."""

    route: str
    started_at: float
    base_bytes: int
    #: The reserve the probes were admitted with (the guess).
    guess_bytes: int
    peak_bytes: int
    last_peak_at: float
    #: The last probe's admission or response.
    last_event_at: float
    probes: list[Probe] = field(default_factory=list)
    #: Probes that opened a session (admitted less those that opened nothing).
    admitted: int = 0
    peaks: list[tuple[float, int]] = field(default_factory=list)
    #: Another session was admitted meanwhile (its growth counts here too).
    mixed: bool = False
    #: A session ended meanwhile (memory freed may hide the probes').
    ended: bool = False
    #: When every probe had answered with its memory visible.
    visible_at: float | None = None
    #: Set once concluded: the footprint one session is taken to add.
    footprint_bytes: int | None = None
    ramp_s: float = 0.0
    concluded_at: float | None = None
    #: Requests waiting for this trial, per worker (for the metrics and ``probe``).
    waiting: dict[int, int] = field(default_factory=dict)

    @property
    def open(self) -> bool:
        return self.footprint_bytes is None

    def per_probe(self) -> int:
        """The growth since the first probe's admission, per probe that opened a session."""
        return max(0, self.peak_bytes - self.base_bytes) // max(1, self.admitted)

    def ramp(self) -> float:
        """Seconds from the first admission until the working set first reached 90 % of
        the peak growth."""
        reached = self.base_bytes + VISIBLE_FRACTION * max(0, self.peak_bytes - self.base_bytes)
        when = next((t for t, used in self.peaks if used >= reached), self.last_peak_at)
        return max(0.0, when - self.started_at)

    def see(self, used_bytes: int, now: float) -> None:
        """A reading: a new peak when it beats the last by a step."""
        step = max(_MIN_STEP, int((self.peak_bytes - self.base_bytes) * _PEAK_STEP))
        if used_bytes > self.peak_bytes + step or (
            used_bytes > self.peak_bytes and self.peak_bytes == self.base_bytes
        ):
            self.peak_bytes = used_bytes
            self.last_peak_at = now
            if len(self.peaks) >= _MAX_PEAKS:
                del self.peaks[1::2]
            self.peaks.append((now, used_bytes))
        elif used_bytes > self.peak_bytes:
            self.peak_bytes = used_bytes

    def quiet(self, now: float) -> bool:
        """Whether every probe has answered and the memory has stopped growing."""
        if any(not probe.responded for probe in self.probes):
            return False
        if (
            self.visible_at is not None
            and now - self.visible_at >= CONFIRM_S
            and self.last_peak_at <= self.visible_at
        ):
            return True
        spell = max(QUIET_S, 0.5 * (self.last_peak_at - self.started_at))
        return now - max(self.last_peak_at, self.last_event_at) >= spell


@dataclass(frozen=True, slots=True)
class ProbeStatus:
    """One route being probed, for the metrics, ``probe`` and the refusal details."""

    route: str
    #: Probes admitted and not yet concluded.
    probes: int
    #: Requests waiting for their evidence (every worker's, as last written).
    waiting: int
    since_s: float
    growth_bytes: int
    guess_bytes: int


def describe(trial: ProbeTrial, now: float, pid: int, waiting_here: int) -> ProbeStatus:
    """One open trial as its :class:`ProbeStatus`; ``waiting_here`` counts this process's."""
    others = sum(n for worker, n in trial.waiting.items() if worker != pid)
    return ProbeStatus(
        route=trial.route,
        probes=len(trial.probes),
        waiting=others + waiting_here,
        since_s=round(max(0.0, now - trial.started_at), 2),
        growth_bytes=max(0, trial.peak_bytes - trial.base_bytes),
        guess_bytes=trial.guess_bytes,
    )


# --------------------------------------------------------------------------------------
# Where the probe trials are kept (``probing.py``): in one process, or in a file the
# workers share (``shared_files.SharedProbeStore``).


class ProbeStore(Protocol):
    """Where the trials are: in this process, or in a file the workers share."""

    def load(self) -> dict[str, ProbeTrial] | None:
        """The trials; ``None`` while they cannot be read (the last ones seen stand)."""
        ...

    def store(self, trials: dict[str, ProbeTrial]) -> None: ...

    def owner_alive(self, pid: int) -> bool: ...

    @property
    def shared(self) -> bool: ...


class LocalProbeStore:
    """The trials of one process."""

    __slots__ = ("_trials",)

    def __init__(self) -> None:
        self._trials: dict[str, ProbeTrial] = {}

    def load(self) -> dict[str, ProbeTrial]:
        return self._trials

    def store(self, trials: dict[str, ProbeTrial]) -> None:
        self._trials = trials

    def owner_alive(self, pid: int) -> bool:
        return True

    shared: Final = False


# --------------------------------------------------------------------------------------
# Probing: a session route whose footprint is unknown is admitted a few sessions at a time.
#
# When a trial concludes, what its evidence is worth, why one route is probed at a time,
# and what a probe that gives no clean evidence leaves: docs/reservations.md, "Probing a
# route nothing is known of". The trials are in this process or, with
# ``ADMISSION_SHARED_DIR``, in a file the workers share (``shared_files.py``), so the
# number of probes is counted container-wide. Everything here runs inside the ledger's
# critical section.

#: At most this many routes are probed at once; others are decided on their reserve.
MAX_TRIALS: Final = 64
#: A route not probed yet waits while another route's probes are younger than this
#: (the longest a learner's window watches), and is probed beside them after it.
SOLO_S: Final = HORIZON_S
#: How long a shared trial stays in the file once concluded, so that the other
#: workers take in its footprint before what was learned reaches them.
CONCLUDED_KEEP_S: Final = 60.0

#: ``known``: decide on the estimate; ``probe``: admit as a probe; ``wait``: a waiter.
ProbeAnswer = Literal["known", "probe", "wait"]


@dataclass(slots=True, kw_only=True, eq=False)
class Probes:
    """The probes of every route not learned yet, and what they showed.

    ``on_wake(route)`` is told when the requests waiting for ``route`` may go on (its
    evidence is in, or a probe's slot is free); ``waiting(route)`` says how many wait
    in this process. Not thread-safe on its own: the reservations call it inside the
    ledger's lock. ``version`` changes whenever :meth:`estimates` does.
    """

    probe_sessions: int
    timeout_s: float
    store: InitVar[ProbeStore | None] = None
    on_wake: Callable[[str], None] = lambda route: None
    waiting: Callable[[str], int] = lambda route: 0
    _store: ProbeStore = field(init=False)
    _trials: dict[str, ProbeTrial] = field(init=False)
    #: This process's probes in open trials: their sequence number and route.
    own: dict[int, str] = field(default_factory=dict, init=False)
    #: Concluded trials' provisional footprints, until the learner has one (``None``:
    #: nothing beyond the guess was seen, and the route is decided on its reserve).
    _concluded: dict[str, RouteEstimate | None] = field(default_factory=dict, init=False)
    #: Open trials whose growth per probe passed the guessed reserve.
    _raised: dict[str, RouteEstimate] = field(default_factory=dict, init=False)
    _pid: int = field(default_factory=os.getpid, init=False)
    version: int = field(default=0, init=False)

    def __post_init__(self, store: ProbeStore | None) -> None:
        self._store = store if store is not None else LocalProbeStore()
        self._trials = self._store.load() or {}

    @property
    def shared(self) -> bool:
        return self._store.shared

    @property
    def busy(self) -> bool:
        """Whether readings matter here: this process has probes, or saw a trial open."""
        if self.own:
            return True
        # Asked on every admission: most often there is no trial at all.
        return bool(self._trials) and any(w.open for w in self._trials.values())

    # -- the decision ----------------------------------------------------------------

    def probe_answer(self, route: str, now: float) -> ProbeAnswer:
        """How to decide one more session of ``route``, which the learner does not know."""
        if route in self._concluded:
            return "known"
        self._load(now)
        trial = self._trials.get(route)
        if trial is None:
            if len(self._trials) >= MAX_TRIALS:
                return "known"
            # One route at a time: another route's probes ramping in this one's trial
            # would be taken for its own, and its probes in theirs.
            return "wait" if self._probing_other(route, now) else "probe"
        if trial.open and now - trial.started_at >= self.timeout_s:
            self._conclude(trial, now, timed_out=True)
            self._save()
        if not trial.open:
            self._take(trial)
            return "known"
        return "probe" if len(trial.probes) < self.probe_sessions else "wait"

    def _probing_other(self, route: str, now: float) -> bool:
        """Whether another route's probes are still ramping (for at most ``SOLO_S``)."""
        return any(
            w.open and w.route != route and now - w.started_at < SOLO_S
            for w in self._trials.values()
        )

    def add(self, route: str, seq: int, used_bytes: int, guess_bytes: int, now: float) -> None:
        """Session ``seq`` of this process was admitted as a probe of ``route``."""
        trial = self._trials.get(route)
        if trial is None or not trial.open:
            trial = self._trials[route] = ProbeTrial(
                route=route,
                started_at=now,
                base_bytes=used_bytes,
                guess_bytes=guess_bytes,
                peak_bytes=used_bytes,
                last_peak_at=now,
                last_event_at=now,
                peaks=[(now, used_bytes)],
            )
        else:
            trial.see(used_bytes, now)
            trial.last_event_at = now
        trial.probes.append(Probe(self._pid, seq))
        trial.admitted += 1
        self.own[seq] = route
        self._save()

    def other_admitted(self, now: float) -> None:
        """A session that is no probe was admitted: its growth mixes into open trials."""
        self._flag_open(now, "mixed")

    def session_ended(self, now: float) -> None:
        """A session ended somewhere: memory freed in open trials may hide probes'."""
        self._flag_open(now, "ended")

    def _flag_open(self, now: float, flag: Literal["mixed", "ended"]) -> None:
        self._load(now)
        changed = False
        for trial in self._trials.values():
            if trial.open and not getattr(trial, flag):
                setattr(trial, flag, True)
                changed = True
        if changed:
            self._save()

    # -- the probes' events ------------------------------------------------------------

    def responded(self, seq: int, used_bytes: int | None, now: float) -> None:
        """Probe ``seq`` answered (its response ended, or its WebSocket was accepted)."""
        trial, probe = self._find(seq, now)
        if trial is None or probe is None:
            return
        probe.responded = True
        trial.last_event_at = now
        if used_bytes is not None:
            trial.see(used_bytes, now)
        if all(p.responded for p in trial.probes) and trial.per_probe() >= (
            VISIBLE_FRACTION * trial.guess_bytes
        ):
            trial.visible_at = now
        self._raise(trial)
        self._save()

    def left(self, seq: int, *, opened: bool, now: float) -> None:
        """Probe ``seq`` is over: it opened nothing (an error answer, a failure before
        its response), or (``opened``) its session ended."""
        trial, probe = self._find(seq, now)
        self.own.pop(seq, None)
        if trial is None or probe is None:
            return
        trial.probes.remove(probe)
        if opened:
            trial.ended = True
        else:
            trial.admitted -= 1
        if trial.probes or trial.admitted <= 0:
            if not trial.probes:
                # Nothing to learn from: the next waiter becomes a probe.
                del self._trials[trial.route]
                self._drop_raised(trial.route)
            self.on_wake(trial.route)  # a probe's slot is free
        else:
            self._conclude(trial, now)  # wakes the waiters too
        self._save()

    # -- readings and what was learned ---------------------------------------------------

    def on_reading(self, used_bytes: int, now: float, learner: SessionLearner) -> None:
        """An exact working set: peaks, estimates raised at once, trials concluded."""
        self._load(now)
        changed = False
        for trial in list(self._trials.values()):
            if not trial.open:
                continue
            trial.see(used_bytes, now)
            self._raise(trial)
            changed = True
            if now - trial.started_at >= self.timeout_s:
                self._conclude(trial, now, timed_out=True)
            elif trial.quiet(now):
                clean = not (trial.mixed or trial.ended)
                self._conclude(trial, now, learner if clean else None)
        if changed:
            self._save()

    def learned(self, routes: Iterable[str], now: float) -> None:
        """The learner has a footprint for ``routes`` now: their trials conclude."""
        for route in routes:
            self._concluded.pop(route, None)
            self._drop_raised(route)
            trial = self._trials.get(route)
            if trial is not None and trial.open:
                trial.footprint_bytes = trial.per_probe()
                trial.ramp_s = trial.ramp()
                trial.concluded_at = now
                self._finish(trial)
                self._save()
                self.on_wake(route)

    def estimates(self) -> dict[str, RouteEstimate]:
        """Provisional footprints: concluded trials, and open ones raised past their guess."""
        concluded = {r: e for r, e in self._concluded.items() if e is not None}
        return {**self._raised, **concluded}

    def concluded(self) -> dict[str, RouteEstimate | None]:
        """The routes whose trials concluded, with their provisional footprints."""
        return dict(self._concluded)

    def watched(self) -> set[str]:
        """The routes this probes has a trial or a provisional footprint for."""
        return {*self._trials, *self._concluded, *self._raised}

    def ready(self, routes: Iterable[str], known: Container[str], now: float) -> list[str]:
        """Of ``routes`` with requests waiting here, those that may go on now: known, or
        (another worker's probe having concluded or left) with a probe's slot free."""
        return [
            route for route in routes if route in known or self.probe_answer(route, now) != "wait"
        ]

    def retry_after_s(self, route: str, now: float) -> float:
        """How long the probes of ``route`` have been ramping (for ``Retry-After``)."""
        trial = self._trials.get(route)
        return 1.0 if trial is None else max(1.0, now - trial.started_at)

    def status(self, now: float, *, load: bool = False) -> list[ProbeStatus]:
        """Every open trial, as last seen here or (``load``, under the ledger's lock)
        as the shared file has them now."""
        if load:
            self._load(now)
        return [
            describe(trial, now, self._pid, self.waiting(route))
            for route, trial in self._trials.items()
            if trial.open
        ]

    def after_fork(self) -> None:
        """A forked worker starts with none of its parent's probes."""
        self.own = {}
        self._pid = os.getpid()
        if not self._store.shared:
            self._store = LocalProbeStore()
            self._trials = {}

    # -- internals -----------------------------------------------------------------------

    def _find(self, seq: int, now: float) -> tuple[ProbeTrial | None, Probe | None]:
        route = self.own.get(seq)
        if route is None:
            return None, None
        self._load(now)
        trial = self._trials.get(route)
        if trial is None or not trial.open:
            self.own.pop(seq, None)
            return None, None
        for probe in trial.probes:
            if probe.pid == self._pid and probe.seq == seq:
                return trial, probe
        self.own.pop(seq, None)
        return None, None

    def _raise(self, trial: ProbeTrial) -> None:
        per_probe = trial.per_probe()
        if per_probe > trial.guess_bytes:
            known = self._raised.get(trial.route)
            if known is None or known.footprint_bytes != per_probe:
                self._raised[trial.route] = RouteEstimate(trial.route, per_probe, trial.ramp(), 0)
                self.version += 1

    def _drop_raised(self, route: str) -> None:
        if self._raised.pop(route, None) is not None:
            self.version += 1

    def _conclude(
        self,
        trial: ProbeTrial,
        now: float,
        learner: SessionLearner | None = None,
        *,
        timed_out: bool = False,
    ) -> None:
        """The trial's evidence is in. Its growth per probe caps the route's learned bounds
        where no session ended meanwhile and it did not time out. A clean trial closes the
        route's learning windows (the route is learned); otherwise its growth per probe is
        a provisional footprint, never below the guess where a session ended meanwhile or
        the trial timed out."""
        footprint = trial.per_probe()
        if learner is not None and not (trial.ended or timed_out):
            # Its growth, the route's others waiting, caps what crowded windows say.
            learner.probed(trial.route, footprint)
        if learner is None or not learner.close_windows(trial.route):
            if trial.ended or timed_out:
                footprint = max(footprint, trial.guess_bytes)
            self._concluded[trial.route] = _provisional(trial, footprint, trial.ramp())
            self.version += 1
        trial.footprint_bytes = footprint
        trial.ramp_s = trial.ramp()
        trial.concluded_at = now
        self._drop_raised(trial.route)
        self._finish(trial)
        self.on_wake(trial.route)

    def _finish(self, trial: ProbeTrial) -> None:
        for probe in trial.probes:
            if probe.pid == self._pid:
                self.own.pop(probe.seq, None)
        trial.probes = []
        if not self._store.shared:
            # In one process the estimate lives on in _concluded (or the learner).
            self._trials.pop(trial.route, None)

    def _take(self, trial: ProbeTrial) -> None:
        """Another worker's concluded trial: its footprint is provisional here."""
        assert trial.footprint_bytes is not None
        self._concluded[trial.route] = _provisional(trial, trial.footprint_bytes, trial.ramp_s)
        self._drop_raised(trial.route)
        self.version += 1

    def _load(self, now: float) -> None:
        if not self._store.shared:
            return
        trials = self._store.load()
        if trials is None:
            return  # unusable for now (logged once): the trials last seen stand
        dead = False
        # This worker's own probes need no asking whether their worker runs.
        pid, owner_alive = self._pid, self._store.owner_alive
        for route, trial in list(trials.items()):
            if not trial.open:
                if trial.concluded_at is not None and now - trial.concluded_at > CONCLUDED_KEEP_S:
                    del trials[route]
                continue
            alive = [p for p in trial.probes if p.pid == pid or owner_alive(p.pid)]
            if len(alive) != len(trial.probes):
                dead = True
                # A worker that died took its sessions' memory with it.
                trial.admitted -= len(trial.probes) - len(alive)
                trial.probes = alive
                if not alive:
                    del trials[route]
                    self._drop_raised(route)
        self._trials = trials
        # This worker's probes that another worker's pass concluded are watched no more.
        watched = {p.seq for w in trials.values() if w.open for p in w.probes if p.pid == self._pid}
        self.own = {seq: route for seq, route in self.own.items() if seq in watched}
        if dead:
            self._save()

    def _save(self) -> None:
        for route, trial in self._trials.items():
            here = self.waiting(route)
            if here:
                trial.waiting[self._pid] = here
            else:
                trial.waiting.pop(self._pid, None)
        self._store.store(self._trials)


def _provisional(trial: ProbeTrial, footprint: int, ramp_s: float) -> RouteEstimate | None:
    """A concluded trial's provisional estimate; ``None`` where it is only the guess."""
    if footprint == trial.guess_bytes:
        return None
    return RouteEstimate(trial.route, footprint, ramp_s, 0)


# --------------------------------------------------------------------------------------
# A waiter for a probe's evidence: until woken, its deadline, or its client left.
#
# The wait is one ``asyncio.wait`` on the waiter's future and, where the client can be
# heard (a :class:`Listener`, ``_session_requests.py``), on its next message: no polling, no
# timer but the deadline's. At the deadline the decision refuses (``probing``) if the
# probe's evidence is still not in.

_T = TypeVar("_T")


class Listener(Protocol):
    """The client of a waiting request: its next message, and whether it left."""

    def next_message(self) -> asyncio.Task[Any] | None:
        """The client's next message, read in the background (``None``: not listening)."""
        ...

    def heard(self) -> bool:
        """After :meth:`next_message` completed: whether the client left."""
        ...


async def wait_then_decide(
    waiter: ProbeWaiter,
    waiters: ProbeWaiters,
    decide: Callable[[ProbeWaiter, bool], Awaitable[_T | ProbeWaiter]],
    listening: Listener | None,
) -> _T | None:
    """Wait as ``waiter`` until woken or its deadline, then ``decide(waiter, expired)``
    again; ``None`` when the client left meanwhile (it holds nothing)."""
    while True:
        outcome = await _wait(waiter, waiters, listening)
        if outcome is None:
            return None
        decided = await decide(waiter, outcome)
        if not isinstance(decided, ProbeWaiter):
            return decided
        waiter = decided


async def _wait(
    waiter: ProbeWaiter, waiters: ProbeWaiters, listening: Listener | None
) -> bool | None:
    """``False`` once woken, ``True`` at the deadline, ``None`` when the client left."""
    try:
        while True:
            remaining = waiter.deadline - time.monotonic()
            if remaining <= 0:
                waiters.leave(waiter)
                return True
            message = None if listening is None else listening.next_message()
            waits: set[asyncio.Future[object]] = {waiter.future}  # type: ignore[arg-type]
            if message is not None:
                waits.add(message)
            done, _ = await asyncio.wait(
                waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter.future in done:
                return False
            if message is not None and message in done:
                assert listening is not None
                if listening.heard():
                    waiters.leave(waiter)
                    return None
    except BaseException:
        waiters.leave(waiter)
        raise
