"""Settling, learning and Retry-After from evidence in a guarded app (fake readings)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
from mwkit import SettableReader, TestClient, controller, environment
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionConfig, AdmissionController, AdmissionMiddleware
from kits.pollkit import wait_for
from kits.suitekit import MIB


def app() -> Starlette:
    async def ok(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/sessions", ok, methods=["POST"])])


def build(
    reader: SettableReader,
    *,
    reserve_mb: float = 10,
    learning: str = "off",
    shared_dir: str | None = None,
    registry: CollectorRegistry | None = None,
    **options: object,
) -> AdmissionMiddleware:
    """The guard over ``reader``; its reservation settings come from the environment."""
    settings = {"ADMISSION_SESSION_RESERVE_LEARNING": learning}
    if shared_dir is not None:
        settings["ADMISSION_SHARED_DIR"] = shared_dir
    with environment(settings):
        return AdmissionMiddleware(
            app(),
            session_routes=["POST /sessions"],
            controller=controller(reader, reserve_mb=reserve_mb),
            max_sessions=100,
            registry=registry,
            **options,  # type: ignore[arg-type]
        )


def test_the_lifespan_sample_settles_without_traffic() -> None:
    """After the response the reservation is pending; once memory shows, the sample settles it."""
    reader = SettableReader(used_mb=100)
    mw = build(reader)
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 200
        assert mw.session_counts() == (0, 1)
        reader.set_mb(110)
        wait_for(lambda: mw.session_counts() == (0, 0), 10, "the sample to settle it")


def test_without_lifespan_the_next_decision_settles() -> None:
    """With no lifespan (no sample), the next decision's own reading settles what shows."""
    reader = SettableReader(used_mb=100)
    mw = build(reader)
    client = TestClient(mw)  # not entered: no lifespan
    assert client.post("/sessions").status_code == 200
    assert mw.session_counts() == (0, 1)
    reader.set_mb(110)
    assert client.post("/sessions").status_code == 200
    assert mw.session_counts() == (0, 1)  # the first settled, the second is pending


def test_in_request_memory_settles_at_the_response() -> None:
    """Memory built inside the request is seen by the response's own reading."""
    reader = SettableReader(used_mb=100)

    async def build_in_request(request: Request) -> Response:
        reader.set_mb(reader.used / MIB + 10)
        return PlainTextResponse("ok")

    with environment({"ADMISSION_SESSION_RESERVE_LEARNING": "off"}):
        mw = AdmissionMiddleware(
            Starlette(routes=[Route("/sessions", build_in_request, methods=["POST"])]),
            session_routes=["POST /sessions"],
            controller=controller(reader, reserve_mb=10),
            registry=None,
        )
    client = TestClient(mw)
    for _ in range(3):
        assert client.post("/sessions").status_code == 200
        assert mw.session_counts() == (0, 0)


def test_learning_raises_the_reserve_and_shows_it() -> None:
    """A 50 MiB session against a 10 MiB reserve: learning raises the reserve to it,
    and the refusal details and metrics show what was learned."""
    reader = SettableReader(used_mb=100)
    registry = CollectorRegistry()
    mw = build(reader, learning="raise", registry=registry, expose_details=True)
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 200
        reader.set_mb(150)
        # The probe's growth raises the reserve at once; the footprint is learned once
        # its memory has stopped growing: 50 MiB, and what drift may have hidden over
        # its window (256 KiB a second).
        wait_for(lambda: mw.reservations.estimates(), 10, "a route learned")
        assert 50 * MIB <= mw.controller.reserve_for(reader.limit) <= 52 * MIB
        footprint = registry.get_sample_value(
            "asgi_admission_session_footprint_bytes", {"route": "POST /sessions"}
        )
        assert footprint == mw.controller.reserve_for(reader.limit)
        reader.set_mb(760)  # 800 MiB ceiling: one 50 MiB reserve no longer fits
        refused = client.post("/sessions")
        assert refused.status_code == 503
        body = refused.json()
        assert body["memory"]["reserve_bytes"] == mw.controller.reserve_for(reader.limit)
        [learned] = body["learned"]
        assert learned["route"] == "POST /sessions"
        assert learned["footprint_bytes"] == mw.controller.reserve_for(reader.limit)
        assert registry.get_sample_value("asgi_admission_admissible_sessions") == 0


def test_learning_off_keeps_the_configured_reserve() -> None:
    """With learning off the reserve stays as configured, however large sessions are."""
    reader = SettableReader(used_mb=100)
    mw = build(reader, learning="off")
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 200
        reader.set_mb(150)
        time.sleep(1.6)
        assert mw.controller.reserve_for(reader.limit) == 10 * MIB
        assert mw.reservations.estimates() == []


