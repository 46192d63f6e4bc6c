"""The demo's process sessions: a real child process per session, growing on request.

``POST /processes?hold_mb=&budget_mb=`` starts a child that holds ``hold_mb`` MiB and
registers it with the session watchdog under a budget (``&ramp_s=`` answers ``201`` as
soon as the child is spawned and lets its memory arrive in steps over that many
seconds, as a browser or a kernel booting after its request would); ``POST
/processes/{id}/grow?mb=`` makes it hold more; ``GET /processes/{id}`` shows what the
watchdog measured and, once it acted, why it halted the session; ``DELETE`` ends it.
Watch a session pass its budget, or the container pass the critical watermark, and
be halted. The children run in their own process groups and are ended at shutdown.
Where the watchdog can make memory groups (docs/session-groups.md), each child starts
inside one limited to its budget: the kernel then stops it at the budget, and the
watchdog reports that as the halt ``memory_limit``. ``&burst=1`` allocates the memory
as fast as it can instead of in steps, faster than any sampling watchdog can act.

A child grows in steps of 4 MiB at most 80 MiB a second, so that the watchdog sees
it cross the line before the kernel's OOM killer has to act (docs/operations.md,
"The session watchdog"). Growing a session that was halted answers 409, one whose
process has ended 410.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import anyio
from fastapi import FastAPI, HTTPException, Query, Request, Response

from asgi_admission import (
    AdmissionTicket,
    SessionWatchdog,
    WatchedSession,
    admission_ticket,
    session_watchdog,
)

_MIB: Final = 1024 * 1024
DEFAULT_BUDGET_MB: Final = 512

#: The child grows by this much at a time, pausing GROWTH_PAUSE_S between steps.
GROWTH_STEP_MB: Final = 4
GROWTH_PAUSE_S: Final = 0.05

# Holds argv[1] MiB, then N more for each line N read on stdin, answering "ready"
# each time; every page is written so the kernel really charges it, in steps of
# argv[2] MiB argv[3] seconds apart. With argv[4] seconds above 0 the first argv[1]
# MiB arrive in eight parts spread over that time instead (a session booting after
# its response): part k starts argv[4] * k / 7 seconds in, or at once if the parts
# before it took longer. When the worker that reads its answers is gone (killed), it exits
# quietly instead of printing a BrokenPipeError traceback into the server's log.
CHILD_SCRIPT: Final = """
import os, sys, time
held = []
def answer():
    try:
        print("ready", flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
step, pause = int(sys.argv[2]), float(sys.argv[3])
def hold(mib):
    while mib > 0:
        block = bytearray(min(mib, step) * 1048576)
        block[::4096] = b"\\x01" * len(range(0, len(block), 4096))
        held.append(block)
        mib -= step
        time.sleep(pause)
mib, ramp_s = int(sys.argv[1]), float(sys.argv[4])
if ramp_s > 0 and mib >= 8:
    start = time.monotonic()
    for part in range(8):
        time.sleep(max(0.0, start + ramp_s * part / 7 - time.monotonic()))
        hold(mib // 8 + (mib % 8 if part == 7 else 0))
else:
    hold(mib)
answer()
for line in sys.stdin:
    hold(int(line))
    answer()
"""


@dataclass(slots=True)
class _Child:
    session_id: str
    process: asyncio.subprocess.Process
    watched: WatchedSession | None
    budget_mb: int
    #: Reads the child's first "ready" while its memory ramps in after the response.
    ramping: asyncio.Task[bytes] | None = None


class ProcessSessions:
    """The demo's running child processes, by session id."""

    def __init__(self) -> None:
        self._children: dict[str, _Child] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._children)

    async def open(
        self,
        watchdog: SessionWatchdog | None,
        *,
        hold_mb: int,
        budget_mb: int,
        ramp_s: float = 0.0,
        on_ready: Callable[[], None] | None = None,
        route: str | None = None,
        ticket: AdmissionTicket | None = None,
        burst: bool = False,
    ) -> _Child:
        session_id = f"p{next(self._ids)}"
        argv = [sys.executable, "-c", CHILD_SCRIPT, str(hold_mb)]
        # A burst allocates in one block with no pause: as fast as the kernel gives pages.
        argv += ["65536", "0"] if burst else [str(GROWTH_STEP_MB), str(GROWTH_PAUSE_S)]
        argv.append(str(ramp_s))
        budget = budget_mb * _MIB
        # The group exists before the child: it starts inside it, before it allocates.
        group = (
            None
            if watchdog is None
            else await asyncio.to_thread(
                watchdog.session_group, session_id=session_id, budget_bytes=budget
            )
        )
        try:
            process = await asyncio.create_subprocess_exec(
                *(argv if group is None else group.command(argv)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except BaseException:
            if watchdog is not None and group is not None:
                watchdog.session_groups.remove(group)
            raise
        watched = (
            None
            if watchdog is None
            else watchdog.register(
                process.pid,
                budget_bytes=budget,
                session_id=session_id,
                route=route,
                group=group,
                ticket=ticket,
            )
        )
        assert process.stdout is not None
        ramping = None
        if ramp_s:
            # The memory arrives after the response: the first "ready" is read later.
            ramping = asyncio.get_running_loop().create_task(process.stdout.readline())
            if on_ready is not None:
                ramping.add_done_callback(lambda _: on_ready())
        else:
            try:
                await process.stdout.readline()
            except BaseException:
                # Cancelled (the client left) or failed before the session was recorded:
                # nothing else would ever stop this child.
                await _kill(process)
                if watched is not None:
                    watched.unregister()
                raise
        child = self._children[session_id] = _Child(
            session_id, process, watched, budget_mb, ramping
        )
        return child

    def get(self, session_id: str) -> _Child:
        child = self._children.get(session_id)
        if child is None:
            raise HTTPException(status_code=404, detail="no such process session")
        return child

    async def close(self, session_id: str) -> None:
        child = self._children.pop(session_id)
        if child.watched is not None:
            child.watched.unregister()
        if child.ramping is not None:
            child.ramping.cancel()
        await _kill(child.process)

    async def close_all(self) -> None:
        for session_id in list(self._children):
            await self.close(session_id)


async def _kill(process: asyncio.subprocess.Process) -> None:
    # Shielded: a handler its server cancels (an anyio cancel scope cancels every
    # await in it) still reaps the child it has taken out of the table.
    with anyio.CancelScope(shield=True):
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        await process.wait()


def ended(child: _Child) -> HTTPException | None:
    """409 for a session the watchdog halted, 410 for one whose process is gone; else None."""
    halt = None if child.watched is None else child.watched.halt
    if halt is not None:
        return HTTPException(
            status_code=409,
            detail=f"Session {child.session_id} was halted by the watchdog ({halt.reason}): "
            f"{halt.message}",
        )
    code = child.process.returncode
    if code is not None:
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        return HTTPException(
            status_code=410,
            detail=f"Session {child.session_id}'s process has ended ({how}).",
        )
    return None


async def _ended_after_eof(child: _Child) -> HTTPException:
    # The child closed its pipes: it is exiting. Wait for it, so the answer says why.
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        await asyncio.wait_for(child.process.wait(), timeout=5)
    gone = ended(child)
    if gone is not None:
        return gone
    return HTTPException(  # pragma: no cover - a child that closed stdout but lives on
        status_code=410, detail=f"Session {child.session_id}'s process stopped answering."
    )


def describe(child: _Child) -> dict[str, Any]:
    watched = child.watched
    sample = None if watched is None else watched.last_sample
    halt = None if watched is None else watched.halt
    return {
        "id": child.session_id,
        "pid": child.process.pid,
        "running": child.process.returncode is None,
        "budget_mb": child.budget_mb,
        "rss_bytes": None if sample is None else sample.rss_bytes,
        "cpu_percent": None if sample is None else sample.cpu_percent,
        "peak_rss_bytes": None if watched is None else watched.peak_rss_bytes,
        "halt": None if halt is None else {"reason": halt.reason, "message": halt.message},
    }


def add_process_routes(app: FastAPI, sessions: ProcessSessions) -> None:
    """``/processes`` routes; ``POST /processes`` must be one of the guarded session routes."""

    @app.post("/processes", status_code=201)
    async def open_process(
        request: Request,
        hold_mb: int = Query(16, ge=0, le=4096),
        budget_mb: int = Query(DEFAULT_BUDGET_MB, ge=1, le=65536),
        ramp_s: float = Query(0.0, ge=0, le=60),
        ticket: bool = Query(False),
        burst: bool = Query(False),
        measured: bool = Query(True),
    ) -> dict[str, Any]:
        try:
            watchdog: SessionWatchdog | None = session_watchdog(request)
        except LookupError:  # the unguarded demo: processes run unwatched
            watchdog = None
        # With ?ticket=1 the session's reservation is held until its child is up. The
        # watchdog is handed the ticket either way: the guard learns from the child's peak
        # and settles the reservation once the child's own memory is there. ?measured=0
        # hands it the route alone: the reservation settles by the working set, as for a
        # session the guard cannot measure on its own.
        admitted = admission_ticket(request)
        held = admitted if ticket else None
        if held is not None:
            held.hold()
        try:
            child = await sessions.open(
                watchdog,
                hold_mb=hold_mb,
                budget_mb=budget_mb,
                ramp_s=ramp_s,
                on_ready=None if held is None else held.started,
                route=None if admitted is None or measured else admitted.route,
                ticket=admitted if measured else None,
                burst=burst,
            )
        except BaseException:
            if held is not None:
                held.release()
            raise
        if held is not None and child.ramping is None:
            held.started()
        return describe(child)

    @app.get("/processes")
    async def list_processes() -> dict[str, Any]:
        return {"processes": [describe(c) for c in sessions._children.values()]}

    @app.get("/processes/{session_id}")
    async def show_process(session_id: str) -> dict[str, Any]:
        return describe(sessions.get(session_id))

    @app.post("/processes/{session_id}/grow")
    async def grow_process(session_id: str, mb: int = Query(ge=1, le=4096)) -> dict[str, Any]:
        child = sessions.get(session_id)
        gone = ended(child)
        if gone is not None:
            raise gone
        stdin, stdout = child.process.stdin, child.process.stdout
        assert stdin is not None
        assert stdout is not None
        if child.ramping is not None:
            await child.ramping
        try:
            stdin.write(f"{mb}\n".encode())
            await stdin.drain()
            answer = await stdout.readline()
        except (ConnectionError, RuntimeError):  # the pipe closed under us: halted or gone
            answer = b""
        if not answer:
            raise await _ended_after_eof(child)
        return describe(child)

    @app.delete(
        "/processes/{session_id}", status_code=204, response_class=Response, response_model=None
    )
    async def close_process(session_id: str) -> None:
        sessions.get(session_id)
        await sessions.close(session_id)
