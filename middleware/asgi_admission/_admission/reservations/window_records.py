"""What the growth windows keep per session, and what a closed window says.

The timing of a window (``HORIZON_S``, ``QUIET_S``, how long a route with a learned
ramp is watched), an admitted session as the series remembers it, one open window on
it, and the records a reading hands on (``ClosedWindow``, ``Step``, ``Freed``). The
series and the windows' rules are ``session_windows.py``'s, what the other sessions'
ramps put into a span ``recent_ramps.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from asgi_admission._admission.reservations.attribution import Overlap

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
#: The shortest window of a route with a learned ramp: sessions that build their memory
#: inside the request are watched only a little past their response, so that what other
#: sessions add meanwhile is not taken for theirs.
MIN_WINDOW_S: Final = 0.3
#: How much shorter and longer than learned other sessions' ramps are taken to be at
#: most, for what is taken away from a session's growth.
RAMP_SPREAD: Final = (0.5, 1.5)
#: At most this many windows open at once, and this many admissions remembered: a
#: reading makes a pass over the remembered admissions for each open window, on the
#: event loop, so both stay small. More admissions than that within ``2 x HORIZON_S``
#: (over 6 a second) are too many to tell one session's growth from the others' anyway:
#: one not remembered counts as an unknown session, as another worker's does.
MAX_OPEN: Final = 32
MAX_RECENT: Final = 96
#: A new peak must beat the last by this much, or by ``PEAK_SHARE`` of it: memory
#: drifting up for other reasons must not keep a finished session's window open.
PEAK_STEP: Final = 1024 * 1024
PEAK_SHARE: Final = 0.05

#: What a route's session is expected to add and over how long: ``(bytes, ramp length
#: in seconds)``, bytes 0 while its footprint is not known.
Expected = Callable[[str], tuple[float, float]]
#: How long a route's sessions are watched, ``None`` while its ramp is not learned.
Lengths = Callable[[str], float | None]


@dataclass(frozen=True, slots=True)
class ClosedWindow:
    """One admitted session's window: the growth over it and the other sessions in it."""

    route: str
    growth: float
    seconds: float
    #: Seconds from admission until the session's own growth reached 90 % of its peak,
    #: where no other session ramped in the window before it had (else ``None``).
    ramp_s: float | None
    #: The other sessions in it, per route.
    overlaps: tuple[Overlap, ...]
    #: Every route in ``overlaps`` had a learned ramp (else its share is a lower bound).
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


def ramp_share(ramp_s: float, age_s: float) -> float:
    """The share of a session's memory there ``age_s`` after its admission (linear ramp)."""
    if age_s <= 0:
        return 0.0
    if ramp_s <= 0 or age_s >= ramp_s:
        return 1.0
    return age_s / ramp_s


class Admission:
    __slots__ = ("at", "ended", "responded", "route", "seen", "seen_until")

    def __init__(self, route: str, at: float, responded: float | None) -> None:
        self.route = route
        self.at = at
        #: When its response ended or its WebSocket was accepted (``None``: not yet).
        self.responded = responded
        #: When it was reported ended (its ramp stops there), or ``None``.
        self.ended: float | None = None
        #: What its window saw it add while no other session ramped, and until when.
        self.seen = 0.0
        self.seen_until: float | None = None

    def share(self, ramp_s: float, when: float) -> float:
        until = when if self.ended is None else min(when, self.ended)
        return ramp_share(ramp_s, until - self.at)


class OpenWindow:
    __slots__ = (
        "admission",
        "alone",
        "base",
        "clean",
        "crowded",
        "own_ramp",
        "pauses",
        "peak",
        "peak_at",
        "peaks",
        "quiet",
        "start",
    )

    def __init__(self, admission: Admission, start: float, base: float) -> None:
        self.admission = admission
        self.start = start
        self.base = base
        self.clean = True
        #: Another worker's session may have ramped in it (see the module notes).
        self.crowded = False
        #: No other session has ramped in it (yet), and its ramp if it had ended before.
        self.alone = True
        self.own_ramp: float | None = None
        #: Readings since its last new peak, and the most there were between two.
        self.quiet = 0
        self.pauses = 0
        self.peak = 0.0
        self.peak_at = admission.at
        self.peaks: list[tuple[float, float]] = []

    def ramp_s(self) -> float:
        """Seconds from admission until the growth first reached 90 % of its peak."""
        reached = 0.9 * self.peak
        at = next((t for t, grown in self.peaks if grown >= reached), self.peak_at)
        return max(0.0, at - self.admission.at)


def quick(length: float | None) -> bool:
    """Whether a route watched for ``length`` builds its memory inside the request."""
    return length is not None and length <= MIN_WINDOW_S


def share_between(admission: Admission, ramp_s: float, start: float, end: float) -> float:
    return admission.share(ramp_s, end) - admission.share(ramp_s, start)


def window_length(ramp_s: float | None) -> float | None:
    """How long a session of a route with learned ramp ``ramp_s`` is watched (``None``:
    nothing learned yet, watched until quiet)."""
    if ramp_s is None:
        return None
    if ramp_s <= MIN_WINDOW_S / RAMP_WINDOWS:
        return MIN_WINDOW_S
    return max(QUIET_S, RAMP_WINDOWS * ramp_s + RAMP_PAD_S)
