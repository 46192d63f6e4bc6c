"""The demo app as a server without the WebSocket denial extension would present it."""

from __future__ import annotations

from typing import Any

from asgi_admission.demo import create_app


def create() -> Any:
    inner = create_app()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            extensions = dict(scope.get("extensions") or {})
            extensions.pop("websocket.http.response", None)
            scope = {**scope, "extensions": extensions}
        await inner(scope, receive, send)

    return app
