"""Property: whatever happens to each request, every reservation is released exactly once."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mwkit import AT_RESPONSE, controller, environment
from starlette.types import Message, Receive, Scope, Send

from asgi_admission import AdmissionMiddleware, MemoryReading
from kits.suitekit import MIB

HTTP_ACTIONS = (
    "complete",
    "stream",
    "raise_before",
    "raise_after",
    "disconnect",
    "send_fails",
    "cancel",
    "background",
)
WS_ACTIONS = (
    "accept_close",
    "accept_client_leaves",
    "never_accept",
    "deny",
    "accept_raise",
    "cancel_pending",
    "cancel_active",
    "leave_before_accept",
)

lifecycle = st.one_of(
    st.tuples(st.just("http"), st.sampled_from(HTTP_ACTIONS)),
    st.tuples(st.just("websocket"), st.sampled_from(WS_ACTIONS)),
)


class Boom(Exception):
    pass


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Plays out the action named in the scope, as a misbehaving app or client might."""
    action = scope["action"]
    if scope["type"] == "http":
        if action == "raise_before":
            raise Boom
        if action in ("disconnect", "cancel"):
            await receive()  # http.disconnect, or blocks until cancelled
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        if action == "raise_after":
            raise Boom
        if action == "stream":
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"b"})
        if action == "background":
            await asyncio.sleep(0)
        return
    await receive()  # websocket.connect
    if action == "never_accept":
        return
    if action == "deny":
        await send({"type": "websocket.http.response.start", "status": 403, "headers": []})
        await send({"type": "websocket.http.response.body", "body": b""})
        return
    if action in ("cancel_pending", "leave_before_accept"):
        await receive()  # blocks until cancelled / websocket.disconnect
        return
    await send({"type": "websocket.accept"})
    if action == "accept_raise":
        raise Boom
    if action in ("accept_client_leaves", "cancel_active"):
        await receive()
        return
    await send({"type": "websocket.close", "code": 1000})


def fake_io(kind: str, action: str) -> tuple[Receive, Send]:
    blocks = action.startswith("cancel")
    script: list[Message] = []
    if kind == "websocket":
        script.append({"type": "websocket.connect"})
        if not blocks:
            script.append({"type": "websocket.disconnect", "code": 1001})
    elif not blocks:
        script.append(
            {"type": "http.request", "body": b"", "more_body": False}
            if action != "disconnect"
            else {"type": "http.disconnect"}
        )
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> Message:
        if script:
            return script.pop(0)
        await never
        raise AssertionError  # pragma: no cover

    async def send(message: Message) -> None:
        if action == "send_fails":
            raise OSError("client went away")
        await asyncio.sleep(0)

    return receive, send


def make_guard(percents: list[int]) -> AdmissionMiddleware:
    readings = itertools.cycle(
        [
            MemoryReading(used_bytes=p * 10 * MIB, limit_bytes=1000 * MIB, available=p >= 0)
            for p in percents
        ]
    )
    with environment(AT_RESPONSE):
        return AdmissionMiddleware(
            app,
            session_routes=["POST /s", "WS /w"],
            controller=controller(lambda: next(readings), reserve_mb=20),
            max_sessions=30,
            registry=None,
        )


async def play(mw: AdmissionMiddleware, plan: list[tuple[str, str]]) -> None:
    tasks = []
    for kind, action in plan:
        scope: Scope = {"type": kind, "path": "/s" if kind == "http" else "/w", "action": action}
        if kind == "http":
            scope["method"] = "POST"
        receive, send = fake_io(kind, action)
        tasks.append((action, asyncio.create_task(mw(scope, receive, send))))
    for _ in range(5):
        await asyncio.sleep(0)
    for action, task in tasks:
        if action.startswith("cancel"):
            task.cancel()
    results = await asyncio.gather(*(task for _, task in tasks), return_exceptions=True)
    for (action, _), result in zip(tasks, results, strict=True):
        assert result is None or isinstance(result, (Boom, OSError, asyncio.CancelledError)), (
            action,
            result,
        )


#: A case hypothesis found: a WebSocket, then 30 in-request sessions, then another and 28
#: more, over readings that are lost half the time. A session of a route learned to
#: build its memory in the request waited for the reading at its response, which was
#: lost: it stayed pending though its pending timeout had passed.
LOST_READING_AT_RESPONSE: list[tuple[str, str]] = [
    ("websocket", "accept_close"),
    *[("http", "complete")] * 30,
    ("websocket", "accept_close"),
    *[("http", "complete")] * 28,
]


def test_a_session_whose_reading_at_its_response_is_lost_settles_by_time() -> None:
    """The case above leaves no reservation behind: a session waiting for the reading at
    its response settles by time where that reading is lost."""
    mw = make_guard([3, 0, -1, -1])
    asyncio.run(play(mw, LOST_READING_AT_RESPONSE))
    assert mw.session_counts() == (0, 0)


def test_ten_thousand_lifecycles_leave_no_reservation_behind() -> None:
    """After >= 10,000 random request lifecycles, pending and active counts are both zero."""
    total = [0]

    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        plan=st.lists(lifecycle, min_size=60, max_size=70),
        percents=st.lists(st.integers(min_value=-1, max_value=95), min_size=1, max_size=8),
    )
    def run(plan: list[tuple[str, str]], percents: list[int]) -> None:
        mw = make_guard(percents)
        asyncio.run(play(mw, plan))
        assert mw.session_counts() == (0, 0)
        total[0] += len(plan)

    run()
    assert total[0] >= 10_000
