"""The learner, on synthetic readings: footprint, ramp, noise, freeing, forgetting."""

from __future__ import annotations

import random

import pytest

from asgi_admission._admission.learning import (
    WINDOW,
    RouteEstimate,
    SessionLearner,
    effective_reserve,
    percentile,
)
from suitekit import MIB

#: Internal on purpose: the session learner, on synthetic readings.
INTERNAL = "the session learner, on synthetic readings"

ROUTE = "POST /sessions"


def session(
    learner: SessionLearner,
    *,
    start: float,
    base: int,
    footprint: int,
    ramp_s: float,
    noise: int = 0,
    rng: random.Random | None = None,
    route: str = ROUTE,
) -> float:
    """One session whose memory arrives linearly over ``ramp_s``, sampled at 4 Hz.

    Returns the time its episode ended (the learner went quiet).
    """
    rng = rng or random.Random(0)
    learner.on_admit(route, base, start)
    t = start
    while learner.observing:
        t += 0.25
        arrived = footprint * min(1.0, (t - start) / ramp_s) if ramp_s else footprint
        learner.on_reading(base + int(arrived) + rng.randint(-noise, noise), t)
        assert t - start < 200
    return t


def test_footprint_converges_within_15_percent_in_five_sessions() -> None:
    """Five sequential sessions of 96 MiB (ramping 2 s, noisy) learn it within 15 %."""
    learner = SessionLearner()
    rng = random.Random(1)
    t = 0.0
    for _ in range(5):
        t = session(
            learner,
            start=t + 1,
            base=300 * MIB,
            footprint=96 * MIB,
            ramp_s=2.0,
            noise=2 * MIB,
            rng=rng,
        )
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert abs(estimate.footprint_bytes - 96 * MIB) <= 0.15 * 96 * MIB
    assert estimate.observations == 5


def test_one_quiet_session_is_already_close() -> None:
    """A single session without noise gives its footprint (within the 1 % peak step)."""
    learner = SessionLearner()
    session(learner, start=0.0, base=300 * MIB, footprint=96 * MIB, ramp_s=2.0)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert abs(estimate.footprint_bytes - 96 * MIB) <= 0.02 * 96 * MIB


def test_ramp_time_is_estimated() -> None:
    """A 4 s linear ramp is learned as the time to 90 % of it (about 3.6 s)."""
    learner = SessionLearner()
    session(learner, start=0.0, base=300 * MIB, footprint=200 * MIB, ramp_s=4.0)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert 3.25 <= estimate.ramp_s <= 4.25


def test_concurrent_sessions_share_the_growth() -> None:
    """Three sessions admitted together: the growth is divided by three."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    learner.on_admit(ROUTE, 300 * MIB, 0.05)
    learner.on_admit(ROUTE, 300 * MIB, 0.1)
    t = 0.1
    while learner.observing:
        t += 0.25
        learner.on_reading(300 * MIB + int(150 * MIB * min(1.0, t / 1.5)), t)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert abs(estimate.footprint_bytes - 50 * MIB) <= 2 * MIB


def test_sessions_that_free_memory_learn_zero_not_a_negative() -> None:
    """A session after which the working set fell is observed as 0 bytes."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    for step in range(1, 12):
        learner.on_reading(300 * MIB - step * MIB, step * 0.25)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert estimate.footprint_bytes == 0


