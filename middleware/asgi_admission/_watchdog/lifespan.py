"""The session watchdog's lifespan: started and stopped with the app's, and found from a
request through the lifespan state."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._watchdog.watchdog import SessionWatchdog

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection

#: Where ``AdmissionMiddleware`` puts the watchdog in the lifespan state.
STATE_KEY: Final = "asgi_admission.watchdog"


async def serve_lifespan(
    watchdog: SessionWatchdog, app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Run ``app``'s lifespan with the watchdog: started just before the server hears
    that startup completed, stopped once the app's own shutdown has completed (its
    hooks may still end sessions), and stopped in any case when the lifespan ends.

    The watchdog also goes into the lifespan state, which servers copy into every
    request's scope, so ``session_watchdog(request)`` finds it at no per-request cost.
    """
    state = scope.get("state")
    if isinstance(state, dict):
        state[STATE_KEY] = watchdog

    async def send_and_track(message: Message) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            await watchdog.start()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            await watchdog.stop()
        await send(message)

    try:
        await app(scope, receive, send_and_track)
    finally:
        await watchdog.stop()


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
