"""Learning what one session costs: its route's footprint and its ramp time.

From each session's measured memory where it is measured, and otherwise from the working set's
growth while sessions are admitted and end. (docs/reservations.md)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypedDict, TypeVar

from asgi_admission._admission.reservations.settling import builds_in_request
from asgi_admission._config import Learning

# --------------------------------------------------------------------------------------
# What one session's window says of its footprint: when it measures its session, and
# the bound it sets otherwise (``attributed``), are told in docs/reservations.md,
# "Learning what a session costs" (why ``typical`` is a median, not a model fitted to
# overlapping windows: bench/README.md, "The sixteenth session: which learning mechanisms
# earn their place").

#: How fast memory is taken to drift down for other reasons, at most, over a window.
DRIFT_BYTES_PER_S: Final = 256 * 1024
#: Clean values a route needs for a typical size where none is a window (``typical``).
MIN_OWN: Final = 2


@dataclass(frozen=True, slots=True)
class Overlap:
    """Other sessions of one route in a window."""

    route: str
    #: How much of their footprints is expected to have arrived in the window, by their
    #: learned ramps (in footprints), and the least that may have, ramps varying.
    share: float
    least: float
    #: What those of them that ramped alone inside the window were seen to add (bytes),
    #: and how much of ``least`` they are.
    seen: float = 0.0
    seen_share: float = 0.0


@dataclass(frozen=True, slots=True)
class Window:
    """One session's window: its ``growth`` is its own footprint plus what the sessions
    in ``overlaps`` added in it."""

    #: What the growth series rose by over the window (bytes).
    growth: float
    #: How long the window was (seconds).
    seconds: float
    #: Seconds from admission until the session's own growth reached 90 % of its peak,
    #: ``None`` where sessions of unknown routes ramped in the window too.
    ramp_s: float | None
    #: The other sessions in the window, per route.
    overlaps: tuple[Overlap, ...]
    #: Every route in ``overlaps`` had a learned ramp (else the shares are lower
    #: bounds); with no ``overlaps``, it was alone and its growth seen in every step.
    exact: bool


def attributed(route: str, window: Window, typical: Mapping[str, float]) -> float:
    """What ``window``'s session of ``route`` added, at most: its window's growth less
    the least the others can have added, and more for memory that may have drifted down
    (docs/reservations.md, "Learning what a session costs")."""
    others = 0.0
    own = 0.0
    for overlap in window.overlaps:
        least = typical.get(overlap.route, 0.0)
        if overlap.route == route and least <= 0:
            # Its own route's other sessions, not known yet: those seen alone are taken
            # at what they were seen to add, the others share what is left equally.
            others += overlap.seen
            own += max(0.0, overlap.least - overlap.seen_share)
        else:
            others += max(overlap.least * least, overlap.seen)
    # Memory drifting down over the window may have hidden some of the session's.
    allowance = DRIFT_BYTES_PER_S * window.seconds
    return max(0.0, window.growth + allowance - others) / (1.0 + own)


# --------------------------------------------------------------------------------------
# A route's footprint: the conservative bound everything observed of it allows (how, in
# docs/reservations.md, "Learning what a session costs"; exact peaks, of memory groups
# of their own, replace all else). Pure: the learner hands in what it holds of each
# route and ``typical`` of all routes.

PERCENTILE: Final = 0.9
#: Windows that knew every other session's ramp a route needs before its bound comes
#: from those alone.
MIN_EXACT_WINDOWS: Final = 4
#: Beside windows, per-session values (memory freed at ends, the watchdog's peaks) raise
#: a route's estimate only once there are this many: one drop that other memory freed
#: in the same moment must not (their median needs two of three to say more).
MIN_PER_SESSION: Final = 3


@dataclass(frozen=True, slots=True)
class Footprint:
    """A route's footprint and how many observations it rests on."""

    size_bytes: float
    observations: int


def percentile(values: Iterable[float], share: float = PERCENTILE) -> float:
    """The nearest-rank ``share`` percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


def _alone(state: _Route) -> list[float]:
    """The growth of the route's exact windows with nothing else in them (``Window.exact``)."""
    return [max(0.0, w.growth) for w in state.windows if w.exact and not w.overlaps]


def _clean(state: _Route) -> list[float]:
    """The route's clean values: memory freed at its sessions' ends, and its windows
    with nothing else in them."""
    return [*state.ends, *_alone(state)]


def typical(routes: Mapping[str, _Route]) -> dict[str, float]:
    """What one session of each route typically adds (the median of its clean values):
    no more than that is taken from another session's window for it. A route has one
    from its first window with nothing else in it; from ends alone, from its second
    (``MIN_OWN``): one end's drop may hold other memory freed in the same moment, and
    taken from others' windows, too much would make their sessions look smaller."""
    found: dict[str, float] = {}
    for route, state in routes.items():
        alone = _alone(state)
        clean = [*state.ends, *alone]  # _clean(state), its windows read once
        if alone or len(clean) >= MIN_OWN:
            found[route] = percentile(clean, 0.5)
    return found


