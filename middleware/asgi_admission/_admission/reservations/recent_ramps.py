"""The recent sessions' ramps over a span of the growth series: what they may have added.

Notes:

- The growth windows (``session_windows.py``) ask these of the admissions they
  remember, in admission order, by what is known of each route now: its expected bytes
  and ramp (``Expected``) and how long its sessions are watched (``Lengths``).
- A session's memory is taken to arrive linearly over its ramp (``window_records``).
  Ramps vary, by as much shorter or longer as ``RAMP_SPREAD`` allows: what is taken
  away from one session's growth is the least of the others' that may have arrived,
  what may still be growing after a step that freed memory the most.
"""

from __future__ import annotations

from collections.abc import Iterable

from asgi_admission._admission.reservations.attribution import DRIFT_BYTES_PER_S, Overlap
from asgi_admission._admission.reservations.window_records import (
    QUIET_S,
    RAMP_SPREAD,
    Admission,
    Expected,
    Lengths,
    OpenWindow,
    share_between,
)


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
        footprint, ramp_s = expected(admission.route)
        if admission.at + RAMP_SPREAD[1] * ramp_s + QUIET_S <= start:
            continue  # its memory has all come
        if not footprint:
            return None
        total += footprint * max(
            share_between(admission, spread * ramp_s, start, end) for spread in (*RAMP_SPREAD, 1.0)
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
        footprint, ramp_s = expected(admission.route)
        if footprint and admission.at + ramp_s > window.start:
            total += footprint * share_between(admission, ramp_s, window.start, now)
    return total


def overlaps(
    recent: Iterable[Admission],
    window: OpenWindow,
    now: float,
    horizon_s: float,
    expected: Expected,
    lengths: Lengths,
) -> tuple[tuple[Overlap, ...], bool]:
    """The other sessions in ``window`` closing at ``now``, per route (by route name), and
    whether every one of their routes had a learned ramp (else a share is a lower bound)."""
    own = window.admission
    totals_by_route: dict[str, list[float]] = {}
    exact = True
    for admission in recent:
        if admission is own or admission.at > now:
            continue
        if lengths(admission.route) is None:
            # Its ramp is not learned: the least of it that can have arrived in the
            # window (none from before the window, the longest ramp from inside).
            share = 0.0
            if admission.at >= window.start:
                share = admission.share(horizon_s, now)
            least = share
            exact = exact and admission.at <= window.start - horizon_s
        else:
            _footprint, ramp_s = expected(admission.route)
            share = share_between(admission, ramp_s, window.start, now)
            # Ramps vary: the least that may have arrived, for what is taken away
            # from this session's growth (a short ramp leaves less of a session
            # from before the window, a long one less of one from inside it).
            least = min(
                share_between(admission, RAMP_SPREAD[0] * ramp_s, window.start, now),
                share_between(admission, RAMP_SPREAD[1] * ramp_s, window.start, now),
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
