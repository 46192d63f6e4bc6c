"""Learning what one session costs: its footprint and its ramp time, per route.

Notes:

- Evidence comes in *episodes*. An episode starts with an admission while none
  is open, at the working set that admission was decided with, and takes in
  every admission that follows while it is open. It watches the working set
  (the guard's own readings and its periodic sample: sessions need not be
  processes) and ends once no new peak has come for a quiet spell (at least
  ``QUIET_S``, longer for slow ramps) and no admission either, or, under steady
  traffic, after ``BUSY_QUIET_SPELLS`` quiet spells without a new peak, or at
  the pending timeout. One observation is then ``(peak - start) / sessions``
  bytes, counting the sessions admitted up to the last new peak, and the time
  from the first admission until the working set first reached 90 % of that
  peak. An episode that mixed routes, or saw a session end (memory freed in the
  middle of it), teaches nothing: it cannot say whose memory was whose.
- Noise: other memory moving in the same group inflates or deflates an
  observation; sessions that free memory give 0. A high percentile of the
  recent observations (``PERCENTILE``) errs towards the larger footprint, which
  is the safe side for a reserve.
- Bounded and forgetting: the last ``WINDOW`` observations per route, at most
  ``MAX_ROUTES`` routes. Sessions change when the app does, so an old footprint
  fades out as new sessions are observed rather than at once.
- The watchdog's per-session peaks (processes it samples) are observations of
  their own, where the app registers sessions with it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from asgi_admission._config import Learning

WINDOW: Final = 32
MAX_ROUTES: Final = 64
PERCENTILE: Final = 0.9
QUIET_S: Final = 1.0
BUSY_QUIET_SPELLS: Final = 2
#: Admissions one episode keeps the times of; beyond, it teaches nothing.
_MAX_ADMISSIONS: Final = 4096
#: A new peak must beat the last by this share of the growth so far (or 256 KiB).
_PEAK_STEP: Final = 0.01
_MIN_STEP: Final = 256 * 1024
#: Bounded record of when each new peak came (for the ramp time).
_MAX_PEAKS: Final = 256


@dataclass(frozen=True, slots=True)
class RouteEstimate:
    """What the guard learned of one route's sessions."""

    route: str
    footprint_bytes: int
    ramp_s: float
    observations: int