def footprint(route: str, state: _Route, typical: Mapping[str, float]) -> Footprint | None:
    """``route``'s footprint from what ``state`` holds of it and what the sessions of
    every route typically add; ``None`` before its first observation."""
    per_session = [*state.footprints, *state.ends]
    if not state.windows and not per_session and not state.exact:
        return None
    size = 0.0
    if state.exact:
        # Sessions in memory groups of their own: their peaks are their cost.
        size = percentile(state.exact)
        per_session = []
    elif state.windows:
        # Windows made while another route's ramp was not known yet take its
        # share as a lower bound: once enough windows know every ramp in them,
        # the bound comes from those alone.
        exact = [w for w in state.windows if w.exact]
        windows = exact if len(exact) >= MIN_EXACT_WINDOWS else state.windows
        size = percentile(attributed(route, w, typical) for w in windows)
        # Other sessions' growth inflates the bounds: what its sessions showed with
        # nothing else ramping caps them (one such session is already a measure), else
        # what its probes grew by with the route's others waiting (other routes' sessions
        # may have grown in that too, so it never outweighs a clean value).
        caps = _clean(state) or list(state.probed)
        if caps:
            size = min(size, percentile(caps))
    if per_session and (not state.windows or len(per_session) >= MIN_PER_SESSION):
        # Alone, the per-session values' high percentile; beside windows, they
        # raise the estimate where most of them say more.
        share = 0.5 if state.windows else PERCENTILE
        size = max(size, percentile(per_session, share))
    return Footprint(
        size_bytes=size,
        observations=len(state.windows) + len(per_session) + len(state.exact),
    )


# --------------------------------------------------------------------------------------
# What the growth windows keep per session, and what a closed window says (the series
# and the windows' rules are further down).

#: A step that fell by more than this freed memory (its growth is carried on instead).
FREE_STEP_BYTES: Final = 2 * 1024 * 1024
#: Readings further apart than this make no step: windows open across the gap are dropped.
MAX_STEP_S: Final = 1.0
#: The longest window (memory arriving later than this is not counted as the session's).
HORIZON_S: Final = 8.0
#: A window closes once its session's growth has made no new peak for this long.
QUIET_S: Final = 1.0
#: A route with a learned ramp is watched for this many ramps, and ``RAMP_PAD_S`` more.
RAMP_WINDOWS: Final = 1.5
RAMP_PAD_S: Final = 0.5
#: The window of a route that builds its sessions inside the request
#: (``settling.builds_in_request``): watched only a little past its response, so that what
#: other sessions add meanwhile is not taken for its session's.
MIN_WINDOW_S: Final = 0.3
#: How much shorter and longer than learned other sessions' ramps are taken to be at
#: most, for what is taken away from a session's growth.
RAMP_SPREAD: Final = (0.5, 1.5)
#: At most this many windows open at once, and this many admissions remembered: a
#: reading passes over the admissions for each open window, on the event loop. More
#: admissions within ``2 x HORIZON_S`` (over 6 a second) are too many to tell one
#: session's growth from the others' anyway.
MAX_OPEN: Final = 32
MAX_RECENT: Final = 96
#: A new peak must beat the last by this much, or by ``PEAK_SHARE`` of it: memory
#: drifting up for other reasons must not keep a finished session's window open.
PEAK_STEP: Final = 1024 * 1024
PEAK_SHARE: Final = 0.05

#: What a route's session is expected to add and over how long: ``(bytes, ramp length
#: in seconds)``, bytes 0 while its footprint is not known.
Expected = Callable[[str], tuple[float, float]]
#: A route's learned ramp in seconds, ``None`` while it is not learned.
Ramps = Callable[[str], float | None]


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """One admitted session's window with its route, before the learner records it as a
    :class:`Window`; ``ramp_s`` is ``None`` where another session ramped in it before
    its own had."""

    route: str
    growth: float
    seconds: float
    ramp_s: float | None
    overlaps: tuple[Overlap, ...]
    exact: bool


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the growth series."""

    growth: float
    start: float
    end: float
    #: The growth was seen, not carried over a step in which memory was freed.
    seen: bool = True


@dataclass(frozen=True, slots=True)
class Freed:
    """Memory freed in one step in which sessions of one route were reported ended."""

    route: str
    bytes_per_session: float


def ramp_share(ramp_length_s: float, age_s: float) -> float:
    """The share of a session's memory there ``age_s`` after its admission (linear ramp)."""
    if age_s <= 0:
        return 0.0
    if ramp_length_s <= 0 or age_s >= ramp_length_s:
        return 1.0
    return age_s / ramp_length_s


# eq=False: ``failed`` removes this admission from the recent ones, not an equal one.
@dataclass(slots=True, eq=False)
class Admission:
    route: str
    at: float
    #: When its response ended or its WebSocket was accepted (``None``: not yet).
    responded: float | None
    #: When it was reported ended (its ramp stops there), or ``None``.
    ended: float | None = None
    #: What its window saw it add while no other session ramped, and until when.
    seen: float = 0.0
    seen_until: float | None = None

    def share(self, ramp_length_s: float, when: float) -> float:
        until = when if self.ended is None else min(when, self.ended)
        return ramp_share(ramp_length_s, until - self.at)


