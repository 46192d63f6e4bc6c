"""The growth series: what a step in which memory was freed is taken to have grown."""

from __future__ import annotations

from asgi_admission._admission.reservations.learning import GrowthWindows
from kits.suitekit import MIB

#: Internal on purpose: the learner's growth series, fed readings with a fake clock.
INTERNAL = "the learner's growth series, fed readings with a fake clock"

BASE = 300 * MIB
SIZES = {"POST /build": (48.0 * MIB, 0.03), "POST /ramp": (96.0 * MIB, 2.0)}


def expected(route: str) -> tuple[float, float]:
    return SIZES[route]


def lengths(route: str) -> float | None:
    return 0.3 if route == "POST /build" else 3.5


def test_a_jump_built_in_a_request_is_not_carried_over_memory_freed_next() -> None:
    """A session that built its 48 MiB inside its request made one step's jump; memory
    another session frees in the next step must not make that step count the jump again
    (it would double the session's footprint): with every recent session known, no more
    is carried than they can still add."""
    windows = GrowthWindows()
    windows.reading(BASE, 0.0, expected, lengths)
    windows.admit("POST /build", BASE, 0.1, expected)
    windows.reading(BASE + 48 * MIB, 0.25, expected, lengths)
    windows.end("POST /ramp", 1.0, 0.4, None)
    _closed, _freed, step = windows.reading(BASE - 48 * MIB, 0.5, expected, lengths)
    assert step is not None
    assert step.growth < 1 * MIB


def test_growth_of_a_session_still_ramping_is_carried_over_memory_freed() -> None:
    """Over the same drop, a session still within its ramp is taken to go on growing (the
    step carries on the growth before it): memory freed never hides a session's growth."""
    windows = GrowthWindows()
    windows.reading(BASE, 0.0, expected, lengths)
    windows.admit("POST /ramp", BASE, 0.1, expected)
    windows.reading(BASE + 12 * MIB, 0.25, expected, lengths)
    windows.end("POST /build", 1.0, 0.4, None)
    _closed, _freed, step = windows.reading(BASE - 36 * MIB, 0.5, expected, lengths)
    assert step is not None
    assert step.growth >= 12 * MIB
