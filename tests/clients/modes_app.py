"""One service with a guard per WebSocket refusal mode, for the real-server tests.

``WS /auto/*``, ``/close/*`` and ``/deny/*`` are each guarded by an
``AdmissionMiddleware`` with that ``websocket_refusal`` and no session to give
(``max_sessions=0``), so every handshake there is refused; ``/health`` answers 200.
The memory reading comes from ``ADMISSION_CGROUP_ROOT``.
"""

from __future__ import annotations

from typing import get_args

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp
from starlette.websockets import WebSocket

from asgi_admission import AdmissionConfig, AdmissionMiddleware
from asgi_admission._config import WebSocketRefusal

#: Internal on purpose: one guard per mode the setting's type lists, none forgotten.
INTERNAL = "the websocket_refusal modes, from the setting's own type"


def create() -> ASGIApp:
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def never(websocket: WebSocket) -> None:  # pragma: no cover - always refused
        raise AssertionError("a refused handshake reached the app")

    app: ASGIApp = Starlette(
        routes=[Route("/health", health), WebSocketRoute("/{mode}/{name}", never)]
    )
    base = AdmissionConfig.from_env()
    for mode in get_args(WebSocketRefusal):
        app = AdmissionMiddleware(
            app,
            session_routes=[f"WS /{mode}/*"],
            config=base,
            max_sessions=0,
            websocket_refusal=mode,
            registry=None,
        )
    return app