def test_retry_after_follows_the_rate_of_session_ends() -> None:
    """Refused for memory after sessions ended every ~20 s: Retry-After is about 20 s."""
    reader = SettableReader(used_mb=900)
    mw = build(reader)
    ends = mw.reservations.ends
    now = time.monotonic()
    for i, active in enumerate([5, 4, 3, 2]):
        ends.on_active(active, now - 60 + 20 * i)
    client = TestClient(mw)
    delays = {int(client.post("/sessions").headers["retry-after"]) for _ in range(20)}
    assert delays <= set(range(16, 25))
    assert len(delays) > 1  # jittered


def test_retry_after_without_evidence_is_the_configured_base() -> None:
    """With no session ends seen, a memory refusal uses the configured base (5 s +-20 %)."""
    reader = SettableReader(used_mb=900)
    client = TestClient(build(reader))
    delays = {int(client.post("/sessions").headers["retry-after"]) for _ in range(20)}
    assert delays <= {4, 5, 6}


def test_two_workers_share_the_settling_queue_and_what_they_learned(tmp_path: Path) -> None:
    """Over one shared directory, a session admitted by one guard is settled by the
    other's sample, and what one learned is in the file the other reads."""
    shared = str(tmp_path / "shared")
    reader = SettableReader(used_mb=100)
    first = build(reader, learning="raise", shared_dir=shared)
    second = build(reader, learning="raise", shared_dir=shared)
    client = TestClient(first)
    assert client.post("/sessions").status_code == 200
    assert second.session_counts() == (0, 1)
    reader.set_mb(160)
    second.reservations.sample()  # the other worker's sample takes it off the shared queue
    first.reservations.sample()  # and its owner notices
    assert second.session_counts() == (0, 0)
    deadline = time.monotonic() + 5
    while not first.reservations.estimates():
        assert time.monotonic() < deadline
        time.sleep(0.25)
        first.reservations.sample()
    learned = json.loads((Path(shared) / "asgi-admission.learned").read_text())
    assert "POST /sessions" in learned["routes"]
    second.reservations.sharing.refresh(time.monotonic(), urgent=True)
    assert second.reservations.estimates() == first.reservations.estimates()
    learned = first.controller.reserve_for(reader.limit)
    assert second.controller.reserve_for(reader.limit) == learned > 10 * MIB
    # A restarted worker starts from what the container learned.
    third = build(reader, learning="raise", shared_dir=shared)
    assert third.reservations.estimates() == first.reservations.estimates()


def test_the_watchdogs_peaks_teach_the_guard(tmp_path: Path) -> None:
    """A session process registered with its ticket's route: its peak RSS is learned."""
    from asgi_admission import SessionWatchdog

    reader = SettableReader(used_mb=100)
    watchdog = SessionWatchdog(config=AdmissionConfig(), memory_reader=reader, registry=None)
    mw = build(reader, learning="raise", watchdog=watchdog)
    with subprocess.Popen(
        [sys.executable, "-c", "b = bytearray(40 << 20); b[::4096] = b'x' * (40 << 8); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    ) as child:
        try:
            deadline = time.monotonic() + 10
            while psutil.Process(child.pid).memory_info().rss < 40 << 20:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            watched = watchdog.register(child.pid, route="POST /sessions")
            watchdog.sample_once()
            watched.unregister()
        finally:
            child.kill()
    [estimate] = mw.reservations.estimates()
    assert estimate.route == "POST /sessions"
    assert estimate.footprint_bytes >= 40 * MIB
    assert mw.controller.reserve_for(reader.limit) == estimate.footprint_bytes  # raised from 10 MiB


def test_with_no_reserve_set_what_was_learned_replaces_the_derived_guess() -> None:
    """No reserve configured: the eighth of the limit is a guess. Sessions of 40 MiB are
    learned, and the reserve becomes about 40 MiB, not the 125 MiB derived from the
    1000 MiB limit (``raise`` floors only a reserve that was configured)."""
    reader = SettableReader(used_mb=100, limit_mb=1000)
    with environment({"ADMISSION_SESSION_RESERVE_LEARNING": "raise"}):
        mw = AdmissionMiddleware(
            app(),
            session_routes=["POST /sessions"],
            controller=AdmissionController(
                high_watermark_percent=80,
                resume_threshold_percent=70,
                reserve_bytes=None,
                memory_reader=reader,
            ),
            registry=None,
        )
    assert mw.controller.reserve_for(reader.limit) == 125 * MIB
    with TestClient(mw) as client:
        assert client.post("/sessions").status_code == 200
        reader.set_mb(140)
        wait_for(lambda: mw.reservations.estimates(), 10, "a route learned")
    assert 40 * MIB <= mw.controller.reserve_for(reader.limit) <= 44 * MIB
