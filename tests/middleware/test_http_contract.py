"""The HTTP contract through httpx's ASGITransport: admit, refuse, pass through."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from mwkit import SettableReader, controller, guard
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from asgi_admission import AdmissionController, AdmissionMiddleware, MemoryReading
from kits.suitekit import MIB

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_app() -> Starlette:
    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def boom(request: Request) -> Response:
        raise RuntimeError("boom")

    return Starlette(
        routes=[
            Route("/sessions", ok, methods=["POST"]),
            Route("/boom", boom, methods=["POST"]),
            Route("/health", ok),
            Route("/other", ok, methods=["POST"]),
        ]
    )


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),  # type: ignore[arg-type]
        base_url="http://test",
    )


async def test_admits_below_the_ceiling() -> None:
    """A session request with room to spare reaches the app and frees its slot after."""
    reader = SettableReader(used_mb=100)
    mw = guard(make_app(), reader)
    async with client(mw) as c:
        response = await c.post("/sessions")
    assert response.status_code == 200
    assert response.text == "ok"
    assert reader.calls == 1
    assert mw.session_counts() == (0, 0)


async def test_refusal_is_a_problem_document() -> None:
    """A refused session gets 503, integer Retry-After, no-store and RFC 9457 fields."""
    reader = SettableReader(used_mb=900)
    mw = guard(make_app(), reader)
    async with client(mw) as c:
        response = await c.post("/sessions")
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["cache-control"] == "no-store"
    retry_after = int(response.headers["retry-after"])
    assert 4 <= retry_after <= 6
    body = response.json()
    assert body["status"] == 503
    assert body["reason"] == "memory_pressure"
    assert body["type"] == "urn:asgi-admission:problem:memory_pressure"
    assert body["retry_after_s"] == retry_after
    assert body["title"]
    assert str(retry_after) in body["detail"]
    assert "memory" not in body
    assert int(response.headers["content-length"]) == len(response.content)


async def test_expose_details_adds_figures() -> None:
    """With expose_details the body carries the memory figures and the counts."""
    reader = SettableReader(used_mb=900)
    mw = guard(make_app(), reader, expose_details=True)
    async with client(mw) as c:
        body = (await c.post("/sessions")).json()
    assert body["memory"]["working_set_bytes"] == 900 * MIB
    assert body["memory"]["limit_bytes"] == 1000 * MIB
    assert body["memory"]["percent"] == 90.0
    assert body["memory"]["reserve_bytes"] == 10 * MIB
    assert body["sessions"] == {
        "active": 0,
        "pending": 0,
        "limit": 100,
        "limit_from": "max_sessions",
    }
    assert body["state"] == "pressured"


async def test_session_limit_refusal_reason() -> None:
    """At the count cap the refusal says session_limit."""
    mw = guard(make_app(), SettableReader(), max_sessions=0)
    async with client(mw) as c:
        response = await c.post("/sessions")
    assert response.status_code == 503
    assert response.json()["reason"] == "session_limit"


async def test_blind_refusal_reason() -> None:
    """Without telemetry the count cap applies and the reason says so."""
    reader = SettableReader()
    reader.available = False
    mw = guard(make_app(), reader, max_sessions=0)
    async with client(mw) as c:
        response = await c.post("/sessions")
    assert response.json()["reason"] == "telemetry_unavailable"


async def test_unlimited_refusal_has_its_own_reason_and_words() -> None:
    """With a readable but unlimited cgroup the cap's refusal says no_memory_limit, plainly."""
    reader = SettableReader()
    reader.limit = None
    mw = guard(make_app(), reader, max_sessions=0)
    async with client(mw) as c:
        response = await c.post("/sessions")
    body = response.json()
    assert (response.status_code, body["reason"]) == (503, "no_memory_limit")
    assert body["type"].endswith(":no_memory_limit")
    assert body["detail"].startswith("The service has no memory limit to measure against")
    assert "unavailable" not in body["detail"]


async def test_reserve_that_can_never_fit_is_logged_once_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A reserve at or above the ceiling of the limit found: one ERROR naming the variable."""
    reader = SettableReader(used_mb=34, limit_mb=512)
    mw = guard(make_app(), reader, reserve_mb=768)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        async with client(mw) as c:
            for _ in range(3):
                assert (await c.post("/sessions")).status_code == 503
            reader.available = False
            await c.post("/sessions")
            reader.available = True
            assert (await c.post("/sessions")).status_code == 503
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert (
        errors[0]
        .getMessage()
        .startswith(
            "asgi-admission: ADMISSION_SESSION_RESERVE_MB (reserve_bytes) is 768 MiB, at or above "
            "the admission ceiling of the memory limit 512.0 MiB (80% high watermark = 409.6 MiB)"
        )
    )
    assert "unset it to derive the reserve from the limit (64 MiB here)" in errors[0].getMessage()


async def test_derived_reserve_that_can_never_fit_names_the_high_watermark(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the reserve derived, a high watermark too low for it is the setting named."""
    reader = SettableReader(used_mb=1, limit_mb=512)
    mw = AdmissionMiddleware(
        make_app(),
        session_routes=["POST /sessions"],
        controller=AdmissionController(
            high_watermark_percent=10, resume_threshold_percent=5, memory_reader=reader
        ),
    )
    with caplog.at_level(logging.ERROR, logger="asgi_admission"):
        async with client(mw) as c:
            assert (await c.post("/sessions")).status_code == 503
    (error,) = caplog.records
    assert error.getMessage().startswith(
        "asgi-admission: ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT (high_watermark_percent) is 10%"
    )


