"""Probing: a session route whose footprint is unknown is admitted a few sessions at a time.

Before anything is learned of a route, its reserve is a guess (an eighth of the
limit, or a configured figure that may be many times too small), and a burst
admitted on it can be killed by the kernel. So while a route has no learned
footprint the guard admits ``probe_sessions`` of its sessions (the *probes*) and
holds the others back (``holds.py``) until the probes' memory has stopped growing;
then they are decided by what the probes showed (``docs/reservations.md``).

Notes:

- A *window* follows a route's probes from the first one's admission, at the exact
  working set then (its *base*), through its peak. It concludes once every probe
  has answered and the working set has made no new peak for a quiet spell (as
  long as the learner's, ``window_records.QUIET_S`` or half the ramp so far), or, for
  memory built inside the request, once a look a sample interval after the
  probes' responses finds it all there (their growth reached 90 % of the guessed
  reserve at the response) and still no new peak.
- The evidence: the window's growth per probe. A clean window (no other session
  admitted, none ended) closes the learner's episode at once, so the route is
  learned; otherwise the growth per probe is a *provisional* footprint, used until
  the learner has one. Memory freed meanwhile could hide part of a probe's memory,
  so a window in which a session ended never concludes below the guessed reserve;
  other sessions' growth only makes the footprint larger, the safe side.
- While a window is open, growth per probe beyond the guessed reserve raises the
  route's estimate at once (the reserve the latch uses with it).
- One route is probed at a time: a route not probed yet waits while another route's
  probes ramp (for at most ``SOLO_S``), so that neither's growth is taken for the
  other's; sessions of routes already known are admitted meanwhile.
- A probe that opened nothing (an error answer, a failure before its response)
  frees its slot, and the next waiter becomes a probe; a probe whose session ended
  concludes its window with what it showed.
- The windows (``probe_window.py``) are in this process (``probe_store.py``) or, with
  ``ADMISSION_SHARED_DIR``, in a file the workers share (``shared_probes.py``), so
  the number of probes is counted container-wide. Everything here runs inside the
  ledger's critical section.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Iterable
from typing import Final, Literal

from asgi_admission._admission.reservations.learning import RouteEstimate, SessionLearner
from asgi_admission._admission.reservations.probe_store import LocalProbeStore, ProbeStore
from asgi_admission._admission.reservations.probe_window import (
    Probe,
    ProbeStatus,
    ProbeWindow,
    describe,
)
from asgi_admission._admission.reservations.settle_queue import VISIBLE_FRACTION
from asgi_admission._admission.reservations.window_records import HORIZON_S

#: At most this many routes are probed at once; others are decided on their reserve.
MAX_WINDOWS: Final = 64
#: A route not probed yet waits while another route's probes are younger than this
#: (the longest a learner's window watches), and is probed beside them after it.
SOLO_S: Final = HORIZON_S
#: How long a shared window stays in the file once concluded, so that the other
#: workers take in its footprint before what was learned reaches them.
CONCLUDED_KEEP_S: Final = 60.0

#: ``known``: decide on the estimate; ``probe``: admit as a probe; ``hold``: wait.
Gate = Literal["known", "probe", "hold"]


class ProbeBoard:
    """The probes of every route not learned yet, and what they showed.

    ``on_wake(route)`` is told when the requests waiting for ``route`` may go on (its
    evidence is in, or a probe's slot is free); ``waiting(route)`` says how many wait
    in this process. Not thread-safe on its own: the keeper calls it inside the
    ledger's lock. ``version`` changes whenever :meth:`estimates` does.
    """

    __slots__ = (
        "_concluded",
        "_on_wake",
        "_pid",
        "_raised",
        "_store",
        "_waiting",
        "_windows",
        "own",
        "probe_sessions",
        "timeout_s",
        "version",
    )

    def __init__(
        self,
        *,
        probe_sessions: int,
        timeout_s: float,
        store: ProbeStore | None = None,
        on_wake: Callable[[str], None] = lambda route: None,
        waiting: Callable[[str], int] = lambda route: 0,
    ) -> None:
        self.probe_sessions = probe_sessions
        self.timeout_s = timeout_s
        self._store: ProbeStore = store if store is not None else LocalProbeStore()
        self._on_wake = on_wake
        self._waiting = waiting
        self._windows: dict[str, ProbeWindow] = self._store.load() or {}
        #: This process's probes in open windows: their sequence number and route.
        self.own: dict[int, str] = {}
        #: Concluded windows' provisional footprints, until the learner has one (``None``:
        #: nothing beyond the guess was seen, and the route is decided on its reserve).
        self._concluded: dict[str, RouteEstimate | None] = {}
        #: Open windows whose growth per probe passed the guessed reserve.
        self._raised: dict[str, RouteEstimate] = {}
        self._pid = os.getpid()
        self.version = 0

    @property
    def shared(self) -> bool:
        return self._store.shared

    @property
    def busy(self) -> bool:
        """Whether readings matter here: this process has probes, or saw a window open."""
        if self.own:
            return True
        # Asked on every admission: most often there is no window at all.
        return bool(self._windows) and any(w.open for w in self._windows.values())

    # -- the decision ----------------------------------------------------------------

    def gate(self, route: str, now: float) -> Gate:
        """How to decide one more session of ``route``, which the learner does not know."""
        if route in self._concluded:
            return "known"
        self._load(now)
        window = self._windows.get(route)
        if window is None:
            if len(self._windows) >= MAX_WINDOWS:
                return "known"
            # One route at a time: another route's probes ramping in this one's window
            # would be taken for its own, and its probes in theirs.
            return "hold" if self._probing_other(route, now) else "probe"
        if window.open and now - window.started_at >= self.timeout_s:
            self._conclude(window, now, timed_out=True)
            self._save()
        if not window.open:
            self._take(window)
            return "known"
        return "probe" if len(window.probes) < self.probe_sessions else "hold"

    def _probing_other(self, route: str, now: float) -> bool:
        """Whether another route's probes are still ramping (for at most ``SOLO_S``)."""
        return any(
            w.open and w.route != route and now - w.started_at < SOLO_S
            for w in self._windows.values()
        )

    def add(self, route: str, seq: int, used_bytes: int, guess_bytes: int, now: float) -> None:
        """Session ``seq`` of this process was admitted as a probe of ``route``."""
        window = self._windows.get(route)
        if window is None or not window.open:
            window = self._windows[route] = ProbeWindow(
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
            window.see(used_bytes, now)
            window.last_event_at = now
        window.probes.append(Probe(self._pid, seq))
        window.admitted += 1
        self.own[seq] = route
        self._save()

    def other_admitted(self, now: float) -> None:
        """A session that is no probe was admitted: its growth mixes into open windows."""
        self._mark(now, "mixed")

    def session_ended(self, now: float) -> None:
        """A session ended somewhere: memory freed in open windows may hide probes'."""
        self._mark(now, "ended")

    def _mark(self, now: float, flag: Literal["mixed", "ended"]) -> None:
        self._load(now)
        changed = False
        for window in self._windows.values():
            if window.open and not getattr(window, flag):
                setattr(window, flag, True)
                changed = True
        if changed:
            self._save()

    # -- the probes' events ------------------------------------------------------------

    def responded(self, seq: int, used_bytes: int | None, now: float) -> None:
        """Probe ``seq`` answered (its response ended, or its WebSocket was accepted)."""
        window, probe = self._find(seq, now)
        if window is None or probe is None:
            return
        probe.responded = True
        window.last_event_at = now
        if used_bytes is not None:
            window.see(used_bytes, now)
        if all(p.responded for p in window.probes) and window.per_probe() >= (
            VISIBLE_FRACTION * window.guess_bytes
        ):
            window.visible_at = now
        self._raise(window)
        self._save()

    def left(self, seq: int, *, opened: bool, now: float) -> None:
        """Probe ``seq`` is over: it opened nothing (an error answer, a failure before
        its response), or (``opened``) its session ended."""
        window, probe = self._find(seq, now)
        self.own.pop(seq, None)
        if window is None or probe is None:
            return
        window.probes.remove(probe)
        if opened:
            window.ended = True
        else:
            window.admitted -= 1
        if window.probes or window.admitted <= 0:
            if not window.probes:
                # Nothing to learn from: the next waiter becomes a probe.
                del self._windows[window.route]
                self._drop_raised(window.route)
            self._on_wake(window.route)  # a probe's slot is free
        else:
            self._conclude(window, now)  # wakes the waiters too
        self._save()

    # -- readings and what was learned ---------------------------------------------------

    def on_reading(self, used_bytes: int, now: float, learner: SessionLearner) -> None:
        """An exact working set: peaks, estimates raised at once, windows concluded."""
        self._load(now)
        changed = False
        for window in list(self._windows.values()):
            if not window.open:
                continue
            window.see(used_bytes, now)
            self._raise(window)
            changed = True
            if now - window.started_at >= self.timeout_s:
                self._conclude(window, now, timed_out=True)
            elif window.quiet(now):
                clean = not (window.mixed or window.ended)
                self._conclude(window, now, learner if clean else None)
        if changed:
            self._save()

    def learned(self, routes: Iterable[str], now: float) -> None:
        """The learner has a footprint for ``routes`` now: their windows conclude."""
        for route in routes:
            self._concluded.pop(route, None)
            self._drop_raised(route)
            window = self._windows.get(route)
            if window is not None and window.open:
                window.footprint_bytes = window.per_probe()
                window.ramp_s = window.ramp()
                window.concluded_at = now
                self._finish(window)
                self._save()
                self._on_wake(route)

    def estimates(self) -> dict[str, RouteEstimate]:
        """Provisional footprints: concluded windows, and open ones raised past their guess."""
        concluded = {r: e for r, e in self._concluded.items() if e is not None}
        return {**self._raised, **concluded}

    def concluded(self) -> dict[str, RouteEstimate | None]:
        """The routes whose windows concluded, with their provisional footprints."""
        return dict(self._concluded)

    def watched(self) -> set[str]:
        """The routes this board has a window or a provisional footprint for."""
        return {*self._windows, *self._concluded, *self._raised}

    def ready(self, routes: Iterable[str], known: Container[str], now: float) -> list[str]:
        """Of ``routes`` with requests waiting here, those that may go on now: known, or
        (another worker's probe having concluded or left) with a probe's slot free."""
        return [route for route in routes if route in known or self.gate(route, now) != "hold"]

    def retry_after_s(self, route: str, now: float) -> float:
        """How long the probes of ``route`` have been ramping (for ``Retry-After``)."""
        window = self._windows.get(route)
        return 1.0 if window is None else max(1.0, now - window.started_at)

    def status(self, now: float, *, load: bool = False) -> list[ProbeStatus]:
        """Every open window, as last seen here or (``load``, under the ledger's lock)
        as the shared file has them now."""
        if load:
            self._load(now)
        return [
            describe(window, now, self._pid, self._waiting(route))
            for route, window in self._windows.items()
            if window.open
        ]

    def after_fork(self) -> None:
        """A forked worker starts with none of its parent's probes."""
        self.own = {}
        self._pid = os.getpid()
        if not self._store.shared:
            self._store = LocalProbeStore()
            self._windows = {}

    # -- internals -----------------------------------------------------------------------

    def _find(self, seq: int, now: float) -> tuple[ProbeWindow | None, Probe | None]:
        route = self.own.get(seq)
        if route is None:
            return None, None
        self._load(now)
        window = self._windows.get(route)
        if window is None or not window.open:
            self.own.pop(seq, None)
            return None, None
        for probe in window.probes:
            if probe.pid == self._pid and probe.seq == seq:
                return window, probe
        self.own.pop(seq, None)
        return None, None

    def _raise(self, window: ProbeWindow) -> None:
        per_probe = window.per_probe()
        if per_probe > window.guess_bytes:
            known = self._raised.get(window.route)
            if known is None or known.footprint_bytes != per_probe:
                self._raised[window.route] = RouteEstimate(
                    window.route, per_probe, window.ramp(), 0
                )
                self.version += 1

    def _drop_raised(self, route: str) -> None:
        if self._raised.pop(route, None) is not None:
            self.version += 1

    def _conclude(
        self,
        window: ProbeWindow,
        now: float,
        learner: SessionLearner | None = None,
        *,
        timed_out: bool = False,
    ) -> None:
        """The window's evidence is in. A clean window closes the learner's episode (the
        route is learned); otherwise its growth per probe is a provisional footprint,
        never below the guess where a session ended meanwhile or the window timed out."""
        footprint = window.per_probe()
        if learner is None or not learner.close_episode(window.route):
            if window.ended or timed_out:
                footprint = max(footprint, window.guess_bytes)
            self._concluded[window.route] = _provisional(window, footprint, window.ramp())
            self.version += 1
        window.footprint_bytes = footprint
        window.ramp_s = window.ramp()
        window.concluded_at = now
        self._drop_raised(window.route)
        self._finish(window)
        self._on_wake(window.route)

    def _finish(self, window: ProbeWindow) -> None:
        for probe in window.probes:
            if probe.pid == self._pid:
                self.own.pop(probe.seq, None)
        window.probes = []
        if not self._store.shared:
            # In one process the estimate lives on in _concluded (or the learner).
            self._windows.pop(window.route, None)

    def _take(self, window: ProbeWindow) -> None:
        """Another worker's concluded window: its footprint is provisional here."""
        assert window.footprint_bytes is not None
        self._concluded[window.route] = _provisional(window, window.footprint_bytes, window.ramp_s)
        self._drop_raised(window.route)
        self.version += 1

    def _load(self, now: float) -> None:
        if not self._store.shared:
            return
        windows = self._store.load()
        if windows is None:
            return  # unusable for now (logged once): the windows last seen stand
        dead = False
        for route, window in list(windows.items()):
            if not window.open:
                if window.concluded_at is not None and now - window.concluded_at > CONCLUDED_KEEP_S:
                    del windows[route]
                continue
            alive = [p for p in window.probes if self._store.owner_alive(p.pid)]
            if len(alive) != len(window.probes):
                dead = True
                # A worker that died took its sessions' memory with it.
                window.admitted -= len(window.probes) - len(alive)
                window.probes = alive
                if not alive:
                    del windows[route]
                    self._drop_raised(route)
        self._windows = windows
        # This worker's probes that another worker's pass concluded are watched no more.
        watched = {
            p.seq for w in windows.values() if w.open for p in w.probes if p.pid == self._pid
        }
        self.own = {seq: route for seq, route in self.own.items() if seq in watched}
        if dead:
            self._save()

    def _save(self) -> None:
        for route, window in self._windows.items():
            here = self._waiting(route)
            if here:
                window.waiting[self._pid] = here
            else:
                window.waiting.pop(self._pid, None)
        self._store.store(self._windows)


def _provisional(window: ProbeWindow, footprint: int, ramp_s: float) -> RouteEstimate | None:
    """A concluded window's provisional estimate; ``None`` where it is only the guess."""
    if footprint == window.guess_bytes:
        return None
    return RouteEstimate(window.route, footprint, ramp_s, 0)
