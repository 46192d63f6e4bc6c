"""The shared ledger under faults: a directory that goes away, a lock held elsewhere,
a failing ``current_sessions``; through the middleware, as a server would drive it."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from ledgerkit import write_v2_tree
from prometheus_client import CollectorRegistry

from asgi_admission import AdmissionConfig, AdmissionMiddleware, PriorityClass
from asgi_admission._admission.ledger import shared_ledger
from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME, SharedLedger, read_entries
from asgi_admission._admission.reservations import shared_files

#: Internal on purpose: the shared ledger's file and timings, faulted on purpose.
INTERNAL = "the shared ledger's file and timings, faulted on purpose"

App = Callable[[Any, Any, Any], Any]


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "ledger"
    yield path
    if path.is_file():
        path.unlink()


def guard(
    tmp_path: Path, ledger_dir: Path, app: App, *, max_sessions: int = 10, **options: Any
) -> AdmissionMiddleware:
    cgroup = write_v2_tree(tmp_path / f"cgroup{time.monotonic_ns()}", used_mb=100, limit_mb=4096)
    # The fixture's memory never moves, so a session would stay pending until the pending
    # timeout (docs/reservations.md): a timeout of ~0 settles each one at its response.
    config = AdmissionConfig(
        shared_dir=str(ledger_dir),
        cgroup_root=str(cgroup),
        max_sessions=max_sessions,
        pending_timeout_s=1e-9,
    )
    options.setdefault("registry", None)
    return AdmissionMiddleware(app, session_routes=["POST /s"], config=config, **options)


async def ok_app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def post(app: App, path: str = "/s") -> tuple[int, dict[bytes, bytes], bytes]:
    """One HTTP request through ``app``: its status, headers and body."""
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [],
        "query_string": b"",
        "asgi": {"version": "3.0"},
    }

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


def replace_with_a_file(directory: Path) -> None:
    shutil.rmtree(directory)
    directory.write_text("not a directory")


def restore(directory: Path) -> None:
    directory.unlink()
    directory.mkdir(mode=0o700)


def test_release_survives_the_directory_replaced_by_a_file(
    tmp_path: Path,
    ledger_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the ledger directory deleted and a file at its path while sessions are in
    flight, their releases raise nothing and are not lost: once the directory is back,
    sessions are admitted again and the ledger counts none."""
    monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 0.0)
    proceed = asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await proceed.wait()
        await ok_app(scope, receive, send)

    middleware = guard(tmp_path, ledger_dir, slow_app, max_sessions=3)

    async def scenario() -> list[int]:
        in_flight = [asyncio.ensure_future(post(middleware)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert middleware.session_counts() == (0, 3)
        replace_with_a_file(ledger_dir)
        proceed.set()
        statuses = [status for status, _, _ in await asyncio.gather(*in_flight)]
        restore(ledger_dir)
        statuses.append((await post(middleware))[0])
        return statuses

    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        statuses = asyncio.run(scenario())
    assert statuses == [200, 200, 200, 200]
    assert middleware.session_counts() == (0, 0)
    assert [(e.pending, e.active) for e in read_entries(ledger_dir)] == [(0, 0)]
    assert caplog.text.count("cannot be used") == 1  # logged once, not per release


def test_decisions_refuse_while_the_directory_is_a_file(
    tmp_path: Path, ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the ledger cannot be opened, session requests get 503 ledger_busy with a
    Retry-After, not a 500, counted under that reason; requests that open no session
    pass."""
    monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 0.0)
    registry = CollectorRegistry()
    middleware = guard(tmp_path, ledger_dir, ok_app, registry=registry)
    replace_with_a_file(ledger_dir)
    status, headers, body = asyncio.run(post(middleware))
    assert status == 503
    assert int(headers[b"retry-after"]) >= 1
    assert b'"reason":"ledger_busy"' in body
    assert asyncio.run(post(middleware, "/other"))[0] == 200
    labels = {"kind": "http", "outcome": "rejected", "reason": "ledger_busy"}
    assert registry.get_sample_value("asgi_admission_decisions_total", labels) == 1


def test_a_ledger_busy_refusal_is_counted_under_its_requests_class(
    tmp_path: Path, ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With priority classes, a ``ledger_busy`` refusal counts under the class of the
    request it refused, as every other decision does."""
    monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 0.0)
    registry = CollectorRegistry()
    cgroup = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=4096)
    config = AdmissionConfig(
        shared_dir=str(ledger_dir),
        cgroup_root=str(cgroup),
        max_sessions=10,
        pending_timeout_s=1e-9,
        priority_classes=(
            PriorityClass(name="critical", high_watermark_percent=90.0),
            PriorityClass(name="batch", high_watermark_percent=80.0),
        ),
    )
    middleware = AdmissionMiddleware(
        ok_app, session_routes={"POST /s": "critical"}, config=config, registry=registry
    )
    replace_with_a_file(ledger_dir)
    assert asyncio.run(post(middleware))[0] == 503
    labels = {"class": "critical", "outcome": "rejected", "reason": "ledger_busy"}
    assert registry.get_sample_value("asgi_admission_class_decisions_total", labels) == 1


def test_app_count_is_asked_outside_the_critical_section(tmp_path: Path, ledger_dir: Path) -> None:
    """current_sessions() runs while the ledger's cross-process lock is free, so a slow
    app counter never holds up the other workers."""
    held: list[bool] = []

    def current_sessions() -> int:
        fd = os.open(ledger_dir / FILE_NAME, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(True)
        else:
            held.append(False)
        finally:
            os.close(fd)
        return 0

    middleware = guard(tmp_path, ledger_dir, ok_app, current_sessions=current_sessions)
    assert asyncio.run(post(middleware))[0] == 200
    assert held
    assert not any(held)


def test_a_lock_held_elsewhere_never_stalls_the_event_loop(
    tmp_path: Path, ledger_dir: Path
) -> None:
    """While another worker holds the ledger lock for seconds, a session request gets 503
    ledger_busy within the bounded wait and the event loop keeps running meanwhile."""
    middleware = guard(tmp_path, ledger_dir, ok_app)
    fd = os.open(ledger_dir / FILE_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another open file description: another worker
    timer = threading.Timer(4.0, os.close, (fd,))
    timer.start()

    async def scenario() -> tuple[tuple[int, dict[bytes, bytes], bytes], float, float]:
        worst = 0.0
        done = False

        async def ticker() -> None:
            nonlocal worst
            last = time.monotonic()
            while not done:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                worst = max(worst, now - last)
                last = now

        ticking = asyncio.ensure_future(ticker())
        started = time.monotonic()
        result = await post(middleware)
        took = time.monotonic() - started
        done = True
        await ticking
        return result, took, worst

    try:
        (status, headers, body), took, worst = asyncio.run(scenario())
    finally:
        timer.cancel()
        timer.function(*timer.args)
    assert status == 503
    assert b'"reason":"ledger_busy"' in body
    assert int(headers[b"retry-after"]) >= 1
    assert took < 3.0  # refused within the bounded wait, not after the 4 s hold
    assert worst < 0.5  # the loop kept turning (a blocking flock stalls it for seconds)
    assert asyncio.run(post(middleware))[0] == 200  # lock free again: admitted


def test_failing_app_count_falls_back_to_the_ledgers_own(tmp_path: Path, ledger_dir: Path) -> None:
    """When current_sessions() starts failing, the worker stops publishing its last
    reported count and counts what it admitted itself, as the in-process ledger does."""
    reported: list[int | None] = [7]

    def current_sessions() -> int:
        value = reported[0]
        if value is None:
            raise RuntimeError("the app's counter broke")
        return value

    first = guard(tmp_path, ledger_dir, ok_app, current_sessions=current_sessions)
    second = guard(tmp_path, ledger_dir, ok_app)
    assert asyncio.run(post(first))[0] == 200
    # 7 reported, plus the session just admitted until first publishes again.
    assert second.session_counts() == (8, 0)
    reported[0] = None
    assert asyncio.run(post(first))[0] == 200
    assert first.session_counts() == (0, 0)
    assert second.session_counts() == (0, 0)


def test_a_session_the_app_now_counts_stays_counted_for_the_other_workers(
    tmp_path: Path, ledger_dir: Path
) -> None:
    """When a session request's response is sent, its pending reservation becomes one of
    the app's reported sessions in the shared ledger: another worker never sees the
    container-wide count dip below the sessions that exist (which over-admitted)."""
    store: list[str] = []

    async def opening_app(scope: Any, receive: Any, send: Any) -> None:
        store.append("session")
        await ok_app(scope, receive, send)

    first = guard(tmp_path, ledger_dir, opening_app, current_sessions=lambda: len(store))
    second = guard(tmp_path, ledger_dir, ok_app, max_sessions=2)
    assert asyncio.run(post(first))[0] == 200
    assert second.session_counts() == (1, 0)
    assert asyncio.run(post(second))[0] == 200  # 1 + 1 of 2
    store.clear()  # the session ends in the app; published at first's next decision
    assert first.session_counts() == (0, 0)
    assert second.session_counts() == (0, 0)


def garble(directory: Path) -> None:
    path = directory / FILE_NAME
    path.write_bytes(os.urandom(path.stat().st_size))


def test_the_heartbeat_restores_a_garbled_file_without_a_decision(
    tmp_path: Path, ledger_dir: Path
) -> None:
    """After the ledger file is filled with garbage, each worker's heartbeat rebuilds it
    and writes its sessions back within a few heartbeats, with no decision in between,
    so the workers are missing from each other's counts only that long."""
    proceed = asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await proceed.wait()
        await ok_app(scope, receive, send)

    first = guard(tmp_path, ledger_dir, slow_app)
    second = guard(tmp_path, ledger_dir, slow_app)

    async def scenario() -> list[tuple[int, int]]:
        held = [asyncio.ensure_future(post(first)), asyncio.ensure_future(post(second))]
        await asyncio.sleep(0.1)
        garble(ledger_dir)
        await asyncio.sleep(4 * shared_ledger.HEARTBEAT_S)
        rows = [(e.pending, e.active) for e in read_entries(ledger_dir)]
        proceed.set()
        await asyncio.gather(*held)
        return rows

    assert sorted(asyncio.run(scenario())) == [(1, 0), (1, 0)]


def test_after_a_rebuild_decisions_wait_for_the_others_to_re_register(
    tmp_path: Path, ledger_dir: Path
) -> None:
    """A worker that finds the ledger file garbled rebuilds it and then waits (two
    heartbeats, with awaits) before admitting, so it counts the other workers' sessions
    again instead of admitting past max_sessions on a file that had lost them."""
    proceed = asyncio.Event()

    async def slow_app(scope: Any, receive: Any, send: Any) -> None:
        await proceed.wait()
        await ok_app(scope, receive, send)

    first = guard(tmp_path, ledger_dir, slow_app, max_sessions=2)
    second = guard(tmp_path, ledger_dir, slow_app, max_sessions=2)

    async def scenario() -> int:
        held = [asyncio.ensure_future(post(first)), asyncio.ensure_future(post(second))]
        await asyncio.sleep(0.05)
        garble(ledger_dir)
        third = asyncio.ensure_future(post(first))  # decided right after the garbage
        await asyncio.wait([third], timeout=3)
        proceed.set()  # an admitted third (the bug) would wait for this
        await asyncio.gather(*held, third)
        return third.result()[0]

    assert asyncio.run(scenario()) == 503


def test_readiness_says_ledger_busy_while_the_ledger_is_unusable(
    tmp_path: Path, ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readiness path answers 503 with state ledger_busy while the shared ledger
    cannot be opened, and ready again once it can."""
    monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 0.0)
    middleware = guard(tmp_path, ledger_dir, ok_app, readiness_path="/ready")
    assert asyncio.run(post(middleware, "/ready"))[0] == 200
    replace_with_a_file(ledger_dir)
    status, _, body = asyncio.run(post(middleware, "/ready"))
    assert (status, body) == (503, b'{"ready":false,"state":"ledger_busy"}')
    restore(ledger_dir)
    assert asyncio.run(post(middleware, "/ready"))[:3:2] == (
        200,
        b'{"ready":true,"state":"normal"}',
    )


def test_a_worker_left_in_a_deleted_file_does_not_take_the_movers_for_dead(
    ledger_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker still reading a deleted ledger file, whose link check is not yet due,
    sees the slot locks of workers that moved on as free: it follows them to the new
    file instead of releasing their sessions as a dead worker's (an under-count)."""
    first, second = SharedLedger(ledger_dir), SharedLedger(ledger_dir)
    try:
        for ledger in (first, second):
            with ledger.locked():
                ledger.reserve()
        (ledger_dir / FILE_NAME).unlink()
        first._next_link_check = 0.0  # first's check is due: it moves now
        with first.locked():
            assert first.counts() == (0, 1)
        with pytest.raises(LedgerBusy, match="was replaced"), second.locked():
            second.counts()
        with second.locked():
            assert second.counts() == (0, 2)
        assert "exited holding" not in caplog.text
    finally:
        first.close()
        second.close()


def test_the_ledger_says_whether_it_counts_in_the_file_at_its_path(
    ledger_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """is_current (what the settling queue asks before it follows a deleted file): true
    in the file at the path, false once that was deleted, true again after the move."""
    monkeypatch.setattr(shared_ledger, "LINK_CHECK_INTERVAL_S", 0.0)
    ledger = SharedLedger(str(ledger_dir))
    with ledger.locked():
        ledger.counts()
        assert ledger.is_current()
    shutil.rmtree(ledger_dir)
    assert not ledger.is_current()
    with ledger.locked():  # the next critical section moves to the file made again
        assert ledger.is_current()
    ledger.close()


def test_the_guards_settling_queue_asks_its_own_ledger(tmp_path: Path, ledger_dir: Path) -> None:
    """With a shared directory, the settling queue follows a deleted file only when the
    guard's own ledger has moved (it is handed that ledger's is_current)."""
    middleware = guard(tmp_path, ledger_dir, ok_app)
    queue = middleware.reservations._queue
    assert isinstance(queue, shared_files.SharedSettleQueue)
    assert queue._may_follow == middleware.service.ledger.is_current  # type: ignore[attr-defined]