@dataclass(slots=True, eq=False)
class OpenWindow:
    """One admitted session's window while it is open: its own growth so far, and what
    else may have grown in it."""

    admission: Admission
    #: When it opened: the reading before its admission.
    start: float
    #: The growth series there.
    base: float
    #: When its own growth last made a new peak (at first, its admission).
    peak_at: float
    #: No session of unknown footprint ramped in it: it may close once quiet.
    clean: bool = True
    #: Another worker's session may have ramped in it (see the module notes).
    crowded: bool = False
    #: A step in it freed memory: its growth there is a guess (carried over).
    guessed: bool = False
    #: No other session has ramped in it (yet).
    alone: bool = True
    #: Its ramp, where its own growth had stopped before another session came.
    own_ramp: float | None = None
    #: Readings since its own growth last made a new peak.
    quiet: int = 0
    #: The most readings there were between two of its new peaks.
    pauses: int = 0
    #: The most its own growth has reached.
    peak: float = 0.0
    #: Its new peaks: when, and its own growth then.
    peaks: list[tuple[float, float]] = field(default_factory=list)

    def ramp_s(self) -> float:
        """Seconds from admission until the growth first reached 90 % of its peak."""
        reached = 0.9 * self.peak
        at = next((t for t, grown in self.peaks if grown >= reached), self.peak_at)
        return max(0.0, at - self.admission.at)

    def rises(self, mine: float) -> bool:
        """Whether its own growth ``mine`` makes a new peak: a step above the last new peak
        (not the highest reading since: growth that comes slowly, a little each step,
        still makes new peaks)."""
        last_peak = self.peaks[-1][1] if self.peaks else 0.0
        return mine > last_peak + max(PEAK_STEP, PEAK_SHARE * last_peak)

    def had_stopped(self, rising: bool) -> bool:
        """Whether its own growth had stopped before this reading's company came: quiet
        for two readings at least (this one counted unless ``rising``), more than it
        ever paused between two new peaks."""
        quiet = self.quiet + (0 if rising else 1)
        return bool(self.peaks) and quiet >= 2 and quiet > self.pauses

    def company_came(self, known: bool, rising: bool, step_start: float) -> None:
        """Other sessions may be ramping in it in the step that began at ``step_start``
        (``known``: all of known footprint). It is alone no more: its ramp is not its
        own. Unless they are known it is clean no more: its growth cannot be told apart,
        it does not close when quiet. If its own growth had stopped, that ramp and that
        growth stay its own, whatever the others add from now on."""
        if self.alone and self.had_stopped(rising):
            self.own_ramp = self.ramp_s()
            self.admission.seen, self.admission.seen_until = self.peak, step_start
        self.alone = False
        self.clean = self.clean and known

    def grew(self, mine: float, rising: bool, now: float) -> None:
        """Its own growth was ``mine`` at the reading at ``now`` (``rising``: a new peak)."""
        if rising:
            if self.peaks:
                self.pauses = max(self.pauses, self.quiet)
            self.quiet = 0
            self.peak_at = now
            self.peaks.append((now, mine))
        else:
            self.quiet += 1
        self.peak = max(self.peak, mine)

    def quiet_spell(self, responded: float, now: float) -> bool:
        """Whether its own growth has been quiet since its last new peak and its response
        (``responded``) for half as long as it took to rise, ``QUIET_S`` at least: before
        its route's ramp is learned, the sign that its memory has come."""
        spell = max(QUIET_S, 0.5 * (self.peak_at - self.admission.at))
        return now - max(self.peak_at, responded) >= spell

    def timed_ramp(self) -> float | None:
        """Its ramp where no other session's hid it: measured if it was alone, else the
        one it kept when company came (``None``: another ramped in it before its own had
        stopped)."""
        return self.ramp_s() if self.alone else self.own_ramp

    def measures(self) -> bool:
        """Whether its growth measures its session where no other session is in it by
        the learned ramps: it was alone, and its growth was seen in every step (not
        carried over memory freed)."""
        return self.alone and not self.guessed


def share_between(admission: Admission, ramp_length_s: float, start: float, end: float) -> float:
    return admission.share(ramp_length_s, end) - admission.share(ramp_length_s, start)


def window_length(ramp_s: float | None) -> float | None:
    """How long a session of a route with learned ramp ``ramp_s`` is watched (``None``:
    nothing learned yet, watched until quiet)."""
    if ramp_s is None:
        return None
    if builds_in_request(ramp_s):
        return MIN_WINDOW_S
    return max(QUIET_S, RAMP_WINDOWS * ramp_s + RAMP_PAD_S)


# --------------------------------------------------------------------------------------
# The recent sessions' ramps over a span of the growth series: what they may have added.
#
# Notes:
#
# - Asked of the remembered admissions by what is known of each route now
# (``Expected``, ``Ramps``). A session's memory arrives linearly over its ramp, and
# ramps vary by ``RAMP_SPREAD``: what is taken away from one session's growth is the
# least of the others' that may have arrived, what may still grow after a free the most.


def most_added(
    recent: Iterable[Admission], start: float, end: float, expected: Expected
) -> float | None:
    """The most the recent sessions can have added from ``start`` to ``end`` by what is
    known of them (their ramps as much shorter or longer as ``RAMP_SPREAD`` allows),
    with the drift allowance; ``None`` while one that may still grow is not known."""
    total = DRIFT_BYTES_PER_S * (end - start)
    for admission in recent:
        if admission.ended is not None and admission.ended <= start:
            continue
        footprint, ramp_length_s = expected(admission.route)
        if admission.at + RAMP_SPREAD[1] * ramp_length_s + QUIET_S <= start:
            continue  # its memory has all come
        if not footprint:
            return None
        total += footprint * max(
            share_between(admission, spread * ramp_length_s, start, end)
            for spread in (*RAMP_SPREAD, 1.0)
        )
    return total


def any_ramping(recent: Iterable[Admission], now: float, expected: Expected) -> bool:
    """Whether a recent session may still be growing (within its ramp, or a quiet
    spell after it)."""
    for admission in recent:
        if admission.ended is None and now < admission.at + expected(admission.route)[1] + QUIET_S:
            return True
    return False


def others_added(
    recent: Iterable[Admission], window: OpenWindow, now: float, expected: Expected
) -> float:
    """What the other sessions are expected to have added over ``window`` so far, by
    what is known of them now (both ends alike, so that what became known meanwhile
    does not show as growth)."""
    total = 0.0
    for admission in recent:
        if admission is window.admission or admission.at >= now:
            continue
        footprint, ramp_length_s = expected(admission.route)
        if footprint and admission.at + ramp_length_s > window.start:
            total += footprint * share_between(admission, ramp_length_s, window.start, now)
    return total


