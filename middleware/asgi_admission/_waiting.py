"""The client of a session request held for a probe's evidence, heard while it waits.

The service (``_admission/reservations/probing.py``) waits a held request; this is what it
listens to meanwhile, so that a client that leaves ends the wait.

Notes:

- HTTP: the body has been read before the decision, so the next message is the
  client's disconnect, which ends the wait with nothing sent. A body larger than
  the guard's buffer is still arriving: it is not read ahead (it belongs to the
  app), and a client that leaves is found once the app reads it.
- WebSocket: the wait is before the accept. The server's ``websocket.connect`` is
  taken first and kept for the app (or the refusal); the next message can only be
  the client's disconnect.
- Whatever is read while waiting is handed to the app in order (``receive``); a
  read still pending when the request ends is cancelled (``close``).
"""

from __future__ import annotations

import asyncio

from starlette.types import Message, Receive

_DISCONNECTS = frozenset({"http.disconnect", "websocket.disconnect"})


class Listening:
    """The client's messages while its request waits: a disconnect is noticed, anything
    else kept for the app."""

    __slots__ = ("_kept", "_quiet", "_receive", "_task")

    def __init__(self, receive: Receive, kept: list[Message] | None = None) -> None:
        self._receive = receive
        self._kept = list(kept or ())
        self._task: asyncio.Task[Message] | None = None
        #: Once anything but a disconnect arrived, nothing more is read ahead.
        self._quiet = False

    def next_message(self) -> asyncio.Task[Message] | None:
        """The client's next message, read in the background (``None``: not listening)."""
        if self._quiet:
            return None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._read())
        return self._task

    async def _read(self) -> Message:
        return await self._receive()

    def heard(self) -> bool:
        """After :meth:`next_message` completed: whether the client left (else the message
        is kept for the app, and nothing more is read ahead)."""
        task, self._task = self._task, None
        assert task is not None
        assert task.done()
        try:
            message = task.result()
        except Exception:
            return True  # the server can no longer give this request anything
        if message["type"] in _DISCONNECTS:
            return True
        self._kept.append(message)
        self._quiet = True
        return False

    async def receive(self) -> Message:
        """The app's ``receive``: what was kept, then what was being read, then the server's."""
        if self._kept:
            return self._kept.pop(0)
        task = self._task
        if task is not None:
            self._task = None
            return await task
        return await self._receive()

    def close(self) -> None:
        """The request is over: a read still pending is cancelled."""
        task, self._task = self._task, None
        if task is not None:
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved, so that asyncio does not log it
            else:
                task.cancel()
