"""The session watchdog's place in the lifespan state: put there at startup, found from a
request."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from starlette.types import Scope

from asgi_admission._watchdog.watchdog import SessionWatchdog

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

#: Where ``AdmissionMiddleware`` puts the watchdog in the lifespan state.
STATE_KEY: Final = "asgi_admission.watchdog"


def put_in_state(scope: Scope, watchdog: SessionWatchdog) -> None:
    """Put ``watchdog`` in the lifespan state, which servers copy into every request's
    scope, so ``session_watchdog(request)`` finds it at no per-request cost."""
    state = scope.get("state")
    if isinstance(state, dict):
        state[STATE_KEY] = watchdog


def session_watchdog(connection: HTTPConnection) -> SessionWatchdog:
    """The watchdog ``AdmissionMiddleware(watchdog=...)`` installed, from a request or WebSocket.

    Raises ``LookupError`` when there is none (no watchdog configured, or the server
    ran without lifespan).
    """
    state = connection.scope.get("state")
    watchdog = state.get(STATE_KEY) if isinstance(state, dict) else None
    if not isinstance(watchdog, SessionWatchdog):
        raise LookupError(
            "No session watchdog is installed: pass watchdog=SessionWatchdog(...) to "
            "AdmissionMiddleware and serve the app with lifespan on."
        )
    return watchdog
