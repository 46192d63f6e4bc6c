"""The learner under real traffic: overlapping ramps, sessions ending, drift, late frees."""

from __future__ import annotations

import time

import pytest
from traffic import SAMPLE_S, Sample, Traffic, drive

from asgi_admission._admission.reservations.learning import KEPT, SessionLearner
from kits.suitekit import MIB

#: Internal on purpose: the session learner, fed synthetic traffic with a fake clock.
INTERNAL = "the session learner, fed synthetic traffic with a fake clock"

SEEDS = range(40)
#: After this many sessions of a route (and their memory arrived), its estimate is close.
SETTLED_AFTER = 8
TOLERANCE = 0.15
#: The share of routes' runs whose estimate is within ``TOLERANCE`` above the truth after
#: ``SETTLED_AFTER`` sessions, on the Poisson traffic below (measured: 72 of 80); the
#: others stay too large, the safe side, from windows other sessions' growth inflates
#: (docs/reservations.md, Limits).
MOSTLY = 0.85


def by_route(samples: list[Sample], route: str) -> list[Sample]:
    return [s for s in samples if s.route == route]


def after_sessions(rows: list[Sample], sessions: int) -> list[Sample]:
    """The samples once ``sessions`` sessions were admitted and their memory had arrived."""
    admitted_at = next((s.t for s in rows if s.admitted >= sessions), None)
    assert admitted_at is not None, "the traffic never reached that many sessions"
    return [s for s in rows if s.t >= admitted_at + 5.0]


def worst(rows: list[Sample], size: int) -> tuple[float, float]:
    """The lowest and highest estimate against the truth (among samples with one)."""
    ratios = [s.footprint / size for s in rows if s.footprint is not None]
    return min(ratios), max(ratios)


def test_poisson_traffic_learns_every_route_never_far_below_and_mostly_within_15_percent() -> None:
    """Poisson arrivals at about capacity, two routes (48 and 96 MiB), overlapping 2 s
    ramps, random lifetimes, drift of +-20 MiB, 40 seeds: no footprint is ever more than
    15 % below the truth, and most are within 15 % above it after 8 sessions."""
    highs = []
    for seed in SEEDS:
        traffic = Traffic(seed=seed, duration_s=300.0)
        samples = list(drive(SessionLearner(), traffic))
        for route, size in traffic.sizes.items():
            rows = by_route(samples, route)
            low, _high = worst(rows, size)
            assert low >= 1 - TOLERANCE, (seed, route, low)
            highs.append(worst(after_sessions(rows, SETTLED_AFTER), size)[1])
    assert sum(high <= 1 + TOLERANCE for high in highs) >= MOSTLY * len(highs), highs


@pytest.mark.parametrize("seed", SEEDS)
def test_sessions_that_free_their_memory_late_do_not_drive_the_estimate_down(
    seed: int,
) -> None:
    """Half of the sessions free their memory 1-10 s after their end (the working set
    stays up while they are gone): no estimate falls more than 15 % below the truth."""
    traffic = Traffic(seed=seed, late_share=0.5, duration_s=300.0)
    samples = list(drive(SessionLearner(), traffic))
    for route, size in traffic.sizes.items():
        rows = by_route(samples, route)
        low, _high = worst(rows, size)
        assert low >= 1 - TOLERANCE, (route, low)
        settled_low, _ = worst(after_sessions(rows, SETTLED_AFTER), size)
        assert settled_low >= 1 - TOLERANCE, (route, settled_low)


def test_ends_of_unknown_route_still_learn() -> None:
    """Ends reported only as a count falling (the app's ``current_sessions``) still
    learn both routes, never far below the truth, over 10 seeds; more of them stay too
    large for a while than with named ends (15 of 20 routes' runs within 15 % above
    after 8 sessions, the largest 3.8 times the truth)."""
    highs = []
    for seed in range(10):
        traffic = Traffic(seed=seed, duration_s=300.0)
        samples = list(drive(SessionLearner(), traffic, named_ends=False))
        for route, size in traffic.sizes.items():
            rows = by_route(samples, route)
            low, _high = worst(rows, size)
            assert low >= 1 - TOLERANCE, (seed, route, low)
            highs.append(worst(after_sessions(rows, SETTLED_AFTER), size)[1])
    assert sum(high <= 1 + TOLERANCE for high in highs) >= 0.7 * len(highs), highs


