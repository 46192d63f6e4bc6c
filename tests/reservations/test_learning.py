"""The learner, on synthetic readings: footprint, ramp, noise, freeing, forgetting.

Traffic with overlapping sessions is in ``test_learning_traffic.py``.
"""

from __future__ import annotations

import random

import pytest

from asgi_admission._admission.reservations.learning import (
    DRIFT_BYTES_PER_S,
    HORIZON_S,
    KEPT,
    Overlap,
    RouteEstimate,
    SessionLearner,
    Window,
    effective_reserve,
    empty_observations,
    percentile,
)
from kits.suitekit import MIB

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
    """One session whose memory arrives linearly over ``ramp_s``, sampled at 4 Hz, and
    that ends once its window has closed (its memory freed).

    Returns the time it ended.
    """
    rng = rng or random.Random(0)
    closed = windows(learner) + 1
    # Read at the admission: a window open across a gap of over a second is dropped.
    learner.on_reading(base, start)
    learner.on_admit(route, base, start)
    t = start
    while windows(learner) < closed:
        t += 0.25
        arrived = footprint * min(1.0, (t - start) / ramp_s) if ramp_s else footprint
        learner.on_reading(base + int(arrived) + rng.randint(-noise, noise), t)
        assert t - start < 200
    learner.on_session_end(t, route=route, admitted_at=start)
    for _ in range(4):
        t += 0.25
        learner.on_reading(base + rng.randint(-noise, noise), t)
    return t


def windows(learner: SessionLearner) -> int:
    """How many windows the learner recorded: one as each closes."""
    return sum(len(observed["windows"]) for observed in learner.observations().values())


def allowance(seconds: float) -> int:
    """What is counted to a single window for memory that may have drifted down."""
    return int(DRIFT_BYTES_PER_S * seconds)


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
    assert estimate.observations >= 5  # five windows, and the memory freed at their ends


def test_one_quiet_session_is_already_close() -> None:
    """A single session without noise gives its footprint, at most the drift allowance of
    its window (about 3 s) more, as soon as its window closes."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    t = 0.0
    while not windows(learner):
        t += 0.25
        learner.on_reading(300 * MIB + int(96 * MIB * min(1.0, t / 2.0)), t)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert 96 * MIB <= estimate.footprint_bytes <= 96 * MIB + allowance(t)
    assert t <= 3.5  # the ramp (2 s) and a quiet second


def test_ramp_time_is_estimated() -> None:
    """A 4 s linear ramp is learned as the time to 90 % of it (about 3.6 s)."""
    learner = SessionLearner()
    session(learner, start=0.0, base=300 * MIB, footprint=200 * MIB, ramp_s=4.0)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert 3.25 <= estimate.ramp_s <= 4.25


def test_concurrent_sessions_share_the_growth() -> None:
    """Three sessions admitted together: the growth is divided by three (with the drift
    allowance of the windows, which run to the horizon: none can be told apart)."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    learner.on_admit(ROUTE, 300 * MIB, 0.05)
    learner.on_admit(ROUTE, 300 * MIB, 0.1)
    t = 0.1
    while windows(learner) < 3:
        t += 0.25
        learner.on_reading(300 * MIB + int(150 * MIB * min(1.0, t / 1.5)), t)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert 48 * MIB <= estimate.footprint_bytes <= 50 * MIB + allowance(HORIZON_S + 0.25) // 3


