"""The hold registry: who is woken when a route's held requests may go on."""

from __future__ import annotations

import asyncio

from asgi_admission._admission.reservations.probing import HoldRegistry

INTERNAL = "the registry of requests held for a probe, and whom its wakes tell"

ROUTE = "POST /sessions"


def test_a_wake_tells_whoever_asked_to_be_told() -> None:
    """Each wake of a route tells the callback given to ``tell_wakes`` once, whether or
    not requests of that route wait (the wait queue's may go on too)."""
    holds = HoldRegistry()
    told: list[None] = []
    holds.tell_wakes(lambda: told.append(None))
    holds.hold(ROUTE, deadline=0.0)
    holds.wake(ROUTE)
    assert (len(told), holds.count(ROUTE)) == (1, 0)
    holds.wake("WS /terminal")
    assert len(told) == 2


def test_a_wake_with_nobody_told_wakes_the_holds_alone() -> None:
    """Without ``tell_wakes`` a wake lets the route's held requests go on, and nothing
    else."""

    async def scenario() -> bool:
        holds = HoldRegistry()
        hold = holds.hold(ROUTE, deadline=0.0)
        holds.wake(ROUTE)
        await asyncio.wait_for(hold.future, timeout=1.0)
        return bool(holds)

    assert asyncio.run(scenario()) is False