async def test_fitting_reserve_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    """Ordinary memory pressure with a reserve that fits is a warning, never the sizing error."""
    reader = SettableReader(used_mb=900, limit_mb=1000)
    mw = guard(make_app(), reader)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        async with client(mw) as c:
            assert (await c.post("/sessions")).status_code == 503
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


async def test_non_session_requests_pass_without_reading() -> None:
    """Health checks and other routes reach the app even under pressure, with no reading."""
    reader = SettableReader(used_mb=990)
    mw = guard(make_app(), reader)
    async with client(mw) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.post("/other")).status_code == 200
        assert (await c.get("/sessions")).status_code == 405
    assert reader.calls == 0


async def test_app_exception_releases() -> None:
    """A session handler that raises still gives its reservation back."""
    mw = guard(make_app(), SettableReader(), routes=["POST /boom"])
    async with client(mw) as c:
        with pytest.raises(RuntimeError, match="boom"):
            await c.post("/boom")
    assert mw.session_counts() == (0, 0)


async def test_current_sessions_callable_counts() -> None:
    """Sessions the app reports through current_sessions count against max_sessions."""
    live = [0]
    mw = guard(make_app(), SettableReader(), max_sessions=2, current_sessions=lambda: live[0])
    async with client(mw) as c:
        assert (await c.post("/sessions")).status_code == 200
        live[0] = 2
        assert (await c.post("/sessions")).status_code == 503
    assert mw.session_counts() == (2, 0)


async def test_failing_current_sessions_falls_back_to_the_guards_own_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A current_sessions that raises or returns no whole number does not fail the request:
    the guard counts its own sessions, logs the failure once and the recovery once."""
    answers: list[object] = [RuntimeError("db down"), "3", 1]

    def count() -> int:
        answer = answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    mw = guard(make_app(), SettableReader(), max_sessions=2, current_sessions=count)
    with caplog.at_level(logging.INFO, logger="asgi_admission"):
        async with client(mw) as c:
            assert (await c.post("/sessions")).status_code == 200
            answers.pop(0)
            assert (await c.post("/sessions")).status_code == 200
            assert mw.session_counts() == (0, 0)
            answers.pop(0)
            assert mw.session_counts() == (1, 0)
    failures = [r for r in caplog.records if "current_sessions() failed" in r.getMessage()]
    assert len(failures) == 1
    assert "answers again" in caplog.text


async def test_pending_until_streaming_response_finishes() -> None:
    """A streamed session response stays pending until its last chunk, not its first."""
    seen: list[tuple[int, int]] = []
    holder: list[AdmissionMiddleware] = []

    async def chunks() -> AsyncIterator[bytes]:
        yield b"a"
        seen.append(holder[0].session_counts())
        yield b"b"

    def after() -> None:
        seen.append(holder[0].session_counts())

    async def stream(request: Request) -> Response:
        return StreamingResponse(chunks(), background=BackgroundTask(after))

    app = Starlette(routes=[Route("/sessions", stream, methods=["POST"])])
    mw = guard(app, SettableReader())
    holder.append(mw)
    async with client(mw) as c:
        assert (await c.post("/sessions")).content == b"ab"
    assert seen == [(0, 1), (0, 0)]


async def test_predicate_selects_sessions() -> None:
    """A session_predicate alone guards the requests it picks."""
    reader = SettableReader(used_mb=900)
    mw = AdmissionMiddleware(
        make_app(),
        session_predicate=lambda scope: scope["path"] == "/other",
        controller=controller(reader),
    )
    async with client(mw) as c:
        assert (await c.post("/other")).status_code == 503
        assert (await c.post("/sessions")).status_code == 200


async def test_readiness_follows_the_latch() -> None:
    """The readiness path answers 200 while admitting and 503 once latched, until resume."""
    reader = SettableReader(used_mb=100)
    mw = guard(make_app(), reader, readiness_path="/admission/ready")
    async with client(mw) as c:
        ready = await c.get("/admission/ready")
        assert (ready.status_code, ready.json()) == (200, {"ready": True, "state": "normal"})
        assert ready.headers["cache-control"] == "no-store"
        reader.set_mb(850)
        assert (await c.get("/admission/ready")).status_code == 503
        reader.set_mb(750)  # below high, above resume: still latched
        assert (await c.get("/admission/ready")).json() == {"ready": False, "state": "pressured"}
        head = await c.head("/admission/ready")
        assert (head.status_code, head.content) == (503, b"")
        reader.set_mb(600)
        assert (await c.get("/admission/ready")).status_code == 200
        assert (await c.get("/health")).status_code == 200
    assert mw.session_counts() == (0, 0)


async def test_transitions_and_telemetry_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Latch set/clear and telemetry loss/recovery are each logged once with the figures."""
    reader = SettableReader(used_mb=100)
    mw = guard(make_app(), reader)
    with caplog.at_level(logging.INFO, logger="asgi_admission"):
        async with client(mw) as c:
            for used in (100, 850, 860, 870, 600, 610):
                reader.set_mb(used)
                await c.post("/sessions")
            reader.available = False
            await c.post("/sessions")
            await c.post("/sessions")
            reader.available = True
            await c.post("/sessions")
            await c.post("/sessions")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 4, messages
    assert "memory pressure: refusing" in messages[0]
    assert "850.0 MiB of 1000.0 MiB (85.00%" in messages[0]
    assert "pressure cleared" in messages[1]
    assert "60.00%" in messages[1]
    assert "telemetry lost" in messages[2]
    assert "telemetry recovered" in messages[3]


