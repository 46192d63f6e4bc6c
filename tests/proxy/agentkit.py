"""A guard with its agent-check listener, served through its lifespan on this test's loop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import warnings
from collections.abc import AsyncIterator
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from asgi_admission import AdmissionController, AdmissionMiddleware, MemoryReading
from kits.suitekit import MIB

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork for its TestClient and warns when it
    # falls back to httpx; the fallback works, and httpx is what the project pins.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient as TestClient

__all__ = ["SettableReader", "agent_guard", "ask", "serving", "session_app", "start_lifespan"]


class SettableReader:
    """A memory reader whose working set the test sets; counts its calls."""

    def __init__(self, used_mb: float = 100, limit_mb: float = 1000) -> None:
        self.used = int(used_mb * MIB)
        self.limit = int(limit_mb * MIB)
        self.calls = 0

    def set_mb(self, used_mb: float) -> None:
        self.used = int(used_mb * MIB)

    def __call__(self) -> MemoryReading:
        self.calls += 1
        return MemoryReading(used_bytes=self.used, limit_bytes=self.limit, available=True)


async def session_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers every HTTP request 201 (a session opened), accepts every WebSocket (then
    closes it), and accepts its lifespan."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})
        return
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def agent_guard(
    reader: SettableReader, *, env: dict[str, str] | None = None, **options: Any
) -> AdmissionMiddleware:
    """A guard of ``POST /sessions`` on ``reader``: 10 MiB reserves, an 80 % high
    watermark, 100 sessions at most, no probing (a fixed reading never grows); ``env``
    sets further variables while it is built; ``session_routes=`` others than that."""
    controller = AdmissionController(
        high_watermark_percent=80,
        resume_threshold_percent=70,
        reserve_bytes=10 * MIB,
        memory_reader=reader,
    )
    # With controller=, the other settings come from the environment.
    settings = {"ADMISSION_PROBE_SESSIONS": "0", **(env or {})}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        return AdmissionMiddleware(
            session_app,
            session_routes=options.pop("session_routes", ["POST /sessions"]),
            controller=controller,
            max_sessions=100,
            registry=None,
            **options,
        )
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


async def start_lifespan(
    app: AdmissionMiddleware,
) -> tuple[asyncio.Task[None], asyncio.Queue[Message], asyncio.Queue[Message]]:
    """``app``'s lifespan started on the running loop: its task, and the queues it
    receives from and sends to."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.get_running_loop().create_task(app(scope, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    return task, inbox, outbox


@contextlib.asynccontextmanager
async def serving(app: AdmissionMiddleware) -> AsyncIterator[None]:
    """``app``'s lifespan on the running loop: started on entry, shut down on exit."""
    task, inbox, outbox = await start_lifespan(app)
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await task


def ask(port: int, *, timeout: float = 5) -> bytes:
    """One agent check, as HAProxy makes it: connect, read to the end. Blocking: call it
    off the guard's loop (``asyncio.to_thread``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        answer = b""
        while chunk := sock.recv(64):
            answer += chunk
    return answer