def overlaps(
    recent: Iterable[Admission],
    window: OpenWindow,
    now: float,
    horizon_s: float,
    expected: Expected,
    ramps: Ramps,
) -> tuple[tuple[Overlap, ...], bool]:
    """The other sessions in ``window`` closing at ``now``, per route (by route name), and
    whether every one of their routes had a learned ramp (else a share is a lower bound)."""
    own = window.admission
    totals_by_route: dict[str, list[float]] = {}
    exact = True
    for admission in recent:
        if admission is own or admission.at > now:
            continue
        if ramps(admission.route) is None:
            # Its ramp is not learned: the least of it that can have arrived in the
            # window (none from before the window, the longest ramp from inside).
            share = 0.0
            if admission.at >= window.start:
                share = admission.share(horizon_s, now)
            least = share
            exact = exact and admission.at <= window.start - horizon_s
        else:
            _footprint, ramp_length_s = expected(admission.route)
            share = share_between(admission, ramp_length_s, window.start, now)
            # Ramps vary: the least that may have arrived, for what is taken away
            # from this session's growth (a short ramp leaves less of a session
            # from before the window, a long one less of one from inside it).
            least = min(
                share_between(admission, RAMP_SPREAD[0] * ramp_length_s, window.start, now),
                share_between(admission, RAMP_SPREAD[1] * ramp_length_s, window.start, now),
            )
        if share <= 0:
            continue
        totals = totals_by_route.setdefault(admission.route, [0.0, 0.0, 0.0, 0.0])
        totals[0] += share
        totals[1] += least
        # A session that ramped alone to its end inside the window added that much.
        inside = admission.seen_until is not None and admission.seen_until <= now
        if inside and admission.at >= window.start:
            totals[2] += admission.seen
            totals[3] += least
    found = tuple(
        Overlap(route, share, least, seen, seen_share)
        for route, (share, least, seen, seen_share) in sorted(totals_by_route.items())
    )
    return found, exact


# --------------------------------------------------------------------------------------
# How long a route's sessions take to ramp, from every step of the growth series.
#
# Notes:
#
# - Each step of the growth series, less what the other routes' known sessions are
# expected to have added in it, is regressed, per route, on how much of that route's
# recent sessions a linear ramp of each candidate length would have added, together
# with how much the sessions of the routes not known yet would have (by their own best
# ramps; their footprint a free coefficient). The candidate with the smallest squared
# error is the route's ramp: it matches when the memory really came, and sessions
# overlapping in time do not hide that, since each step counts.
# - Evidence fades per session of the route (``FADE``), so an app that changes its ramp
# is followed, and an early estimate made while other routes were unknown is outgrown.
# - Bounded: a few numbers per candidate per route, one pass over the recent sessions
# per step.

#: Ramp lengths tried, in seconds.
CANDIDATES: Final = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
#: A linear ramp reaches 90 % of its memory (a ramp time) at this share of its length.
_RAMP_POINT: Final = 0.9
#: The weight left to earlier evidence at each new session of the route.
FADE: Final = 1.0 - 1.0 / 16
#: Sessions of the route past the longest candidate before its ramp is trusted.
MIN_SESSIONS: Final = 2
#: The best candidate's error must be below this share of any far candidate's.
DECISIVE: Final = 0.75


@dataclass(slots=True, eq=False)
class _Profile:
    #: Per candidate, sums over the steps of x*x, x*u, u*u, x*y, u*y and y*y: x the
    #: route's own ramps, u the unknown routes' ramps, y the growth; each divided by
    #: ``scale``, so that fading (on every admission) touches one number. Only ratios
    #: of the sums are ever used.
    sums: list[list[float]] = field(default_factory=lambda: [[0.0] * 6 for _ in CANDIDATES])
    scale: float = 1.0
    #: Sessions of the route past the longest candidate (faded as the evidence is).
    matured: float = 0.0

    def fade(self) -> None:
        self.scale *= FADE
        self.matured *= FADE
        if self.scale < 1e-100:
            for sums in self.sums:
                for k in range(6):
                    sums[k] *= self.scale
            self.scale = 1.0

    def best(self) -> float | None:
        """The candidate with the least squared error, ``None`` before any step."""
        errors = self.errors()
        if not errors:
            return None
        return min(errors, key=lambda length: errors[length])

    def decisive(self) -> float | None:
        """The best candidate where it clearly beats every ramp half as long or half again
        as long (``DECISIVE``), else ``None``: other sessions overlapping it in ways the
        fit cannot tell apart leave the error nearly as small for a ramp far off."""
        errors = self.errors()
        if not errors:
            return None
        best = min(errors, key=lambda length: errors[length])
        far = [e for length, e in errors.items() if length < best / 1.5 or length > best * 1.5]
        if far and errors[best] > DECISIVE * min(far):
            return None
        return best

    def bound(self) -> float | None:
        """The longest candidate the evidence does not clearly rule out (its error within
        ``1 / DECISIVE`` of the best's), ``None`` before any step: where no candidate is
        decisive yet, the memory has come by then at the latest."""
        errors = self.errors()
        if not errors:
            return None
        least = min(errors.values())
        return max(length for length, e in errors.items() if DECISIVE * e <= least)

    def errors(self) -> dict[float, float]:
        """Per candidate, the squared error left by the best fit with it."""
        errors: dict[float, float] = {}
        for length, (xx, xu, uu, xy, uy, yy) in zip(CANDIDATES, self.sums, strict=True):
            if xx <= 0:
                continue
            det = xx * uu - xu * xu
            if uu > 0 and det > 1e-9 * xx * uu:
                # Least squares on both: the unknown routes' part is fitted, not assumed.
                explained = (uu * xy * xy - 2 * xu * xy * uy + xx * uy * uy) / det
            else:
                explained = xy * xy / xx
            errors[length] = yy - explained
        return errors