def test_sessions_that_free_memory_learn_zero_not_a_negative() -> None:
    """A session after which the working set fell is observed as 0 bytes."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    for step in range(1, 12):
        learner.on_reading(300 * MIB - step * MIB, step * 0.25)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert estimate.footprint_bytes == 0


def test_growth_two_routes_cannot_be_told_apart_is_counted_for_each() -> None:
    """Two routes admitted together and 100 MiB of growth: neither is guessed to be the
    smaller, all of it is counted for each (until other windows tell them apart)."""
    learner = SessionLearner()
    learner.on_admit(ROUTE, 300 * MIB, 0.0)
    learner.on_admit("WS /t/*", 300 * MIB, 0.1)
    t = 0.1
    while windows(learner) < 2:
        t += 0.25
        learner.on_reading(400 * MIB, t)
    estimates = learner.estimates()
    assert [e.route for e in estimates] == sorted([ROUTE, "WS /t/*"])
    assert all(e.footprint_bytes >= 100 * MIB for e in estimates)


def test_old_sessions_are_forgotten_as_new_ones_come() -> None:
    """After ``KEPT`` smaller sessions the old, larger footprint is gone."""
    learner = SessionLearner()
    for _i in range(KEPT):
        learner.observe(ROUTE, footprint_bytes=200 * MIB, ramp_s=1.0)
    for _i in range(KEPT // 2):
        learner.observe(ROUTE, footprint_bytes=50 * MIB, ramp_s=1.0)
    half = learner.estimate(ROUTE)
    assert half is not None
    assert half.footprint_bytes == 200 * MIB
    for _i in range(KEPT // 2):
        learner.observe(ROUTE, footprint_bytes=50 * MIB, ramp_s=1.0)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert estimate.footprint_bytes == 50 * MIB


def test_memory_is_bounded_in_routes_and_observations() -> None:
    """No more than ``KEPT`` observations per route, and a bounded number of routes."""
    learner = SessionLearner()
    for i in range(1000):
        learner.observe(f"POST /r{i}", footprint_bytes=i, ramp_s=0.5)
        learner.observe("POST /one", footprint_bytes=i)
    assert len(learner.estimates()) <= 64
    assert len(learner.observations()["POST /one"]["footprints"]) == KEPT


@pytest.mark.parametrize(("timeout_s", "closes_at"), [(120.0, HORIZON_S), (5.0, 5.0)])
def test_a_window_that_never_goes_quiet_closes_at_its_horizon(
    timeout_s: float, closes_at: float
) -> None:
    """Memory climbing for ever closes the window at the horizon (the pending timeout if
    that is shorter) with what it saw."""
    learner = SessionLearner(timeout_s=timeout_s)
    learner.on_admit(ROUTE, 0, 0.0)
    t = 0.0
    while not windows(learner):
        t += 0.25
        learner.on_reading(int(t * 10 * MIB), t)
    assert t == pytest.approx(closes_at)
    assert learner.estimate(ROUTE) is not None


def test_merge_replaces_with_the_shared_observations() -> None:
    """merge() takes the shared file's observations and bumps the version once."""
    learner = SessionLearner()
    version = learner.version
    observed = empty_observations()
    observed["footprints"] = [10.0 * MIB, 20.0 * MIB]
    observed["ramps"] = [1.0]
    shared = {ROUTE: observed}
    learner.merge(shared)
    assert learner.version == version + 1
    learner.merge(shared)
    assert learner.version == version + 1
    estimate = learner.estimate(ROUTE)
    assert estimate == RouteEstimate(ROUTE, 20 * MIB, 1.0, 2)


def test_a_probes_figure_caps_bounds_from_windows_that_always_had_company() -> None:
    """Where every window of a route had company and ran long (no clean value: nothing
    ramped alone), its bounds count the others' growth in full; a concluded probe's
    growth per session, the route's others waiting, caps them as a clean value would.
    (In the churn bench's unmeasured mode such bounds once made a 48 MiB route's
    footprint 600 MiB: bench/README.md, "The eighteenth session: ten seeds unmeasured,
    and where a run loses a third".)"""
    crowded = empty_observations()
    crowded["windows"] = [
        Window(400.0 * MIB, 7.0, None, (Overlap("POST /processes", 1.0, 0.9, 0.0, 0.0),), False)
        for _ in range(4)
    ]
    learner = SessionLearner()
    learner.merge({ROUTE: crowded})
    bound = learner.estimate(ROUTE)
    assert bound is not None
    assert bound.footprint_bytes > 300 * MIB
    learner.probed(ROUTE, 48 * MIB)
    capped = learner.estimate(ROUTE)
    assert capped is not None
    assert capped.footprint_bytes == 48 * MIB
    # A figure only caps: alone it learns nothing (the probe's provisional one stands).
    alone = SessionLearner()
    alone.probed("POST /other", 48 * MIB)
    assert alone.estimate("POST /other") is None
    # It is kept with the route's observations, for the other workers.
    assert learner.observations()[ROUTE]["probed"] == [48.0 * MIB]
    # Beside a clean value it counts for nothing: a probe's growth may hold other
    # routes' sessions' too, so a larger figure never lifts the cap a clean value sets.
    with_clean = empty_observations()
    with_clean["windows"] = [*crowded["windows"], Window(50.0 * MIB, 1.0, 0.1, (), True)]
    with_clean["probed"] = [104.0 * MIB]
    learner.merge({ROUTE: with_clean})
    clean = learner.estimate(ROUTE)
    assert clean is not None
    assert clean.footprint_bytes == 50 * MIB


