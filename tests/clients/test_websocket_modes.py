"""Each WebSocket refusal mode against real uvicorn, hypercorn and granian on 127.0.0.1."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from kits.cgroup_trees import write_v2_tree
from kits.processkit import Server, free_port

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(90)]

HERE = Path(__file__).resolve().parent


def argv(server: str, port: int) -> list[str]:
    bind = ["--host", "127.0.0.1", "--port", str(port)]
    if server == "uvicorn":
        return [sys.executable, "-m", "uvicorn", "--factory", "modes_app:create", *bind]
    if server == "hypercorn":
        return [
            sys.executable,
            "-m",
            "hypercorn",
            "modes_app:create()",
            "--bind",
            f"127.0.0.1:{port}",
        ]
    return [
        sys.executable,
        "-m",
        "granian",
        "--interface",
        "asgi",
        "--factory",
        *bind,
        "modes_app:create",
    ]


@pytest.fixture(scope="module", params=["uvicorn", "hypercorn", "granian"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    name: str = request.param
    directory = tmp_path_factory.mktemp(name)
    port = free_port()
    env = {
        "ADMISSION_CGROUP_ROOT": str(write_v2_tree(directory / "cgroup")),
        "ADMISSION_RETRY_AFTER_SECONDS": "1",
        "PYTHONPATH": str(HERE),
    }
    srv = Server(argv(name, port), port, env, directory / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


async def outcome(url: str, origin: Origin | None) -> tuple[str, int, str]:
    """``("denial", status, Retry-After)`` or ``("close", code, reason)``: what the client saw."""
    try:
        async with websockets.connect(url, origin=origin, open_timeout=10) as ws:
            await asyncio.wait_for(ws.recv(), 10)
    except InvalidStatus as exc:
        return "denial", exc.response.status_code, exc.response.headers.get("Retry-After", "")
    except ConnectionClosed as exc:
        frame = exc.rcvd
        return "close", frame.code if frame else 1006, frame.reason if frame else ""
    raise AssertionError("the refused handshake was answered with a message")


#: (mode, the client sends Origin) -> how the guard refuses it.
EXPECTED = {
    ("auto", True): "close",
    ("auto", False): "denial",
    ("close", True): "close",
    ("close", False): "close",
    ("deny", True): "denial",
    ("deny", False): "denial",
}


@pytest.mark.parametrize(("mode", "with_origin"), list(EXPECTED))
def test_refusal_mode_on_a_real_server(server: Server, mode: str, with_origin: bool) -> None:
    """auto closes 1013 for a browser (Origin) and denies others; close and deny force one way."""
    origin = Origin(f"http://127.0.0.1:{server.port + 1}") if with_origin else None
    kind, code, detail = asyncio.run(outcome(f"ws://127.0.0.1:{server.port}/{mode}/x", origin))
    assert kind == EXPECTED[mode, with_origin], (kind, code, detail)
    if kind == "close":
        assert code == 1013
        assert detail.startswith("retry_after_s=1; reason=session_limit; ")
        assert len(detail.encode()) <= 123
    else:
        assert code == 503
        assert detail.isdigit()
        assert int(detail) >= 1
