"""CORSMiddleware outside the guard puts CORS headers on refusals; inside, one warning says so."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi import FastAPI
from mwkit import SettableReader, TestClient, controller
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware
from asgi_admission._cors import cors_inside

#: Internal on purpose: the walk down the app chain that finds CORSMiddleware.
INTERNAL = "the walk down the app chain that finds CORSMiddleware"

PAGE = "http://127.0.0.1:9"
CORS_OPTIONS: dict[str, Any] = {"allow_origins": [PAGE], "expose_headers": ["Retry-After"]}


def guard_options() -> dict[str, Any]:
    """A guard that refuses every session: the memory reading is over the high watermark."""
    return {
        "session_routes": ["POST /sessions"],
        "controller": controller(SettableReader(used_mb=900)),
        "retry_after": 5,
        "registry": None,
    }


async def sessions(request: Any) -> JSONResponse:  # pragma: no cover - always refused
    return JSONResponse({"id": "s1"}, status_code=201)


def starlette_app(order: str) -> Starlette:
    guard = Middleware(AdmissionMiddleware, **guard_options())
    cors = Middleware(CORSMiddleware, **CORS_OPTIONS)
    middleware = [cors, guard] if order == "cors outside" else [guard, cors]
    return Starlette(routes=[Route("/sessions", sessions, methods=["POST"])], middleware=middleware)


def fastapi_app(order: str) -> FastAPI:
    app = FastAPI()
    app.add_api_route("/sessions", sessions, methods=["POST"])
    # add_middleware puts each new middleware outside the ones added before it.
    if order == "cors outside":
        app.add_middleware(AdmissionMiddleware, **guard_options())
        app.add_middleware(CORSMiddleware, **CORS_OPTIONS)
    else:
        app.add_middleware(CORSMiddleware, **CORS_OPTIONS)
        app.add_middleware(AdmissionMiddleware, **guard_options())
    return app


def cors_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "CORSMiddleware runs inside" in r.getMessage()
    ]


@pytest.mark.parametrize("build", [starlette_app, fastapi_app], ids=["Starlette", "FastAPI"])
def test_documented_order_puts_cors_headers_on_the_refusal(
    build: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With CORS outside the guard a cross-origin refusal exposes Retry-After, and no warning."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        with TestClient(build("cors outside")) as client:
            refused = client.post("/sessions", headers={"Origin": PAGE})
        assert cors_warnings(caplog) == []
    assert refused.status_code == 503
    assert refused.headers["access-control-allow-origin"] == PAGE
    assert "retry-after" in refused.headers["access-control-expose-headers"].lower()
    assert refused.json()["retry_after_s"] == int(refused.headers["retry-after"])


@pytest.mark.parametrize("build", [starlette_app, fastapi_app], ids=["Starlette", "FastAPI"])
def test_cors_inside_the_guard_warns_once(build: Any, caplog: pytest.LogCaptureFixture) -> None:
    """With CORS inside the guard a refusal has no CORS headers; one warning says how to fix it."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        with TestClient(build("cors inside")) as client:
            first = client.post("/sessions", headers={"Origin": PAGE})
            client.post("/sessions", headers={"Origin": PAGE})
        (warning,) = cors_warnings(caplog)
    assert first.status_code == 503
    assert "access-control-allow-origin" not in first.headers
    assert "refusals (503 + Retry-After) carry no CORS headers" in warning
    assert (
        "app.add_middleware(CORSMiddleware, ...) after app.add_middleware(AdmissionMiddleware"
        in (warning)
    )
    assert "expose_headers=['Retry-After']" in warning


def test_guard_around_an_application_sees_its_cors_middleware(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A guard wrapping a whole Starlette app finds CORSMiddleware in the app's middleware list."""
    inner = Starlette(middleware=[Middleware(CORSMiddleware, **CORS_OPTIONS)])
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        AdmissionMiddleware(inner, **guard_options())
        AdmissionMiddleware(Starlette(), **guard_options())
    assert len(cors_warnings(caplog)) == 1


class Loop:
    """An app whose ``.app`` is itself: the search must still end."""

    def __init__(self) -> None:
        self.app = self


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        (CORSMiddleware(Starlette()), True),
        (AdmissionMiddleware(CORSMiddleware(Starlette()), **guard_options()), True),
        (AdmissionMiddleware(Starlette(), **guard_options()), False),
        (Loop(), False),
        (sessions, False),
        (type("Listed", (), {"user_middleware": "not a list"})(), False),
    ],
    ids=["CORS itself", "CORS below a middleware", "none", "a loop", "a function", "odd list"],
)
def test_cors_inside_follows_the_app_chain(app: object, expected: bool) -> None:
    """The search follows .app attributes and Starlette's user_middleware, and always ends."""
    assert cors_inside(app) is expected
