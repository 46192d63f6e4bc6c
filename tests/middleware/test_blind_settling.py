"""A blind guard without lifespan: every reservation it holds has a way to end.

Blind (a readable memory group without a limit, or one that cannot be read) the guard
has no memory to measure a session by, and without lifespan (httpx's ASGITransport, a
server run with ``--lifespan off``) no periodic sample runs. Each case runs the default
path: the real reader on a fixture tree named by ``ADMISSION_CGROUP_ROOT``.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from mwkit import Server, TestClient, free_port, write_v2_tree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from asgi_admission import AdmissionMiddleware, AdmissionTicket, admission_ticket
from asgi_admission._admission.ledger import shared_place

#: Internal on purpose: the base the default shared place is made under, for this
#: process's guard and the server's alike (never the machine's /dev/shm).
INTERNAL = "the default shared place's bases"

HERE = Path(__file__).parent
Blind = Literal["unlimited", "unreadable"]
REASON = {"unlimited": "no_memory_limit", "unreadable": "telemetry_unavailable"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ADMISSION_* variable from the machine reaches the guard but the suite's own."""
    for name in [k for k in os.environ if k.startswith("ADMISSION_")]:
        if name not in ("ADMISSION_SHARED_DIR", "ADMISSION_SESSION_GROUPS"):
            monkeypatch.delenv(name)


def blind_tree(tmp_path: Path, blind: Blind) -> Path:
    """A memory group without a limit (its working set readable), or an empty directory."""
    root = tmp_path / f"cgroup-{blind}"
    if blind == "unreadable":
        root.mkdir()
        return root
    write_v2_tree(root, used_mb=100)
    (root / "memory.max").write_text("max\n")
    return root


def client(guard: AdmissionMiddleware) -> httpx.AsyncClient:
    """A client of ``guard`` that runs no lifespan."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guard), base_url="http://guarded")


def guarded(app: Starlette, max_sessions: int) -> AdmissionMiddleware:
    return AdmissionMiddleware(
        app,
        session_routes=["POST /sessions", "WS /socket"],
        max_sessions=max_sessions,
        expose_details=True,
        registry=None,
    )


async def opened(request: Request) -> Response:
    return JSONResponse({"id": "s"}, status_code=201)


@pytest.mark.anyio
@pytest.mark.parametrize("blind", ["unlimited", "unreadable"])
async def test_sequential_sessions_past_the_cap_are_admitted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blind: Blind
) -> None:
    """With max_sessions=2, five sessions opened one after another are all admitted: each
    reservation ends with its request, as there is no memory to wait for."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(blind_tree(tmp_path, blind)))
    guard = guarded(Starlette(routes=[Route("/sessions", opened, methods=["POST"])]), 2)
    async with client(guard) as c:
        for _ in range(5):
            response = await c.post("/sessions")
            assert response.status_code == 201, response.text
            assert guard.session_counts() == (0, 0)


@pytest.mark.anyio
@pytest.mark.parametrize("blind", ["unlimited", "unreadable"])
async def test_sessions_still_in_their_request_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blind: Blind
) -> None:
    """Two requests still in progress hold the cap of 2: the third is refused with the blind
    reason, and once they have ended the next is admitted."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(blind_tree(tmp_path, blind)))
    answer, both_in = asyncio.Event(), asyncio.Event()
    entered: list[Request] = []

    async def slow(request: Request) -> Response:
        entered.append(request)
        if len(entered) == 2:
            both_in.set()
        await answer.wait()
        return JSONResponse({"id": "s"}, status_code=201)

    guard = guarded(Starlette(routes=[Route("/sessions", slow, methods=["POST"])]), 2)
    async with client(guard) as c:
        first = [asyncio.ensure_future(c.post("/sessions")) for _ in range(2)]
        await both_in.wait()
        assert guard.session_counts() == (0, 2)
        refused = await c.post("/sessions")
        assert (refused.status_code, refused.json()["reason"]) == (503, REASON[blind])
        answer.set()
        assert [(await f).status_code for f in first] == [201, 201]
        assert (await c.post("/sessions")).status_code == 201


@pytest.mark.anyio
@pytest.mark.parametrize("blind", ["unlimited", "unreadable"])
async def test_held_tickets_end_by_their_app_or_their_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blind: Blind
) -> None:
    """A held ticket keeps its session pending past the response until its app releases
    it; one never started ends at the pending timeout, seen by the next decisions."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(blind_tree(tmp_path, blind)))
    monkeypatch.setenv("ADMISSION_PENDING_TIMEOUT_SECONDS", "0.5")
    tickets: list[AdmissionTicket] = []

    async def held(request: Request) -> Response:
        ticket = admission_ticket(request)
        assert ticket is not None
        assert ticket.hold()
        tickets.append(ticket)
        return JSONResponse({"id": "s"}, status_code=201)

    guard = guarded(Starlette(routes=[Route("/sessions", held, methods=["POST"])]), 1)
    async with client(guard) as c:
        assert (await c.post("/sessions")).status_code == 201
        assert (await c.post("/sessions")).json()["reason"] == REASON[blind]
        tickets[0].release()  # the app's word
        assert (await c.post("/sessions")).status_code == 201
        await asyncio.sleep(0.6)  # never started: the timeout's
        statuses = [(await c.post("/sessions")).status_code for _ in range(2)]
    assert 201 in statuses, statuses
    assert tickets[1].state == "released"
    assert guard.service.reservations.expired_total == 1


