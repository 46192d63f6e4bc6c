"""WebSocket sessions: the denial response, 1013 without it, and pending → active → released."""

from __future__ import annotations

import asyncio
import re

import pytest
from mwkit import SettableReader, TestClient, controller, guard
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import WebSocketRoute
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from asgi_admission import AdmissionMiddleware


def echo_app(counts: list[tuple[int, int]], holder: list[AdmissionMiddleware]) -> Starlette:
    async def terminal(websocket: WebSocket) -> None:
        counts.append(holder[0].session_counts())
        await websocket.accept()
        counts.append(holder[0].session_counts())
        try:
            while True:
                await websocket.send_text(await websocket.receive_text())
        except WebSocketDisconnect:
            pass

    async def refuse(websocket: WebSocket) -> None:
        await websocket.send_denial_response(PlainTextResponse("no", status_code=403))

    async def ignore(websocket: WebSocket) -> None:
        return None

    return Starlette(
        routes=[
            WebSocketRoute("/terminal/{name}", terminal),
            WebSocketRoute("/deny/{name}", refuse),
            WebSocketRoute("/ignore/{name}", ignore),
            WebSocketRoute("/plain", terminal),
        ]
    )


def build(used_mb: float = 100) -> tuple[AdmissionMiddleware, list[tuple[int, int]]]:
    counts: list[tuple[int, int]] = []
    holder: list[AdmissionMiddleware] = []
    mw = guard(
        echo_app(counts, holder),
        SettableReader(used_mb=used_mb),
        routes=["WS /terminal/*", "WS /deny/*", "WS /ignore/*"],
    )
    holder.append(mw)
    return mw, counts


def test_admitted_websocket_is_pending_then_active_then_released() -> None:
    """An admitted WebSocket counts as pending until accepted, then active until closed."""
    mw, counts = build()
    with TestClient(mw) as client, client.websocket_connect("/terminal/a") as ws:
        ws.send_text("hi")
        assert ws.receive_text() == "hi"
        assert mw.session_counts() == (1, 0)
    assert counts == [(0, 1), (1, 0)]
    assert mw.session_counts() == (0, 0)


def test_refused_websocket_gets_the_503_denial() -> None:
    """Where the server offers the denial extension, a refused handshake gets the HTTP 503."""
    mw, counts = build(used_mb=900)
    with (
        TestClient(mw) as client,
        pytest.raises(Exception) as info,  # noqa: PT011 - Starlette's denial type
        client.websocket_connect("/terminal/a"),
    ):
        pass  # pragma: no cover - the handshake is denied
    response = info.value
    assert type(response).__name__ == "WebSocketDenialResponse"
    assert response.status_code == 503  # type: ignore[attr-defined]
    assert response.headers["retry-after"].isdigit()  # type: ignore[attr-defined]
    assert response.headers["cache-control"] == "no-store"  # type: ignore[attr-defined]
    assert response.json()["reason"] == "memory_pressure"  # type: ignore[attr-defined]
    assert counts == []


def test_app_denial_releases() -> None:
    """A WebSocket the app denies itself with a denial response gives its reservation back."""
    mw, _ = build()
    with TestClient(mw) as client:
        with (
            pytest.raises(Exception) as info,  # noqa: PT011 - Starlette's denial type
            client.websocket_connect("/deny/a"),
        ):
            pass  # pragma: no cover
        assert info.value.status_code == 403  # type: ignore[attr-defined]
    assert mw.session_counts() == (0, 0)


def test_never_accepted_websocket_releases() -> None:
    """A WebSocket the app returns from without accepting gives its reservation back."""
    mw, _ = build()
    server = RawServer([{"type": "websocket.connect"}])
    asyncio.run(mw(ws_scope("/ignore/a"), server.receive, server.send))
    assert mw.session_counts() == (0, 0)


