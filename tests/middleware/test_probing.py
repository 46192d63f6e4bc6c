"""Probing a route not learned yet, through the middleware: who waits, who is woken, who is refused.

The app's sessions are fake (a settable reading), the requests raw ASGI calls on one
event loop, with no lifespan: the first waiter for a probe starts the sample.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mwkit import SettableReader, controller, environment
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from asgi_admission import AdmissionMiddleware, admission_ticket
from kits.suitekit import MIB

#: A guard that held nothing back would leave some of these scenarios waiting for ever.
pytestmark = pytest.mark.timeout(30)

ROUTE = "POST /sessions"
Handler = Callable[[Request], Awaitable[int]]


def guarded(
    handler: Handler,
    reader: SettableReader,
    *,
    probes: str = "1",
    wait_s: str = "5",
    shared_dir: str | None = None,
    registry: CollectorRegistry | None = None,
    expose_details: bool = False,
) -> AdmissionMiddleware:
    """The guard over an app whose ``POST /sessions`` answers ``handler``'s status, and
    whose ``WS /terminal`` accepts and echoes; learning ``raise``, a 10 MiB reserve."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            assert (await receive())["type"] == "websocket.connect"
            await send({"type": "websocket.accept"})
            while (await receive())["type"] != "websocket.disconnect":
                pass
            return
        status = await handler(Request(scope, receive))
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    settings = {
        "ADMISSION_SESSION_RESERVE_LEARNING": "raise",
        "ADMISSION_PROBE_SESSIONS": probes,
        "ADMISSION_PROBE_WAIT_SECONDS": wait_s,
    }
    if shared_dir is not None:
        settings["ADMISSION_SHARED_DIR"] = shared_dir
    with environment(settings):
        return AdmissionMiddleware(
            app,
            session_routes=[ROUTE, "WS /terminal"],
            controller=controller(reader, reserve_mb=10),
            max_sessions=100,
            retry_after=5,
            registry=registry,
            expose_details=expose_details,
        )


class Answer:
    """What one request got: its status (``None``: nothing sent), headers, body, time."""

    def __init__(self, sent: list[Message], seconds: float) -> None:
        start = next((m for m in sent if m["type"] == "http.response.start"), None)
        self.status: int | None = None if start is None else start["status"]
        self.headers = (
            {} if start is None else {k.decode(): v.decode() for k, v in start["headers"]}
        )
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        self.body: dict[str, Any] = json.loads(body) if body else {}
        self.seconds = seconds


async def post(mw: AdmissionMiddleware, leave: asyncio.Event | None = None) -> Answer:
    """One ``POST /sessions`` whose client disconnects once ``leave`` is set."""
    sent: list[Message] = []
    messages = [{"type": "http.request", "body": b"", "more_body": False}]
    gone = leave or asyncio.Event()

    async def receive() -> Message:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {"type": "http", "method": "POST", "path": "/sessions", "headers": []}
    scope.update(query_string=b"", root_path="")
    start = time.monotonic()
    await mw(scope, receive, send)
    return Answer(sent, time.monotonic() - start)


async def ramp(reader: SettableReader, to_mb: float, *, over_s: float) -> None:
    """The working set grows to ``to_mb`` in ten steps over ``over_s``, then stays."""
    start = reader.used / MIB
    for step in range(1, 11):
        await asyncio.sleep(over_s / 10)
        reader.set_mb(start + (to_mb - start) * step / 10)


def answered(status: int = 201) -> Handler:
    """A handler that answers ``status`` at once."""

    async def handler(request: Request) -> int:
        return status

    return handler