def test_a_routes_first_clean_value_is_taken_from_the_windows_it_ramped_in() -> None:
    """A route with one clean value (a session that ramped alone) has a typical size from
    it, and that much of each of its sessions' share is taken from another route's window.
    (In the churn bench's unmeasured mode the in-request route's probe window ran 8 s
    beside five and a half sessions of the ramping route, whose first clean window had
    measured 96 MiB: nothing was taken for them, and the in-request route was learned at
    586 MiB, too large for any more of its sessions to be admitted: bench/README.md, "The
    nineteenth session: the in-request route learned beside a route known once".)"""
    ramping = empty_observations()
    ramping["windows"] = [Window(96.0 * MIB, 3.5, 2.2, (), True)]
    crowded = empty_observations()
    company = (Overlap("POST /processes", 5.7, 5.5, 0.0, 0.0),)
    crowded["windows"] = [Window(584.0 * MIB, 8.0, None, company, True)]
    learner = SessionLearner()
    learner.merge({"POST /processes": ramping, ROUTE: crowded})
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    drift = DRIFT_BYTES_PER_S * 8.0
    assert estimate.footprint_bytes == int(584.0 * MIB + drift - 5.5 * 96.0 * MIB)
    # A route with no clean value yet is not known: nothing is taken for it.
    unknown = SessionLearner()
    unknown.merge({ROUTE: crowded})
    alone = unknown.estimate(ROUTE)
    assert alone is not None
    assert alone.footprint_bytes == int(584.0 * MIB + drift)


def test_one_end_alone_is_no_typical_size_to_take_from_other_windows() -> None:
    """A small route's only clean value is one end whose drop held 100 MiB of other
    memory freed at the same moment (120 MiB for a 20 MiB session). Taken as its typical
    size, it would be taken from each of a big route's windows beside one of its
    sessions, and the big route (116 MiB windows) learned at nothing. From one end alone
    it is not; from a second end, the median of the two."""
    small = empty_observations()
    small["ends"] = [120.0 * MIB]
    big = empty_observations()
    company = (Overlap("POST /small", 1.0, 1.0),)
    big["windows"] = [Window(116.0 * MIB, 3.0, 2.0, company, True) for _ in range(5)]
    learner = SessionLearner()
    learner.merge({"POST /small": small, "POST /big": big})
    estimate = learner.estimate("POST /big")
    assert estimate is not None
    assert estimate.footprint_bytes >= 116 * MIB
    small["ends"] = [120.0 * MIB, 20.0 * MIB]
    second = SessionLearner()
    second.merge({"POST /small": small, "POST /big": big})
    estimate = second.estimate("POST /big")
    assert estimate is not None
    assert 96 * MIB <= estimate.footprint_bytes < 100 * MIB


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


def test_steady_traffic_that_adds_nothing_learns_about_zero() -> None:
    """Admissions every 0.1 s with a flat working set: each session adds nothing (less
    than a MiB: the drift allowance shared by the sessions of each window)."""
    learner = SessionLearner()
    t = 0.0
    while t < 30:
        t += 0.1
        learner.on_admit(ROUTE, 300 * MIB, t)
        learner.on_reading(300 * MIB, t)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert estimate.footprint_bytes < MIB


def test_memory_freed_by_another_session_ending_is_left_out() -> None:
    """A 60 MiB session ramping while an older one ends and frees 80 MiB: the drop is
    not taken from the new session's growth."""
    learner = SessionLearner()
    older = "WS /old"
    learner.on_admit(older, 300 * MIB, 0.0)
    learner.on_reading(380 * MIB, 0.25)
    t, used = 0.25, 380 * MIB
    while t < 20:  # the older session's window closes; it lives on
        t += 0.25
        learner.on_reading(used, t)
    admitted = t
    learner.on_admit(ROUTE, used, admitted)
    for step in range(1, 40):
        t = admitted + step * 0.25
        if step == 4:
            learner.on_session_end(t, route=older, admitted_at=0.0)
            used -= 80 * MIB
        grown = int(60 * MIB * min(1.0, step * 0.25 / 2.0))
        learner.on_reading(used + grown, t)
    estimate = learner.estimate(ROUTE)
    assert estimate is not None
    assert 57 * MIB <= estimate.footprint_bytes <= 60 * MIB + allowance(4.0)


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