@pytest.mark.parametrize("blind", ["unlimited", "unreadable"])
def test_websockets_count_while_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blind: Blind
) -> None:
    """A WebSocket session counts while it is open and not after it closed: sequential
    sockets past the cap are accepted, a third beside two open ones is denied."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(blind_tree(tmp_path, blind)))

    async def socket(websocket: WebSocket) -> None:
        await websocket.accept()
        async for _ in websocket.iter_text():
            pass  # until the client closes

    guard = guarded(Starlette(routes=[WebSocketRoute("/socket", socket)]), 2)
    test_client = TestClient(guard)  # no `with`: no lifespan
    for _ in range(4):
        with test_client.websocket_connect("/socket"):
            pass
    assert guard.session_counts() == (0, 0)
    with test_client.websocket_connect("/socket"), test_client.websocket_connect("/socket"):
        assert guard.session_counts() == (2, 0)
        with (
            pytest.raises(Exception) as denied,  # noqa: PT011 - Starlette's denial type
            test_client.websocket_connect("/socket"),
        ):
            pass  # pragma: no cover - the handshake is denied
        assert denied.value.status_code == 503  # type: ignore[attr-defined]


@pytest.mark.anyio
@pytest.mark.parametrize("blind", ["unlimited", "unreadable"])
async def test_a_waiter_is_admitted_when_the_request_ahead_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blind: Blind
) -> None:
    """With the wait queue on and max_sessions=1, a request waits while another is in
    progress and is admitted as soon as that one has answered, not at its queue timeout."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(blind_tree(tmp_path, blind)))
    monkeypatch.setenv("ADMISSION_QUEUE_TIMEOUT_SECONDS", "10")
    answer, entered = asyncio.Event(), asyncio.Event()

    async def slow(request: Request) -> Response:
        if request.query_params.get("slow"):
            entered.set()
            await answer.wait()
        return JSONResponse({"id": "s"}, status_code=201)

    guard = guarded(Starlette(routes=[Route("/sessions", slow, methods=["POST"])]), 1)
    async with client(guard) as c:
        ahead = asyncio.ensure_future(c.post("/sessions", params={"slow": "1"}))
        await entered.wait()
        waiter = asyncio.ensure_future(c.post("/sessions"))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        answer.set()
        assert (await ahead).status_code == 201
        admitted = await asyncio.wait_for(waiter, 3)
    assert admitted.status_code == 201, admitted.text


@pytest.mark.real_server
@pytest.mark.timeout(90)
def test_two_processes_sharing_the_default_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This process's guard and a real uvicorn run with ``--lifespan off``, both blind in
    one memory group with no limit and max_sessions=2, share the default ledger: the
    sessions one opened do not keep the other refusing once their requests have ended,
    while two requests still in progress in the server hold the cap for both."""
    root = blind_tree(tmp_path, "unlimited")
    base = tmp_path / "shm"
    base.mkdir(mode=0o700)
    monkeypatch.delenv("ADMISSION_SHARED_DIR")  # the default place, under ``base``
    monkeypatch.setattr(shared_place, "default_bases", lambda: (str(base),))
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(root))
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "2")
    guard = AdmissionMiddleware(
        Starlette(routes=[Route("/sessions", opened, methods=["POST"])]),
        session_routes=["POST /sessions"],
        expose_details=True,
        registry=None,
    )
    assert guard.service.shared_dir is not None
    assert Path(guard.service.shared_dir).parent == base
    port = free_port()
    server = Server(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            "blind_app:create",
            "--app-dir",
            str(HERE),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--lifespan",
            "off",
            "--log-level",
            "warning",
        ],
        port,
        {"BLIND_TEST_BASE": str(base)},
        tmp_path / "uvicorn.log",
    )

    async def both() -> tuple[list[int], list[int], dict[str, Any], list[int]]:
        async with (
            client(guard) as here,
            httpx.AsyncClient(base_url=server.base_url, timeout=30) as there,
        ):
            ours = [(await here.post("/sessions")).status_code for _ in range(3)]
            theirs = [(await there.post("/sessions")).status_code for _ in range(4)]
            slow = [
                asyncio.ensure_future(there.post("/sessions", params={"hold": "3"}))
                for _ in range(2)
            ]
            # The server's requests, in another process: seen through the shared ledger.
            while guard.session_counts() != (0, 2):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
            refused: dict[str, Any] = (await here.post("/sessions")).json()
            held = [(await f).status_code for f in slow]
            after = [(await here.post("/sessions")).status_code for _ in range(3)]
        return ours + theirs, held, refused, after

    try:
        server.wait_ready()
        statuses, held, refused, after = asyncio.run(both())
    finally:
        server.stop()
    assert statuses == [201] * 7, statuses
    assert held == [201, 201]
    assert (refused["reason"], refused["sessions"]["pending"]) == ("no_memory_limit", 2)
    assert after == [201] * 3
