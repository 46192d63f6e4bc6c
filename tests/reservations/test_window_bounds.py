"""The growth windows stay cheap however fast sessions are admitted: a reading runs on
the event loop (the periodic sample), four times a second."""

from __future__ import annotations

from collections import Counter

from asgi_admission._admission.reservations.learning import (
    MAX_OPEN,
    MAX_RECENT,
    Expected,
    GrowthWindows,
    Ramps,
)
from kits.suitekit import MIB

#: Internal on purpose: the learner's growth series, fed readings with a fake clock.
INTERNAL = "the learner's growth series, fed readings with a fake clock"

BASE = 300 * MIB
ROUTES = ("POST /a", "WS /b")


def flood(windows: GrowthWindows, expected: Expected, ramps: Ramps) -> float:
    """MAX_RECENT + 1 admissions 10 ms apart on a flat working set, read every 0.2 s
    (windows open across a longer gap would be dropped); the time of the last."""
    now = 0.0
    windows.reading(BASE, now, expected, ramps)
    for n in range(1, MAX_RECENT + 2):
        now += 0.01
        windows.admit("POST /a", BASE, now, expected, responded=True)
        if n % 20 == 0:
            windows.reading(BASE, now, expected, ramps)
    return now


def test_a_reading_asks_what_is_known_of_each_route_once() -> None:
    """With many sessions of two routes open (admitted 20 a second, none ended), one
    reading asks each route's footprint and window length once, not once per pair of
    sessions: the learner's answers do not change during a reading."""
    asked: Counter[str] = Counter()

    def expected(route: str) -> tuple[float, float]:
        asked["expected", route] += 1  # type: ignore[index]
        return (0.0, 4.0)

    def ramps(route: str) -> float | None:
        asked["ramps", route] += 1  # type: ignore[index]
        return None

    windows = GrowthWindows()
    now = 0.0
    windows.reading(BASE, now, expected, ramps)
    for n in range(60):
        now += 0.05
        windows.admit(ROUTES[n % 2], BASE, now, expected, responded=True)
        if n % 5 == 4:
            windows.reading(BASE, now + 0.01, expected, ramps)
    asked.clear()
    windows.reading(BASE, now + 0.2, expected, ramps)
    assert windows.open > 10
    assert max(asked.values()) == 1
    assert len(asked) <= 2 * len(ROUTES)


def test_admissions_beyond_what_is_remembered_crowd_the_open_windows() -> None:
    """Past MAX_RECENT admissions within the windows' reach, a new session is not
    remembered, so no window can take its growth away from its own: every window open
    while it may ramp, and that then grew, is dropped; at most MAX_OPEN are open."""

    def expected(route: str) -> tuple[float, float]:
        return (0.0, 2.0)

    def ramps(route: str) -> float | None:
        return None

    windows = GrowthWindows()
    now = flood(windows, expected, ramps)
    used = BASE
    assert windows.open == MAX_OPEN
    assert len(windows.sessions()) == MAX_RECENT
    # The memory of some session arrives, then nothing more grows until every window
    # reaches its horizon.
    closed = []
    for step in range(1, 60):
        used = BASE + min(step, 4) * 16 * MIB
        found, _freed, _step = windows.reading(used, now + 0.2 * step, expected, ramps)
        closed += found
    assert windows.open == 0
    assert closed == []


def test_a_flat_window_still_bounds_its_session_when_crowded() -> None:
    """Crowded by sessions too many to remember, a window over which nothing grew still
    says its session added nothing (it bounds the session all the same)."""

    def expected(route: str) -> tuple[float, float]:
        return (0.0, 2.0)

    def ramps(route: str) -> float | None:
        return None

    windows = GrowthWindows()
    now = flood(windows, expected, ramps)
    closed = []
    for step in range(1, 60):
        found, _freed, _step = windows.reading(BASE, now + 0.2 * step, expected, ramps)
        closed += found
    assert closed
    assert all(window.growth == 0 for window in closed)
