"""A guarded service for the waiting order's real tests under ``uvicorn --workers``.

A WebSocket to ``/batch/{name}`` (class ``batch``) or ``/critical/{name}`` (class
``critical``) is a session: accepted once admitted, it sends ``{"pid": ..., "name": ...}``
and is held until its client leaves. Each worker appends one JSON line per event to the
file ``ORDER_APP_EVENTS``: ``admitted`` as a session is accepted, ``ended`` as its client
leaves (before the guard releases its slot), with the worker's pid, the session's name
and ``time.monotonic()`` (one clock for every process of the machine). ``GET /counts`` is
the guard's (active, pending), counted across the workers.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from asgi_admission import AdmissionMiddleware

ROUTES = {"WS /critical/*": "critical", "WS /batch/*": "batch"}


def create() -> Any:
    events = os.open(os.environ["ORDER_APP_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    guards: list[AdmissionMiddleware] = []

    def note(event: str, name: str) -> None:
        line = {"event": event, "pid": os.getpid(), "name": name, "at": time.monotonic()}
        os.write(events, (json.dumps(line) + "\n").encode())  # one append: one line

    async def session(websocket: WebSocket) -> None:
        name = websocket.path_params["name"]
        await websocket.accept()
        note("admitted", name)
        await websocket.send_json({"pid": os.getpid(), "name": name})
        try:
            while True:
                await websocket.receive_text()
        except WebSocketDisconnect:
            note("ended", name)

    async def counts(request: Request) -> Response:
        return JSONResponse(list(guards[0].session_counts()))

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            WebSocketRoute("/critical/{name}", session),
            WebSocketRoute("/batch/{name}", session),
            Route("/counts", counts),
            Route("/health", health),
        ]
    )
    guard = AdmissionMiddleware(app, session_routes=ROUTES, registry=None)
    guards.append(guard)
    return guard
