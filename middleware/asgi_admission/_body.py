"""A session request's body, read before the decision so that a slow client holds nothing.

Notes:

- A reservation made before the body has arrived could be held by a client that
  sends its headers and then nothing: as many such connections as sessions fit
  would lock the service (ASGI servers set no body timeout of their own). So the
  guard reads the body first, up to ``buffer_bytes``, and decides only once it
  is complete; the app then reads the same messages, replayed.
- The wait is bounded by ``timeout_s`` from the request's start: past it the
  client gets a ``408`` and the app is never called. The bound is one timer for
  all the requests still reading (``BodyReader``), which cancels a late
  request's own task while it waits on ``receive``; only a cancellation the
  timer made is taken as the timeout, any other one goes on.
- A body larger than ``buffer_bytes`` is decided on its first part and streams
  to the app; if the rest has not arrived by the same deadline, the reservation
  is given back (``WatchedHttp``'s timer in ``_watching.py``) and the app reads on
  holding nothing.
  Buffering is bounded so that the guard itself never holds more than
  ``buffer_bytes`` per request.
"""

from __future__ import annotations

import asyncio
import sys
from asyncio import current_task
from time import monotonic
from typing import Any, Final, Literal

from starlette.types import Message, Receive

Arrival = Literal["complete", "partial", "disconnected", "timed_out"]

_UNCANCEL: Final = sys.version_info >= (3, 11)


class BodyReader:
    """Reads session requests' bodies before their decision, each within ``timeout_s``.

    One timer serves every request whose body is still arriving (armed for the
    earliest deadline, never per request): a body that is already there, the
    common case, costs a dictionary entry and no timer.
    """

    __slots__ = ("_expired", "_reading", "_timer", "buffer_bytes", "timeout_s")

    def __init__(self, *, timeout_s: float, buffer_bytes: int) -> None:
        self.timeout_s = timeout_s
        self.buffer_bytes = buffer_bytes
        #: The tasks reading a body now, with their deadlines (``time.monotonic``).
        self._reading: dict[asyncio.Task[Any], float] = {}
        #: Those the timer cancelled.
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> asyncio.Task[Any]:
        """The current request begins reading its body: its deadline starts now."""
        task = current_task()
        if task is None:  # pragma: no cover - an ASGI app always runs in a task
            raise RuntimeError("asgi-admission must run inside an asyncio task.")
        self._reading[task] = monotonic() + self.timeout_s
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        return task

    def stop(self, task: asyncio.Task[Any]) -> float:
        """The request has its body (or left, or timed out): the seconds its deadline
        had left."""
        return self._reading.pop(task) - monotonic()

    def timed_out(self, task: asyncio.Task[Any]) -> None:
        """Inside ``except CancelledError`` around the read: returns where the timer
        cancelled it (the read timed out), re-raises any other cancellation."""
        if task not in self._expired:
            raise  # the cancellation being handled: not the timer's
        self._expired.discard(task)
        if _UNCANCEL:
            task.uncancel()  # type: ignore[attr-defined,unused-ignore]

    async def rest(self, receive: Receive, message: Message) -> tuple[list[Message], Arrival]:
        """After a first ``message`` that is not the whole body: the messages up to the
        whole body, at most ``buffer_bytes`` of it, or the client leaving."""
        messages = [message]
        size = 0
        while True:
            if message["type"] != "http.request":
                return messages, "disconnected"
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return messages, "complete"
            if size >= self.buffer_bytes:
                return messages, "partial"
            message = await receive()
            messages.append(message)

    def _expire(self) -> None:
        # Cancel the reads past their deadline; re-arm for the earliest one left.
        self._timer = None
        now = monotonic()
        earliest = None
        for task, deadline in self._reading.items():
            if task in self._expired:
                continue
            if deadline <= now:
                self._expired.add(task)
                task.cancel()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._timer = asyncio.get_running_loop().call_later(earliest - now, self._expire)
