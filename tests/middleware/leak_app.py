"""A guarded service whose server leaks on request, for the stuck-pressure tests:
``POST /leak?mb=N`` allocates N MiB and keeps it (touched, so it is in the working set),
``DELETE /leak`` frees it all; ``POST /sessions`` is the session route."""

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

    async def open_session(request: Request) -> Response:
        return JSONResponse({"id": 1}, status_code=201)

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/leak", leak, methods=["POST"]),
            Route("/leak", free, methods=["DELETE"]),
            Route("/sessions", open_session, methods=["POST"]),
            Route("/health", health),
            metrics_route(),
        ]
    )
    return AdmissionMiddleware(
        app, session_routes=["POST /sessions"], readiness_path="/admission/ready"
    )
