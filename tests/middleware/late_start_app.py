"""A guarded session service whose sessions start late, for the real late-start test:
``POST /sessions?hold_mb=&delay_s=`` starts a child process and answers 201 at once; the
child waits ``delay_s`` seconds (a process slow to start), then holds ``hold_mb`` MiB,
every page written. ``DELETE /sessions/{id}`` ends the child and releases the session;
``GET /metrics`` the guard's metrics (the learned footprint among them)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from typing import Any, Final

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware, AdmissionTicket, admission_ticket, metrics_route

CHILD: Final = """
import sys, time
time.sleep(float(sys.argv[2]))
held = bytearray(int(sys.argv[1]) * 1048576)
held[::4096] = b"\\x01" * len(range(0, len(held), 4096))
time.sleep(3600)
"""


def create() -> Any:
    children: dict[str, tuple[asyncio.subprocess.Process, AdmissionTicket | None]] = {}
    ids = itertools.count(1)

    async def open_session(request: Request) -> Response:
        argv = [
            sys.executable,
            "-c",
            CHILD,
            request.query_params["hold_mb"],
            request.query_params.get("delay_s", "0"),
        ]
        process = await asyncio.create_subprocess_exec(*argv, start_new_session=True)
        session_id = str(next(ids))
        children[session_id] = (process, admission_ticket(request))
        return JSONResponse({"id": session_id}, status_code=201)

    async def close_session(request: Request) -> Response:
        process, ticket = children.pop(request.path_params["id"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        if ticket is not None:
            ticket.release()
        return Response(status_code=204)

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    registry = CollectorRegistry()
    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/sessions/{id}", close_session, methods=["DELETE"]),
            Route("/health", health),
            metrics_route(registry=registry),
        ]
    )
    return AdmissionMiddleware(app, session_routes=["POST /sessions"], registry=registry)