def test_non_session_websocket_passes_without_reading() -> None:
    """A WebSocket on a route that is not a session route is never read or refused."""
    counts: list[tuple[int, int]] = []
    holder: list[AdmissionMiddleware] = []
    reader = SettableReader(used_mb=990)
    mw = guard(echo_app(counts, holder), reader, routes=["WS /terminal/*"])
    holder.append(mw)
    with TestClient(mw) as client, client.websocket_connect("/plain") as ws:
        ws.send_text("x")
        assert ws.receive_text() == "x"
    assert reader.calls == 0


class RawServer:
    """A minimal ASGI server side: scripted receive, recorded send."""

    def __init__(self, incoming: list[Message]) -> None:
        self.incoming = list(incoming)
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        if self.incoming:
            return self.incoming.pop(0)
        await asyncio.sleep(3600)  # pragma: no cover - a test never waits here
        raise AssertionError  # pragma: no cover

    async def send(self, message: Message) -> None:
        self.sent.append(message)


def ws_scope(path: str, extensions: dict[str, object] | None = None) -> Scope:
    return {
        "type": "websocket",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [],
        "scheme": "ws",
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1234),
        "root_path": "",
        "subprotocols": [],
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "extensions": extensions or {},
    }


async def never_called(scope: Scope, receive: Receive, send: Send) -> None:  # pragma: no cover
    raise AssertionError("the app must not be called")


def test_refusal_without_denial_extension_closes_1013() -> None:
    """Without the denial extension a refused WebSocket is accepted then closed with 1013."""
    mw = guard(never_called, SettableReader(used_mb=900))
    server = RawServer([{"type": "websocket.connect"}])
    asyncio.run(mw(ws_scope("/terminal/a"), server.receive, server.send))
    assert [m["type"] for m in server.sent] == ["websocket.accept", "websocket.close"]
    close = server.sent[1]
    assert close["code"] == 1013
    delay = int(close["reason"].split(";")[0].removeprefix("retry_after_s="))
    assert 4 <= delay <= 6


def test_refusal_of_a_client_already_gone_sends_nothing() -> None:
    """A refused client that disconnected before the handshake is sent nothing."""
    mw = guard(never_called, SettableReader(used_mb=900))
    server = RawServer([{"type": "websocket.disconnect", "code": 1006}])
    asyncio.run(
        mw(ws_scope("/terminal/a", {"websocket.http.response": {}}), server.receive, server.send)
    )
    assert server.sent == []


def test_client_disconnect_before_accept_releases() -> None:
    """A client that leaves while its session is pending frees the slot at once."""
    seen: list[tuple[int, int]] = []
    holder: list[AdmissionMiddleware] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()  # connect
        await receive()  # disconnect
        seen.append(holder[0].session_counts())

    mw = guard(app, SettableReader())
    holder.append(mw)
    server = RawServer(
        [{"type": "websocket.connect"}, {"type": "websocket.disconnect", "code": 1001}]
    )
    asyncio.run(mw(ws_scope("/terminal/a"), server.receive, server.send))
    assert seen == [(0, 0)]