def test_waiters_are_decided_on_the_probes_memory_once_it_stops_growing() -> None:
    """A 10 MiB reserve for 200 MiB sessions: the probe's memory arrives after its
    response, and the four waiters are decided on the 200 MiB it showed (two fit),
    once it has stopped growing, without a lifespan."""
    reader = SettableReader(used_mb=100, limit_mb=1000)
    registry = CollectorRegistry()
    mw = guarded(answered(), reader, registry=registry)

    async def burst() -> list[Answer]:
        probe = await post(mw)  # answers before its memory arrives
        growing = asyncio.create_task(ramp(reader, 300, over_s=1.0))
        answers = await asyncio.gather(*(post(mw) for _ in range(4)))
        await growing
        return [probe, *answers]

    answers = asyncio.run(burst())
    statuses = sorted(a.status or 0 for a in answers)
    assert statuses == [201, 201, 201, 503, 503]  # the probe, and 2 x 200 MiB under 800 MiB
    refusals = [a for a in answers if a.status == 503]
    assert {a.body["reason"] for a in refusals} == {"memory_pressure"}
    waited = [a.seconds for a in answers[1:]]
    assert min(waited) >= 1.5  # the ramp and a quiet second
    assert max(waited) <= 3.5  # and a sample or two
    [estimate] = mw.reservations.estimates()
    # What arrived, and what drift may have hidden over the trial (256 KiB a second).
    assert 200 * MIB <= estimate.footprint_bytes <= 201 * MIB
    assert mw.controller.reserve_for(reader.limit) == estimate.footprint_bytes
    decided = registry.get_sample_value(
        "asgi_admission_decisions_total", {"kind": "http", "outcome": "admitted", "reason": "none"}
    )
    assert decided == 3  # a waiter counts once, when it is decided
    assert registry.get_sample_value("asgi_admission_probing_routes") == 0
    assert mw.reservations.probe_waiters.total() == 0


def test_a_wait_that_runs_out_is_refused_with_probing() -> None:
    """A probe that does not answer: the others wait ADMISSION_PROBE_WAIT_SECONDS, then
    get a 503 with reason probing and Retry-After about the probe's time so far; the
    metrics and the detailed body show the probing while it lasts."""
    reader = SettableReader(used_mb=100)
    registry = CollectorRegistry()

    async def scenario() -> tuple[list[Answer], float | None, float | None, Answer]:
        done = asyncio.Event()

        async def handler(request: Request) -> int:
            await done.wait()
            return 201

        mw = guarded(handler, reader, wait_s="1.5", registry=registry, expose_details=True)
        probe = asyncio.create_task(post(mw))
        await asyncio.sleep(0.05)
        waiting = [asyncio.create_task(post(mw)) for _ in range(3)]
        await asyncio.sleep(0.5)
        routes = registry.get_sample_value("asgi_admission_probing_routes")
        waiters = registry.get_sample_value("asgi_admission_probe_waiting_requests")
        answers = await asyncio.gather(*waiting)
        done.set()
        return answers, routes, waiters, await probe

    answers, routes, waiters, probe = asyncio.run(scenario())
    assert (routes, waiters) == (1, 3)
    assert probe.status == 201
    for answer in answers:
        assert answer.status == 503
        assert answer.body["reason"] == "probing"
        assert answer.body["title"] == "Measuring what a new session costs"
        assert 1 <= int(answer.headers["retry-after"]) <= 3  # about 1.55 s so far
        assert answer.headers["cache-control"] == "no-store"
        [probing] = answer.body["probing"]
        assert (probing["route"], probing["probes"]) == (ROUTE, 1)
        assert 1.4 <= answer.seconds <= 2.5
    refused = registry.get_sample_value(
        "asgi_admission_decisions_total",
        {"kind": "http", "outcome": "rejected", "reason": "probing"},
    )
    assert refused == 3


