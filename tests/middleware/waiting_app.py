"""A guarded session service for the real waiting tests: ``POST /sessions?seq=N`` notes
its admission, holds ``ADMISSION_TEST_SESSION_MB`` MiB for ``?hold=`` seconds inside the
request and answers 201 (``POST /admin`` the same); ``GET /order`` is the admissions'
``seq`` in the order they began; ``GET /counts`` the guard's (active, pending). With
``WAITING_APP_CLASSES=1`` the sessions are of class ``batch`` and the admin ones of
``critical`` (``ADMISSION_PRIORITY_CLASSES`` names them)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware

PAGE = 4096


def create() -> Any:
    guards: list[AdmissionMiddleware] = []
    order: list[int] = []
    session_bytes = int(float(os.environ.get("ADMISSION_TEST_SESSION_MB", "48")) * 1024 * 1024)

    async def open_session(request: Request) -> Response:
        order.append(int(request.query_params["seq"]))
        memory = bytearray(session_bytes)
        for offset in range(0, session_bytes, PAGE):  # every page touched: charged now
            memory[offset] = 1
        await asyncio.sleep(float(request.query_params.get("hold", "0")))
        del memory
        return JSONResponse({"seq": order[-1]}, status_code=201)

    async def admitted(request: Request) -> Response:
        return JSONResponse(order)

    async def counts(request: Request) -> Response:
        return JSONResponse(list(guards[0].session_counts()))

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/admin", open_session, methods=["POST"]),
            Route("/order", admitted),
            Route("/counts", counts),
            Route("/health", health),
        ]
    )
    routes: list[str] | dict[str, str] = ["POST /sessions"]
    if os.environ.get("WAITING_APP_CLASSES") == "1":
        routes = {"POST /sessions": "batch", "POST /admin": "critical"}
    guard = AdmissionMiddleware(app, session_routes=routes, registry=None)
    guards.append(guard)
    return guard