class RampProfiles:
    """Per route, the ramp length that best explains the growth series so far."""

    __slots__ = ("_profiles",)

    def __init__(self) -> None:
        self._profiles: dict[str, _Profile] = {}

    def admitted(self, route: str) -> None:
        """A session of ``route`` was admitted: earlier evidence fades a little."""
        profile = self._profiles.get(route)
        if profile is None:
            profile = self._profiles[route] = _Profile()
        profile.fade()

    def ramp_s(self, route: str) -> float | None:
        """The route's learned ramp time (to 90 %), ``None`` before it is trusted."""
        profile = self._profiles.get(route)
        if profile is None or profile.matured < MIN_SESSIONS:
            return None
        length = profile.decisive()
        return None if length is None else _RAMP_POINT * length

    def bound_s(self, route: str) -> float | None:
        """Before its ramp is trusted (:meth:`ramp_s`), the longest the route's sessions
        can be taking to ramp (to 90 %) by the evidence so far; ``None`` until its sessions
        have ramped past the longest candidate."""
        profile = self._profiles.get(route)
        if profile is None or profile.matured < MIN_SESSIONS:
            return None
        length = profile.bound()
        return None if length is None else _RAMP_POINT * length

    def step(
        self,
        growth: float,
        start: float,
        end: float,
        sessions: Iterable[Admission],
        expected: dict[str, tuple[float, float]],
        *,
        seen: bool = True,
    ) -> None:
        """One step of the growth series from ``start`` to ``end``: ``sessions`` are the
        recent admissions; ``expected`` the known ``(footprint, ramp length)`` of routes whose
        footprint is known (``typical``). A step whose growth was not ``seen`` (carried
        over memory freed: a guess, which says nothing of when memory came) only ages the
        sessions in it."""
        by_route: dict[str, list[Admission]] = {}
        longest = CANDIDATES[-1]
        for admission in sessions:
            # The same steps for every candidate: those within the longest ramp.
            at = admission.at
            if admission.route in self._profiles and at < end and at + longest >= start:
                by_route.setdefault(admission.route, []).append(admission)
        if not by_route:
            return
        if not seen:
            for route, rows in by_route.items():
                self._profiles[route].matured += _passed(rows, start, end)
            return
        predicted: dict[str, float] = {}
        unknown: dict[str, float] = {}
        for route, rows in by_route.items():
            footprint, ramp_length_s = expected.get(route, (0.0, 0.0))
            if footprint:
                predicted[route] = footprint * sum(
                    share_between(a, ramp_length_s, start, end) for a in rows
                )
            else:
                length = self._profiles[route].best()
                unknown[route] = sum(
                    share_between(a, longest / 2 if length is None else length, start, end)
                    for a in rows
                )
        total = sum(predicted.values())
        others_unknown = sum(unknown.values())
        for route, rows in by_route.items():
            profile = self._profiles[route]
            y = growth - (total - predicted.get(route, 0.0))
            u = others_unknown - unknown.get(route, 0.0)
            weight = 1.0 / profile.scale
            for length, sums in zip(CANDIDATES, profile.sums, strict=True):
                x = sum(share_between(a, length, start, end) for a in rows)
                sums[0] += weight * x * x
                sums[1] += weight * x * u
                sums[2] += weight * u * u
                sums[3] += weight * x * y
                sums[4] += weight * u * y
                sums[5] += weight * y * y
            # Sessions past the longest candidate in this step: their ramp is over
            # whichever it was.
            profile.matured += _passed(rows, start, end)


def _passed(rows: list[Admission], start: float, end: float) -> int:
    """How many of the sessions ``rows`` passed the longest candidate in the step."""
    return sum(1 for a in rows if start < a.at + CANDIDATES[-1] <= end)


# --------------------------------------------------------------------------------------
# The working set as growth alone, and one window on it per admitted session.
#
# Notes:
#
# - The growth series, the windows, and what other workers' sessions (a shared ledger)
# drop of them are told in docs/reservations.md, "Learning what a session costs".
# Ramps, which say when memory comes rather than how much, still come from every step,
# crowded or not.
# - A session whose own growth had stopped (for more readings than it ever paused)
# when another session came keeps that ramp as its own, and what it added alone is the
# least it adds to any later window it lies in.
# - A step in which sessions of one route were reported ended and nothing else was
# ramping says how much memory one of them freed: evidence of its footprint too.

T = TypeVar("T")
#: A session that may still be ramping: until when, and whether its footprint is known.
Ramping = tuple[Admission, float, bool]


