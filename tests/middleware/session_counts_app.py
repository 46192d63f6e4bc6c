"""A guarded session service for real-server tests: ``POST /sessions`` reads its body,
waits ``?hold=`` seconds and answers 201; ``GET /counts`` is the guard's (active, pending)."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware


def create() -> Any:
    guards: list[AdmissionMiddleware] = []

    async def open_session(request: Request) -> Response:
        body = await request.body()
        await asyncio.sleep(float(request.query_params.get("hold", "0")))
        return JSONResponse({"bytes": len(body)}, status_code=201)

    async def counts(request: Request) -> Response:
        return JSONResponse(list(guards[0].session_counts()))

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/counts", counts),
            Route("/health", health),
        ]
    )
    guard = AdmissionMiddleware(app, session_routes=["POST /sessions"], registry=None)
    guards.append(guard)
    return guard
