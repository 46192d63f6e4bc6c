"""How long a route's sessions take to ramp, from every step of the growth series.

Notes:

- Each step of the growth series (``session_windows.py``), less what the other
  routes' known sessions are expected to have added in it, is regressed, per route,
  on how much of that route's recent sessions a linear ramp of each candidate length
  would have added, together with how much the sessions of the routes not known yet
  would have (by their own best ramps; their footprint a free coefficient). The
  candidate with the smallest squared error is the route's ramp: the error is
  smallest where the assumed ramp matches when the memory really came, and sessions
  overlapping in time do not hide that, since each step counts.
- Evidence fades per session of the route (``FADE``), so an app that changes its ramp
  is followed, and an early estimate made while other routes were unknown is outgrown.
- Bounded: a few numbers per candidate per route, one pass over the recent sessions
  per step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from asgi_admission._admission.reservations.window_records import ramp_share

#: Ramp lengths tried, in seconds (the 90 % point of a linear ramp is 0.9 of its length).
CANDIDATES: Final = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
#: The weight left to earlier evidence at each new session of the route.
FADE: Final = 1.0 - 1.0 / 16
#: Sessions of the route past the longest candidate before its ramp is trusted.
MIN_SESSIONS: Final = 2
#: The best candidate's error must be below this share of any far candidate's.
DECISIVE: Final = 0.75


class _Profile:
    __slots__ = ("matured", "scale", "sums")

    def __init__(self) -> None:
        #: Per candidate, sums over the steps of x*x, x*u, u*u, x*y, u*y and y*y: x the
        #: route's own ramps, u the unknown routes' ramps, y the growth; each divided by
        #: ``scale``, so that fading (on every admission) touches one number. Only ratios
        #: of the sums are ever used.
        self.sums = [[0.0] * 6 for _ in CANDIDATES]
        self.scale = 1.0
        self.matured = 0.0

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
        return None if length is None else 0.9 * length

    def bound_s(self, route: str) -> float | None:
        """Before its ramp is trusted (:meth:`ramp_s`), the longest the route's sessions
        can be taking to ramp (to 90 %) by the evidence so far; ``None`` until its sessions
        have ramped past the longest candidate."""
        profile = self._profiles.get(route)
        if profile is None or profile.matured < MIN_SESSIONS:
            return None
        length = profile.bound()
        return None if length is None else 0.9 * length

    def step(
        self,
        growth: float,
        start: float,
        end: float,
        sessions: Iterable[tuple[str, float, float | None]],
        expected: dict[str, tuple[float, float]],
        *,
        seen: bool = True,
    ) -> None:
        """One step of the growth series from ``start`` to ``end``: ``sessions`` are the
        recent ones as ``(route, admitted_at, ended_at)``; ``expected`` the known
        ``(footprint, ramp_s)`` of routes whose footprint is determined. A step whose
        growth was not ``seen`` (carried over memory freed: a guess, which says nothing
        of when memory came) only ages the sessions in it."""
        by_route: dict[str, list[tuple[float, float | None]]] = {}
        longest = CANDIDATES[-1]
        for route, admitted_at, ended_at in sessions:
            # The same steps for every candidate: those within the longest ramp.
            if route in self._profiles and admitted_at < end and admitted_at + longest >= start:
                by_route.setdefault(route, []).append((admitted_at, ended_at))
        if not by_route:
            return
        if not seen:
            for route, rows in by_route.items():
                self._profiles[route].matured += _passed(rows, start, end)
            return
        predicted: dict[str, float] = {}
        unknown: dict[str, float] = {}
        for route, rows in by_route.items():
            footprint, ramp_s = expected.get(route, (0.0, 0.0))
            if footprint:
                predicted[route] = footprint * sum(
                    _rise(ramp_s, start, end, at, ended) for at, ended in rows
                )
            else:
                length = self._profiles[route].best()
                unknown[route] = sum(
                    _rise(CANDIDATES[-1] / 2 if length is None else length, start, end, at, e)
                    for at, e in rows
                )
        total = sum(predicted.values())
        others_unknown = sum(unknown.values())
        for route, rows in by_route.items():
            profile = self._profiles[route]
            y = growth - (total - predicted.get(route, 0.0))
            u = others_unknown - unknown.get(route, 0.0)
            weight = 1.0 / profile.scale
            for length, sums in zip(CANDIDATES, profile.sums, strict=True):
                x = sum(_rise(length, start, end, at, ended) for at, ended in rows)
                sums[0] += weight * x * x
                sums[1] += weight * x * u
                sums[2] += weight * u * u
                sums[3] += weight * x * y
                sums[4] += weight * u * y
                sums[5] += weight * y * y
            # Sessions past the longest candidate in this step: their ramp is over
            # whichever it was.
            profile.matured += _passed(rows, start, end)


def _passed(rows: list[tuple[float, float | None]], start: float, end: float) -> int:
    """How many of the sessions ``rows`` passed the longest candidate in the step."""
    return sum(1 for at, _e in rows if start < at + CANDIDATES[-1] <= end)


def _rise(length: float, start: float, end: float, at: float, ended: float | None) -> float:
    """The share of one session's memory a ramp of ``length`` adds between the two times."""
    stop = end if ended is None else min(end, ended)
    if stop <= start:
        return 0.0
    return ramp_share(length, stop - at) - ramp_share(length, start - at)