def test_lifespan_passes_through_without_reading() -> None:
    """Lifespan events reach the app untouched and take no reading."""
    events: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            events.append(message["type"])
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return

    reader = SettableReader()
    mw = guard(app, reader)
    server = RawServer([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    asyncio.run(mw({"type": "lifespan", "asgi": {"version": "3.0"}}, server.receive, server.send))
    assert events == ["lifespan.startup", "lifespan.shutdown"]
    assert [m["type"] for m in server.sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
    assert reader.calls == 0


def test_unknown_scope_types_pass_through() -> None:
    """A scope type the middleware does not know reaches the app as is."""
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    mw = guard(app, SettableReader())
    asyncio.run(mw({"type": "custom"}, RawServer([]).receive, RawServer([]).send))
    assert seen == ["custom"]


DENIAL = ["websocket.http.response.start", "websocket.http.response.body"]
CLOSE = ["websocket.accept", "websocket.close"]


def refuse(
    mw: AdmissionMiddleware,
    *,
    origin: bool,
    extension: bool = True,
    subprotocols: tuple[str, ...] = (),
) -> list[Message]:
    """What a refused handshake is sent, with or without Origin and the denial extension."""
    scope = ws_scope("/terminal/a", {"websocket.http.response": {}} if extension else None)
    scope["headers"] = [(b"origin", b"http://127.0.0.1:9")] if origin else []
    scope["subprotocols"] = list(subprotocols)
    server = RawServer([{"type": "websocket.connect"}])
    asyncio.run(mw(scope, server.receive, server.send))
    return server.sent


@pytest.mark.parametrize(
    ("mode", "origin", "extension", "expected"),
    [
        ("auto", True, True, CLOSE),
        ("auto", False, True, DENIAL),
        ("auto", True, False, CLOSE),
        ("auto", False, False, CLOSE),
        ("close", True, True, CLOSE),
        ("close", False, True, CLOSE),
        ("close", False, False, CLOSE),
        ("deny", True, True, DENIAL),
        ("deny", False, True, DENIAL),
        ("deny", True, False, CLOSE),
    ],
)
def test_refusal_mode_picks_denial_or_1013(
    mode: str, origin: bool, extension: bool, expected: list[str]
) -> None:
    """auto closes for a browser (Origin) and denies others; without the extension all close."""
    mw = guard(never_called, SettableReader(used_mb=900), websocket_refusal=mode)
    sent = refuse(mw, origin=origin, extension=extension)
    assert [m["type"] for m in sent] == expected
    if expected == CLOSE:
        assert sent[1]["code"] == 1013
        assert sent[1]["reason"].startswith("retry_after_s=")
        assert "; reason=memory_pressure; Not enough memory for a new session" in sent[1]["reason"]
    else:
        assert sent[0]["status"] == 503


def test_1013_accept_names_the_first_subprotocol_asked_for() -> None:
    """A browser that asked for subprotocols fails a handshake naming none: accept the first."""
    mw = guard(never_called, SettableReader(used_mb=900), websocket_refusal="close")
    asked = refuse(mw, origin=True, subprotocols=("tty", "v2.tty"))
    assert asked[0] == {"type": "websocket.accept", "subprotocol": "tty"}
    assert refuse(mw, origin=True)[0] == {"type": "websocket.accept", "subprotocol": None}


def test_refusal_mode_comes_from_the_config_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the keyword the config's websocket_refusal applies; the keyword overrides it.

    With controller= the configuration is the environment's (config= cannot be given).
    """
    monkeypatch.setenv("ADMISSION_WEBSOCKET_REFUSAL", "close")
    reader = SettableReader(used_mb=900)
    from_config = AdmissionMiddleware(
        never_called,
        session_routes=["WS /terminal/*"],
        controller=controller(reader),
        registry=None,
    )
    assert [m["type"] for m in refuse(from_config, origin=False)] == CLOSE
    given = AdmissionMiddleware(
        never_called,
        session_routes=["WS /terminal/*"],
        controller=controller(reader),
        registry=None,
        websocket_refusal="deny",
    )
    assert [m["type"] for m in refuse(given, origin=True)] == DENIAL


def test_unknown_refusal_mode_is_an_error_naming_it() -> None:
    """A websocket_refusal that is not auto, close or deny raises a sentence naming it."""
    message = "websocket_refusal must be 'auto', 'close' or 'deny'; got '1013'."
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        guard(never_called, SettableReader(), websocket_refusal="1013")


@pytest.mark.parametrize("mode", ["auto", "close", "deny"])
def test_every_refusal_mode_counts_the_same_rejection(mode: str) -> None:
    """Whichever way a WebSocket is refused, the metrics count one rejected websocket decision."""
    registry = CollectorRegistry()
    mw = guard(never_called, SettableReader(used_mb=900), websocket_refusal=mode, registry=registry)
    refuse(mw, origin=True)
    refuse(mw, origin=False)
    labels = {"kind": "websocket", "outcome": "rejected", "reason": "memory_pressure"}
    assert registry.get_sample_value("asgi_admission_decisions_total", labels) == 2
