"""The keeper's periodic sample: with the app's lifespan, or while requests wait for a probe.

Where the server runs no lifespan, nothing would take the readings that end a
probe (``probing.py``); the first request held for one starts a sample of the
running loop, which ends once nothing waits or is probed any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.reservations.keeper import SAMPLE_INTERVAL_S, ReservationKeeper

#: The sample started for requests waiting without a lifespan, per keeper.
_helpers: weakref.WeakKeyDictionary[ReservationKeeper, asyncio.Task[None]] = (
    weakref.WeakKeyDictionary()
)


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
            tasks.append(loop.create_task(keeper.run()))
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
    if keeper.sampling or (helper is not None and not helper.done()):
        return
    _helpers[keeper] = asyncio.get_running_loop().create_task(_sample_waiting(keeper))


async def _sample_waiting(keeper: ReservationKeeper) -> None:
    while not keeper.sampling and (keeper.holds or keeper.board.busy):
        await keeper.sample_after(SAMPLE_INTERVAL_S)
