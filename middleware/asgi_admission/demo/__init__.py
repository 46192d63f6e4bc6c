"""A small session service guarded by :class:`AdmissionMiddleware` (needs the ``demo`` extra).

Each session holds real memory: ``session_mb`` MiB, touched page by page so the
kernel charges it to the cgroup. ``POST /sessions`` opens one (``?hold_s=`` keeps
the request open first, the time in which it is pending), ``DELETE
/sessions/{id}`` frees it, ``WS /terminal/{id}`` is an echo session holding the
same memory while connected, and ``/health`` always answers 200. ``/processes``
sessions each run a real child process, watched by the session watchdog, whose
memory grows on request (see ``asgi_admission.demo.processes``). Serve it with
``asgi-admission demo`` or ``uvicorn asgi_admission.demo:create_app --factory``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Response, WebSocket, WebSocketDisconnect
from prometheus_client import REGISTRY

from asgi_admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionMiddleware,
    SessionWatchdog,
    metrics_route,
    serving_metrics,
)
from asgi_admission.demo.processes import ProcessSessions, add_process_routes

__all__ = ["SESSION_ROUTES", "SessionStore", "create_app"]

SESSION_ROUTES = ("POST /sessions", "WS /terminal/*", "POST /processes")
DEFAULT_SESSION_MB = 64
_PAGE = 4096
_MIB = 1024 * 1024
ENV_METRICS_PORT = "ADMISSION_METRICS_PORT"


def hold_memory(n_bytes: int) -> bytearray:
    """``n_bytes`` that are really resident: one write per page."""
    block = bytearray(n_bytes)
    block[::_PAGE] = b"\x01" * len(range(0, n_bytes, _PAGE))
    return block


class SessionStore:
    """The sessions the app is running; its length is ``current_sessions``."""

    def __init__(self) -> None:
        self._sessions: dict[str, bytearray] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, n_bytes: int, prefix: str = "s") -> str:
        session_id = f"{prefix}{next(self._ids)}"
        self._sessions[session_id] = hold_memory(n_bytes)
        return session_id

    def close(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None

    def ids(self) -> list[str]:
        return list(self._sessions)


def metrics_port_from_env(environ: Mapping[str, str] | None = None) -> int | None:
    """``ADMISSION_METRICS_PORT`` as a port number, or ``None`` when unset or empty.

    A malformed value raises ``ValueError`` rather than quietly serving the
    metrics on the public port.
    """
    env = os.environ if environ is None else environ
    raw = env.get(ENV_METRICS_PORT, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ValueError(f"{ENV_METRICS_PORT}={raw!r} is not a TCP port number (1-65535).")
    return int(raw)


def _env_session_mb() -> int:
    raw = os.environ.get("DEMO_SESSION_MB", "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_SESSION_MB
    return value if value >= 0 else DEFAULT_SESSION_MB


def create_app(
    *,
    session_mb: int | None = None,
    config: AdmissionConfig | None = None,
    controller: AdmissionController | None = None,
    max_sessions: int | None = None,
    readiness_path: str | None = "/admission/ready",
    guarded: bool = True,
    watchdog: SessionWatchdog | None = None,
    **middleware_options: Any,
) -> FastAPI:
    """The demo app; ``session_mb`` defaults to ``DEMO_SESSION_MB`` (64).

    ``guarded=False`` leaves the middleware out: the same service, unprotected
    (what ``bench/oom_burst.py`` runs to show the OOM kill). Metrics are served
    at ``/metrics``, or only on ``ADMISSION_METRICS_PORT`` when that is set.
    ``watchdog`` defaults to ``SessionWatchdog.from_env`` reading what the
    controller reads.
    """
    size = (_env_session_mb() if session_mb is None else session_mb) * _MIB
    store = SessionStore()
    processes = ProcessSessions()
    registry = middleware_options.get("registry", REGISTRY)
    metrics_port = metrics_port_from_env() if registry is not None else None

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            if metrics_port is None:
                yield
                return
            with serving_metrics(metrics_port, registry=registry):
                yield
        finally:
            await processes.close_all()

    app = FastAPI(title="asgi-admission demo", lifespan=lifespan)
    if registry is not None and metrics_port is None:
        app.router.routes.append(metrics_route(registry=registry))
    app.state.sessions = store
    app.state.processes = processes
    add_process_routes(app, processes)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/sessions")
    async def list_sessions() -> dict[str, Any]:
        return {"sessions": store.ids(), "session_mb": size // _MIB}

    @app.post("/sessions", status_code=201)
    async def open_session(hold_s: float = Query(0.0, ge=0, le=60)) -> dict[str, str]:
        if hold_s:
            await asyncio.sleep(hold_s)
        return {"id": store.open(size)}

    # No response model: FastAPI 0.115 takes "-> None" for one and refuses it on a 204.
    @app.delete(
        "/sessions/{session_id}", status_code=204, response_class=Response, response_model=None
    )
    async def close_session(session_id: str) -> None:
        if not store.close(session_id):
            raise HTTPException(status_code=404, detail="no such session")

    @app.websocket("/terminal/{name}")
    async def terminal(websocket: WebSocket, name: str) -> None:
        session_id = store.open(size, prefix="t")
        try:
            await websocket.accept()
            await websocket.send_text(f"session {session_id} ({name}) ready")
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            pass
        finally:
            store.close(session_id)

    if guarded:
        if watchdog is None:
            watchdog = SessionWatchdog.from_env(
                config=config,
                memory_reader=None if controller is None else controller.memory_reader,
                registry=registry,
            )
        app.add_middleware(
            AdmissionMiddleware,
            session_routes=SESSION_ROUTES,
            config=config,
            controller=controller,
            current_sessions=lambda: len(store) + len(processes),
            watchdog=watchdog,
            max_sessions=max_sessions,
            readiness_path=readiness_path,
            **middleware_options,
        )
    return app
