"""A session request still arriving holds nothing: the body is read before the decision."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from mwkit import NOT_PROBING, SettableReader, controller, environment
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message

from asgi_admission import AdmissionMiddleware

Sent = list[Message]


def session_app(bodies: list[bytes]) -> Starlette:
    async def open_session(request: Request) -> Response:
        bodies.append(await request.body())
        return JSONResponse({"id": "1"}, status_code=201)

    return Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])


def guarded(
    app: Any, *, body_timeout: str = "0.2", buffer_kb: str = "64", pending: str = "120", **kw: Any
) -> AdmissionMiddleware:
    settings = {
        "ADMISSION_BODY_TIMEOUT_SECONDS": body_timeout,
        "ADMISSION_BODY_BUFFER_KB": buffer_kb,
        "ADMISSION_PENDING_TIMEOUT_SECONDS": pending,
        **NOT_PROBING,
    }
    with environment(settings):
        return AdmissionMiddleware(
            app,
            session_routes=["POST /sessions"],
            controller=controller(SettableReader(used_mb=300), reserve_mb=100),
            max_sessions=kw.pop("max_sessions", 2),
            retry_after=5,
            **{"registry": None, **kw},
        )


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "path": "/sessions",
        "raw_path": b"/sessions",
        "root_path": "",
        "scheme": "http",
        "query_string": b"",
        "headers": [(b"content-length", b"100000"), (b"host", b"t")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


def trickle(chunks: list[bytes], *, then_wait: bool = True) -> Any:
    """A receive that hands out ``chunks`` (more to come), then waits for ever."""
    pending = list(chunks)
    gone = asyncio.Event()

    async def receive() -> Message:
        if pending:
            await asyncio.sleep(0.01)
            return {"type": "http.request", "body": pending.pop(0), "more_body": True}
        if then_wait:
            await gone.wait()
        return {"type": "http.disconnect"}

    return receive


def whole(body: bytes, parts: int = 1) -> Any:
    """A receive that hands out ``body`` in ``parts`` messages, then waits for a disconnect."""
    size = max(1, len(body) // parts)
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    never = asyncio.Event()

    async def receive() -> Message:
        if pieces:
            piece = pieces.pop(0)
            return {"type": "http.request", "body": piece, "more_body": bool(pieces)}
        await never.wait()
        return {"type": "http.disconnect"}

    return receive


def collector(sent: Sent) -> Any:
    async def send(message: Message) -> None:
        sent.append(message)

    return send


def status(sent: Sent) -> int:
    return int(next(m["status"] for m in sent if m["type"] == "http.response.start"))


def test_a_body_that_never_arrives_gets_a_408_and_holds_nothing() -> None:
    """Headers and one byte, then nothing: a 408 after the bound, the app never called."""
    bodies: list[bytes] = []
    registry = CollectorRegistry()
    mw = guarded(session_app(bodies), registry=registry)

    async def run() -> tuple[Sent, list[tuple[int, int]], float]:
        sent: Sent = []
        seen: list[tuple[int, int]] = []
        start = time.monotonic()
        slow = asyncio.ensure_future(mw(scope(), trickle([b"x"]), collector(sent)))
        for _ in range(3):
            await asyncio.sleep(0.03)
            seen.append(mw.session_counts())
        await slow
        return sent, seen, time.monotonic() - start

    sent, seen, took = asyncio.run(run())
    assert status(sent) == 408
    assert (b"connection", b"close") in next(m for m in sent if m["type"] == "http.response.start")[
        "headers"
    ]
    problem = json.loads(sent[-1]["body"])
    assert problem["reason"] == "body_timeout"
    assert seen == [(0, 0)] * 3
    assert bodies == []
    assert 0.15 <= took < 2
    sample = registry.get_sample_value(
        "asgi_admission_session_requests_failed_total", {"kind": "http", "cause": "body_timeout"}
    )
    assert sample == 1


def test_slow_clients_leave_every_slot_to_normal_ones() -> None:
    """As many slow bodies as the cap allows, still arriving: normal clients are admitted."""
    bodies: list[bytes] = []
    mw = guarded(session_app(bodies), body_timeout="5", max_sessions=2)

    async def run() -> tuple[list[int], list[int]]:
        slow_sent: list[Sent] = [[], []]
        slow = [
            asyncio.ensure_future(mw(scope(), trickle([b"x"] * 3), collector(sent)))
            for sent in slow_sent
        ]
        await asyncio.sleep(0.05)
        normal_sent: list[Sent] = [[], []]
        for sent in normal_sent:
            await mw(scope(), whole(b'{"a": 1}'), collector(sent))
        for task in slow:
            task.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        return [status(sent) for sent in normal_sent], [len(sent) for sent in slow_sent]

    normal, slow = asyncio.run(run())
    assert normal == [201, 201]
    assert slow == [0, 0]
    assert bodies == [b'{"a": 1}'] * 2
    assert mw.session_counts() == (0, 2)


def test_the_app_reads_the_body_it_was_sent() -> None:
    """A body in several parts, read by the guard first, reaches the app whole and in order."""
    bodies: list[bytes] = []
    mw = guarded(session_app(bodies))
    payload = bytes(range(256)) * 40

    async def run() -> Sent:
        sent: Sent = []
        await mw(scope(), whole(payload, parts=7), collector(sent))
        return sent

    assert status(asyncio.run(run())) == 201
    assert bodies == [payload]


def test_a_client_that_leaves_while_sending_holds_nothing() -> None:
    """A disconnect before the body is complete: no answer, no app call, nothing counted."""
    bodies: list[bytes] = []
    mw = guarded(session_app(bodies))

    async def run() -> Sent:
        sent: Sent = []
        await mw(scope(), trickle([b"x", b"y"], then_wait=False), collector(sent))
        return sent

    assert asyncio.run(run()) == []
    assert bodies == []
    assert mw.session_counts() == (0, 0)


def test_a_body_beyond_the_buffer_gives_its_reservation_back_when_late() -> None:
    """Past the buffer the guard decides; if the rest is late the reservation goes back."""
    bodies: list[bytes] = []
    registry = CollectorRegistry()
    mw = guarded(session_app(bodies), buffer_kb="1", body_timeout="0.3", registry=registry)
    arrive = asyncio.Event()

    async def receive_factory() -> Any:
        parts = [b"a" * 1024, b"b" * 1024]

        async def receive() -> Message:
            if parts:
                return {"type": "http.request", "body": parts.pop(0), "more_body": True}
            await arrive.wait()
            return {"type": "http.request", "body": b"c", "more_body": False}

        return receive

    async def run() -> tuple[list[tuple[int, int]], Sent]:
        sent: Sent = []
        task = asyncio.ensure_future(mw(scope(), await receive_factory(), collector(sent)))
        seen = []
        await asyncio.sleep(0.1)
        seen.append(mw.session_counts())  # admitted on its first KiB, the rest still coming
        await asyncio.sleep(0.4)
        seen.append(mw.session_counts())  # past the bound: given back
        arrive.set()
        await task
        return seen, sent

    seen, sent = asyncio.run(run())
    assert seen == [(0, 1), (0, 0)]
    assert status(sent) == 201
    assert bodies == [b"a" * 1024 + b"b" * 1024 + b"c"]
    assert mw.session_counts() == (0, 0)
    sample = registry.get_sample_value(
        "asgi_admission_session_requests_failed_total", {"kind": "http", "cause": "body_timeout"}
    )
    assert sample == 1


def test_a_body_beyond_the_buffer_that_arrives_in_time_keeps_its_reservation() -> None:
    """A large body that completes within the bound settles as any other session."""
    bodies: list[bytes] = []
    mw = guarded(session_app(bodies), buffer_kb="1", body_timeout="0.3")

    async def run() -> Sent:
        sent: Sent = []
        await mw(scope(), whole(b"z" * 4096, parts=4), collector(sent))
        await asyncio.sleep(0.4)  # past the bound: nothing fires for a finished body
        return sent

    assert status(asyncio.run(run())) == 201
    assert bodies == [b"z" * 4096]
    assert mw.session_counts() == (0, 1)


def test_a_request_in_progress_holds_its_reservation_at_most_the_pending_timeout() -> None:
    """A handler that never answers: its reservation is given back after the pending timeout."""
    release = asyncio.Event()

    async def never_answers(request: Request) -> Response:
        await release.wait()
        return JSONResponse({}, status_code=201)

    app = Starlette(routes=[Route("/sessions", never_answers, methods=["POST"])])
    mw = guarded(app, pending="0.3", body_timeout="0.1", max_sessions=1)

    async def run() -> tuple[list[tuple[int, int]], int]:
        # The lifespan runs the guard's periodic sample, which ends what the timeout bounds.
        events: asyncio.Queue[Message] = asyncio.Queue()
        await events.put({"type": "lifespan.startup"})
        lifespan = asyncio.ensure_future(mw({"type": "lifespan"}, events.get, collector([])))
        stuck = asyncio.ensure_future(mw(scope(), whole(b"{}"), collector([])))
        seen = []
        await asyncio.sleep(0.1)
        seen.append(mw.session_counts())
        await asyncio.sleep(0.5)
        seen.append(mw.session_counts())
        sent: Sent = []
        second = asyncio.ensure_future(mw(scope(), whole(b"{}"), collector(sent)))
        await asyncio.sleep(0.05)
        seen.append(mw.session_counts())
        release.set()
        await asyncio.gather(stuck, second)
        await events.put({"type": "lifespan.shutdown"})
        await lifespan
        return seen, status(sent)

    seen, second_status = asyncio.run(run())
    # Held while young, given back past the timeout, and the slot is the next one's.
    assert seen == [(0, 1), (0, 0), (0, 1)]
    assert second_status == 201


@pytest.mark.parametrize(
    ("variable", "value"),
    [("ADMISSION_BODY_TIMEOUT_SECONDS", "0"), ("ADMISSION_BODY_TIMEOUT_SECONDS", "nan")],
)
def test_a_bad_body_timeout_falls_back_to_its_default(
    variable: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A body timeout that is not a positive number of seconds is the default, with a warning."""
    from asgi_admission import AdmissionConfig

    config = AdmissionConfig.from_env({variable: value})
    assert config.body_timeout_s == 10.0
    assert variable in caplog.text