def test_steady_traffic_without_a_quiet_moment_still_learns() -> None:
    """Sessions opening every 0.5-1.5 s and closing after 6-10 s, never a quiet second in
    four minutes: the footprint and the ramp are learned, the footprint on the safe side
    (no window measures one session alone here: each overlaps the route's others, and
    what each leaves for its own session is a bound; 1.6 times the truth, measured)."""
    learner = SessionLearner()
    route, size = "POST /s", 64 * MIB
    t, used, opened = 0.0, 300.0 * MIB, []
    next_admit, readings_quiet = 0.0, 0
    rng_times = [0.5 + (i * 0.37) % 1.0 for i in range(1000)]
    lives = [6.0 + (i * 0.53) % 4.0 for i in range(1000)]
    i = 0
    while t < 240.0:
        t += SAMPLE_S
        while next_admit <= t:
            learner.on_admit(route, int(used), next_admit)
            opened.append((next_admit, next_admit + lives[i]))
            next_admit += rng_times[i]
            i += 1
        for session in [s for s in opened if s[1] <= t]:
            opened.remove(session)
            learner.on_session_end(t, route=route, admitted_at=session[0])
        previous = used
        used = 300 * MIB + sum(size * min(1.0, (t - a) / 2.0) for a, _e in opened)
        readings_quiet += abs(used - previous) < 1 * MIB
        learner.on_reading(int(used), t)
    assert readings_quiet < 0.05 * (240.0 / SAMPLE_S)  # steady traffic, not episodes
    estimate = learner.estimate(route)
    assert estimate is not None
    assert (1 - TOLERANCE) * size <= estimate.footprint_bytes <= 2 * size
    assert 1.4 <= estimate.ramp_s <= 2.6  # a linear 2 s ramp reaches 90 % at 1.8 s


@pytest.mark.parametrize("seed", range(10))
def test_the_ramp_is_learned_under_overlap(seed: int) -> None:
    """Sessions ramping over 3 s, overlapping: the learned ramp (to 90 %) is 2-4 s for both
    routes once each has had a dozen sessions."""
    traffic = Traffic(seed=seed, ramp_s=3.0, duration_s=200.0)
    learner = SessionLearner()
    for _ in drive(learner, traffic):
        pass
    for route in traffic.sizes:
        estimate = learner.estimate(route)
        assert estimate is not None
        assert 2.0 <= estimate.ramp_s <= 4.0, (route, estimate.ramp_s)


def test_memory_and_time_per_reading_stay_bounded() -> None:
    """Ten minutes of traffic over 64 routes and more: at most ``KEPT`` windows per route,
    at most 64 routes, and a reading costs well under a millisecond on average."""
    sizes = {f"POST /r{i}": (16 + i) * MIB for i in range(70)}
    traffic = Traffic(seed=3, sizes=sizes, capacity=20, duration_s=600.0)
    learner = SessionLearner()
    start = time.process_time()
    readings = sum(1 for _ in drive(learner, traffic)) // len(sizes)
    per_reading = (time.process_time() - start) / readings
    observations = learner.observations()
    assert len(observations) <= 64
    assert all(len(values["windows"]) <= KEPT for values in observations.values())
    assert per_reading < 0.005  # includes the test's own driving and estimates


@pytest.mark.parametrize("seed", range(20))
def test_other_workers_sessions_are_not_taken_for_this_workers_own(seed: int) -> None:
    """Four workers share the memory and one learns, told of the others' sessions while
    they settle (the shared settling queue) and of their ends (the container's count
    falling by more than its own): its estimate is never more than 15 % below the truth,
    is there after 16 of its own sessions, and within -15 %/+30 % after 12 (it learns
    only from the spells its own sessions had to themselves, so it needs more sessions,
    and the memory other workers free inside a window makes it err high, not low: 1.27
    at most, measured)."""
    traffic = Traffic(seed=seed, duration_s=1200.0)
    samples = list(drive(SessionLearner(), traffic, workers=4))
    for route, size in traffic.sizes.items():
        rows = by_route(samples, route)
        low, _high = worst(rows, size)
        assert low >= 1 - TOLERANCE, (route, low)
        assert after_sessions(rows, 16)[0].footprint is not None, route
        settled_low, settled_high = worst(after_sessions(rows, 12), size)
        assert 1 - TOLERANCE <= settled_low <= settled_high <= 1.3, (route, settled_high)


def test_other_workers_sessions_untold_would_inflate_the_estimate() -> None:
    """The trap the test above guards against is real: untold, the other workers'
    growth is taken for this worker's own sessions, several times their size."""
    traffic = Traffic(seed=0, duration_s=600.0)
    samples = list(drive(SessionLearner(), traffic, workers=4, tell_others=False))
    highs = [worst(by_route(samples, route), size)[1] for route, size in traffic.sizes.items()]
    assert max(highs) > 1.5


@pytest.mark.parametrize(("grown_mb", "learned"), [(96, False), (0, True)])
def test_a_window_another_workers_session_ramped_in_teaches_only_if_nothing_grew(
    grown_mb: int, learned: bool
) -> None:
    """A session admitted while another worker's session settles: memory that grew over
    its window may be either's, so it teaches nothing; a window over which nothing grew
    bounds the session all the same (it cost nothing)."""
    learner = SessionLearner()
    base = 300 * MIB
    learner.on_reading(base, 0.0)
    learner.on_admit("POST /s", base, 0.1)
    t = 0.0
    while t < 10.0:
        t += SAMPLE_S
        others = (0.05,) if t < 2.0 else ()
        used = base + int(grown_mb * MIB * min(1.0, t / 2.0))
        learner.on_reading(used, t, others=others)
    assert (learner.estimate("POST /s") is not None) is learned
