"""A session's release while the shared directory is unusable: it takes effect at once and
is never undone, whatever the directory does afterwards."""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from pathlib import Path
from typing import Any

import pytest
from ledgerkit import write_v2_tree
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from test_ledger_faults import post, replace_with_a_file, restore

from asgi_admission import AdmissionConfig, AdmissionMiddleware, admission_ticket
from asgi_admission._admission.ledger import shared_ledger
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, read_entries

#: The second test is internal on purpose: it holds the ledger's lock from outside and
#: times the workers' link checks, to reach the sample's catch-up in a deleted file.
INTERNAL = "the shared ledger's lock and link checks, faulted on purpose"


def guarded(app: Any, cgroup: Path, **settings: Any) -> AdmissionMiddleware:
    config = AdmissionConfig(cgroup_root=str(cgroup), **settings)
    return AdmissionMiddleware(app, session_routes=["POST /s"], config=config, registry=None)


def test_a_ticket_released_while_the_directory_is_a_file_stays_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app holds its ticket, the shared directory is replaced by a file, the app
    releases the ticket and answers, the directory comes back: once the request has
    ended the guard counts no session, before any sample or decision catches up."""
    shared = tmp_path / "shared"
    cgroup = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=4096)
    monkeypatch.setenv("ADMISSION_SHARED_DIR", str(shared))
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(cgroup))
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "1")
    held, go_on = asyncio.Event(), asyncio.Event()

    async def open_session(request: Request) -> PlainTextResponse:
        ticket = admission_ticket(request)
        assert ticket is not None
        assert ticket.hold()
        held.set()
        await go_on.wait()
        ticket.release()
        return PlainTextResponse("gave up", status_code=200)

    app = Starlette(routes=[Route("/s", open_session, methods=["POST"])])
    guard = AdmissionMiddleware(app, session_routes=["POST /s"], registry=None)

    async def scenario() -> tuple[int, tuple[int, int]]:
        request = asyncio.ensure_future(post(guard))
        await held.wait()
        replace_with_a_file(shared)
        # Long enough for the worker's heartbeat to find its file gone and fail to
        # make it again: the release below cannot enter the ledger's critical section.
        await asyncio.sleep(3 * shared_ledger.HEARTBEAT_S)
        go_on.set()
        status = (await request)[0]
        restore(shared)
        return status, guard.session_counts()

    status, counts = asyncio.run(scenario())
    assert status == 200
    assert counts == (0, 0)
    assert [(e.pending, e.active) for e in read_entries(shared)] == [(0, 0)]


def test_events_caught_up_by_a_sample_that_then_finds_the_file_replaced_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's response ends while another worker holds the ledger, so its release
    waits for the next sample; that sample finds the file replaced (another worker
    moved on): the release it caught up still happens, instead of being dropped and
    the session counting as pending in the new file for good."""
    shared = tmp_path / "shared"
    cgroup = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=4096)
    go_ahead = {"first": asyncio.Event(), "second": asyncio.Event()}

    def answering_when(name: str) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await go_ahead[name].wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        return app

    # A pending timeout of ~0: a session's reservation is given back at its response.
    settings = {"shared_dir": str(shared), "pending_timeout_s": 1e-9}
    first = guarded(answering_when("first"), cgroup, **settings)
    second = guarded(answering_when("second"), cgroup, **settings)

    async def scenario() -> None:
        sessions = [asyncio.ensure_future(post(first)), asyncio.ensure_future(post(second))]
        await asyncio.sleep(0.05)
        monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 3600.0)
        first.service.ledger._next_link_check = time.monotonic() + 3600.0  # type: ignore[attr-defined]
        fd = os.open(shared / FILE_NAME, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another worker inside its critical section
        try:
            go_ahead["first"].set()
            await sessions[0]  # first's response: its release waits
        finally:
            os.close(fd)
        assert first.reservations.kept_events == 1
        (shared / FILE_NAME).unlink()
        second.service.ledger._next_link_check = 0.0  # type: ignore[attr-defined]
        second.session_counts()  # second moves to the new file, its old row left behind
        first.reservations.sample()  # catches up, then finds second's row unlocked: replaced
        go_ahead["second"].set()
        await sessions[1]

    asyncio.run(scenario())
    first.service.ledger._next_link_check = 0.0  # type: ignore[attr-defined]
    assert first.session_counts() == (0, 0)
    assert second.session_counts() == (0, 0)
