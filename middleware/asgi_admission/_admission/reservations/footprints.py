"""A route's footprint: the conservative bound everything observed of it allows.

Notes:

- A route's footprint is a high percentile (``PERCENTILE``) of what each of its
  windows grew less the least the other sessions in it can have added (all of it
  while they are unknown; ``attribution.py``), or, once its own fit is known, the
  fit's upper bound where that is lower. Memory freed when its sessions end and the
  watchdog's peaks raise it where most of them say more; sessions that free memory
  later only give smaller values, which cannot lower it. Memory that grows for other
  reasons makes a session look larger, the safe side for a reserve.
- Sessions in memory groups of their own give exact peaks: those are their cost, and
  nothing else observed of the route changes it.
- Pure: the learner (``learning.py``) hands in what it holds of each route and the
  fits of all of them, and makes the route's estimate of the result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from asgi_admission._admission.reservations.attribution import Fit, Window, attributed

PERCENTILE: Final = 0.9
#: Windows that knew every other session's ramp a route needs before its bound comes
#: from those alone.
MIN_EXACT_WINDOWS: Final = 4
#: Beside windows, per-session values (memory freed at ends, the watchdog's peaks) raise
#: a route's estimate only once there are this many: one drop that other memory freed
#: in the same moment must not (their median needs two of three to say more).
MIN_PER_SESSION: Final = 3


class Observed(Protocol):
    """What is held of one route's sessions (the learner keeps it, bounded)."""

    @property
    def footprints(self) -> Sequence[float]:
        """Per-session footprints: the watchdog's peaks."""

    @property
    def ends(self) -> Sequence[float]:
        """Memory freed at one session's end, in a step in which nothing else ramped."""

    @property
    def exact(self) -> Sequence[float]:
        """Exact per-session peaks: a session's own memory group."""

    @property
    def windows(self) -> Sequence[Window]:
        """The route's closed windows."""


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


def end_floors(routes: Mapping[str, Observed]) -> dict[str, float]:
    """The least one session of each route frees at its end (the median of its ends):
    no more than that, or its fit's lower bound, is ever taken from another session's
    window for it."""
    return {route: percentile(state.ends, 0.5) for route, state in routes.items() if state.ends}


def footprint(
    route: str, state: Observed, fits: Mapping[str, Fit], floors: Mapping[str, float]
) -> Footprint | None:
    """``route``'s footprint from what ``state`` holds of it, the fits of all routes
    and their ``end_floors``; ``None`` before its first observation."""
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
        bounds = [attributed(route, w, fits, floors) for w in windows]
        size = percentile(bounds)
        known = fits.get(route)
        if known is not None and known.determined:
            # The fit tightens the bounds that other sessions' growth inflates,
            # but it is a model: never below what sessions typically showed with
            # nothing else ramping in their window (the median: drift aside,
            # those measure their session).
            alone = [w.growth for w in windows if not w.overlaps]
            cap = known.upper()
            if alone:
                cap = max(cap, percentile(alone, 0.5))
            size = min(size, cap)
    if per_session and (not state.windows or len(per_session) >= MIN_PER_SESSION):
        # Alone, the per-session values' high percentile; beside windows, they
        # raise the estimate where most of them say more.
        share = 0.5 if state.windows else PERCENTILE
        size = max(size, percentile(per_session, share))
    return Footprint(
        size_bytes=size,
        observations=len(state.windows) + len(per_session) + len(state.exact),
    )