def test_a_client_that_leaves_while_waiting_holds_nothing() -> None:
    """Its disconnect ends the wait: nothing is sent, the app never sees it, nothing is
    held or reserved for it, and the others still wait."""
    reader = SettableReader(used_mb=100)
    calls: list[str] = []

    async def scenario() -> tuple[Answer, int, tuple[int, int]]:
        done = asyncio.Event()

        async def handler(request: Request) -> int:
            calls.append("app")
            await done.wait()
            return 201

        mw = guarded(handler, reader)
        probe = asyncio.create_task(post(mw))
        await asyncio.sleep(0.05)
        leave = asyncio.Event()
        leaving = asyncio.create_task(post(mw, leave))
        staying = asyncio.create_task(post(mw))
        await asyncio.sleep(0.2)
        assert mw.reservations.probe_waiters.total() == 2
        leave.set()
        left = await leaving
        counts = mw.reservations.probe_waiters.total(), mw.session_counts()
        staying.cancel()
        done.set()
        await asyncio.gather(probe, staying, return_exceptions=True)
        return left, *counts

    left, waiters, counts = asyncio.run(scenario())
    assert left.status is None
    assert left.seconds < 1
    assert calls == ["app"]  # the probe only
    assert waiters == 1
    assert counts == (0, 1)  # the probe's reservation, nothing for the one that left


def test_a_probe_answered_with_an_error_lets_the_next_waiter_probe() -> None:
    """The probe opened nothing (a 500): nothing is learned from it, and one of those
    waiting becomes the probe at once while the others wait on."""
    reader = SettableReader(used_mb=100)
    statuses = iter([500])

    async def scenario() -> tuple[Answer, list[int], int]:
        done = asyncio.Event()

        async def handler(request: Request) -> int:
            status = next(statuses, 201)
            if status == 500:
                await done.wait()
            return status

        mw = guarded(handler, reader)
        probe = asyncio.create_task(post(mw))
        await asyncio.sleep(0.05)
        waiting = [asyncio.create_task(post(mw)) for _ in range(3)]
        await asyncio.sleep(0.2)
        done.set()
        failed = await probe
        await asyncio.sleep(0.1)
        [status] = mw.reservations.probe_status()
        finished = sum(task.done() for task in waiting)
        rest = await asyncio.gather(*waiting)
        admitted = sum(answer.status == 201 for answer in rest)
        return failed, [finished, status.probes, status.waiting], admitted

    failed, (finished, probes, still_waiting), admitted = asyncio.run(scenario())
    assert failed.status == 500
    assert (finished, probes, still_waiting) == (1, 1, 2)  # one is the probe now
    assert admitted == 3  # a fixed reading: nothing to fit, all open once it is learned


def test_probe_sessions_zero_trusts_the_reserve() -> None:
    """ADMISSION_PROBE_SESSIONS=0: a burst is decided at once on the reserve, as before."""
    reader = SettableReader(used_mb=100)
    mw = guarded(answered(), reader, probes="0")

    async def burst() -> list[Answer]:
        return await asyncio.gather(*(post(mw) for _ in range(5)))

    answers = asyncio.run(burst())
    assert [a.status for a in answers] == [201] * 5
    assert max(a.seconds for a in answers) < 0.5
    assert mw.reservations.probe_status() == []
    assert mw.session_counts() == (0, 5)


def test_learning_off_probes_nothing() -> None:
    """With learning off nothing is ever learned, so nothing is probed either."""
    reader = SettableReader(used_mb=100)
    with environment({"ADMISSION_SESSION_RESERVE_LEARNING": "off"}):
        mw = AdmissionMiddleware(
            guarded(answered(), reader).app,
            session_routes=[ROUTE],
            controller=controller(reader),
            registry=None,
        )
    assert not mw.reservations.probing

    async def burst() -> list[Answer]:
        return await asyncio.gather(*(post(mw) for _ in range(3)))

    assert [a.status for a in asyncio.run(burst())] == [201] * 3