def percentile(values: Iterable[float], share: float = PERCENTILE) -> float:
    """The nearest-rank ``share`` percentile of ``values`` (not empty)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(share * len(ordered)))
    return ordered[rank - 1]


class _Episode:
    __slots__ = (
        "admitted",
        "base",
        "last_admit",
        "last_peak_at",
        "mixed",
        "peak",
        "peaks",
        "route",
        "sessions",
        "start",
    )

    def __init__(self, route: str, base: int, now: float) -> None:
        self.route = route
        self.base = base
        self.start = now
        self.last_admit = now
        self.sessions = 1
        self.peak = base
        self.last_peak_at = now
        self.peaks: list[tuple[float, int]] = [(now, base)]
        self.mixed = False
        self.admitted = [now]


class SessionLearner:
    """Per-route footprints and ramp times from readings, counts and watchdog peaks.

    Not thread-safe on its own: the guard calls it inside the ledger's lock.
    ``timeout_s`` ends an episode that never goes quiet.
    """

    __slots__ = ("_episode", "_footprints", "_new", "_ramps", "timeout_s", "version")

    def __init__(self, *, timeout_s: float = 120.0) -> None:
        self.timeout_s = timeout_s
        self._footprints: dict[str, deque[int]] = {}
        self._ramps: dict[str, deque[float]] = {}
        self._episode: _Episode | None = None
        #: Observations made here and not yet handed to the shared file.
        self._new: list[tuple[str, int, float | None]] = []
        #: Bumped by every new observation, so callers can tell when estimates changed
        #: (a plain attribute: the decision path compares it).
        self.version = 0

    @property
    def observing(self) -> bool:
        """Whether an episode is open (the periodic sample should keep reading)."""
        return self._episode is not None

    def on_admit(self, route: str, used_bytes: int | None, now: float) -> None:
        """A session of ``route`` was admitted at working set ``used_bytes``."""
        episode = self._episode
        if episode is None:
            if used_bytes is not None:
                self._episode = _Episode(route, used_bytes, now)
            return
        episode.sessions += 1
        episode.last_admit = now
        if len(episode.admitted) < _MAX_ADMISSIONS:
            episode.admitted.append(now)
        else:
            episode.mixed = True
        if route != episode.route:
            episode.mixed = True

    def on_failed(self, admitted_at: float) -> None:
        """The session admitted at ``admitted_at`` opened nothing (an error answer):
        the open episode no longer counts it."""
        episode = self._episode
        if episode is None:
            return
        try:
            episode.admitted.remove(admitted_at)
        except ValueError:
            return  # admitted before this episode (or beyond what it keeps)
        episode.sessions -= 1
        if not episode.admitted:
            self._episode = None

    def on_session_end(self) -> None:
        """A session ended: memory freed in the open episode makes it teach nothing."""
        if self._episode is not None:
            self._episode.mixed = True

    def on_reading(self, used_bytes: int, now: float, *, held: bool = False) -> None:
        """An exact working set; may close the episode and record an observation.

        ``held``: a probe's window is open (``probing.py``), and it closes the episode
        once the probe's memory has stopped growing (:meth:`close_episode`); only the
        timeout closes it meanwhile.
        """
        episode = self._episode
        if episode is None:
            return
        step = max(_MIN_STEP, int((episode.peak - episode.base) * _PEAK_STEP))
        if used_bytes > episode.peak + step or (
            used_bytes > episode.peak and episode.peak == episode.base
        ):
            episode.peak = used_bytes
            episode.last_peak_at = now
            if len(episode.peaks) >= _MAX_PEAKS:
                del episode.peaks[1::2]
            episode.peaks.append((now, used_bytes))
        elif used_bytes > episode.peak:
            episode.peak = used_bytes
        quiet = max(QUIET_S, 0.5 * (episode.last_peak_at - episode.start))
        since_peak = now - episode.last_peak_at
        if now - episode.start >= self.timeout_s or (
            not held
            and (
                (since_peak >= quiet and now - episode.last_admit >= quiet)
                or since_peak >= BUSY_QUIET_SPELLS * quiet
            )
        ):
            self._episode = None
            if not episode.mixed:
                self._close(episode)

    def close_episode(self, route: str) -> bool:
        """A probe of ``route`` found its memory has stopped growing: the open episode
        closes now with its observation if it is that route's alone; whether it was."""
        episode = self._episode
        if episode is None or episode.route != route or episode.mixed:
            return False
        self._episode = None
        self._close(episode)
        return True

    def _close(self, episode: _Episode) -> None:
        growth = max(0, episode.peak - episode.base)
        reached = episode.base + 0.9 * growth
        ramp = next((t for t, used in episode.peaks if used >= reached), episode.last_peak_at)
        # Sessions admitted after the last new peak added nothing that was seen.
        sessions = max(1, sum(1 for t in episode.admitted if t <= episode.last_peak_at))
        self.observe(
            episode.route,
            footprint_bytes=growth // sessions,
            ramp_s=max(0.0, ramp - episode.start),
        )

    def observe(self, route: str, *, footprint_bytes: int, ramp_s: float | None = None) -> None:
        """One observation of a session of ``route`` (also for the watchdog's peaks)."""
        footprints = self._footprints.get(route)
        if footprints is None:
            if len(self._footprints) >= MAX_ROUTES:
                return
            footprints = self._footprints[route] = deque(maxlen=WINDOW)
            self._ramps[route] = deque(maxlen=WINDOW)
        footprint = max(0, int(footprint_bytes))
        ramp = None if ramp_s is None else max(0.0, float(ramp_s))
        footprints.append(footprint)
        if ramp is not None:
            self._ramps[route].append(ramp)
        self._new.append((route, footprint, ramp))
        self.version += 1

    def take_new(self) -> list[tuple[str, int, float | None]]:
        """The observations made since the last call: ``(route, footprint, ramp)``."""
        new, self._new = self._new, []
        return new

    def estimate(self, route: str) -> RouteEstimate | None:
        """What was learned of ``route``; ``None`` before its first observation."""
        footprints = self._footprints.get(route)
        if not footprints:
            return None
        ramps = self._ramps[route]
        return RouteEstimate(
            route=route,
            footprint_bytes=int(percentile(footprints)),
            ramp_s=float(percentile(ramps)) if ramps else 0.0,
            observations=len(footprints),
        )

    def routes(self) -> set[str]:
        """The routes with at least one observation."""
        return {route for route, footprints in self._footprints.items() if footprints}

    def estimates(self) -> list[RouteEstimate]:
        found = (self.estimate(route) for route in sorted(self._footprints))
        return [estimate for estimate in found if estimate is not None]

    def export(self) -> dict[str, dict[str, list[float]]]:
        """The observations, for the shared file."""
        return {
            route: {"footprints": list(map(float, values)), "ramps": list(self._ramps[route])}
            for route, values in self._footprints.items()
        }

    def observations(self) -> dict[str, dict[str, list[float]]]:
        """Everything this learner holds, in the shape of the shared file."""
        return {
            route: {
                "footprints": [float(v) for v in footprints],
                "ramps": [float(v) for v in self._ramps.get(route, ())],
            }
            for route, footprints in self._footprints.items()
        }

    def merge(self, observations: dict[str, dict[str, list[float]]]) -> None:
        """Replace this learner's observations with the shared file's (already merged)."""
        footprints: dict[str, deque[int]] = {}
        ramps: dict[str, deque[float]] = {}
        for route, values in list(observations.items())[:MAX_ROUTES]:
            footprints[route] = deque((int(v) for v in values.get("footprints", [])), maxlen=WINDOW)
            ramps[route] = deque((float(v) for v in values.get("ramps", [])), maxlen=WINDOW)
        if footprints != self._footprints or ramps != self._ramps:
            self._footprints, self._ramps = footprints, ramps
            self.version += 1


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
