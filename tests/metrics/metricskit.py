"""Shared helpers for the metrics tests: a settable reader, a tiny guarded app, tools."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Scope
from starlette.websockets import WebSocket

from asgi_admission import AdmissionController, AdmissionMiddleware, MemoryReading, metrics_route
from kits.processkit import free_port as free_port
from kits.suitekit import MIB

#: What a server still starting may answer with (ValueError: a body not yet JSON).
STARTING = (httpx.HTTPError, OSError, ValueError)


class SettableReader:
    """A memory reader whose figures the test sets, with PSI through ``read(pressure=True)``."""

    def __init__(self, used_mb: float = 100, limit_mb: float | None = 1000) -> None:
        self.reading = MemoryReading(
            used_bytes=int(used_mb * MIB),
            limit_bytes=None if limit_mb is None else int(limit_mb * MIB),
            available=True,
            usage_bytes=int(used_mb * MIB) + 5 * MIB,
            reclaimable_bytes=5 * MIB,
        )
        self.psi: float | None = None
        self.fail: Exception | None = None

    def set_mb(self, used_mb: float) -> None:
        self.reading = replace(self.reading, used_bytes=int(used_mb * MIB), available=True)

    def lose(self) -> None:
        self.reading = replace(self.reading, used_bytes=None, available=False)

    def __call__(self) -> MemoryReading:
        if self.fail is not None:
            raise self.fail
        return self.reading

    def read(self, *, pressure: bool = False) -> MemoryReading:
        reading = self()
        return replace(reading, pressure_some_avg10=self.psi) if pressure else reading


def controller(
    reader: Callable[[], MemoryReading], *, reserve_mb: float = 10
) -> AdmissionController:
    return AdmissionController(
        high_watermark_percent=80,
        resume_threshold_percent=70,
        reserve_bytes=int(reserve_mb * MIB),
        memory_reader=reader,
    )


async def _session(request: Request) -> Response:
    proceed = request.app.state.proceed
    if proceed is not None:
        request.app.state.entered.set()
        await proceed.wait()
    return PlainTextResponse("opened", status_code=201)


async def _terminal(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.close()


def guarded_app(
    reader: Callable[[], MemoryReading],
    registry: CollectorRegistry | None,
    *,
    max_sessions: int = 100,
    **options: Any,
) -> Starlette:
    """A Starlette app with ``POST /sessions``, ``WS /terminal/x`` and ``/metrics``, guarded."""
    app = Starlette(
        routes=[
            Route("/sessions", _session, methods=["POST"]),
            WebSocketRoute("/terminal/{name}", _terminal),
            metrics_route(registry=registry or CollectorRegistry()),
        ]
    )
    app.state.proceed = None
    app.add_middleware(
        AdmissionMiddleware,
        session_routes=["POST /sessions", "WS /terminal/*"],
        controller=controller(reader),
        max_sessions=max_sessions,
        registry=registry,
        **options,
    )
    return app


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; scripts/setup installs Debian's prometheus package")
    return path


def promtool_check(promtool: str, exposition: bytes) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition.decode(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def request(
    app: ASGIApp, method: str, path: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """One HTTP request to the ASGI ``app``, run to completion on a fresh event loop."""

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.request(method, path, headers=headers)

    result: httpx.Response = anyio.run(go)
    return result


def websocket(app: ASGIApp, path: str) -> list[Message]:
    """Open a WebSocket on ``app`` and disconnect; returns what the app sent."""
    sent: list[Message] = []
    incoming: list[Message] = [
        {"type": "websocket.connect"},
        {"type": "websocket.disconnect", "code": 1000},
    ]

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "websocket.disconnect", "code": 1000}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "websocket",
        "asgi": {"version": "3.0"},
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [],
        "scheme": "ws",
        "server": ("test", 80),
        "client": ("127.0.0.1", 1),
        "subprotocols": [],
    }
    anyio.run(app, scope, receive, send)
    return sent
