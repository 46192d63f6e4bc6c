"""A guarded Starlette service for the client tests, served by a real uvicorn.

Session routes: ``POST /sessions?ttl_s=`` opens a session that ends by itself after
``ttl_s`` seconds (or on ``DELETE /sessions/{id}``), and ``WS /terminal/{name}`` is an
echo session while connected. Both count toward ``ADMISSION_MAX_SESSIONS``. The guard
is configured from the ``ADMISSION_*`` environment (``ADMISSION_WEBSOCKET_REFUSAL``
included); ``CLIENTS_CORS`` puts Starlette's ``CORSMiddleware`` ``outside`` the guard
(the documented order), ``inside`` it (the wrong one) or nowhere (``none``), allowing
the origin in ``CLIENTS_ALLOW_ORIGIN``.

For the browser, ``GET /pages/{name}`` serves ``tests/clients/pages``, ``GET
/clients/{name}`` the recipes in ``examples/clients``, and ``POST /results/{run}``
stores what a page's JavaScript saw, which the test reads back with ``GET
/results/{run}`` (404 until the page has posted).
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from asgi_admission import AdmissionConfig, AdmissionMiddleware

HERE = Path(__file__).resolve().parent
PAGES = HERE / "pages"
RECIPES = HERE.parents[1] / "examples" / "clients"


def create() -> Starlette:
    sessions: dict[str, float] = {}  # id -> monotonic end
    sockets: set[int] = set()
    results: dict[str, Any] = {}
    ids = itertools.count(1)

    def live_sessions() -> int:
        now = time.monotonic()
        for session_id in [s for s, end in sessions.items() if end <= now]:
            del sessions[session_id]
        return len(sessions) + len(sockets)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def open_session(request: Request) -> Response:
        session_id = f"s{next(ids)}"
        sessions[session_id] = time.monotonic() + float(request.query_params.get("ttl_s", "60"))
        return JSONResponse({"id": session_id}, status_code=201)

    async def close_session(request: Request) -> Response:
        sessions.pop(request.path_params["session_id"], None)
        return Response(status_code=204)

    async def terminal(websocket: WebSocket) -> None:
        sockets.add(id(websocket))
        try:
            protocols = websocket.scope.get("subprotocols") or []
            await websocket.accept(subprotocol=protocols[0] if protocols else None)
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            pass
        finally:
            sockets.discard(id(websocket))

    async def page(request: Request) -> Response:
        return FileResponse(PAGES / Path(request.path_params["name"]).name)

    async def recipe(request: Request) -> Response:
        return FileResponse(
            RECIPES / Path(request.path_params["name"]).name, media_type="text/javascript"
        )

    async def post_result(request: Request) -> Response:
        results[request.path_params["run"]] = await request.json()
        return Response(status_code=204)

    async def get_result(request: Request) -> Response:
        run = request.path_params["run"]
        if run not in results:
            return JSONResponse({"pending": run}, status_code=404)
        return JSONResponse(results[run])

    guard = Middleware(
        AdmissionMiddleware,
        session_routes=["POST /sessions", "WS /terminal/*"],
        config=AdmissionConfig.from_env(),
        current_sessions=live_sessions,
    )
    cors = Middleware(
        CORSMiddleware,
        allow_origins=[os.environ.get("CLIENTS_ALLOW_ORIGIN", "")],
        allow_methods=["*"],
        allow_headers=["*"],
        expose_headers=["Retry-After"],
    )
    order = os.environ.get("CLIENTS_CORS", "outside")
    middleware = {"outside": [cors, guard], "inside": [guard, cors], "none": [guard]}[order]
    return Starlette(
        routes=[
            Route("/health", health),
            Route("/sessions", open_session, methods=["POST"]),
            Route("/sessions/{session_id}", close_session, methods=["DELETE"]),
            WebSocketRoute("/terminal/{name}", terminal),
            Route("/pages/{name}", page),
            Route("/clients/{name}", recipe),
            Route("/results/{run}", post_result, methods=["POST"]),
            Route("/results/{run}", get_result, methods=["GET"]),
        ],
        middleware=middleware,
    )
