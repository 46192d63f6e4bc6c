"""The demo app behind real servers on 127.0.0.1: uvicorn, hypercorn and granian."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from mwkit import Server, free_port, write_v2_tree
from websockets.exceptions import ConnectionClosed, InvalidStatus

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(90)]


def argv(server: str, port: int) -> list[str]:
    if server == "uvicorn":  # through the console command, which runs uvicorn
        return [
            sys.executable,
            "-m",
            "asgi_admission.cli",
            "demo",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--session-mb",
            "1",
            "--log-level",
            "warning",
        ]
    if server == "hypercorn":
        return [
            sys.executable,
            "-m",
            "hypercorn",
            "asgi_admission.demo:create_app()",
            "--bind",
            f"127.0.0.1:{port}",
        ]
    if server == "uvicorn-without-denial":
        return [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "no_denial_app:create",
            "--app-dir",
            str(Path(__file__).parent),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "asgi",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "asgi_admission.demo:create_app",
    ]


#: How each server refuses a WebSocket: the 503 denial response, or accept + 1013.
#: All three offer ``websocket.http.response``; the last entry hides it from the
#: middleware to show what a client sees on a server without the extension.
WEBSOCKET_REFUSAL = {
    "granian": "denial",
    "hypercorn": "denial",
    "uvicorn": "denial",
    "uvicorn-without-denial": "1013",
}


@pytest.fixture(params=list(WEBSOCKET_REFUSAL))
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Server]]:
    name: str = request.param
    port = free_port()
    env = {
        "ADMISSION_CGROUP_ROOT": str(write_v2_tree(tmp_path / "cgroup")),
        "ADMISSION_MAX_SESSIONS": "1",
        "ADMISSION_SESSION_RESERVE_MB": "1",
        "DEMO_SESSION_MB": "1",
    }
    srv = Server(argv(name, port), port, env, tmp_path / f"{name}.log")
    try:
        srv.wait_ready()
        yield name, srv
    finally:
        srv.stop()


async def websocket_outcome(url: str) -> tuple[str, object]:
    """What a real client sees: ('denial', response), ('closed', frame) or ('open', replies)."""
    try:
        async with websockets.connect(url, open_timeout=10) as ws:
            greeting = await asyncio.wait_for(ws.recv(), 10)
            await ws.send("ping")
            echoed = await asyncio.wait_for(ws.recv(), 10)
            return "open", (greeting, echoed)
    except InvalidStatus as exc:
        return "denial", exc.response
    except ConnectionClosed as exc:
        return "closed", exc.rcvd


def test_real_server_refuses_with_503_and_1013_or_denial(server: tuple[str, Server]) -> None:
    """A real HTTP client gets 503 + Retry-After and a WebSocket client the denial or 1013."""
    name, srv = server
    with httpx.Client(base_url=srv.base_url, timeout=10) as client:
        opened = client.post("/sessions")
        assert opened.status_code == 201
        refused = client.post("/sessions")
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["cache-control"] == "no-store"
        assert refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["reason"] == "session_limit"
        assert client.get("/health").status_code == 200

        url = f"ws://127.0.0.1:{srv.port}/terminal/x"
        kind, detail = asyncio.run(websocket_outcome(url))
        if WEBSOCKET_REFUSAL[name] == "denial":
            assert kind == "denial", (kind, detail)
            assert detail.status_code == 503  # type: ignore[attr-defined]
            assert detail.headers["Retry-After"].isdigit()  # type: ignore[attr-defined]
        else:
            assert kind == "closed", (kind, detail)
            assert detail.code == 1013  # type: ignore[attr-defined]
            assert detail.reason.startswith("retry_after_s=")  # type: ignore[attr-defined]

        assert client.delete(f"/sessions/{opened.json()['id']}").status_code == 204
        kind, detail = asyncio.run(websocket_outcome(url))
        assert kind == "open"
        assert detail[1] == "ping"  # type: ignore[index]
