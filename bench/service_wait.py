"""Wake latency through the middleware: from a session's end to the waiter's accept.

    .venv/bin/python bench/service_wait.py [--wakes 500]

A guard with ``ADMISSION_QUEUE_TIMEOUT_SECONDS=10`` and a count cap of 1 (raw ASGI
calls on one event loop, a settable reading, no lifespan): a WebSocket holds the one
slot, a second waits before its accept; the first's client disconnects and the time
to the second's ``websocket.accept`` is taken, one waiter at a time. What it replaces
is the refused client's retry: a ``Retry-After`` of at least 1 s, plus a round trip.
A second figure has the slot freed in another worker (two guards over one shared
ledger): the waiter's freed watch, reading every sample interval, finds it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time

from starlette.types import Message, Receive, Scope, Send

from asgi_admission import AdmissionController, AdmissionMiddleware, MemoryReading
from benchkit import MIB

WS_SCOPE = {
    "type": "websocket",
    "path": "/terminal",
    "headers": [],
    "query_string": b"",
    "root_path": "",
    "subprotocols": [],
}


async def terminal(scope: Scope, receive: Receive, send: Send) -> None:
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while (await receive())["type"] != "websocket.disconnect":
        pass


def guard(shared_dir: str = "off") -> AdmissionMiddleware:
    def reading() -> MemoryReading:
        return MemoryReading(used_bytes=100 * MIB, limit_bytes=1000 * MIB, available=True)

    # With a controller the guard reads its other settings from the environment.
    os.environ.update(
        ADMISSION_QUEUE_TIMEOUT_SECONDS="10",
        ADMISSION_PROBE_SESSIONS="0",
        ADMISSION_PENDING_TIMEOUT_SECONDS="1e-9",
        ADMISSION_SHARED_DIR=shared_dir,
    )
    return AdmissionMiddleware(
        terminal,
        session_routes=["WS /terminal"],
        controller=AdmissionController(reserve_bytes=10 * MIB, memory_reader=reading),
        max_sessions=1,
        registry=None,
    )


class Socket:
    """One WebSocket client on ``mw``: ``opened`` (and ``on_accept``, where given) set at
    its accept, whose ``time.monotonic()`` is ``accepted_at``; it leaves on ``leave``."""

    def __init__(self, mw: AdmissionMiddleware, on_accept: asyncio.Event | None = None) -> None:
        self.opened = asyncio.Event()
        self.leave = asyncio.Event()
        self.accepted_at = 0.0
        self._on_accept = on_accept
        self.task = asyncio.create_task(self._run(mw))

    async def _run(self, mw: AdmissionMiddleware) -> None:
        connected = False

        async def receive() -> Message:
            nonlocal connected
            if not connected:
                connected = True
                return {"type": "websocket.connect"}
            await self.leave.wait()
            return {"type": "websocket.disconnect", "code": 1000}

        async def send(message: Message) -> None:
            if message["type"] == "websocket.accept":
                self.accepted_at = time.monotonic()
                self.opened.set()
                if self._on_accept is not None:
                    self._on_accept.set()

        await mw(dict(WS_SCOPE), receive, send)


async def wakes(
    count: int, holder_guard: AdmissionMiddleware, waiter_guard: AdmissionMiddleware
) -> list[float]:
    latencies = []
    holder = Socket(holder_guard)
    await holder.opened.wait()
    for _ in range(count):
        waiter = Socket(waiter_guard)
        await asyncio.sleep(0.002)  # it has joined the queue
        freed = time.monotonic()
        holder.leave.set()
        await waiter.opened.wait()
        latencies.append(waiter.accepted_at - freed)
        await holder.task
        # The waiter holds the slot now; the next round frees it in the holder's guard.
        holder = waiter
        holder_guard, waiter_guard = waiter_guard, holder_guard
    holder.leave.set()
    await holder.task
    return latencies


def report(name: str, latencies: list[float]) -> None:
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(f"{name:44} median {statistics.median(ms):7.3f} ms  p99 {p99:7.3f} ms  ({len(ms)} wakes)")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--wakes", type=int, default=500)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}")
    one = guard()
    report("session ends in this worker", asyncio.run(wakes(args.wakes, one, one)))
    with tempfile.TemporaryDirectory() as shared:
        first, second = guard(shared), guard(shared)
        cross = asyncio.run(wakes(max(1, args.wakes // 10), first, second))
        report("session ends in another worker (shared ledger)", cross)
    print("the retry it replaces: Retry-After >= 1 s, plus the client's round trip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
