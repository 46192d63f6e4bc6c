"""The keeper's periodic sample: with the app's lifespan, or while requests wait for a probe.

Where the server runs no lifespan, nothing would take the readings that end a
probe (``probing.py``); the first request held for one starts a sample of the
running loop, which ends once nothing waits or is probed any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.reservations.keeper import ReservationKeeper
from asgi_admission._admission.reservations.looks import SAMPLE_INTERVAL_S

logger = logging.getLogger("asgi_admission")

#: The sample started for requests waiting without a lifespan, per keeper.
_helpers: weakref.WeakKeyDictionary[ReservationKeeper, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)
#: How many periodic samples run per keeper (from a lifespan: :func:`run`).
_running: weakref.WeakKeyDictionary[ReservationKeeper, int] = weakref.WeakKeyDictionary()


async def run(keeper: ReservationKeeper, interval_s: float = SAMPLE_INTERVAL_S) -> None:
    """Sample ``keeper`` every ``interval_s`` until cancelled (the lifespan runs this)."""
    _running[keeper] = _running.get(keeper, 0) + 1
    try:
        while True:
            await sample_after(keeper, interval_s)
    finally:
        _running[keeper] -= 1


async def sample_after(keeper: ReservationKeeper, interval_s: float) -> None:
    """One sample once ``interval_s`` has passed; a failure is logged, never raised."""
    await asyncio.sleep(interval_s)
    try:
        keeper.sample()
    except Exception:
        logger.exception("asgi-admission: the reservation sample failed; trying again.")


def sampling(keeper: ReservationKeeper) -> bool:
    """Whether a periodic sample of ``keeper`` runs (from a lifespan)."""
    return _running.get(keeper, 0) > 0


async def serve_with_keeper(
    keeper: ReservationKeeper,
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    also: Callable[[], Coroutine[Any, Any, None]] | None = None,
) -> None:
    """Run ``app``'s lifespan with the keeper's periodic sample (and ``also``, another
    watch of the guard's) from startup to shutdown."""
    tasks: list[asyncio.Task[None]] = []

    async def send_and_track(message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete" and not tasks:
            loop = asyncio.get_running_loop()
            tasks.append(loop.create_task(run(keeper)))
            if also is not None:
                tasks.append(loop.create_task(also()))
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            await _stop(tasks)
        await send(message)

    try:
        await app(scope, receive, send_and_track)
    finally:
        await _stop(tasks)


async def _stop(tasks: list[asyncio.Task[None]]) -> None:
    while tasks:
        task = tasks.pop()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def sample_while_waiting(keeper: ReservationKeeper) -> None:
    """Requests wait for a probe: with no lifespan sampling, a task of the running loop
    samples every ``SAMPLE_INTERVAL_S`` until nothing waits or is probed any more."""
    helper = _helpers.get(keeper)
    if sampling(keeper) or (helper is not None and not helper.done()):
        return
    _helpers[keeper] = asyncio.get_running_loop().create_task(_sample_waiting(keeper))


async def _sample_waiting(keeper: ReservationKeeper) -> None:
    while not sampling(keeper) and keeper.probes_busy:
        await sample_after(keeper, SAMPLE_INTERVAL_S)
