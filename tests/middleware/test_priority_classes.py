"""Priority classes through the middleware: each class its own ceiling, waiters served by
class then arrival, the route's class or the ``priority`` callable's, and the default
class deciding exactly as the single latch does.

Raw ASGI calls on one loop, a settable reading of 1000 MiB, a 10 MiB reserve, the high
watermark 80 and the resume threshold 70 (a gap of 10 points per class).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import httpx
import pytest
from mwkit import SettableReader, controller, environment
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send
from waitkit import Socket, post

from asgi_admission import AdmissionMiddleware

pytestmark = pytest.mark.timeout(30)

CLASSES = "critical=90,standard=80,batch=65"


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["type"] == "websocket":
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        while (await receive())["type"] != "websocket.disconnect":
            pass
        return
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def guarded(
    routes: Mapping[str, str] | list[str],
    *,
    reader: SettableReader | None = None,
    classes: str = CLASSES,
    wait_s: str = "5",
    max_sessions: int = 100,
    priority: Callable[[Scope], str] | None = None,
    registry: CollectorRegistry | None = None,
) -> AdmissionMiddleware:
    settings = {
        "ADMISSION_PRIORITY_CLASSES": classes,
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": wait_s,
        "ADMISSION_PROBE_SESSIONS": "0",
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9",
        "ADMISSION_SHARED_DIR": "off",
    }
    with environment(settings):
        return AdmissionMiddleware(
            app,
            session_routes=routes,
            controller=controller(reader or SettableReader(used_mb=100), reserve_mb=10),
            max_sessions=max_sessions,
            retry_after=5,
            registry=registry,
            priority=priority,
        )


def test_a_route_mapped_to_an_unknown_class_is_a_clear_error() -> None:
    """A class name that is not configured is refused at construction, naming the route."""
    with pytest.raises(ValueError, match=r"'WS /terminal'.*'urgent'.*ADMISSION_PRIORITY_CLASSES"):
        guarded({"POST /sessions": "batch", "WS /terminal": "urgent"})


def test_a_priority_that_is_not_callable_is_a_clear_error() -> None:
    """``priority`` must be a callable of the scope."""
    with pytest.raises(ValueError, match="priority must be a callable"):
        guarded(["POST /sessions"], priority="critical")  # type: ignore[arg-type]


def test_each_class_has_its_own_ceiling() -> None:
    """At 70 % used a batch session (ceiling 65) is refused at once without a wait, and a
    critical one (ceiling 90) is admitted, by their routes' classes."""
    reader = SettableReader(used_mb=700)

    async def scenario() -> tuple[int | None, str, int | None]:
        mw = guarded(
            {"POST /sessions": "batch", "POST /admin": "critical"}, reader=reader, wait_s="0"
        )
        batch = await post(mw)
        admin = await post(mw, path="/admin")
        return batch["status"], batch["body"].get("reason", ""), admin["status"]

    assert asyncio.run(scenario()) == (503, "memory_pressure", 201)


def test_each_classs_decisions_are_counted_apart_and_the_decisions_counter_is_unchanged() -> None:
    """With classes, each decision is counted under its request's class (a wait that ran
    out as its refusal, not its checks while it waited) and the decisions counter keeps
    its labels; a guard without classes exports no per-class series at all."""
    reader = SettableReader(used_mb=700)
    registry, plain = CollectorRegistry(), CollectorRegistry()

    async def scenario() -> None:
        mw = guarded(
            {"POST /sessions": "batch", "POST /admin": "critical"},
            reader=reader,
            wait_s="0.2",
            registry=registry,
        )
        assert (await post(mw))["status"] == 503  # batch: waits, then queue_timeout
        assert (await post(mw, path="/admin"))["status"] == 201
        without = guarded(["POST /sessions"], classes="", reader=reader, registry=plain)
        assert (await post(without, path="/sessions"))["status"] == 201  # under 80 %

    asyncio.run(scenario())
    per_class = "asgi_admission_class_decisions_total"

    def counted(klass: str, outcome: str, reason: str) -> float | None:
        labels = {"class": klass, "outcome": outcome, "reason": reason}
        return registry.get_sample_value(per_class, labels)

    assert counted("batch", "rejected", "queue_timeout") == 1
    assert counted("batch", "rejected", "memory_pressure") == 0  # a check while it waited
    assert counted("critical", "admitted", "none") == 1
    assert counted("standard", "admitted", "none") == 0  # every class starts at 0
    decisions = [m for m in registry.collect() if m.name == "asgi_admission_decisions"]
    assert {tuple(sorted(s.labels)) for s in decisions[0].samples} == {
        ("kind", "outcome", "reason")
    }
    assert [
        s for m in plain.collect() if m.name.endswith("class_decisions") for s in m.samples
    ] == []
    admitted = {"kind": "http", "outcome": "admitted", "reason": "none"}
    assert plain.get_sample_value("asgi_admission_decisions_total", admitted) == 1


