"""Learning what one session costs: its footprint and its ramp time, per route.

Notes:

- Evidence comes from all traffic, not only from quiet spells. Each admitted session
  is watched over a window of the working set taken as growth alone (memory freed in
  a step, at a session's end or later, is left out; ``session_windows.py``). A window
  that other sessions' ramps overlapped is one equation among many: the footprints of
  all routes are fitted to the recent windows together (``attribution.py``), and the
  ramps to every step of the growth series (``ramp_profile.py``).
- Conservative: a route's footprint is a high percentile of what its windows and
  sessions say, the safe side for a reserve (``footprints.py``); its ramp time, a high
  percentile of the ramps recorded.
- Bounded and forgetting: the last ``WINDOW`` windows, ends and peaks per route, at
  most ``MAX_ROUTES`` routes. Sessions change when the app does, so an old footprint
  fades out as new sessions are observed rather than at once.
- The observations are what the workers share (``learned_file.LearnedStore``), each
  worker fitting all of them; the ramp profile is each worker's own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal, TypedDict

from asgi_admission._admission.reservations.attribution import Fit, Overlap, Window, fit
from asgi_admission._admission.reservations.footprints import end_floors, footprint, percentile
from asgi_admission._admission.reservations.ramp_profile import RampProfiles
from asgi_admission._admission.reservations.session_windows import GrowthWindows
from asgi_admission._admission.reservations.window_records import (
    HORIZON_S,
    ClosedWindow,
    window_length,
)
from asgi_admission._config import Learning

WINDOW: Final = 32
MAX_ROUTES: Final = 64
#: The ramp assumed of a route's sessions before any is learned: long, so that less of
#: them is taken to have arrived in another session's window (the safe side).
_UNKNOWN_RAMP_S: Final = HORIZON_S / 2
#: A linear ramp reaches 90 % of its memory at this share of its length.
_RAMP_POINT: Final = 0.9


class RouteObservations(TypedDict):
    """What was observed of one route, as the shared file holds it."""

    #: Per-session footprints: the watchdog's peaks (and values of earlier releases).
    footprints: list[float]
    #: Ramp times observed other than by windows (earlier releases).
    ramps: list[float]
    #: Memory freed at one session's end, in a step in which nothing else ramped.
    ends: list[float]
    #: Exact per-session peaks: a session's own memory group (no attribution needed).
    exact: list[float]
    windows: list[Window]


Observations = dict[str, RouteObservations]


@dataclass(frozen=True, slots=True)
class RouteEstimate:
    """What the guard learned of one route's sessions."""

    route: str
    footprint_bytes: int
    ramp_s: float
    observations: int


def empty_observations() -> RouteObservations:
    return {"footprints": [], "ramps": [], "ends": [], "exact": [], "windows": []}


class _Route:
    __slots__ = ("ends", "exact", "footprints", "live", "ramps", "windows")

    def __init__(self) -> None:
        self.footprints: deque[float] = deque(maxlen=WINDOW)
        self.ramps: deque[float] = deque(maxlen=WINDOW)
        self.ends: deque[float] = deque(maxlen=WINDOW)
        self.exact: deque[float] = deque(maxlen=WINDOW)
        self.windows: deque[Window] = deque(maxlen=WINDOW)
        #: Sessions admitted here and not seen ended (fractions: ends of unknown route).
        self.live = 0.0

    def load(self, values: RouteObservations) -> None:
        self.footprints.extend(values["footprints"])
        self.ramps.extend(values["ramps"])
        self.ends.extend(values["ends"])
        self.exact.extend(values["exact"])
        self.windows.extend(values["windows"])


