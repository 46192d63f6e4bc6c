"""A session request that opened nothing holds nothing: error answers and their learning."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
import pytest
from fastapi import FastAPI
from mwkit import NOT_PROBING, SettableReader, TestClient, controller, environment
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import WebSocketDenialResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from asgi_admission import AdmissionMiddleware, admission_ticket
from kits.suitekit import MIB

#: 300 MiB used of 1000 MiB, high 80 %, 100 MiB per session: 5 pending sessions fit.
FIT = 5
#: A normal pending timeout: a reservation held past its response stays held.
HELD = {"ADMISSION_PENDING_TIMEOUT_SECONDS": "120", **NOT_PROBING}


def guarded(app: ASGIApp, reader: SettableReader, **options: object) -> AdmissionMiddleware:
    with environment(HELD):
        return AdmissionMiddleware(
            app,
            session_routes=["POST /sessions", "WS /terminal"],
            controller=controller(reader, reserve_mb=100),
            max_sessions=100,
            retry_after=5,
            **{"registry": None, **options},  # type: ignore[arg-type]
        )


def answering(status: int) -> Starlette:
    async def open_session(request: Request) -> Response:
        if request.query_params.get("ok"):
            return JSONResponse({"id": "1"}, status_code=201)
        return PlainTextResponse("no", status_code=status)

    return Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])


class Spec(BaseModel):
    """A session's body as FastAPI validates it (module level: annotations are strings)."""

    image: str


def failures(registry: CollectorRegistry, kind: str, cause: str) -> float:
    value = registry.get_sample_value(
        "asgi_admission_session_requests_failed_total", {"kind": kind, "cause": cause}
    )
    return 0.0 if value is None else value


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422, 429, 500, 502, 503])
def test_an_error_answer_gives_its_reservation_back(status: int) -> None:
    """Error answers in a row leave nothing reserved: every session that fits after them opens."""
    registry = CollectorRegistry()
    mw = guarded(answering(status), SettableReader(used_mb=300), registry=registry)
    with TestClient(mw) as client:
        for _ in range(FIT + 2):
            assert client.post("/sessions").status_code == status
            assert mw.session_counts() == (0, 0)
        opened = [client.post("/sessions?ok=1").status_code for _ in range(FIT + 1)]
    assert opened == [201] * FIT + [503]
    assert failures(registry, "http", "error_status") == FIT + 2


@pytest.mark.parametrize("status", [201, 303])
def test_an_answer_below_400_keeps_settling(status: int) -> None:
    """A 201 or a 303 to the session's page stays pending until its memory shows."""

    async def open_session(request: Request) -> Response:
        if status == 303:
            return RedirectResponse("/session/1", status_code=303)
        return JSONResponse({"id": "1"}, status_code=201)

    app = Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])
    registry = CollectorRegistry()
    mw = guarded(app, SettableReader(used_mb=300), registry=registry)
    with TestClient(mw) as client:
        assert client.post("/sessions", follow_redirects=False).status_code == status
        assert mw.session_counts() == (0, 1)
    assert failures(registry, "http", "error_status") == 0


def test_fastapi_validation_errors_hold_nothing() -> None:
    """FastAPI's 422 for a malformed body opens no session, through add_middleware."""

    app = FastAPI()

    @app.post("/sessions", status_code=201)
    async def open_session(spec: Spec) -> dict[str, str]:
        return {"image": spec.image}

    reader = SettableReader(used_mb=300)
    with environment(HELD):
        app.add_middleware(
            AdmissionMiddleware,
            session_routes=["POST /sessions"],
            controller=controller(reader, reserve_mb=100),
            registry=None,
        )
    with TestClient(app) as client:
        for _ in range(FIT + 1):
            assert client.post("/sessions", json={"wrong": 1}).status_code == 422
        assert client.post("/sessions", json={"image": "x"}).status_code == 201


def test_a_handled_exception_turned_into_a_500_holds_nothing() -> None:
    """An exception that the app's own handler turns into a 500 inside the guard opens nothing."""

    async def broken(request: Request) -> Response:
        raise ValueError("boom")

    async def as_500(request: Request, exc: Exception) -> Response:
        return PlainTextResponse("failed", status_code=500)

    app = Starlette(
        routes=[Route("/sessions", broken, methods=["POST"])],
        exception_handlers={ValueError: as_500},
    )
    mw = guarded(app, SettableReader(used_mb=300))
    with TestClient(mw) as client:
        for _ in range(FIT + 1):
            assert client.post("/sessions").status_code == 500
        assert mw.session_counts() == (0, 0)


def test_an_http_exception_and_an_unhandled_one_hold_nothing() -> None:
    """A 404 raised as HTTPException, and an exception Starlette's error middleware answers."""

    async def missing(request: Request) -> Response:
        raise HTTPException(404)

    async def crashing(request: Request) -> Response:
        raise RuntimeError("boom")

    app = Starlette(
        routes=[
            Route("/sessions", missing, methods=["POST"]),
            Route("/crash", crashing, methods=["POST"]),
        ]
    )
    reader = SettableReader(used_mb=300)
    with environment(HELD):
        mw = AdmissionMiddleware(
            app,
            session_routes=["POST /sessions", "POST /crash"],
            controller=controller(reader, reserve_mb=100),
            registry=None,
        )
    with TestClient(mw, raise_server_exceptions=False) as client:
        for _ in range(FIT + 1):
            assert client.post("/sessions").status_code == 404
            assert client.post("/crash").status_code == 500
        assert mw.session_counts() == (0, 0)


