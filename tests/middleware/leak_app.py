"""A guarded service whose server leaks on request, for the stuck-pressure tests:
``POST /leak?mb=N`` allocates N MiB and keeps it (touched, so it is in the working set),
``DELETE /leak`` frees it all; ``POST /sessions?mb=N`` is the session route (a
session holding N MiB until ``DELETE /sessions/{id}``), counted by the app."""

from __future__ import annotations

import logging
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware, metrics_route

PAGE = 4096


def create() -> Any:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    leaked: list[bytearray] = []

    async def leak(request: Request) -> Response:
        block = bytearray(int(request.query_params["mb"]) * 1024 * 1024)
        for offset in range(0, len(block), PAGE):
            block[offset] = 1
        leaked.append(block)
        return JSONResponse({"leaked_mb": sum(len(b) for b in leaked) // 2**20})

    async def free(request: Request) -> Response:
        leaked.clear()
        return JSONResponse({"leaked_mb": 0})

    sessions: dict[int, bytearray] = {}

    async def open_session(request: Request) -> Response:
        # ?mb=N: the session holds N MiB (touched) until DELETE /sessions/{id}.
        block = bytearray(int(request.query_params.get("mb", "0")) * 1024 * 1024)
        for offset in range(0, len(block), PAGE):
            block[offset] = 1
        number = max(sessions, default=0) + 1
        sessions[number] = block
        return JSONResponse({"id": number}, status_code=201)

    async def close_session(request: Request) -> Response:
        sessions.pop(int(request.path_params["number"]), None)
        return JSONResponse({"open": len(sessions)})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/leak", leak, methods=["POST"]),
            Route("/leak", free, methods=["DELETE"]),
            Route("/sessions", open_session, methods=["POST"]),
            Route("/sessions/{number:int}", close_session, methods=["DELETE"]),
            Route("/health", health),
            metrics_route(),
        ]
    )
    return AdmissionMiddleware(
        app,
        session_routes=["POST /sessions"],
        readiness_path="/admission/ready",
        current_sessions=lambda: len(sessions),
    )
