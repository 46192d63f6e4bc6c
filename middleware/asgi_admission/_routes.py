"""Which requests open a session: ``"METHOD /path/glob"`` patterns, compiled once.

A pattern is a method (or ``WS``) and a path glob separated by one space: ``*`` matches
within one segment, ``**`` anything, the rest literally. The route is the app's, behind
any path prefix: docs/configuration.md, "Behind a path prefix". Matching runs on every
request, so it is laid out for the common miss: one dict lookup on the method
(WebSocket scopes have no ``method`` and look up ``WS``), then a set lookup for literal
paths and one combined regex for globs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from starlette.types import Scope

WEBSOCKET: Final = "WS"
_HTTP_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"}
)


def route_path(scope: Scope) -> str:
    """The path the app routes: ``scope["path"]`` less its ``root_path`` prefix.

    An older server leaves the prefix out of ``path``, which then is the route already,
    so the prefix goes only as whole segments: ``/apix/sessions`` under ``/api`` stays.
    """
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if not root_path or not path.startswith(root_path):
        return path
    if len(path) == len(root_path):
        return ""
    if path[len(root_path)] == "/":
        return path[len(root_path) :]
    return path


@dataclass(frozen=True, slots=True)
class MethodRoutes:
    """One method's session paths: a set of literal paths and one combined regex."""

    literal: frozenset[str]
    regex: re.Pattern[str] | None

    def matches(self, path: str) -> bool:
        if path in self.literal:
            return True
        return self.regex is not None and self.regex.fullmatch(path) is not None


_GLOBS: Final = {"**": ".*", "*": "[^/]*"}


def _glob_to_regex(path: str) -> str:
    parts = re.split(r"(\*\*|\*)", path)
    return "".join(_GLOBS.get(part, re.escape(part)) for part in parts)


def parse_pattern(pattern: str) -> tuple[str, str]:
    """Split ``"POST /sessions"`` into ``("POST", "/sessions")``, or raise ``ValueError``."""
    if not isinstance(pattern, str):
        raise ValueError(
            f"Each session route must be a string such as 'POST /sessions'; got {pattern!r}."
        )
    fields = pattern.split()
    if len(fields) != 2:
        raise ValueError(
            f"The session route {pattern!r} must be a method and a path separated by a space, "
            "such as 'POST /sessions' or 'WS /terminal/*'."
        )
    method, path = fields[0].upper(), fields[1]
    if method != WEBSOCKET and method not in _HTTP_METHODS:
        raise ValueError(
            f"The session route {pattern!r} has an unknown method {fields[0]!r}; use an HTTP "
            "method such as POST, or WS for a WebSocket handshake."
        )
    if not path.startswith("/"):
        raise ValueError(f"The session route {pattern!r} must have a path starting with '/'.")
    if "***" in path:
        raise ValueError(
            f"The session route {pattern!r} has '***' in its path; use '*' for one segment "
            "or '**' for any number of segments."
        )
    return method, path


class RouteMatcher:
    """Tells whether a scope opens a session, from patterns compiled once."""

    __slots__ = ("_each", "http_routes", "websocket_routes")

    def __init__(self, patterns: Iterable[str]) -> None:
        if isinstance(patterns, str):
            raise ValueError(
                "session_routes must be a list of patterns such as ['POST /sessions'], "
                f"not a single string ({patterns!r})."
            )
        literal: dict[str, set[str]] = {}
        globs: dict[str, list[str]] = {}
        # Each pattern on its own, for telling which one a session came by.
        self._each: list[tuple[str, str, str, re.Pattern[str]]] = []
        for pattern in patterns:
            method, path = parse_pattern(pattern)
            if "*" in path:
                regex_text = _glob_to_regex(path)
                globs.setdefault(method, []).append(regex_text)
            else:
                regex_text = re.escape(path)
                literal.setdefault(method, set()).add(path)
            self._each.append((pattern, method, path, re.compile(regex_text)))
        routes: dict[str, MethodRoutes] = {}
        for method in literal.keys() | globs.keys():
            regexes = globs.get(method)
            regex = re.compile("|".join(f"(?:{r})" for r in regexes)) if regexes else None
            routes[method] = MethodRoutes(frozenset(literal.get(method, ())), regex)
        #: The compiled WebSocket routes, if any.
        self.websocket_routes = routes.pop(WEBSOCKET, None)
        #: The compiled HTTP routes by method (the middleware looks each request up in it).
        self.http_routes = routes

    def __bool__(self) -> bool:
        return bool(self.http_routes) or self.websocket_routes is not None

    def pattern_of(self, scope: Scope) -> str | None:
        """The first pattern that matches this scope's route, as it was given; ``None``
        if none."""
        method = scope.get("method", WEBSOCKET) if scope["type"] == "http" else WEBSOCKET
        path = route_path(scope)
        for pattern, pattern_method, _, regex in self._each:
            if pattern_method == method and regex.fullmatch(path) is not None:
                return pattern
        return None

    def prefixed(self, root_path: str) -> str | None:
        """What to say of the patterns whose path starts with ``root_path``, the prefix
        the app is served under: written with the prefix, they match no route the app
        routes (unless it routes the prefix twice). ``None`` when none does."""
        prefix = root_path.rstrip("/")
        if not prefix:
            return None
        found = []
        for pattern, method, path, _ in self._each:
            if path == prefix or path.startswith(prefix + "/"):
                found.append((pattern, f"{method} {path[len(prefix) :] or '/'}"))
        if not found:
            return None
        return (
            f"the session routes {', '.join(repr(p) for p, _ in found)} start with the "
            f"prefix {root_path!r} the app is served under (its root_path), but a session "
            "route names the route as the app routes it, without the prefix: "
            f"{', '.join(repr(r) for _, r in found)}. Unless the app routes the prefix "
            "twice, those patterns guard nothing."
        )


class RouteNames:
    """The session pattern each scope came by, cached by the route the app routes (the
    path less its ``root_path``) and method: ``"predicate"`` where no pattern matched,
    ``"unnamed"`` without a scope."""

    __slots__ = ("_names", "_pattern_of")

    #: Distinct (route, method) pairs kept before the cache starts again.
    CACHE: Final = 1024

    def __init__(self, pattern_of: Callable[[Scope], str | None]) -> None:
        self._pattern_of = pattern_of
        self._names: dict[tuple[str, str | None], str] = {}

    def __call__(self, scope: Scope | None) -> str:
        if scope is None:
            return "unnamed"
        # Without a root_path (most scopes) the route is the path itself.
        path = route_path(scope) if scope.get("root_path") else scope["path"]
        key = (path, scope.get("method"))
        try:
            return self._names[key]
        except KeyError:
            name = self._pattern_of(scope) or "predicate"
            if len(self._names) >= self.CACHE:
                self._names.clear()
            self._names[key] = name
            return name