def test_an_auth_layer_inside_the_guard_answering_401_holds_nothing() -> None:
    """A pure ASGI authentication middleware inside the guard refuses: nothing is reserved."""

    def require_token(app: ASGIApp) -> ASGIApp:
        async def auth(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and (b"authorization", b"Bearer ok") not in scope["headers"]:
                await PlainTextResponse("sign in", status_code=401)(scope, receive, send)
                return
            await app(scope, receive, send)

        return auth

    mw = guarded(require_token(answering(500)), SettableReader(used_mb=300))
    with TestClient(mw) as client:
        for _ in range(FIT + 3):
            assert client.post("/sessions").status_code == 401
        signed_in = {"authorization": "Bearer ok"}
        opened = [client.post("/sessions?ok=1", headers=signed_in).status_code for _ in range(FIT)]
    assert opened == [201] * FIT


def test_a_held_ticket_does_not_outlive_an_error_answer() -> None:
    """A ticket held before the app answers 409 is released with the answer."""
    states: list[str] = []

    async def open_session(request: Request) -> Response:
        ticket = admission_ticket(request)
        assert ticket is not None
        ticket.hold()
        states.append(ticket.state)
        return PlainTextResponse("taken", status_code=409)

    app = Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])
    mw = guarded(app, SettableReader(used_mb=300))
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 409
        assert mw.session_counts() == (0, 0)
    assert states == ["pending"]


def test_the_learner_counts_only_the_sessions_that_opened() -> None:
    """Failed requests just before one real session leave its footprint whole: 120 MiB
    (at most the drift allowance of its window more), not shared out among four."""
    reader = SettableReader(used_mb=300)
    registry = CollectorRegistry()
    mw = guarded(answering(400), reader, registry=registry)
    with TestClient(mw) as client:
        for _ in range(3):
            assert client.post("/sessions").status_code == 400
        assert client.post("/sessions?ok=1").status_code == 201
        reader.set_mb(420)  # the one session's 120 MiB arrives
        deadline = time.monotonic() + 10
        footprint = None
        while footprint is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the lifespan's sample ends the episode after a quiet spell
            footprint = registry.get_sample_value(
                "asgi_admission_session_footprint_bytes", {"route": "POST /sessions"}
            )
    assert footprint is not None
    assert 120 * MIB <= footprint <= 128 * MIB  # credited with what drift may have hidden


WsHandler = Callable[[WebSocket], Awaitable[None]]


async def close_before_accept(ws: WebSocket) -> None:
    await ws.close(code=1008)


async def close_at_accept_with_error(ws: WebSocket) -> None:
    await ws.accept()
    await ws.close(code=1011)


async def deny_with_403(ws: WebSocket) -> None:
    await ws.send_denial_response(PlainTextResponse("no", status_code=403))


@pytest.mark.parametrize(
    "handler", [close_before_accept, close_at_accept_with_error, deny_with_403]
)
def test_a_websocket_closed_with_an_error_at_its_accept_opened_nothing(handler: WsHandler) -> None:
    """Closed or denied with an error before or at the accept: released and counted as failed."""
    app = Starlette(routes=[WebSocketRoute("/terminal", handler)])
    registry = CollectorRegistry()
    mw = guarded(app, SettableReader(used_mb=300), registry=registry)
    with TestClient(mw) as client:
        for _ in range(FIT + 1):
            with (
                pytest.raises((WebSocketDisconnect, WebSocketDenialResponse)),
                client.websocket_connect("/terminal") as ws,
            ):
                ws.receive_text()
        assert mw.session_counts() == (0, 0)
    assert failures(registry, "websocket", "error_status") == FIT + 1


def test_a_websocket_that_opened_is_not_a_failure() -> None:
    """A session that talks and then closes cleanly, or with an error later, opened something."""

    async def terminal(ws: WebSocket) -> None:
        await ws.accept()
        await ws.send_text("hello")
        try:
            await ws.receive_text()
        except WebSocketDisconnect:
            return
        await ws.close(code=1011)

    app = Starlette(routes=[WebSocketRoute("/terminal", terminal)])
    registry = CollectorRegistry()
    mw = guarded(app, SettableReader(used_mb=300), registry=registry)
    with TestClient(mw) as client:
        with client.websocket_connect("/terminal") as ws:
            assert ws.receive_text() == "hello"
            ws.send_text("exit")
        assert mw.session_counts() == (0, 0)
    assert failures(registry, "websocket", "error_status") == 0


def test_the_failure_counter_is_per_kind_and_cause() -> None:
    """Every (kind, cause) pair is exported from the start, at zero."""
    registry = CollectorRegistry()
    mw = guarded(answering(400), SettableReader(), registry=registry)

    async def one() -> None:
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.post("/sessions")).status_code == 400

    asyncio.run(one())
    seen = {
        (kind, cause): failures(registry, kind, cause)
        for kind in ("http", "websocket")
        for cause in ("error_status", "body_timeout")
    }
    assert seen == {
        ("http", "error_status"): 1,
        ("http", "body_timeout"): 0,
        ("websocket", "error_status"): 0,
        ("websocket", "body_timeout"): 0,
    }