def test_the_config_refuses_an_unusable_body_setting() -> None:
    """In code, a body timeout of 0 or a negative buffer is an error naming the setting."""
    from asgi_admission import AdmissionConfig

    with pytest.raises(ValueError, match="ADMISSION_BODY_TIMEOUT_SECONDS"):
        AdmissionConfig(body_timeout_s=0)
    with pytest.raises(ValueError, match="ADMISSION_BODY_BUFFER_KB"):
        AdmissionConfig(body_buffer_bytes=-1)


def test_a_cancellation_from_the_server_while_reading_goes_on() -> None:
    """Only the guard's own timer turns a cancellation into a 408: the server's propagates."""
    mw = guarded(session_app([]), body_timeout="5")

    async def run() -> Sent:
        sent: Sent = []
        task = asyncio.ensure_future(mw(scope(), trickle([b"x"]), collector(sent)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sent

    assert asyncio.run(run()) == []
    assert mw.session_counts() == (0, 0)


def test_many_slow_bodies_each_time_out_at_their_own_deadline() -> None:
    """One timer serves every read: bodies that start at different times each get a 408 about
    one bound after their own start, and a body completing in time is not cut short."""
    bodies: list[bytes] = []
    mw = guarded(session_app(bodies), body_timeout="0.3")

    async def timed(delay: float, receive: Any) -> tuple[int, float]:
        await asyncio.sleep(delay)
        sent: Sent = []
        start = time.monotonic()
        await mw(scope(), receive, collector(sent))
        return status(sent), time.monotonic() - start

    async def completes_late() -> Message:
        await asyncio.sleep(0.2)
        return {"type": "http.request", "body": b"done", "more_body": False}

    async def run() -> tuple[tuple[int, float], ...]:
        return await asyncio.gather(
            timed(0.0, trickle([b"x"])),
            timed(0.1, trickle([b"x"])),
            timed(0.2, completes_late),
        )

    (first, took1), (second, took2), (third, _took3) = asyncio.run(run())
    assert (first, second, third) == (408, 408, 201)
    assert 0.25 <= took1 < 0.6
    assert 0.25 <= took2 < 0.6
    assert bodies == [b"done"]
