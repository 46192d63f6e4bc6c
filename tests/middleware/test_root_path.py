"""Session routes behind a path prefix: patterns name the route the app routes.

Direct ASGI calls with the scopes servers build: the ASGI spec's (and uvicorn's since
0.26, and Starlette's ``Mount``) with the prefix in both ``root_path`` and ``path``,
and older servers' with the prefix in ``root_path`` only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from mwkit import SettableReader, guard
from starlette._utils import get_route_path
from starlette.types import Message

from asgi_admission import AdmissionMiddleware
from asgi_admission._routes import RouteMatcher, route_path

#: Internal on purpose: the route path helper against Starlette's private one, and the
#: route names the matcher and the reservations give a session.
INTERNAL = "the route path helper and the names of a session's route"


class Inner:
    """The app behind the guard: answers 200 and remembers that it was reached."""

    def __init__(self) -> None:
        self.reached = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.reached += 1
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"app"})
        else:
            await send({"type": "websocket.close", "code": 1000})


def call(mw: AdmissionMiddleware, scope: dict[str, Any]) -> list[Message]:
    """One request through ``mw``; the messages it sent back."""
    sent: list[Message] = []
    incoming = (
        [{"type": "http.request", "body": b"", "more_body": False}]
        if scope["type"] == "http"
        else [{"type": "websocket.connect"}]
    )

    async def receive() -> Message:
        if incoming:
            return incoming.pop(0)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(mw(scope, receive, send))
    return sent


def http(method: str, path: str, root_path: str | None) -> dict[str, Any]:
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "headers": []}
    if root_path is not None:
        scope["root_path"] = root_path
    return scope


def websocket(path: str, root_path: str) -> dict[str, Any]:
    return {
        "type": "websocket",
        "path": path,
        "root_path": root_path,
        "headers": [],
        "extensions": {"websocket.http.response": {}},
    }


def pressured() -> tuple[AdmissionMiddleware, Inner, SettableReader]:
    """A guard on ``POST /sessions``, ``POST /apix/jobs`` and ``WS /terminal/*``
    whose memory is past the high watermark: a guarded request is refused."""
    inner = Inner()
    reader = SettableReader(used_mb=900)
    routes = ("POST /sessions", "POST /apix/jobs", "WS /terminal/*")
    return guard(inner, reader, routes=routes, readiness_path="/ready"), inner, reader


@pytest.mark.parametrize(
    ("root_path", "path"),
    [
        (None, "/sessions"),
        ("", "/sessions"),
        ("/api", "/api/sessions"),  # the ASGI spec, uvicorn --root-path, a Mount
        ("/api", "/sessions"),  # an older server: the prefix in root_path only
        ("/api/v1", "/api/v1/sessions"),
        ("/apix", "/apix/apix/jobs"),  # only the prefix goes, not a repeat of it
        ("/api", "/apix/jobs"),  # shares a string prefix only: not stripped
    ],
)
def test_a_session_route_is_guarded_under_its_prefix(root_path: str | None, path: str) -> None:
    """A request whose route (its path less the root_path) matches a pattern is guarded,
    whichever way the server put the prefix in the scope."""
    mw, inner, reader = pressured()
    sent = call(mw, http("POST", path, root_path))
    assert sent[0]["status"] == 503
    assert inner.reached == 0
    assert reader.calls == 1


@pytest.mark.parametrize(
    ("root_path", "path"),
    [
        ("/api", "/apix/sessions"),  # not under /api: the route is /apix/sessions
        ("/api", "/api"),  # the prefix alone routes nowhere
        ("/api", "/api/api/sessions"),  # a prefix once too often
        ("/api", "/api/apix/jobs/more"),
    ],
)
def test_a_path_whose_route_matches_no_pattern_passes(root_path: str, path: str) -> None:
    """A request whose route matches no pattern reaches the app without a reading."""
    mw, inner, reader = pressured()
    sent = call(mw, http("POST", path, root_path))
    assert sent[0]["status"] == 200
    assert inner.reached == 1
    assert reader.calls == 0


def test_a_websocket_session_is_guarded_under_its_prefix() -> None:
    """A WebSocket handshake whose route matches ``WS /terminal/*`` is refused under a
    root_path (the 503 denial), and one whose route does not reaches the app."""
    mw, inner, _ = pressured()
    sent = call(mw, websocket("/api/terminal/x", "/api"))
    assert sent[0]["type"] == "websocket.http.response.start"
    assert sent[0]["status"] == 503
    assert inner.reached == 0
    call(mw, websocket("/api/other", "/api"))
    assert inner.reached == 1


@pytest.mark.parametrize("path", ["/api/ready", "/ready"])
def test_readiness_answers_under_a_root_path(path: str) -> None:
    """The readiness path is the route too: under root_path /api the guard answers it
    (503 while latched, 200 once memory is back), not the app."""
    mw, inner, reader = pressured()
    sent = call(mw, http("GET", path, "/api"))
    assert sent[0]["status"] == 503
    assert sent[1]["body"] == b'{"ready":false,"state":"pressured"}'
    reader.set_mb(100)
    sent = call(mw, http("GET", path, "/api"))
    assert sent[0]["status"] == 200
    assert inner.reached == 0
    call(mw, http("GET", "/apix/ready", "/api"))
    assert inner.reached == 1


@pytest.mark.parametrize(
    ("root_path", "path"),
    [
        ("", "/api/sessions"),
        ("/api", "/api/sessions"),
        ("/api", "/sessions"),
        ("/api", "/api"),
        ("/api", "/api/"),
        ("/api", "/apix/sessions"),
        ("/api/", "/api/sessions"),
        ("/a", "/a/a/b"),
    ],
)
def test_route_path_is_the_one_starlette_routes(root_path: str, path: str) -> None:
    """The path the patterns see is the one Starlette's router matches its routes on."""
    scope = {"type": "http", "path": path, "root_path": root_path}
    assert route_path(scope) == get_route_path(scope)


def test_a_session_is_named_by_its_route() -> None:
    """The matcher and the reservations name a session by its route, not its full path: one
    full path under two root paths is two routes (the reservations' cache keeps them apart)."""
    matcher = RouteMatcher(["POST /sessions", "POST /api/sessions"])
    assert matcher.pattern_of(http("POST", "/api/sessions", "/api")) == "POST /sessions"
    assert matcher.pattern_of(http("POST", "/api/sessions", "")) == "POST /api/sessions"
    mw = guard(Inner(), SettableReader(), routes=["POST /sessions", "POST /api/sessions"])
    reservations = mw.reservations
    assert reservations.route(http("POST", "/api/sessions", "/api")) == "POST /sessions"
    assert reservations.route(http("POST", "/api/sessions", None)) == "POST /api/sessions"
    assert reservations.route(http("POST", "/sessions", "/api")) == "POST /sessions"


def test_a_pattern_with_the_prefix_in_it_is_warned_of_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Patterns written with the prefix (``POST /api/sessions`` under root_path /api)
    match no route: the first request under a root_path logs one warning naming them
    and the routes to write instead, and later requests log nothing."""
    inner = Inner()
    routes = ["POST /api/sessions", "WS /api/terminal/*", "POST /jobs", "POST /apix"]
    mw = guard(inner, SettableReader(used_mb=900), routes=routes)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        for _ in range(3):
            assert call(mw, http("POST", "/api/sessions", "/api"))[0]["status"] == 200
    warnings = [r.getMessage() for r in caplog.records if "prefix" in r.getMessage()]
    assert len(warnings) == 1, warnings
    named = "'POST /api/sessions', 'WS /api/terminal/*' start with the prefix '/api'"
    assert named in warnings[0]
    assert "'POST /sessions', 'WS /terminal/*'." in warnings[0]
    assert "jobs" not in warnings[0]
    assert "apix" not in warnings[0]
    assert inner.reached == 3


def test_no_warning_for_patterns_without_the_prefix(caplog: pytest.LogCaptureFixture) -> None:
    """Patterns that name routes log nothing under a root_path, and a pattern that seems
    prefixed logs nothing while requests come without one."""
    right = guard(Inner(), SettableReader(), routes=["POST /sessions"])
    seems_prefixed = guard(Inner(), SettableReader(), routes=["POST /api/sessions"])
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        call(right, http("POST", "/api/other", "/api"))
        call(right, http("POST", "/api/sessions", "/api"))
        call(seems_prefixed, http("POST", "/api/sessions", None))
        call(seems_prefixed, http("POST", "/api/sessions", ""))
    assert [r for r in caplog.records if "prefix" in r.getMessage()] == []
