"""A small session service with a watchdog, served in-process and by a real uvicorn.

``POST /sessions?hold_mb=N&budget_mb=M`` starts a child holding N MiB and registers
it; ``POST /sessions/{pid}/grow?mb=N`` makes it hold more; ``GET /sessions/{pid}``
says what the watchdog saw; ``GET /watchdog`` whether it runs. The app ends its own
children at shutdown, as a real service must.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from watchdogkit import CHILD, FixedReader, reading

from asgi_admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionMiddleware,
    SessionWatchdog,
    WatchedSession,
    session_watchdog,
)
from kits.suitekit import MIB


def build_app(**watchdog_options: Any) -> Starlette:
    config = AdmissionConfig()
    registry = CollectorRegistry()
    # A calm container, so only the sessions' own budgets decide anything here.
    calm = FixedReader(reading(10.0, limit=16 * 1024 * MIB))
    watchdog = SessionWatchdog(
        config=config, memory_reader=calm, interval_s=0.1, registry=registry, **watchdog_options
    )
    children: dict[int, tuple[asyncio.subprocess.Process, WatchedSession]] = {}

    async def open_session(request: Request) -> JSONResponse:
        hold = int(request.query_params.get("hold_mb", "0"))
        budget = request.query_params.get("budget_mb")
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            str(hold),
            "0",
            "0",
            CHILD,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert process.stdout is not None
        await process.stdout.readline()
        session = session_watchdog(request).register(
            process.pid, budget_bytes=None if budget is None else int(budget) * MIB
        )
        children[process.pid] = (process, session)
        return JSONResponse({"pid": process.pid})

    async def grow(request: Request) -> JSONResponse:
        process, _ = children[int(request.path_params["pid"])]
        assert process.stdin is not None
        with contextlib.suppress(ConnectionError):
            process.stdin.write(f"{request.query_params['mb']}\n".encode())
            await process.stdin.drain()
        return JSONResponse({})

    async def describe(request: Request) -> JSONResponse:
        process, session = children[int(request.path_params["pid"])]
        return JSONResponse(
            {
                "peak_rss_bytes": session.peak_rss_bytes,
                "halt": None if session.halt is None else session.halt.reason,
                "ended": session.ended,
                "returncode": process.returncode,
            }
        )

    async def status(request: Request) -> JSONResponse:
        found = session_watchdog(request)
        return JSONResponse({"running": found.running, "same": found is watchdog})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        for process, session in children.values():
            session.unregister()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            await process.wait()

    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/sessions/{pid:int}/grow", grow, methods=["POST"]),
            Route("/sessions/{pid:int}", describe),
            Route("/watchdog", status),
            Route("/health", lambda request: JSONResponse({"ok": True})),
        ],
        middleware=[
            Middleware(
                AdmissionMiddleware,
                session_routes=["POST /sessions"],
                controller=AdmissionController(memory_reader=calm),
                max_sessions=config.max_sessions,
                registry=registry,
                watchdog=watchdog,
            )
        ],
        lifespan=lifespan,
    )
    app.state.watchdog = watchdog
    return app


app = build_app()