def test_a_ticket_released_from_a_thread_wakes_the_waiters() -> None:
    """The probe's session ends (its ticket released from a worker thread) before its
    memory showed: the waiters are woken from that thread and decided on the reserve."""
    reader = SettableReader(used_mb=100)

    async def scenario() -> list[Answer]:
        held: list[Any] = []

        async def handler(request: Request) -> int:
            ticket = admission_ticket(request)
            if ticket is not None and not held:
                ticket.hold()
                held.append(ticket)
            return 201

        mw = guarded(handler, reader)
        probe = await post(mw)
        waiting = [asyncio.create_task(post(mw)) for _ in range(2)]
        await asyncio.sleep(0.2)
        assert mw.reservations.probe_waiters.total() == 2
        await asyncio.to_thread(held[0].release)
        return [probe, *await asyncio.wait_for(asyncio.gather(*waiting), timeout=1)]

    answers = asyncio.run(scenario())
    assert [a.status for a in answers] == [201] * 3
    assert max(a.seconds for a in answers[1:]) < 1


def test_a_websocket_waits_before_its_accept() -> None:
    """A WebSocket of a route being probed waits before its accept, the server's connect
    kept for the app; one that leaves meanwhile is forgotten."""
    reader = SettableReader(used_mb=100)
    mw = guarded(answered(), reader)

    async def connect(leave: asyncio.Event, closed: asyncio.Event) -> list[Message]:
        sent: list[Message] = []
        connected = False

        async def receive() -> Message:
            nonlocal connected
            if not connected:
                connected = True
                return {"type": "websocket.connect"}
            await leave.wait()
            return {"type": "websocket.disconnect", "code": 1000}

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "websocket.accept":
                closed.set()

        scope = {"type": "websocket", "path": "/terminal", "headers": [], "query_string": b""}
        await mw(scope | {"root_path": ""}, receive, send)
        return sent

    async def scenario() -> tuple[list[Message], list[Message], list[Message], int]:
        events = [(asyncio.Event(), asyncio.Event()) for _ in range(3)]
        probe = asyncio.create_task(connect(*events[0]))
        await events[0][1].wait()  # accepted
        waiter = asyncio.create_task(connect(*events[1]))
        leaver = asyncio.create_task(connect(*events[2]))
        await asyncio.sleep(0.1)
        waiters = mw.reservations.probe_waiters.total()
        events[2][0].set()  # leaves while waiting
        left = await leaver
        await asyncio.wait_for(events[1][1].wait(), timeout=3)  # the probe's memory: none
        for leave, _ in events[:2]:
            leave.set()
        return await probe, await waiter, left, waiters

    probe, waiter, left, waiters = asyncio.run(scenario())
    assert waiters == 2
    assert probe[0]["type"] == waiter[0]["type"] == "websocket.accept"
    assert left == []
    assert mw.session_counts() == (0, 0)


async def sample_every(guard: AdmissionMiddleware, interval_s: float = 0.25) -> None:
    """What a lifespan runs for ``guard``: its reservations' sample, four times a second."""
    while True:
        await asyncio.sleep(interval_s)
        guard.reservations.sample()


def test_workers_probe_once_and_wait_for_each_other(tmp_path: Path) -> None:
    """Two guards over one shared directory: one probe in the container; the other
    guard's request waits for it and is decided on what that probe showed."""
    reader = SettableReader(used_mb=100, limit_mb=1000)
    shared = str(tmp_path / "shared")

    async def scenario() -> tuple[Answer, Answer, Answer]:
        first = guarded(answered(), reader, shared_dir=shared)
        second = guarded(answered(), reader, shared_dir=shared)
        sampling = asyncio.create_task(sample_every(first))  # the first worker's lifespan
        probe = await post(first)
        growing = asyncio.create_task(ramp(reader, 400, over_s=0.5))
        other, third = await asyncio.gather(post(second), post(second))
        await growing
        sampling.cancel()
        return probe, other, third

    probe, other, third = asyncio.run(scenario())
    assert probe.status == 201
    # 300 MiB learned from the first worker's probe: one more fits under 800 MiB.
    assert sorted([other.status or 0, third.status or 0]) == [201, 503]
    assert min(other.seconds, third.seconds) >= 1.0
