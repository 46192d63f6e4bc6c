"""A property over >= 10,000 random sessions: settling, tickets, failures, timeouts.

Each example drives one settler and one ledger through 250 sessions on a
simulated clock and working set: memory arriving in the request or over a ramp
after it, tickets held and started, held and released, held and never started
(the timeout), WebSockets, disconnects, app exceptions and cancellation before
the response. Throughout, nothing is released twice and the memory the guard
accounts for (the working set plus a reserve per pending session) never falls
short of what the sessions will hold, beyond the slack the spec allows: the last
10 % of a session that settled on its growth, and sessions released by their
timeout. At the end every count is zero.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import example, given, settings
from hypothesis import strategies as st
from reskit import apply, counts

from asgi_admission._admission.ledger.ledger import CountedSession, InProcessLedger
from asgi_admission._admission.reservations.settling import (
    VISIBLE_FRACTION,
    Action,
    Learned,
    Reservation,
    Settler,
)
from kits.suitekit import MIB

#: Internal on purpose: the settler and reservations, driven through random lifecycles.
INTERNAL = "the settler and reservations, driven through random lifecycles"

R = 100 * MIB
SESSIONS = 250
EXAMPLES = 40
TIMEOUT = 30.0
STEP = 0.1
BASE = 200 * MIB
#: No route learned: every session settles by its memory, its ticket or the timeout.
NOTHING_LEARNED = Learned()

BEHAVIOURS = (
    "in_request",
    "ramp",
    "ramp",
    "ticket",
    "ticket_released",
    "ticket_never_started",
    "websocket",
    "disconnect",
    "exception",
    "cancelled",
)

sessions_run = [0]


class Watched:
    """A reservation that records its transitions and fails on an effective double release."""

    def __init__(self, inner: CountedSession) -> None:
        self.inner = inner
        self.state = "pending"
        self.left_pending_by_settler = False

    def activate(self) -> None:
        if self.state == "pending":
            self.state = "active"
        self.inner.activate()

    def release(self) -> None:
        assert self.state != "released-twice"
        if self.state == "released":
            self.inner.release()  # idempotent: must change nothing
            return
        self.state = "released"
        self.inner.release()


@dataclass
class Sim:
    behaviour: str
    footprint: int
    admitted_at: float
    respond_at: float
    ramp_s: float
    end_at: float
    entry: Reservation
    reservation: Watched
    responded: bool = False
    ended: bool = False
    failed: bool = False
    started: bool = False

    def arrived(self, now: float) -> int:
        if self.failed or self.ended:
            return 0
        if self.behaviour == "in_request":
            return self.footprint if now >= self.admitted_at + 0.05 else 0
        if not self.responded:
            return 0
        fraction = 1.0 if self.ramp_s == 0 else min(1.0, (now - self.respond_at) / self.ramp_s)
        return int(self.footprint * fraction)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), oversized=st.booleans())
# A ticket started on memory counted as an older session's still ramping (its reserve
# was all that covered the older one's), and the same after a later ticket's memory
# paid for its record left early.
@example(seed=527, oversized=False)
@example(seed=1914, oversized=False)
def test_random_sessions_release_once_never_early_and_return_to_zero(
    seed: int, oversized: bool
) -> None:
    """250 random sessions per example: once each, never early, counts back to zero."""
    rng = random.Random(seed)
    settler = Settler(timeout_s=TIMEOUT)
    ledger = InProcessLedger()
    sims: list[Sim] = []
    now = 0.0

    def working_set() -> int:
        return BASE + sum(sim.arrived(now) for sim in sims)

    def check() -> None:
        active, pending = counts(ledger)
        assert active >= 0
        assert pending >= 0
        expected_pending = sum(1 for s in sims if s.reservation.state == "pending")
        assert pending == expected_pending
        # Memory still to come from sessions that are no longer pending, beyond the
        # allowed slack, must be covered by the reserves still held.
        missing = 0
        for sim in sims:
            if sim.reservation.state == "pending" or sim.failed or sim.ended:
                continue
            if sim.entry.expired or now - sim.admitted_at >= TIMEOUT:
                continue
            owed = sim.footprint - sim.arrived(now)
            missing += max(0, owed - int((1 - VISIBLE_FRACTION) * R) - 1)
        assert missing <= pending * R
        # What the pending sessions still hold is kept as a running total: it is the sum.
        assert settler.still_to_add() == (
            sum(entry.remaining for entry in settler._pending),
            settler.unsettled,
        )

    for _index in range(SESSIONS):
        behaviour = rng.choice(BEHAVIOURS)
        footprint = int(R * (rng.uniform(0.3, 0.9) if oversized else rng.uniform(0.95, 1.0)))
        with ledger.locked():
            reservation = Watched(ledger.reserve())
            entry = settler.admit(
                reservation,
                kind="websocket" if behaviour == "websocket" else "http",
                route="POST /s",
                used_bytes=working_set(),
                now=now,
                expected_bytes=R,
            )
        sims.append(
            Sim(
                behaviour=behaviour,
                footprint=footprint,
                admitted_at=now,
                respond_at=now + rng.uniform(0.05, 0.5),
                ramp_s=rng.choice([0.0, 0.5, 2.0, 5.0]),
                end_at=now + rng.uniform(1.0, 60.0),
                entry=entry,
                reservation=reservation,
            )
        )
        if behaviour.startswith("ticket"):
            assert settler.hold(entry)
        # Advance the clock until the next arrival, playing every session's events.
        for _ in range(rng.randint(0, 6)):
            now += STEP
            events: list[Action] = []
            for sim in sims:
                if sim.ended:
                    continue
                if not sim.responded and not sim.failed and now >= sim.respond_at:
                    if sim.behaviour in ("disconnect", "exception", "cancelled"):
                        sim.failed = True
                        events += settler.abandon(sim.entry)
                    else:
                        sim.responded = True
                        events += settler.respond(sim.entry, now, NOTHING_LEARNED)
                if (
                    sim.behaviour in ("ticket", "ticket_released")
                    and sim.responded
                    and not sim.started
                    and sim.arrived(now) == sim.footprint
                ):
                    sim.started = True
                    events += settler.started(sim.entry, NOTHING_LEARNED)
                if now >= sim.end_at and (sim.responded or sim.failed):
                    sim.ended = True
                    if sim.behaviour == "websocket":
                        events += settler.abandon(sim.entry, session_over=True)
                    elif sim.behaviour in ("ticket", "ticket_released"):
                        events += settler.release(sim.entry)
                        events += settler.release(sim.entry)
            with ledger.locked():
                events += settler.settle(working_set(), now, NOTHING_LEARNED)
            apply(events)
            check()
    # Every request completes and every session ends; the timeout passes.
    for sim in sims:
        if not sim.responded and not sim.failed:
            if sim.behaviour in ("disconnect", "exception", "cancelled"):
                sim.failed = True
                apply(settler.abandon(sim.entry))
            else:
                sim.responded = True
                apply(settler.respond(sim.entry, now, NOTHING_LEARNED))
        if not sim.ended:
            sim.ended = True
            if sim.behaviour == "websocket" or sim.behaviour.startswith("ticket"):
                apply(settler.release(sim.entry))
    for _ in range(int(TIMEOUT / STEP) + 5):
        now += STEP
        with ledger.locked():
            events = settler.settle(working_set(), now, NOTHING_LEARNED)
        apply(events)
    assert counts(ledger) == (0, 0)
    assert settler.unsettled == 0
    assert settler.responded == 0
    assert settler._queue.load() == (None, [])
    assert all(
        sim.reservation.state == "released"
        for sim in sims
        if sim.entry.kind == "http" and not sim.started
    )
    sessions_run[0] += SESSIONS


def test_the_property_ran_over_ten_thousand_sessions() -> None:
    """The property above drove at least 10,000 sessions (it runs first, in file order)."""
    assert sessions_run[0] >= 10_000
