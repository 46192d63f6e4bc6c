"""The session-route matcher, driven by a table of patterns and scopes."""

from __future__ import annotations

import pytest

from asgi_admission._routes import RouteMatcher

#: Internal on purpose: the route matcher's compiled tables.
INTERNAL = "the route matcher's compiled tables"


def http(method: str, path: str) -> dict[str, object]:
    return {"type": "http", "method": method, "path": path}


def ws(path: str) -> dict[str, object]:
    return {"type": "websocket", "path": path}


def opens_session(matcher: RouteMatcher, scope: dict[str, object]) -> bool:
    """The middleware's dispatch: the scope's method (or WebSocket) routes, then the path."""
    if scope["type"] == "websocket":
        routes = matcher.websocket_routes
    else:
        routes = matcher.http_routes.get(str(scope["method"]))
    return routes is not None and routes.matches(str(scope["path"]))


@pytest.mark.parametrize(
    ("patterns", "scope", "expected"),
    [
        (["POST /sessions"], http("POST", "/sessions"), True),
        (["POST /sessions"], http("GET", "/sessions"), False),
        (["POST /sessions"], http("POST", "/sessions/"), False),
        (["POST /sessions"], http("POST", "/sessions/1"), False),
        (["post /sessions"], http("POST", "/sessions"), True),
        (["WS /terminal/*"], ws("/terminal/abc"), True),
        (["WS /terminal/*"], ws("/terminal/a/b"), False),
        (["WS /terminal/*"], http("GET", "/terminal/abc"), False),
        (["WS /terminal/**"], ws("/terminal/a/b"), True),
        (["POST /sessions"], ws("/sessions"), False),
        (["POST /a/*/run", "POST /b"], http("POST", "/a/x/run"), True),
        (["POST /a/*/run", "POST /b"], http("POST", "/b"), True),
        (["POST /a/*/run", "POST /b"], http("POST", "/a/x/y/run"), False),
        (["POST /a.b"], http("POST", "/aXb"), False),
        (["PUT /kernels/*", "WS /kernels/*/channels"], ws("/kernels/k1/channels"), True),
    ],
)
def test_matches(patterns: list[str], scope: dict[str, object], expected: bool) -> None:
    """A scope matches exactly when its method and path fit one of the patterns."""
    assert opens_session(RouteMatcher(patterns), scope) is expected


@pytest.mark.parametrize(
    ("patterns", "message"),
    [
        (["/sessions"], "method and a path"),
        (["POST /sessions extra"], "method and a path"),
        (["FETCH /sessions"], "unknown method"),
        (["POST sessions"], "starting with '/'"),
        (["POST /a/***"], "'\\*\\*\\*'"),
        ([42], "must be a string"),
        ("POST /sessions", "not a single string"),
    ],
)
def test_bad_patterns_raise(patterns: object, message: str) -> None:
    """A malformed pattern is refused at construction with a sentence naming it."""
    with pytest.raises(ValueError, match=message):
        RouteMatcher(patterns)  # type: ignore[arg-type]


def test_empty_matcher_is_falsy() -> None:
    """A matcher without patterns reports itself empty and matches nothing."""
    matcher = RouteMatcher([])
    assert not matcher
    assert not opens_session(matcher, http("POST", "/sessions"))
