"""The growth series: what a step in which memory was freed is taken to have grown."""

from __future__ import annotations

from asgi_admission._admission.reservations.learning import (
    MIN_WINDOW_S,
    QUIET_S,
    GrowthWindows,
    SessionLearner,
    window_length,
)
from asgi_admission._admission.reservations.settling import IN_REQUEST_RAMP_S, builds_in_request
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


class Replay:
    """A learner fed readings every 0.25 s of a fake clock, ``used`` the memory read."""

    def __init__(self) -> None:
        self.learner = SessionLearner()
        self.t = 0.0
        self.used = BASE
        self.learner.on_reading(self.used, self.t)

    def read(self, until: float, grow: float = 0.0) -> None:
        """Readings up to ``until``, memory growing by ``grow`` at each."""
        while self.t < until - 1e-9:
            self.t = round(self.t + 0.25, 3)
            self.used += int(grow)
            self.learner.on_reading(self.used, self.t)

    def build(self, at: float) -> None:
        """An in-request session admitted at ``at``: 48 MiB built before its response."""
        self.learner.on_admit("POST /build", self.used, at, responded=False)
        self.used += 48 * MIB
        self.learner.on_response(at, round(at + 0.03, 3))


def test_a_window_whose_growth_was_carried_over_memory_freed_measures_nothing() -> None:
    """An in-request session's window spans a step in which another route's process
    ended (its 96 MiB freed, the end told by the count alone): that step's growth is a
    guess, the rise before it carried on (the session's own 48 MiB jump, while its
    route's typical size is not known yet). With nothing else in it, the window would be
    taken as a measure of 96 MiB for the in-request route, the ramping route's size, and
    its bound capped there (seen in ``bench/churn.py --modes unmeasured``, bench/README.md,
    "The seventeenth session"): a window whose growth was guessed measures nothing."""
    replay = Replay()
    # A process session whose 96 MiB arrive over 2 s after its response.
    replay.learner.on_admit("POST /ramp", replay.used, 0.05)
    replay.read(2.0, 12 * MIB)
    replay.read(5.0)
    # An in-request session alone: 48 MiB, built before its response.
    replay.build(5.05)
    replay.read(7.0)
    # Another: its 48 MiB, then the process ends (told by the count, its route unknown)
    # and frees its 96 MiB in the next step, in which nothing grew.
    replay.build(7.05)
    replay.read(7.25)
    replay.learner.on_session_end(7.3, count=1)
    replay.used -= 96 * MIB
    replay.read(9.0)
    estimate = replay.learner.estimate("POST /build")
    assert estimate is not None
    assert estimate.footprint_bytes < 60 * MIB


def test_a_window_another_session_may_have_ramped_in_measures_nothing() -> None:
    """The ramping route's ramp was learned short (its first session's memory came in
    0.5 s, the next one's takes 2 s): an in-request session admitted just after the
    second is past that learned ramp has, by it, nothing else in its window, though the
    other session may still be growing (within its ramp and a quiet spell after it),
    and it is. Its window would be taken as a measure of the in-request session's 48 MiB
    and most of the other's memory (bench/README.md, "The seventeenth session"): it
    measures nothing."""
    replay = Replay()
    # An in-request session alone: 48 MiB, built before its response.
    replay.build(0.05)
    replay.read(2.0)
    # A process session whose 96 MiB come in 0.5 s: its route's ramp is learned short.
    replay.learner.on_admit("POST /ramp", replay.used, 2.05)
    replay.read(2.5, 48 * MIB)
    replay.read(6.0)
    # The next one's come over 2 s; an in-request session comes 0.9 s into it.
    replay.learner.on_admit("POST /ramp", replay.used, 6.05)
    replay.read(6.75, 12 * MIB)
    replay.build(6.95)
    replay.read(8.0, 12 * MIB)
    replay.read(16.0)
    estimate = replay.learner.estimate("POST /build")
    assert estimate is not None
    assert estimate.footprint_bytes < 60 * MIB


def test_learning_and_settling_draw_the_in_request_line_at_the_same_ramp() -> None:
    """A route whose learned ramp is at most IN_REQUEST_RAMP_S is watched only a little
    past its response and settles at its response; one just above it is neither, on
    both sides (the two once agreed only by arithmetic, and not at 0.2 s itself)."""
    line = IN_REQUEST_RAMP_S
    assert builds_in_request(line)
    assert window_length(line) == MIN_WINDOW_S
    above = line + 0.001
    assert not builds_in_request(above)
    length = window_length(above)
    assert length is not None
    assert length >= QUIET_S
    assert not builds_in_request(None)
    assert window_length(None) is None


def test_a_session_a_second_past_its_learned_ramp_may_still_be_ramping() -> None:
    """The ramping route's ramp was learned from one session alone (1.5 s); the next one's
    memory takes 2.5 s. An in-request session admitted 1.8 s into it is past that learned
    ramp and its first second, yet the other is still growing: within its ramp and a
    quiet spell after it, it is company, and the in-request session's window measures
    nothing. Taken as a measure it held the other's tail (69.9 MiB for a 48 MiB route
    in ``bench/churn.py --modes unmeasured``, seed 1: bench/README.md, "The nineteenth
    session: the in-request route learned beside a route known once")."""
    replay = Replay()
    # An in-request session alone: 48 MiB, built before its response.
    replay.build(0.05)
    replay.read(2.0)
    # A process session whose 96 MiB come over 1.5 s, alone: its ramp is learned there.
    replay.learner.on_admit("POST /ramp", replay.used, 2.05)
    replay.read(3.5, 16 * MIB)
    replay.read(7.0)
    # The next one's come over 2.5 s; an in-request session comes 1.8 s into it.
    replay.learner.on_admit("POST /ramp", replay.used, 7.05)
    replay.read(8.75, 9.6 * MIB)
    replay.build(8.85)
    replay.read(9.5, 9.6 * MIB)
    replay.read(16.0)
    estimate = replay.learner.estimate("POST /build")
    assert estimate is not None
    assert estimate.footprint_bytes < 52 * MIB
