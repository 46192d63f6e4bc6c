"""A guarded Starlette app to serve behind a path prefix: a session route that waits.

``POST /sessions`` holds its session for ``HOLD_S`` so that concurrent requests
overlap; ``/health`` answers, and ``/admission/ready`` is the guard's readiness path.
``mounted()`` puts the guarded app under ``Mount("/api", ...)`` of an outer app.
"""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from asgi_admission import AdmissionMiddleware

HOLD_S = 1.0


async def open_session(request: Request) -> Response:
    await asyncio.sleep(HOLD_S)
    return JSONResponse({"opened": True}, status_code=201)


async def health(request: Request) -> Response:
    return PlainTextResponse("ok")


def create() -> AdmissionMiddleware:
    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/health", health),
        ]
    )
    # The cap, memory source and reserve come from the environment (ADMISSION_*).
    return AdmissionMiddleware(
        app, session_routes=["POST /sessions"], readiness_path="/admission/ready"
    )


def mounted() -> Starlette:
    return Starlette(routes=[Mount("/api", app=create())])