class SessionLearner:
    """Per-route footprints and ramp times from readings, session events and peaks.

    Pure and clock-free: times are the caller's. Not thread-safe on its own: the guard
    calls it inside the ledger's lock. ``timeout_s`` (the pending timeout) bounds a
    window's length.
    """

    __slots__ = (
        "_estimates",
        "_fits",
        "_new",
        "_profiles",
        "_ramps",
        "_routes",
        "_windows",
        "version",
    )

    def __init__(self, *, timeout_s: float = 120.0) -> None:
        self._routes: dict[str, _Route] = {}
        self._windows = GrowthWindows(horizon_s=timeout_s)
        self._profiles = RampProfiles()
        #: Observations made here and not yet handed to the shared file.
        self._new: Observations = {}
        #: Bumped by every change of the observations, so callers can tell (a plain
        #: attribute: the decision path compares it).
        self.version = 0
        self._estimates: dict[str, RouteEstimate] = {}
        self._fits: dict[str, Fit] = {}
        #: Ramp times recorded in the observations (the shared file's included).
        self._ramps: dict[str, float] = {}

    @property
    def observing(self) -> bool:
        """Whether readings are wanted: a window is open or a session it admitted lives
        (its end frees memory worth seeing)."""
        return self._windows.open > 0 or any(r.live > 0 for r in self._routes.values())

    @property
    def open_windows(self) -> int:
        """How many admitted sessions are still being watched."""
        return self._windows.open

    # -- events --------------------------------------------------------------------------

    def on_admit(
        self, route: str, used_bytes: int | None, now: float, *, responded: bool = True
    ) -> None:
        """A session of ``route`` was admitted at working set ``used_bytes``;
        ``responded=False``: its response is still to come (:meth:`on_response`), and its
        window stays open until then."""
        state = self._route(route)
        if state is None:
            return
        state.live += 1
        self._profiles.admitted(route)
        self._windows.admit(route, used_bytes, now, self._expected, responded=responded)

    def on_response(self, admitted_at: float, now: float) -> None:
        """The session admitted at ``admitted_at`` answered (or accepted its WebSocket)."""
        self._windows.respond(admitted_at, now)

    def on_failed(self, admitted_at: float) -> None:
        """The session admitted at ``admitted_at`` opened nothing (an error answer):
        it is forgotten."""
        route = self._windows.failed(admitted_at)
        state = None if route is None else self._routes.get(route)
        if state is not None:
            state.live = max(0.0, state.live - 1)

    def on_session_end(
        self,
        now: float,
        *,
        route: str | None = None,
        admitted_at: float | None = None,
        count: int = 1,
    ) -> None:
        """``count`` sessions ended by ``now``: of ``route`` (admitted at ``admitted_at``)
        where the caller knows, else shared among the routes with sessions open."""
        if route is not None:
            state = self._routes.get(route)
            if state is not None:
                state.live = max(0.0, state.live - count)
                for _ in range(count):
                    self._windows.end(route, 1.0, now, admitted_at)
            return
        open_routes = [(name, state) for name, state in self._routes.items() if state.live > 0]
        total = sum(state.live for _name, state in open_routes)
        for name, state in open_routes:
            weight = min(state.live, count * state.live / total)
            state.live -= weight
            self._windows.end(name, weight, now, None)

    def on_foreign_end(self) -> None:
        """Another worker's session ended (a shared ledger's count fell): what the next
        reading shows freed is not only this worker's."""
        self._windows.foreign_end()

    def on_reading(self, used_bytes: int, now: float, *, others: tuple[float, ...] = ()) -> None:
        """An exact working set; may close windows and record observations. ``others``:
        when the other workers' sessions still settling were admitted (a shared ledger)."""
        if others:
            # Their routes are not known here: each may ramp as long as the longest.
            ramps = (self._expected(route)[1] for route in self._routes)
            self._windows.others(others, now, max(ramps, default=_UNKNOWN_RAMP_S))
        closed, freed, step = self._windows.reading(used_bytes, now, self._expected, self._length)
        if step is not None:
            known = {route: self._expected(route) for route in self._fits}
            sessions = self._windows.sessions()
            self._profiles.step(step.growth, step.start, step.end, sessions, known, seen=step.seen)
        for window in closed:
            self._add_window(window)
        for drop in freed:
            state = self._routes.get(drop.route)
            if state is not None:
                value = float(round(drop.bytes_per_session))
                state.ends.append(value)
                self._new.setdefault(drop.route, empty_observations())["ends"].append(value)
        if closed or freed:
            self._changed()

    def close_episode(self, route: str) -> bool:
        """A probe of ``route`` saw its memory stop growing (``probing.py``): the route's
        open windows close now; whether the route has a footprint learned."""
        closed = self._windows.close_route(route, self._expected, self._length)
        for window in closed:
            self._add_window(window)
        if closed:
            self._changed()
        return route in self._estimates

    def observe(
        self,
        route: str,
        *,
        footprint_bytes: int,
        ramp_s: float | None = None,
        exact: bool = False,
    ) -> None:
        """One per-session observation of ``route`` (the watchdog's peaks); ``exact``: the
        session's own memory group's peak, which needs no attribution."""
        state = self._route(route)
        if state is None:
            return
        value = float(max(0, int(footprint_bytes)))
        key: Literal["exact", "footprints"] = "exact" if exact else "footprints"
        (state.exact if exact else state.footprints).append(value)
        new = self._new.setdefault(route, empty_observations())
        new[key].append(value)
        if ramp_s is not None:
            ramp = max(0.0, float(ramp_s))
            state.ramps.append(ramp)
            new["ramps"].append(ramp)
        self._changed()

    # -- estimates -----------------------------------------------------------------------

    def estimate(self, route: str) -> RouteEstimate | None:
        """What was learned of ``route``; ``None`` before its first observation."""
        return self._estimates.get(route)

    def routes(self) -> set[str]:
        """The routes with at least one observation."""
        return set(self._estimates)

    def estimates(self) -> list[RouteEstimate]:
        return [self._estimates[route] for route in sorted(self._estimates)]

    # -- sharing -------------------------------------------------------------------------

    def take_new(self) -> Observations:
        """The observations made since the last call, per route."""
        new, self._new = self._new, {}
        return new

    def observations(self) -> Observations:
        """Everything this learner holds, in the shape of the shared file."""
        return {
            route: {
                "footprints": list(state.footprints),
                "ramps": list(state.ramps),
                "ends": list(state.ends),
                "exact": list(state.exact),
                "windows": list(state.windows),
            }
            for route, state in self._routes.items()
            if state.footprints or state.ramps or state.ends or state.exact or state.windows
        }

    def merge(self, observations: Observations) -> None:
        """Replace this learner's observations with the shared file's (already merged)."""
        if observations == self.observations():
            return
        routes: dict[str, _Route] = {}
        for route, values in list(observations.items())[:MAX_ROUTES]:
            routes[route] = _Route()
            routes[route].load(values)
        # Sessions this worker has open are still open.
        for route, old in self._routes.items():
            if old.live > 0:
                if route not in routes and len(routes) < MAX_ROUTES:
                    routes[route] = _Route()
                if route in routes:
                    routes[route].live = old.live
        self._routes = routes
        self._changed()

    # -- internals -----------------------------------------------------------------------

    def _route(self, route: str) -> _Route | None:
        state = self._routes.get(route)
        if state is None and len(self._routes) < MAX_ROUTES:
            state = self._routes[route] = _Route()
        return state

    def _ramp_s(self, route: str) -> float | None:
        # Learned here from every step, else what the observations record.
        learned = self._profiles.ramp_s(route)
        return self._ramps.get(route) if learned is None else learned

    def _expected(self, route: str) -> tuple[float, float]:
        """A session's known footprint (0 while not known) and its ramp's length."""
        ramp_s = self._ramp_s(route)
        known = self._fits.get(route)
        footprint = known.footprint if known is not None and known.determined else 0.0
        return footprint, _UNKNOWN_RAMP_S if ramp_s is None else ramp_s / _RAMP_POINT

    def _length(self, route: str) -> float | None:
        return window_length(self._ramp_s(route))

    def _add_window(self, closed: ClosedWindow) -> None:
        state = self._routes.get(closed.route)
        if state is None:
            return
        # A window other sessions ramped in before its own growth was over cannot time
        # it: it records the ramp learned from every step, if there is one yet.
        ramp_s = closed.ramp_s if closed.ramp_s is not None else self._profiles.ramp_s(closed.route)
        window = Window(
            growth=float(round(closed.growth)),
            seconds=round(closed.seconds, 3),
            ramp_s=None if ramp_s is None else round(ramp_s, 3),
            overlaps=tuple(
                Overlap(
                    o.route,
                    round(o.share, 4),
                    round(o.least, 4),
                    float(round(o.seen)),
                    round(o.seen_share, 4),
                )
                for o in closed.overlaps
            ),
            exact=closed.exact,
        )
        state.windows.append(window)
        self._new.setdefault(closed.route, empty_observations())["windows"].append(window)

    def _changed(self) -> None:
        self.version += 1
        self._fits = fit({route: state.windows for route, state in self._routes.items()})
        floors = end_floors(self._routes)
        self._estimates = {}
        self._ramps = {}
        for route, state in self._routes.items():
            found = footprint(route, state, self._fits, floors)
            if found is None:
                continue
            ramps = [w.ramp_s for w in state.windows if w.ramp_s is not None] + list(state.ramps)
            if ramps:
                self._ramps[route] = percentile(ramps)
            ramp_s = self._ramp_s(route)
            if ramp_s is None:
                # Not learned yet: settling waits no longer than the evidence allows.
                ramp_s = self._profiles.bound_s(route)
            self._estimates[route] = RouteEstimate(
                route=route,
                footprint_bytes=int(found.size_bytes),
                # Not learned yet: the longest a session's memory is waited for.
                ramp_s=self._windows.horizon_s if ramp_s is None else ramp_s,
                observations=found.observations,
            )


def effective_reserve(
    configured_bytes: int, learned: Iterable[RouteEstimate], *, mode: Learning, min_bytes: int
) -> int:
    """The reserve the latch uses: the configured one, raised or replaced by what was learned.

    ``raise``: the greater of the configured reserve and the largest learned
    footprint (a reserve too small is the dangerous mistake). ``adapt``: the
    largest learned footprint, never below ``min_bytes``. ``off`` (or nothing
    learned yet): the configured reserve.
    """
    if mode == "off":
        return configured_bytes
    largest = max((estimate.footprint_bytes for estimate in learned), default=None)
    if largest is None:
        return configured_bytes
    if mode == "raise":
        return max(configured_bytes, largest)
    return max(min_bytes, largest)