class GrowthWindows:
    """The growth series and the open windows; pure, fed readings and events with times."""

    __slots__ = (
        "_ended",
        "_foreign_ended",
        "_foreign_until",
        "_growth",
        "_last",
        "_last_rises",
        "_open",
        "_recent",
        "horizon_s",
    )

    def __init__(self, *, horizon_s: float = HORIZON_S) -> None:
        self.horizon_s = min(HORIZON_S, horizon_s)
        self._last: tuple[int, float] | None = None
        self._growth = 0.0
        #: The last two steps that freed nothing (a step that did carries the larger on).
        self._last_rises = (0.0, 0.0)
        self._open: list[OpenWindow] = []
        self._recent: deque[Admission] = deque()
        #: Session ends reported since the last reading: route and weight.
        self._ended: list[tuple[str, float]] = []
        #: Until when another worker's session may still be ramping, and whether one
        #: ended since the last reading.
        self._foreign_until = float("-inf")
        self._foreign_ended = False

    @property
    def open(self) -> int:
        """How many windows are still open."""
        return len(self._open)

    def admit(
        self,
        route: str,
        used_bytes: int | None,
        now: float,
        expected: Expected,
        *,
        responded: bool = True,
    ) -> None:
        """A session of ``route`` was admitted at working set ``used_bytes`` (exact or a
        bound); ``responded=False``: its response is still to come (:meth:`respond`)."""
        last = self._last
        if (last is None or now - last[1] > MAX_STEP_S) and used_bytes is not None:
            # No recent reading: the admission's own starts the series afresh. A bound
            # above the working set only shows as a drop at the next exact reading.
            self._restart(used_bytes, now)
            last = self._last
        if len(self._recent) >= MAX_RECENT:
            # Too many to follow: its growth is unknown to every window it may ramp in.
            self._foreign_until = max(self._foreign_until, now + self.horizon_s + QUIET_S)
            return
        admission = Admission(route, now, now if responded else None)
        self._recent.append(admission)
        if last is None or len(self._open) >= MAX_OPEN or now - last[1] > MAX_STEP_S:
            return
        self._open.append(OpenWindow(admission, last[1], self._growth, peak_at=now))

    def others(self, admitted: tuple[float, ...], now: float, ramp_length_s: float) -> None:
        """Other workers' sessions admitted at ``admitted`` were still settling at the last
        reading: each may grow until ``ramp_length_s`` after its admission, and for a quiet
        spell after it was last seen settling."""
        if admitted:
            until = max(now, max(admitted) + ramp_length_s) + QUIET_S
            self._foreign_until = max(self._foreign_until, until)

    def foreign_end(self) -> None:
        """Another worker's session ended: the next step's drop is not only this worker's."""
        self._foreign_ended = True

    def crowded(self, since: float) -> bool:
        """Whether another worker's session may have been ramping after ``since``."""
        return since < self._foreign_until

    def end(self, route: str, weight: float, now: float, admitted_at: float | None) -> None:
        """A session of ``route`` ended (``weight`` below 1: possibly, one of several routes)."""
        self._ended.append((route, weight))
        if admitted_at is None:
            return
        admission = self._admission(admitted_at, route)
        if admission is not None:
            admission.ended = now
        # A session that ended before its memory had all arrived teaches nothing.
        if any(w.admission.at == admitted_at for w in self._open):
            self._open = [
                w
                for w in self._open
                if not (w.admission.route == route and w.admission.at == admitted_at)
            ]

    def respond(self, admitted_at: float, now: float) -> None:
        """The session admitted at ``admitted_at`` answered: its window may close from
        now on (its memory usually starts to arrive then)."""
        admission = self._admission(admitted_at)
        if admission is not None and admission.responded is None:
            admission.responded = now

    def failed(self, admitted_at: float) -> str | None:
        """The session admitted at ``admitted_at`` opened nothing: it is forgotten. Its
        route, or ``None`` when it is no longer remembered."""
        admission = self._admission(admitted_at)
        if admission is None:
            return None
        self._recent.remove(admission)
        self._open = [w for w in self._open if w.admission is not admission]
        return admission.route

    def close_route(self, route: str, expected: Expected, ramps: Ramps) -> list[ClosedWindow]:
        """A probe saw the memory of ``route``'s sessions stop growing: their windows
        close at the last reading, without waiting for a quiet spell of their own."""
        closing = [w for w in self._open if w.admission.route == route]
        if not closing or self._last is None:
            return []
        self._open = [w for w in self._open if w.admission.route != route]
        now = self._last[1]
        expected, ramps = _once_per_route(expected), _once_per_route(ramps)
        closed = [self._closed(window, now, expected, ramps) for window in closing]
        return [w for w in closed if w is not None]

    def sessions(self) -> list[Admission]:
        """The recent admissions."""
        return list(self._recent)

    def reading(
        self, used_bytes: int, now: float, expected: Expected, ramps: Ramps
    ) -> tuple[list[ClosedWindow], list[Freed], Step | None]:
        """An exact working set: the windows it closes, the memory freed at reported ends,
        and the step it made (``None`` after a gap)."""
        last = self._last
        ended, self._ended = self._ended, []
        foreign_ended, self._foreign_ended = self._foreign_ended, False
        # What is known of a route does not change during a reading: asked once each.
        expected, ramps = _once_per_route(expected), _once_per_route(ramps)
        if last is None or not 0 < now - last[1] <= MAX_STEP_S:
            self._restart(used_bytes, now)
            return [], [], None
        self._last = (used_bytes, now)
        rise = float(used_bytes - last[0])
        freed: list[Freed] = []
        carried_over = rise < -FREE_STEP_BYTES or bool(ended) or foreign_ended
        if carried_over:
            # The faster of the last rises: the more growth a window is given, the safe
            # side for learning (settling takes the slower, its own: ``FreedMemory.step``).
            carried = max(0.0, *self._last_rises)
            going_on = (
                None if self.crowded(last[1]) else most_added(self._recent, last[1], now, expected)
            )
            if going_on is not None:
                # What may still be growing is all known: no more than it adds goes on
                # (a session's memory built in its request came at once, and is done).
                carried = min(carried, going_on)
            mine = not foreign_ended and not self.crowded(last[1])
            if mine and not any_ramping(self._recent, now, expected):
                # Growth in the same step would hide part of what was freed.
                freed = _freed(ended, carried - rise)
            rise = carried
            for window in self._open:
                window.guessed = True
        else:
            self._last_rises = (self._last_rises[1], rise)
        self._growth += rise
        horizon = now - 2 * self.horizon_s
        while self._recent and self._recent[0].at < horizon:
            self._recent.popleft()
        if self._open and self.crowded(self._open[0].start):
            for window in self._open:
                window.crowded = window.crowded or self.crowded(window.start)
        closed = self._close_due(last[1], now, expected, ramps)
        return (
            [w for w in closed if w is not None],
            freed,
            Step(rise, last[1], now, seen=not carried_over),
        )

    # -- internals -------------------------------------------------------------------

    def _admission(self, admitted_at: float, route: str | None = None) -> Admission | None:
        # Most are of recent sessions: looked for from the newest (admission order).
        for admission in reversed(self._recent):
            if admission.at < admitted_at:
                return None
            if admission.at == admitted_at and route in (None, admission.route):
                return admission
        return None

    def _restart(self, used_bytes: int, now: float) -> None:
        # Growth across a gap is unknown: windows open across it are dropped.
        self._last = (used_bytes, now)
        self._last_rises = (0.0, 0.0)
        self._open = []

    def _close_due(
        self, start: float, now: float, expected: Expected, ramps: Ramps
    ) -> list[ClosedWindow | None]:
        """Windows due to close at the reading at ``now`` (the step began at ``start``)."""
        if not self._open:
            return []
        ramping = self._ramping(expected, ramps)
        closed: list[ClosedWindow | None] = []
        still: list[OpenWindow] = []
        for window in self._open:
            mine = self._own_growth(window, now, expected)
            rising = window.rises(mine)
            # Whether each other session that may be ramping in it is of known footprint.
            known = _company(window, ramping, now)
            if known:
                window.company_came(all(known), rising, start)
            window.grew(mine, rising, now)
            if self._due(window, now, ramps):
                closed.append(self._closed(window, now, expected, ramps))
            else:
                still.append(window)
        self._open = still
        return closed

    def _ramping(self, expected: Expected, ramps: Ramps) -> list[Ramping]:
        """The sessions that may still be ramping, hiding another's growth or ramp: each
        with until when (its ramp and a quiet spell after it: a ramp is learned from few
        sessions, and others take longer) and whether its footprint is known. One of
        known footprint whose memory comes inside its request is left out: its known
        share is taken away where it came, so it hides neither."""
        ramping: list[Ramping] = []
        for admission in self._recent:
            if admission.ended is not None:
                continue
            footprint, ramp_length_s = expected(admission.route)
            if footprint and builds_in_request(ramps(admission.route)):
                continue
            until = admission.at + ramp_length_s + QUIET_S
            ramping.append((admission, until, bool(footprint)))
        return ramping

    def _own_growth(self, window: OpenWindow, now: float, expected: Expected) -> float:
        """``window``'s session's own growth at ``now``: the series since it opened, less
        what the others are expected to have added."""
        return self._growth - window.base - others_added(self._recent, window, now, expected)

    def _due(self, window: OpenWindow, now: float, ramps: Ramps) -> bool:
        """Whether ``window`` is due to close at ``now``: out of its request, and its
        session's memory has come (its route's window length has passed or, before a ramp
        is learned, a clean window has been quiet for a spell), or the horizon is over."""
        admission = window.admission
        if admission.responded is None:
            # Still in its request: what it builds after its response is to come.
            return False
        # The horizon counts from the response: memory built in a long request is the
        # session's, and so is what comes in the horizon after it.
        if now - admission.responded >= self.horizon_s:
            return True
        length = window_length(ramps(admission.route))
        if length is not None:
            return now - admission.at >= length
        return window.clean and window.quiet_spell(admission.responded, now)

    def _closed(
        self, window: OpenWindow, now: float, expected: Expected, ramps: Ramps
    ) -> ClosedWindow | None:
        """What ``window`` says; ``None`` when another worker's growth may be in it (all
        but a window in which nothing grew: that one bounds its session all the same)."""
        own = window.admission
        growth = self._growth - window.base
        if window.crowded and growth > FREE_STEP_BYTES:
            return None
        if window.alone:
            # What it added alone: the least it adds to any later window it lies in.
            own.seen, own.seen_until = window.peak, now
        company, exact = overlaps(self._recent, window, now, self.horizon_s, expected, ramps)
        if not company and not window.measures():
            # Nothing else in it by the learned ramps, yet no measure where another session
            # may have grown in it all the same, or its growth was carried over a free.
            exact = False
        return ClosedWindow(
            route=own.route,
            growth=growth,
            seconds=now - window.start,
            ramp_s=window.timed_ramp(),
            overlaps=company,
            exact=exact,
        )