async def test_unlimited_memory_is_logged_as_no_limit(caplog: pytest.LogCaptureFixture) -> None:
    """A readable cgroup without a limit is reported as such, not as lost telemetry."""
    reader = SettableReader(used_mb=100)
    reader.limit = None
    mw = guard(make_app(), reader)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        async with client(mw) as c:
            assert (await c.post("/sessions")).status_code == 200
    assert "has no memory limit (working set 100.0 MiB)" in caplog.text
    assert "telemetry lost" not in caplog.text


async def test_reader_that_raises_counts_as_blind(caplog: pytest.LogCaptureFixture) -> None:
    """A custom reader that raises makes the guard fall back to the count cap, not fail."""

    def broken() -> MemoryReading:
        raise OSError("gone")

    mw = guard(make_app(), broken, max_sessions=1)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        async with client(mw) as c:
            assert (await c.post("/sessions")).status_code == 200
    assert "telemetry lost" in caplog.text


async def test_observer_sees_every_session_decision() -> None:
    """The observer is told of each session decision with its kind and a duration,
    and of each readiness check apart from them."""
    seen: list[tuple[str, bool, float]] = []
    checks: list[str] = []

    class Recorder:
        def on_decision(self, kind, decision, seconds):  # type: ignore[no-untyped-def]
            seen.append((kind, decision.allowed, seconds))

        def on_check(self, decision):  # type: ignore[no-untyped-def]
            checks.append(decision.state)

    reader = SettableReader(used_mb=100)
    mw = guard(make_app(), reader, observer=Recorder(), readiness_path="/ready")
    async with client(mw) as c:
        await c.post("/sessions")
        await c.get("/ready")
        await c.get("/health")
        reader.set_mb(900)
        await c.post("/sessions")
    assert [(k, a) for k, a, _ in seen] == [("http", True), ("http", False)]
    assert checks == ["normal"]
    assert all(0 <= s < 1 for _, _, s in seen)


async def test_fastapi_add_middleware() -> None:
    """Through FastAPI's add_middleware the guard refuses sessions and passes the rest."""
    app = FastAPI()

    @app.post("/sessions")
    async def open_session() -> dict[str, str]:
        return {"id": "1"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    reader = SettableReader(used_mb=900)
    app.add_middleware(
        AdmissionMiddleware,
        session_routes=["POST /sessions"],
        controller=controller(reader),
    )
    async with client(app) as c:
        refused = await c.post("/sessions")
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert (await c.get("/health")).json() == {"status": "ok"}
        reader.set_mb(100)
        assert (await c.post("/sessions")).json() == {"id": "1"}


async def test_starlette_middleware_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through Starlette's Middleware(...) with config from the environment, it guards."""
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "0")
    monkeypatch.setenv("ADMISSION_RETRY_AFTER_SECONDS", "9")
    reader = SettableReader()
    app = Starlette(
        routes=make_app().routes,
        middleware=[
            Middleware(
                AdmissionMiddleware,
                session_routes=["POST /sessions"],
                controller=controller(reader),
                retry_after=9,
            )
        ],
    )
    async with client(app) as c:
        response = await c.post("/sessions")
    assert response.status_code == 503
    assert 7 <= int(response.headers["retry-after"]) <= 11
    assert json.loads(response.content)["reason"] == "session_limit"
