"""A session request's body, read before the decision so that a slow client holds nothing.

Notes:

- A reservation made before the body has arrived could be held by a client that
  sends its headers and then nothing: as many such connections as sessions fit
  would lock the service (ASGI servers set no body timeout of their own). So the
  guard reads the body first, up to ``buffer_bytes``, and decides only once it
  is complete; the app then reads the same messages, replayed (``replaying``).
- The wait is bounded by ``timeout_s`` from the request's start: past it the
  client gets a ``408`` and the app is never called. The bound is a timer that
  cancels the request's own task while it waits on ``receive``; only a
  cancellation the timer made is taken as the timeout, any other one goes on.
- A body larger than ``buffer_bytes`` is decided on its first part and streams
  to the app; if the rest has not arrived by the same deadline, the reservation
  is given back (:func:`replaying`'s ``on_late``) and the app reads on holding
  nothing. Buffering is bounded so that the guard itself never holds more than
  ``buffer_bytes`` per request.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Final, Literal

from starlette.types import Message, Receive

Arrival = Literal["complete", "partial", "disconnected", "timed_out"]

_UNCANCEL: Final = sys.version_info >= (3, 11)


async def read_body(
    receive: Receive, *, buffer_bytes: int, timeout_s: float
) -> tuple[list[Message], Arrival]:
    """The request's messages up to its whole body, at most ``buffer_bytes`` of it.

    ``complete``: the body is all there; ``partial``: more than ``buffer_bytes``
    is coming; ``disconnected``: the client left; ``timed_out``: the body had not
    arrived within ``timeout_s``.
    """
    messages: list[Message] = []
    task = asyncio.current_task()
    if task is None:  # pragma: no cover - an ASGI app always runs in a task
        raise RuntimeError("asgi-admission must run inside an asyncio task.")
    fired = False

    def expire() -> None:
        nonlocal fired
        fired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)
    size = 0
    try:
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                return messages, "disconnected"
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return messages, "complete"
            if size >= buffer_bytes:
                return messages, "partial"
    except asyncio.CancelledError:
        if not fired:
            raise
        if _UNCANCEL:
            task.uncancel()  # type: ignore[attr-defined,unused-ignore]
        return messages, "timed_out"
    finally:
        timer.cancel()


def replaying(
    messages: list[Message],
    receive: Receive,
    *,
    partial_for_s: float | None = None,
    on_late: Callable[[], None] = lambda: None,
) -> Receive:
    """A ``receive`` that gives the app ``messages`` first, then the server's.

    ``partial_for_s``: the body is still arriving; ``on_late()`` is called if it
    has not all arrived that many seconds from now.
    """
    queue = list(reversed(messages))
    late = None
    if partial_for_s is not None:
        late = asyncio.get_running_loop().call_later(max(0.0, partial_for_s), on_late)

    async def replay() -> Message:
        nonlocal late
        if queue:
            return queue.pop()
        message = await receive()
        if late is not None and (
            message["type"] != "http.request" or not message.get("more_body", False)
        ):
            late.cancel()
            late = None
        return message

    return replay
