"""Synthetic session traffic for the learner: Poisson arrivals, ramps, ends and drift.

Each session's memory arrives in eight parts over its ramp (as the demo's process
sessions do), after a short start-up delay; it is freed when the session ends, or a
while later for a session that frees it late. The background drifts (three slow
sines, within ``drift_bytes``) and every reading has a little jitter. ``drive`` feeds a
learner with a fake clock: admissions when they happen, ends at the next sample (as
the reservations see them in the active count), readings four times a second.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from asgi_admission._admission.reservations.learning import SessionLearner
from kits.suitekit import MIB

#: Internal on purpose: it drives the session learner with a fake clock.
INTERNAL = "the session learner, driven with a fake clock"

SAMPLE_S = 0.25
BASE_BYTES = 300 * MIB


@dataclass(frozen=True)
class Session:
    route: str
    size: int
    admitted_at: float
    ramp_s: float
    delay_s: float
    ends_at: float
    #: Its memory is freed this long after its end (0: at once).
    free_lag_s: float = 0.0

    def memory(self, t: float) -> float:
        """What the session holds at ``t``."""
        if t < self.admitted_at or t >= self.ends_at + self.free_lag_s:
            return 0.0
        age = min(t, self.ends_at) - self.admitted_at - self.delay_s
        if age < 0:
            return 0.0
        parts = min(8, math.floor(age / self.ramp_s * 8) + 1) if self.ramp_s else 8
        return self.size * parts / 8


@dataclass(frozen=True)
class Traffic:
    """Poisson arrivals of sessions of ``sizes`` (route: bytes), at a rate that keeps
    about ``capacity`` of them open."""

    seed: int
    sizes: dict[str, int] = field(
        default_factory=lambda: {"POST /small": 48 * MIB, "WS /large": 96 * MIB}
    )
    capacity: int = 8
    mean_life_s: float = 30.0
    min_life_s: float = 5.0
    ramp_s: float = 2.0
    drift_bytes: float = 20 * MIB
    jitter_bytes: float = 0.5 * MIB
    #: Share of sessions that free their memory late, and how late at most.
    late_share: float = 0.0
    late_max_s: float = 10.0
    duration_s: float = 150.0

    def sessions(self) -> list[Session]:
        rng = random.Random(self.seed)
        rate = self.capacity / (self.mean_life_s + self.min_life_s)
        routes = sorted(self.sizes)
        out = []
        t = rng.expovariate(rate)
        while t < self.duration_s:
            route = rng.choice(routes)
            life = self.min_life_s + rng.expovariate(1 / self.mean_life_s)
            late = rng.random() < self.late_share
            out.append(
                Session(
                    route=route,
                    size=self.sizes[route],
                    admitted_at=t,
                    ramp_s=self.ramp_s * rng.uniform(0.9, 1.1),
                    delay_s=rng.uniform(0.0, 0.2),
                    ends_at=t + life,
                    free_lag_s=rng.uniform(1.0, self.late_max_s) if late else 0.0,
                )
            )
            t += rng.expovariate(rate)
        return out

    def background(self) -> Callable[[float], float]:
        rng = random.Random(self.seed + 1_000_003)
        waves = [(rng.uniform(60, 180), rng.uniform(0, 2 * math.pi)) for _ in range(3)]

        def at(t: float) -> float:
            wave = sum(math.sin(2 * math.pi * t / period + phase) for period, phase in waves)
            return BASE_BYTES + self.drift_bytes * wave / 3

        return at


@dataclass(frozen=True)
class Sample:
    """The learner's estimate of one route at one reading."""

    t: float
    route: str
    admitted: int
    footprint: int | None


def drive(
    learner: SessionLearner,
    traffic: Traffic,
    *,
    named_ends: bool = True,
    workers: int = 1,
    tell_others: bool = True,
) -> Iterator[Sample]:
    """Feed ``learner`` the traffic; yields every route's estimate after each reading.

    ``named_ends``: ends come with their route (WebSockets, tickets), else as the
    app's count falling (route unknown). With several ``workers`` the sessions are
    dealt round the workers and ``learner`` is the first one's: the others' sessions
    are in the working set only, and (``tell_others``) told at each reading while they
    settle, as the shared settling queue shows them, and their ends as the container's
    count falling by more than this worker's own.
    """
    sessions = traffic.sessions()
    others = sessions[1::workers] if workers > 1 else []
    others += [s for k in range(2, workers) for s in sessions[k::workers]]
    foreign = set(map(id, others))
    background = traffic.background()
    jitter = random.Random(traffic.seed + 7)
    upcoming = iter(sessions)
    following = next(upcoming, None)
    live: list[Session] = []
    freeing: list[Session] = []
    admitted = dict.fromkeys(traffic.sizes, 0)

    def used(t: float) -> float:
        return background(t) + sum(s.memory(t) for s in live + freeing)

    t = 0.0
    while t < traffic.duration_s:
        t += SAMPLE_S
        while following is not None and following.admitted_at <= t:
            if id(following) not in foreign:
                learner.on_admit(
                    following.route, int(used(following.admitted_at)), following.admitted_at
                )
                admitted[following.route] += 1
            live.append(following)
            following = next(upcoming, None)
        for session in [s for s in live if s.ends_at <= t]:
            live.remove(session)
            if session.free_lag_s:
                freeing.append(session)
            if id(session) in foreign:
                # The container's count fell by more than this worker's own (pending.py).
                learner.on_foreign_end()
                continue
            if named_ends:
                learner.on_session_end(t, route=session.route, admitted_at=session.admitted_at)
            else:
                learner.on_session_end(t)
        freeing = [s for s in freeing if s.ends_at + s.free_lag_s > t]
        reading = used(t) + jitter.uniform(-traffic.jitter_bytes, traffic.jitter_bytes)
        settling = tuple(
            s.admitted_at
            for s in live
            if id(s) in foreign and t < s.admitted_at + s.delay_s + s.ramp_s
        )
        learner.on_reading(int(reading), t, others=settling if tell_others else ())
        for route in traffic.sizes:
            estimate = learner.estimate(route)
            yield Sample(
                t, route, admitted[route], None if estimate is None else estimate.footprint_bytes
            )