def _company(window: OpenWindow, ramping: list[Ramping], now: float) -> list[bool]:
    """Whether each other session of ``ramping`` that may be ramping in ``window`` at
    ``now`` (admitted before ``now``, ramping past its start) is of known footprint."""
    own = window.admission
    return [
        known
        for other, until, known in ramping
        if other is not own and other.at < now and until > window.start
    ]


def _once_per_route(ask: Callable[[str], T]) -> Callable[[str], T]:
    """``ask``, remembering its answer for each route (for the length of one reading)."""
    answers: dict[str, T] = {}

    def once(route: str) -> T:
        if route not in answers:
            answers[route] = ask(route)
        return answers[route]

    return once


def _freed(ended: list[tuple[str, float]], freed_bytes: float) -> list[Freed]:
    # Only when every end reported in the step was of one route can the drop be told apart.
    routes = {route for route, _weight in ended}
    if len(routes) != 1 or freed_bytes < FREE_STEP_BYTES:
        return []
    weight = sum(w for _route, w in ended)
    if weight <= 0:
        return []
    return [Freed(route=routes.pop(), bytes_per_session=freed_bytes / weight)]


# --------------------------------------------------------------------------------------
# Learning what one session costs: its footprint and its ramp time, per route, from all
# traffic, bounded and forgetting (docs/reservations.md, "Learning what a session
# costs"). The observations are what the workers share (``shared_files.LearnedStore``),
# each worker reading all of them; the ramp profile is each worker's own.

