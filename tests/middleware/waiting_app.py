"""A guarded session service for the real waiting tests: ``POST /sessions?seq=N`` notes
its admission, holds ``ADMISSION_TEST_SESSION_MB`` MiB for ``?hold=`` seconds inside the
request and answers 201 (``POST /admin`` the same); ``GET /order`` is the admissions'
``seq`` in the order they began; ``GET /counts`` the guard's (active, pending). With
``WAITING_APP_CLASSES=1`` the sessions are of class ``batch`` and the admin ones of
``critical`` (``ADMISSION_PRIORITY_CLASSES`` names them). With ``WAITING_APP_TENANTS=1``
the ``?tenant=`` of a session is its tenant, and ``GET /shares`` what each admission saw
as it was decided (inside the guard's critical section): its tenant, the sessions each
tenant held with it, the sessions counted with it and how many were in the wait queue
(itself among them when it was a waiter)."""

from __future__ import annotations

import asyncio
import os
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Scope

from asgi_admission import AdmissionMiddleware
from asgi_admission._admission.scheduling.tenants import TenantShares, TenantSlot

INTERNAL = "the guard's tenant counts and wait queue, seen by the app as each session begins"

PAGE = 4096


def create() -> Any:
    guards: list[AdmissionMiddleware] = []
    order: list[int] = []
    seen: list[list[Any]] = []
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

    async def shares(request: Request) -> Response:
        return JSONResponse(seen)

    async def counts(request: Request) -> Response:
        return JSONResponse(list(guards[0].session_counts()))

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/admin", open_session, methods=["POST"]),
            Route("/order", admitted),
            Route("/shares", shares),
            Route("/counts", counts),
            Route("/health", health),
        ]
    )
    routes: list[str] | dict[str, str] = ["POST /sessions"]
    if os.environ.get("WAITING_APP_CLASSES") == "1":
        routes = {"POST /sessions": "batch", "POST /admin": "critical"}
    tenant = None
    if os.environ.get("WAITING_APP_TENANTS") == "1":

        def tenant(scope: Scope) -> str | None:
            query = parse_qs(scope["query_string"].decode())
            names = query.get("tenant")
            return names[0] if names else None

    guard = AdmissionMiddleware(app, session_routes=routes, registry=None, tenant=tenant)
    guards.append(guard)
    service = guard.service
    if service.tenants is not None and service.wait_queue is not None:
        queue = service.wait_queue

        class Recording(TenantShares):
            def admitted(self, tenant: str) -> TenantSlot:
                slot = super().admitted(tenant)
                held = {name: self.held(name) for name in ("a", "b", "c")}
                seen.append([tenant, held, sum(service.ledger.counts(None)), queue.total()])
                return slot

        service.tenants.shares = Recording(max_share=service.config.tenant_max_share)
    return guard