def test_an_episode_mixing_routes_teaches_nothing() -> None:
    """Growth that cannot be told apart between two routes is not attributed."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    learner.on_admit("WS /t/*", 300 * MIB, 0.1)
    t = 0.1
    while learner.observing:
        t += 0.25
        learner.on_reading(400 * MIB, t)
    assert learner.estimates() == []


def test_old_sessions_are_forgotten_as_new_ones_come() -> None:
    """After a window of smaller sessions the old, larger footprint is gone."""
    learner = SessionLearner()
    for _i in range(WINDOW):
        learner.observe(ROUTE, footprint_bytes=200 * MIB, ramp_s=1.0)
    for _i in range(WINDOW // 2):
        learner.observe(ROUTE, footprint_bytes=50 * MIB, ramp_s=1.0)
    half = learner.estimate(ROUTE)
    assert half is not None
    assert half.footprint_bytes == 200 * MIB
    for _i in range(WINDOW // 2):
        learner.observe(ROUTE, footprint_bytes=50 * MIB, ramp_s=1.0)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert estimate.footprint_bytes == 50 * MIB


def test_memory_is_bounded_in_routes_and_observations() -> None:
    """No more than WINDOW observations per route, and a bounded number of routes."""
    learner = SessionLearner()
    for i in range(1000):
        learner.observe(f"POST /r{i}", footprint_bytes=i, ramp_s=0.5)
        learner.observe("POST /one", footprint_bytes=i)
    assert len(learner.estimates()) <= 64
    assert len(learner.export()["POST /one"]["footprints"]) == WINDOW


def test_an_episode_that_never_goes_quiet_ends_at_the_timeout() -> None:
    """Memory climbing for ever closes the episode at the timeout with what it saw."""
    learner = SessionLearner(timeout_s=10.0)
    learner.on_admit(ROUTE, 0, 0.0)
    t = 0.0
    while learner.observing:
        t += 0.25
        learner.on_reading(int(t * 10 * MIB), t)
    assert t == pytest.approx(10.0)
    assert learner.estimate(ROUTE) is not None


def test_merge_replaces_with_the_shared_observations() -> None:
    """merge() takes the shared file's observations and bumps the version once."""
    learner = SessionLearner()
    version = learner.version
    shared = {ROUTE: {"footprints": [10.0 * MIB, 20.0 * MIB], "ramps": [1.0]}}
    learner.merge(shared)
    assert learner.version == version + 1
    learner.merge(shared)
    assert learner.version == version + 1
    estimate = learner.estimate(ROUTE)
    assert estimate == RouteEstimate(ROUTE, 20 * MIB, 1.0, 2)


@pytest.mark.parametrize(
    ("mode", "configured", "learned", "expected"),
    [
        ("off", 100, [500], 100),
        ("raise", 100, [], 100),
        ("raise", 100, [50], 100),
        ("raise", 100, [50, 500], 500),
        ("adapt", 100, [50], 50),
        ("adapt", 100, [5], 16),
        ("adapt", 100, [], 100),
    ],
)
def test_effective_reserve(mode: str, configured: int, learned: list[int], expected: int) -> None:
    """raise never lowers the configured reserve; adapt replaces it above the floor."""
    estimates = [RouteEstimate(f"r{i}", value, 1.0, 1) for i, value in enumerate(learned)]
    got = effective_reserve(configured, estimates, mode=mode, min_bytes=16)  # type: ignore[arg-type]
    assert got == expected


def test_percentile_is_nearest_rank() -> None:
    """The 90th percentile of 1..10 is 9; of one value, that value."""
    assert percentile(range(1, 11)) == 9
    assert percentile([7]) == 7


def test_steady_traffic_that_adds_nothing_learns_zero() -> None:
    """Admissions every 0.1 s with a flat working set still end the episode: 0 bytes each."""
    learner = SessionLearner()
    t = 0.0
    learner.on_admit(ROUTE, 300 * MIB, t)
    while learner.observing:
        t += 0.1
        learner.on_admit(ROUTE, 300 * MIB, t)
        learner.on_reading(300 * MIB, t)
        assert t < 30
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert estimate.footprint_bytes == 0


def test_an_episode_in_which_a_session_ended_teaches_nothing() -> None:
    """Memory freed by a session ending mid-episode makes the episode ambiguous."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    learner.on_reading(350 * MIB, 0.5)
    learner.on_session_end()
    t = 0.5
    while learner.observing:
        t += 0.25
        learner.on_reading(350 * MIB, t)
    assert learner.estimates() == []
    learner.on_session_end()  # no episode open: nothing to spoil


@pytest.mark.parametrize(
    ("configured", "learned", "replaces", "expected"),
    [
        (10 * MIB, None, False, 10 * MIB),  # nothing learned
        (10 * MIB, 50 * MIB, False, 50 * MIB),  # raise: a larger footprint wins
        (100 * MIB, 50 * MIB, False, 100 * MIB),  # raise: never below the configured one
        (100 * MIB, 50 * MIB, True, 50 * MIB),  # adapt: the footprint replaces it
        (None, 200 * MIB, False, 200 * MIB),  # derived (1 GiB / 8 = 128 MiB), raised
        (None, 50 * MIB, False, 128 * MIB),
    ],
)
def test_the_latch_reserve_takes_in_what_was_learned(
    configured: int | None, learned: int | None, replaces: bool, expected: int
) -> None:
    """reserve_for applies the learned footprint to the configured or derived reserve."""
    from asgi_admission import AdmissionController, MemoryReading

    def unread() -> MemoryReading:
        raise AssertionError("reserve_for is given the limit: it takes no reading")

    controller = AdmissionController(reserve_bytes=configured, memory_reader=unread)
    controller.learned_reserve_bytes = learned
    controller.learned_replaces = replaces
    assert controller.reserve_for(1024 * MIB) == expected