#: How many of each kind of observation a route keeps: the last ones.
KEPT: Final = 32
MAX_ROUTES: Final = 64
#: The ramp assumed of a route's sessions before any is learned: long, so that less of
#: them is taken to have arrived in another session's window (the safe side).
_UNKNOWN_RAMP_S: Final = HORIZON_S / 2


class RouteObservations(TypedDict):
    """What was observed of one route, as the shared file holds it."""

    #: Per-session footprints: the watchdog's peaks (and values an earlier release wrote).
    footprints: list[float]
    #: Ramp times observed other than by windows (values an earlier release wrote).
    ramps: list[float]
    #: Memory freed at one session's end, in a step in which nothing else ramped.
    ends: list[float]
    #: Exact per-session peaks: a session's own memory group (no attribution needed).
    exact: list[float]
    windows: list[Window]
    #: A concluded probe's growth per session, the route's other sessions waiting: it caps
    #: the route's bounds as a clean value does, but is never what a session typically
    #: adds (other routes' sessions may have grown in it too).
    probed: list[float]


Observations = dict[str, RouteObservations]


@dataclass(frozen=True, slots=True)
class RouteEstimate:
    """What the guard learned of one route's sessions."""

    route: str
    footprint_bytes: int
    ramp_s: float
    observations: int

    def shown(self) -> dict[str, object]:
        """As a detailed refusal body and ``asgi-admission probe`` show it."""
        return {
            "route": self.route,
            "footprint_bytes": self.footprint_bytes,
            "ramp_s": round(self.ramp_s, 2),
            "observations": self.observations,
        }


def empty_observations() -> RouteObservations:
    return {"footprints": [], "ramps": [], "ends": [], "exact": [], "windows": [], "probed": []}


@dataclass(slots=True, eq=False)
class _Route:
    footprints: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT))
    ramps: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT))
    ends: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT))
    exact: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT))
    windows: deque[Window] = field(default_factory=lambda: deque(maxlen=KEPT))
    probed: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT))
    #: Sessions admitted here and not seen ended (fractions: ends of unknown route).
    live: float = 0.0

    def load(self, values: RouteObservations) -> None:
        self.footprints.extend(values["footprints"])
        self.ramps.extend(values["ramps"])
        self.ends.extend(values["ends"])
        self.exact.extend(values["exact"])
        self.windows.extend(values["windows"])
        self.probed.extend(values["probed"])


class SessionLearner:
    """Per-route footprints and ramp times from readings, session events and peaks.

    Pure and clock-free: times are the caller's. Not thread-safe on its own: the guard
    calls it inside the ledger's lock. ``timeout_s`` (the pending timeout) bounds a
    window's length.
    """

    __slots__ = (
        "_estimates",
        "_new",
        "_profiles",
        "_ramps",
        "_routes",
        "_typical",
        "_windows",
        "version",
    )

    def __init__(self, *, timeout_s: float = 120.0) -> None:
        self._routes: dict[str, _Route] = {}
        self._windows = GrowthWindows(horizon_s=timeout_s)
        self._profiles = RampProfiles()
        #: Observations made here and not yet handed to the shared file.
        self._new: Observations = {}
        #: Bumped by every change of the observations, so callers can tell.
        self.version = 0
        self._estimates: dict[str, RouteEstimate] = {}
        #: What one session of each route typically adds, where known (``typical``).
        self._typical: dict[str, float] = {}
        #: Ramp times recorded in the observations (the shared file's included).
        self._ramps: dict[str, float] = {}

    @property
    def observing(self) -> bool:
        """Whether readings are wanted: a window is open or a session it admitted lives
        (its end frees memory worth seeing)."""
        return self._windows.open > 0 or any(r.live > 0 for r in self._routes.values())

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
            lengths = (self._expected(route)[1] for route in self._routes)
            self._windows.others(others, now, max(lengths, default=_UNKNOWN_RAMP_S))
        closed, freed, step = self._windows.reading(used_bytes, now, self._expected, self._ramp_s)
        if step is not None:
            known = {route: self._expected(route) for route in self._typical}
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

    def close_windows(self, route: str) -> bool:
        """A probe of ``route`` saw its memory stop growing (``probing.py``): the route's
        open windows close now; whether the route has a footprint learned."""
        closed = self._windows.close_route(route, self._expected, self._ramp_s)
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

    def probed(self, route: str, per_session_bytes: float) -> None:
        """A probe trial of ``route`` concluded with this growth per probe, the route's
        other sessions waiting (``probing.py``): a cap on the route's bounds."""
        state = self._route(route)
        if state is None:
            return
        value = float(max(0, int(per_session_bytes)))
        state.probed.append(value)
        self._new.setdefault(route, empty_observations())["probed"].append(value)
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
                "probed": list(state.probed),
            }
            for route, state in self._routes.items()
            if state.footprints
            or state.ramps
            or state.ends
            or state.exact
            or state.windows
            or state.probed
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
        footprint = self._typical.get(route, 0.0)
        return footprint, _UNKNOWN_RAMP_S if ramp_s is None else ramp_s / _RAMP_POINT

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
        self._typical = typical(self._routes)
        self._estimates = {}
        self._ramps = {}
        for route, state in self._routes.items():
            found = footprint(route, state, self._typical)
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
    """The reserve the latch uses: the configured one, raised or replaced by the largest
    learned footprint as ``mode`` says (docs/reservations.md, "Learning what a session
    costs", its table of modes); the configured one while nothing is learned."""
    if mode == "off":
        return configured_bytes
    largest = max((estimate.footprint_bytes for estimate in learned), default=None)
    if largest is None:
        return configured_bytes
    if mode == "raise":
        return max(configured_bytes, largest)
    return max(min_bytes, largest)
