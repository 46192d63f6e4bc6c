"""Stuck pressure through the middleware on a settable reading: the watch, the liveness
path, the gauges and the log lines, with the app's lifespan and without one."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx
import pytest
from mwkit import SettableReader, TestClient, environment, guard
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionConfig, AdmissionMiddleware
from kits.pollkit import wait_for
from kits.suitekit import MIB

AFTER_S = 0.4
LIVE = "/admission/alive"


def app() -> Starlette:
    async def open_session(request: Request) -> Response:
        return JSONResponse({"id": 1}, status_code=201)

    return Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])


def stuck_guard(reader: SettableReader, registry: CollectorRegistry) -> AdmissionMiddleware:
    with environment({"ADMISSION_STUCK_AFTER_SECONDS": str(AFTER_S)}):
        return guard(app(), reader, liveness_path=LIVE, registry=registry)


def test_a_latch_held_with_no_session_is_stuck_then_clears_by_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """900 of 1000 MiB, no session: liveness fails after AFTER_S, the gauges say so, one
    WARNING; memory falls and, with no request for a session, all of it clears."""
    reader = SettableReader(used_mb=900)
    registry = CollectorRegistry()
    guarded = stuck_guard(reader, registry)
    with caplog.at_level(logging.INFO, logger="asgi_admission"), TestClient(guarded) as client:
        assert client.get(LIVE).status_code == 200
        assert client.post("/sessions").status_code == 503  # sets the latch
        started = time.monotonic()
        wait_for(lambda: client.get(LIVE).status_code == 503, 5, "stuck")
        took = time.monotonic() - started
        # Stuck at AFTER_S (checked every tenth of it), failing within half more.
        assert AFTER_S * 0.9 <= took <= AFTER_S * 1.5 + 0.5, took
        assert client.get(LIVE).json()["stuck"] is True
        assert registry.get_sample_value("asgi_admission_pressure_stuck") == 1
        assert registry.get_sample_value("asgi_admission_unattributed_bytes") == 900 * MIB
        # The readiness path still answers as before: latched.
        reader.set_mb(500)
        wait_for(lambda: client.get(LIVE).status_code == 200, 5, "cleared")
        assert guarded.controller.pressure_state == "normal"
        assert registry.get_sample_value("asgi_admission_pressure_stuck") == 0
        assert client.post("/sessions").status_code == 201
    stuck = [r for r in caplog.records if "memory pressure is stuck" in r.getMessage()]
    assert len(stuck) == 1
    assert stuck[0].levelno == logging.WARNING
    assert "Working set 900.0 MiB of 1000.0 MiB" in stuck[0].getMessage()
    assert "900.0 MiB is the server's own" in stuck[0].getMessage()
    cleared = [r for r in caplog.records if "no longer stuck" in r.getMessage()]
    assert [r.levelno for r in cleared] == [logging.INFO]


def test_a_latch_open_sessions_could_clear_is_never_stuck() -> None:
    """Three sessions open (the app's count), 85 % with reserves of 100 MiB: their end would
    clear the latch, so after several times AFTER_S liveness still passes and the gauge is 0."""
    reader = SettableReader(used_mb=850)
    registry = CollectorRegistry()
    with environment({"ADMISSION_STUCK_AFTER_SECONDS": str(AFTER_S)}):
        guarded = guard(
            app(),
            reader,
            liveness_path=LIVE,
            registry=registry,
            reserve_mb=100,
            current_sessions=lambda: 3,
        )
    with TestClient(guarded) as client:
        assert client.post("/sessions").status_code == 503
        assert guarded.session_counts() == (3, 0)
        time.sleep(AFTER_S * 4)
        assert client.get(LIVE).status_code == 200
        assert registry.get_sample_value("asgi_admission_pressure_stuck") == 0
        assert registry.get_sample_value("asgi_admission_unattributed_bytes") == 550 * MIB


def test_without_a_lifespan_the_liveness_path_takes_the_checks() -> None:
    """No lifespan (so no watch task): the liveness requests check for themselves."""
    reader = SettableReader(used_mb=900)
    guarded = stuck_guard(reader, CollectorRegistry())
    transport = httpx.ASGITransport(app=guarded)

    async def run() -> list[int]:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.post("/sessions")).status_code == 503
            statuses = []
            for _ in range(int(AFTER_S * 2 / 0.05)):
                statuses.append((await client.get(LIVE)).status_code)
                await asyncio.sleep(0.05)
            reader.set_mb(500)
            statuses.append((await client.get(LIVE)).status_code)
            return statuses

    statuses = asyncio.run(run())
    assert statuses[0] == 200
    assert 503 in statuses
    assert statuses[-1] == 200
    assert guarded.stuck.running == 0


def test_the_liveness_path_comes_from_the_config_and_must_start_with_a_slash() -> None:
    """ADMISSION_LIVENESS_PATH names the path; a keyword without '/' is an error naming it."""
    reader = SettableReader(used_mb=100)
    config = AdmissionConfig(liveness_path="/alive", probe_sessions=0)
    guarded = AdmissionMiddleware(
        app(), session_routes=["POST /sessions"], config=config, registry=None
    )
    with TestClient(guarded) as client:
        response = client.get("/alive")
    assert response.status_code == 200
    assert response.json() == {"alive": True}
    assert response.headers["cache-control"] == "no-store"
    with pytest.raises(ValueError, match="liveness_path must start with '/'"):
        guard(app(), reader, liveness_path="alive")


def test_one_path_cannot_be_both_readiness_and_liveness() -> None:
    """The same path for both (given, or from ADMISSION_LIVENESS_PATH) is an error naming both."""
    reader = SettableReader(used_mb=100)
    with pytest.raises(ValueError, match="liveness_path and readiness_path are both '/ready'"):
        guard(app(), reader, liveness_path="/ready", readiness_path="/ready")
    with (
        environment({"ADMISSION_LIVENESS_PATH": "/ready"}),
        pytest.raises(ValueError, match="ADMISSION_LIVENESS_PATH"),
    ):
        AdmissionMiddleware(
            app(), session_routes=["POST /sessions"], readiness_path="/ready", registry=None
        )
