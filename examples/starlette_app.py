"""A Starlette-only service guarded by AdmissionMiddleware.

``POST /jobs`` starts a memory-hungry job and ``WS /shell/{name}`` opens a shell
session; both are session routes. ``/health`` and ``/jobs`` (GET) are never
refused. Run it with ``uvicorn examples.starlette_app:app``.
"""

from __future__ import annotations

import itertools

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from asgi_admission import AdmissionConfig, AdmissionMiddleware, RetryAfterPolicy

JOB_BYTES = 32 * 1024 * 1024
jobs: dict[str, bytearray] = {}
shells: set[int] = set()
_ids = itertools.count(1)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def list_jobs(request: Request) -> Response:
    return JSONResponse({"jobs": sorted(jobs)})


async def start_job(request: Request) -> Response:
    job_id = f"job{next(_ids)}"
    jobs[job_id] = bytearray(JOB_BYTES)
    return JSONResponse({"id": job_id}, status_code=201)


async def stop_job(request: Request) -> Response:
    jobs.pop(request.path_params["job_id"], None)
    return Response(status_code=204)


async def shell(websocket: WebSocket) -> None:
    shells.add(id(websocket))
    try:
        await websocket.accept()
        while True:
            await websocket.send_text(await websocket.receive_text())
    except WebSocketDisconnect:
        pass
    finally:
        shells.discard(id(websocket))


app = Starlette(
    routes=[
        Route("/health", health),
        Route("/jobs", list_jobs, methods=["GET"]),
        Route("/jobs", start_job, methods=["POST"]),
        Route("/jobs/{job_id}", stop_job, methods=["DELETE"]),
        WebSocketRoute("/shell/{name}", shell),
    ],
    middleware=[
        Middleware(
            AdmissionMiddleware,
            session_routes=["POST /jobs", "WS /shell/*"],
            config=AdmissionConfig.from_env(),
            # Jobs outlive their request, so the app counts its sessions itself.
            current_sessions=lambda: len(jobs) + len(shells),
            retry_after=RetryAfterPolicy(5, jitter=0.2, adaptive=True, max_s=60),
            readiness_path="/admission/ready",
        )
    ],
)
