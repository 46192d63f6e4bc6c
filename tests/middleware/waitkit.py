"""Raw ASGI clients for the waiting tests: a WebSocket that opens and leaves on cue, a POST."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.types import Message, Scope

from asgi_admission import AdmissionMiddleware


class Socket:
    """One WebSocket client: accepted (``opened``), told to leave (``leave``), and what
    the guard sent it, with the seconds from its connect to its accept or close."""

    def __init__(self, mw: AdmissionMiddleware, path: str = "/terminal") -> None:
        self.mw = mw
        self.path = path
        self.sent: list[Message] = []
        self.opened = asyncio.Event()
        self.leave = asyncio.Event()
        self.answered_s: float | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        connected = False
        start = time.monotonic()

        async def receive() -> Message:
            nonlocal connected
            if not connected:
                connected = True
                return {"type": "websocket.connect"}
            await self.leave.wait()
            return {"type": "websocket.disconnect", "code": 1000}

        async def send(message: Message) -> None:
            self.sent.append(message)
            if self.answered_s is None:
                self.answered_s = time.monotonic() - start
            if message["type"] == "websocket.accept":
                self.opened.set()

        scope = {"type": "websocket", "path": self.path, "headers": [], "query_string": b""}
        await self.mw(scope | {"root_path": "", "subprotocols": []}, receive, send)

    async def close(self) -> None:
        self.leave.set()
        await self.task


async def post(
    mw: AdmissionMiddleware,
    leave: asyncio.Event | None = None,
    *,
    path: str = "/sessions",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> dict[str, Any]:
    """One ``POST /sessions`` whose client disconnects once ``leave`` is set: its status
    (``None``: nothing sent), headers and body."""
    sent: list[Message] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    gone = leave or asyncio.Event()

    async def receive() -> Message:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    scope.update(query_string=b"", root_path="")
    await mw(scope, receive, send)
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {
        "status": None if start is None else start["status"],
        "headers": {} if start is None else {k.decode(): v.decode() for k, v in start["headers"]},
        "body": json.loads(body) if body else {},
    }
