"""A session request held for a probe's evidence: until woken, its deadline, or its client left.

The service may answer a request of a route being probed with a :class:`Hold`
(``reservations/probing.py``) instead of a ticket or a refusal. The request then
waits here, holding nothing, and is decided again once woken or once its deadline
passes (``ADMISSION_PROBE_WAIT_SECONDS``), which the decision turns into a refusal
(``probing``) if the probe's evidence is still not in.

The wait is one ``asyncio.wait`` on the hold's future and, where the client can be
heard (a :class:`Listener`, ``_waiting.py``), on its next message: no polling, no
timer but the deadline's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from asgi_admission._admission.reservations.probing import Hold, HoldRegistry

_T = TypeVar("_T")


class Listener(Protocol):
    """The client of a waiting request: its next message, and whether it left."""

    def next_message(self) -> asyncio.Task[Any] | None:
        """The client's next message, read in the background (``None``: not listening)."""
        ...

    def heard(self) -> bool:
        """After :meth:`next_message` completed: whether the client left."""
        ...


async def wait_then_decide(
    hold: Hold,
    holds: HoldRegistry,
    decide: Callable[[Hold, bool], Awaitable[_T | Hold]],
    listening: Listener | None,
) -> _T | None:
    """Wait with ``hold`` until woken or its deadline, then ``decide(hold, expired)``
    again; ``None`` when the client left meanwhile (it holds nothing)."""
    while True:
        outcome = await _wait(hold, holds, listening)
        if outcome is None:
            return None
        decided = await decide(hold, outcome)
        if not isinstance(decided, Hold):
            return decided
        hold = decided


async def _wait(hold: Hold, holds: HoldRegistry, listening: Listener | None) -> bool | None:
    """``False`` once woken, ``True`` at the deadline, ``None`` when the client left."""
    try:
        while True:
            remaining = hold.deadline - time.monotonic()
            if remaining <= 0:
                holds.leave(hold)
                return True
            message = None if listening is None else listening.next_message()
            waits: set[asyncio.Future[object]] = {hold.future}  # type: ignore[arg-type]
            if message is not None:
                waits.add(message)
            done, _ = await asyncio.wait(
                waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if hold.future in done:
                return False
            if message is not None and message in done:
                assert listening is not None
                if listening.heard():
                    holds.leave(hold)
                    return None
    except BaseException:
        holds.leave(hold)
        raise
