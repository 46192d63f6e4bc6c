"""The probe waiters: who is woken when a route's waiters may go on."""

from __future__ import annotations

import asyncio

from asgi_admission._admission.reservations.probing import ProbeWaiters

INTERNAL = "the registry of waiters for a probe, and whom its wakes tell"

ROUTE = "POST /sessions"


def test_a_wake_tells_whoever_asked_to_be_told() -> None:
    """Each wake of a route tells the callback given to ``tell_wakes`` once, whether or
    not requests of that route wait (the wait queue's may go on too)."""
    waiters = ProbeWaiters()
    told: list[None] = []
    waiters.tell_wakes(lambda: told.append(None))
    waiters.add(ROUTE, deadline=0.0)
    waiters.wake(ROUTE)
    assert (len(told), waiters.count(ROUTE)) == (1, 0)
    waiters.wake("WS /terminal")
    assert len(told) == 2


def test_a_wake_with_nobody_told_wakes_the_waiters_alone() -> None:
    """Without ``tell_wakes`` a wake lets the route's waiters go on, and nothing
    else."""

    async def scenario() -> bool:
        waiters = ProbeWaiters()
        waiter = waiters.add(ROUTE, deadline=0.0)
        waiters.wake(ROUTE)
        await asyncio.wait_for(waiter.future, timeout=1.0)
        return bool(waiters)

    assert asyncio.run(scenario()) is False
