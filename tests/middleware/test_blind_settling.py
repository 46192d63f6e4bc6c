"""A blind guard without lifespan: every reservation it holds has a way to end.

Blind (a readable memory group without a limit, or one that cannot be read) the guard
has no memory to measure a session by, and without lifespan (httpx's ASGITransport, a
server run with ``--lifespan off``) no periodic sample runs. Each case runs the default
path: the real reader on a fixture tree named by ``ADMISSION_CGROUP_ROOT``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Literal

import httpx
import pytest
from mwkit import write_v2_tree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionMiddleware, AdmissionTicket, admission_ticket

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
        session_routes=["POST /sessions"],
        max_sessions=max_sessions,
        expose_details=True,
        registry=None,
    )


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
    assert guard.service.keeper.expired_total == 1