def test_waiters_are_served_by_class_then_arrival() -> None:
    """At a count cap of 1, two batch and two critical WebSockets wait, batch first: as
    the session ends each time, the critical ones open first, then the batch ones, each
    class in arrival order."""

    async def scenario() -> list[str]:
        names = {"/terminal": "batch", "/admin": "critical"}
        mw = guarded({"WS /terminal": "batch", "WS /admin": "critical"}, max_sessions=1)
        holder = Socket(mw)
        await holder.opened.wait()
        waiting: list[tuple[str, Socket]] = []
        for path, n in (("/terminal", 1), ("/terminal", 2), ("/admin", 1), ("/admin", 2)):
            waiting.append((f"{names[path]}{n}", Socket(mw, path=path)))
            await asyncio.sleep(0.02)
        order: list[str] = []
        current = holder
        for _ in range(4):
            await current.close()
            await asyncio.sleep(0.1)
            opened = [(n, s) for n, s in waiting if s.opened.is_set() and n not in order]
            assert len(opened) == 1, opened
            order.append(opened[0][0])
            current = opened[0][1]
        await current.close()
        return order

    assert asyncio.run(scenario()) == ["critical1", "critical2", "batch1", "batch2"]


def test_the_priority_callable_picks_the_class_and_its_errors_fall_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``priority(scope)`` wins over the route's class; one that raises or names no class
    leaves the request its route's class, logged once."""
    reader = SettableReader(used_mb=700)

    def priority(scope: Scope) -> str:
        headers: dict[bytes, bytes] = dict(scope["headers"])
        tier = headers.get(b"x-tier", b"").decode()
        if tier == "boom":
            raise RuntimeError("no tier")
        return tier

    async def scenario() -> list[int | None]:
        mw = guarded({"POST /sessions": "batch"}, reader=reader, wait_s="0", priority=priority)
        statuses = []
        for tier in ("critical", "boom", "nonsense", "boom"):
            answer = await post(mw, headers=[(b"x-tier", tier.encode())])
            statuses.append(answer["status"])
        return statuses

    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        assert asyncio.run(scenario()) == [201, 503, 503, 503]
    logged = [r for r in caplog.records if "priority callable" in r.getMessage()]
    assert len(logged) == 1


def test_the_default_class_beside_others_decides_as_the_single_latch() -> None:
    """The burst of tests/middleware/test_burst.py (60 concurrent openings, 50 MiB
    reserves, 100 MiB used of 1000): 14 admitted and 46 refused with only the default
    class (the latch), and exactly so with the default class decided beside others."""

    def burst(classes: str) -> tuple[int, int]:
        release = asyncio.Event()

        async def open_session(request: Request) -> Response:
            await release.wait()
            return PlainTextResponse("opened")

        inner = Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])
        settings = {
            "ADMISSION_PRIORITY_CLASSES": classes,
            "ADMISSION_PROBE_SESSIONS": "0",
            "ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9",
        }
        with environment(settings):
            mw = AdmissionMiddleware(
                inner,
                session_routes=["POST /sessions"],
                controller=controller(SettableReader(used_mb=100), reserve_mb=50),
                max_sessions=100,
                retry_after=5,
                registry=None,
            )
        assert (mw.service.ceilings is None) == (classes == "")

        async def run() -> list[int]:
            transport = httpx.ASGITransport(app=mw)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                tasks = [asyncio.create_task(client.post("/sessions")) for _ in range(60)]
                for _ in range(400):  # the refusals answer at once; give them up to 2 s
                    if sum(task.done() for task in tasks) >= 46:
                        break
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0.05)
                release.set()
                return [r.status_code for r in await asyncio.gather(*tasks)]

        statuses = asyncio.run(run())
        return statuses.count(200), statuses.count(503)

    assert burst("") == (14, 46)
    assert burst("critical=90,default=80,batch=65") == (14, 46)


