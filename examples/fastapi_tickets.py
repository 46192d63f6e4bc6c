"""A FastAPI service whose sessions boot after their 201, holding their admission ticket.

``POST /sessions`` starts a real background child process (a stand-in for a
browser or a kernel) and answers ``201`` at once; the session's reservation is
held until the child says it is up, then becomes an active session.
``DELETE /sessions/{id}`` ends it and gives the reservation back. Run it with
``uvicorn examples.fastapi_tickets:app``.
"""

from __future__ import annotations

import asyncio
import itertools
import sys

from fastapi import FastAPI, HTTPException, Request, Response

from asgi_admission import AdmissionMiddleware, AdmissionTicket, admission_ticket

# The session: build 64 MiB (every page touched), say so, then wait to be ended.
BOOT = """
import sys
block = bytearray(64 * 1024 * 1024)
block[::4096] = b"\\x01" * (len(block) // 4096)
print("up", flush=True)
sys.stdin.read()
"""

app = FastAPI()
sessions: dict[str, tuple[asyncio.subprocess.Process, AdmissionTicket | None]] = {}
booting: set[asyncio.Task[None]] = set()
_ids = itertools.count(1)


async def _wait_until_up(process: asyncio.subprocess.Process, ticket: AdmissionTicket) -> None:
    assert process.stdout is not None
    line = await process.stdout.readline()
    if line:
        ticket.started()  # its memory is up: pending becomes active
    else:
        ticket.release()  # it died booting


@app.post("/sessions", status_code=201)
async def open_session(request: Request) -> dict[str, str]:
    ticket = admission_ticket(request)
    if ticket is not None:
        ticket.hold()  # pending past this response, until started() or release()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        BOOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    session_id = f"s{next(_ids)}"
    sessions[session_id] = (process, ticket)
    if ticket is not None:
        task = asyncio.create_task(_wait_until_up(process, ticket))
        booting.add(task)
        task.add_done_callback(booting.discard)
    return {"id": session_id}


@app.delete("/sessions/{session_id}", status_code=204, response_class=Response)
async def close_session(session_id: str) -> None:
    found = sessions.pop(session_id, None)
    if found is None:
        raise HTTPException(status_code=404, detail="no such session")
    process, ticket = found
    if process.returncode is None:
        process.kill()
    await process.wait()
    if ticket is not None:
        ticket.release()


app.add_middleware(
    AdmissionMiddleware,
    session_routes=["POST /sessions"],
    current_sessions=lambda: len(sessions),
)