def tenant_of(scope: Scope) -> str | None:
    """The tenant is the WebSocket's path segment after ``/terminal/``."""
    path: str = scope["path"]
    return path.rsplit("/", 1)[-1] if path.startswith("/terminal/") else None


def shared_guard(*, wait_s: str, max_sessions: int) -> AdmissionMiddleware:
    settings = {
        "ADMISSION_TENANT_MAX_SHARE": "0.5",
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": wait_s,
        "ADMISSION_PROBE_SESSIONS": "0",
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9",
        "ADMISSION_SHARED_DIR": "off",
    }
    with environment(settings):
        return AdmissionMiddleware(
            app,
            session_routes=["WS /terminal/*"],
            controller=controller(SettableReader(used_mb=100), reserve_mb=10),
            max_sessions=max_sessions,
            retry_after=5,
            registry=None,
            tenant=tenant_of,
        )


def test_a_tenant_at_its_share_lets_the_others_waiting_go_first() -> None:
    """Share 0.5, a cap of 4: tenant a holds 2, b holds 2; a and then b wait. When one of
    a's sessions ends, a's waiter would hold 2 of 4, above half of the 3 counted with it
    gone... so b's waiter, behind it, goes first (a's keeps its place and opens next)."""

    async def scenario() -> list[str]:
        mw = shared_guard(wait_s="5", max_sessions=4)
        held = [Socket(mw, path=f"/terminal/{t}") for t in ("a", "a", "b", "c")]
        for socket in held:
            await socket.opened.wait()
        a_waits = Socket(mw, path="/terminal/a")
        await asyncio.sleep(0.05)
        b_waits = Socket(mw, path="/terminal/b")
        await asyncio.sleep(0.05)
        opened: list[str] = []
        await held[3].close()  # c's ends: 3 counted, a holds 2 of them, b 1
        await asyncio.sleep(0.1)
        opened += [n for n, s in (("a", a_waits), ("b", b_waits)) if s.opened.is_set()]
        await held[2].close()  # b's first ends: a's waiter now fits its share (3 of 4 counted)
        await asyncio.sleep(0.1)
        opened += [
            n for n, s in (("a", a_waits), ("b", b_waits)) if s.opened.is_set() and n not in opened
        ]
        for socket in (held[0], held[1], a_waits, b_waits):
            if socket.opened.is_set():
                await socket.close()
        return opened

    assert asyncio.run(scenario()) == ["b", "a"]


def test_without_a_wait_a_tenant_beyond_its_share_is_refused_while_others_are() -> None:
    """Share 0.5, no wait, a cap of 2: a holds 1 and b 1; a third of a's is refused
    (session_limit), and then, while requests are being refused, one more of a's after
    b's ends is refused with ``tenant_share`` (it would hold 2 of 2), not admitted."""

    async def scenario() -> tuple[list[Message], list[Message], bool]:
        mw = shared_guard(wait_s="0", max_sessions=2)
        a1, b1 = Socket(mw, path="/terminal/a"), Socket(mw, path="/terminal/b")
        await a1.opened.wait()
        await b1.opened.wait()
        first = Socket(mw, path="/terminal/a")
        await first.task
        await b1.close()
        second = Socket(mw, path="/terminal/a")
        await second.task
        c1 = Socket(mw, path="/terminal/c")  # another tenant still fits
        await asyncio.wait_for(c1.opened.wait(), timeout=1)
        await a1.close()
        await c1.close()
        return first.sent, second.sent, c1.opened.is_set()

    first, second, other = asyncio.run(scenario())
    assert "reason=session_limit" in first[-1]["reason"]
    assert "reason=tenant_share" in second[-1]["reason"]
    assert other
