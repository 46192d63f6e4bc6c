"""The watchdog runs exactly as long as the app: TestClient, a real uvicorn, raw lifespans."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from watchdog_app import build_app
from watchdogkit import TestClient

from asgi_admission import AdmissionConfig, AdmissionMiddleware, SessionWatchdog
from kits.processkit import free_port
from kits.suitekit import MIB

#: Internal on purpose: the watchdog's sampling task, seen done once the lifespan ends.
INTERNAL = "the watchdog's sampling task"

HERE = Path(__file__).parent


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """True once ``pid`` has exited (a zombie awaiting a reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def _until(fetch: Any, predicate: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if predicate(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_testclient_lifespan_starts_and_stops_the_watchdog() -> None:
    """Inside `with TestClient(app)` the watchdog runs and halts; after it, nothing is left."""
    app = build_app()
    watchdog: SessionWatchdog = app.state.watchdog
    assert not watchdog.running
    with TestClient(app) as client:
        assert client.get("/watchdog").json() == {"running": True, "same": True}
        task = watchdog._task
        assert task is not None
        over = client.post("/sessions", params={"hold_mb": 16, "budget_mb": 48}).json()["pid"]
        calm = client.post("/sessions", params={"hold_mb": 16}).json()["pid"]
        client.post(f"/sessions/{over}/grow", params={"mb": 64})
        seen = _until(
            lambda: client.get(f"/sessions/{over}").json(),
            lambda body: body["returncode"] is not None,
        )
        assert seen["halt"] == "budget_exceeded"
        assert seen["returncode"] == -signal.SIGTERM
        assert seen["peak_rss_bytes"] > 48 * MIB
        assert client.get(f"/sessions/{calm}").json()["halt"] is None
    assert not watchdog.running
    assert task.done()
    assert _gone(calm)
    assert not watchdog.sessions


def test_handlers_without_a_watchdog_get_a_clear_error() -> None:
    """Without lifespan the helper raises LookupError rather than returning None."""
    app = build_app()
    client = TestClient(app, raise_server_exceptions=True)  # no `with`: no lifespan
    with pytest.raises(LookupError, match="No session watchdog"):
        client.get("/watchdog")
    assert not app.state.watchdog.running


@pytest.mark.real_server
def test_real_uvicorn_runs_and_stops_the_watchdog(tmp_path: Path) -> None:
    """Under uvicorn the watchdog halts an over-budget child; SIGTERM leaves no task or process."""
    port = free_port()
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "watchdog_app:app",
                "--app-dir",
                str(HERE),
                "--port",
                str(port),
                "--lifespan",
                "on",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # The app's kit takes the suite's constants from tests/ (kits.suitekit).
            env={**os.environ, "PYTHONASYNCIODEBUG": "1", "PYTHONPATH": str(HERE.parent)},
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: _health(base), bool, timeout=30)
        assert httpx.get(base + "/watchdog").json() == {"running": True, "same": True}
        over = httpx.post(base + "/sessions", params={"hold_mb": 16, "budget_mb": 48})
        calm = httpx.post(base + "/sessions", params={"hold_mb": 16})
        over_pid, calm_pid = over.json()["pid"], calm.json()["pid"]
        httpx.post(f"{base}/sessions/{over_pid}/grow", params={"mb": 64})
        seen = _until(
            lambda: httpx.get(f"{base}/sessions/{over_pid}").json(),
            lambda body: body["returncode"] is not None,
        )
        assert seen["halt"] == "budget_exceeded"
        assert seen["returncode"] == -signal.SIGTERM
        assert psutil.Process(calm_pid).is_running()
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
        code = server.wait(timeout=20)
    text = log.read_text()
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly.
    assert code in (0, -signal.SIGTERM), text
    assert "Application shutdown complete" in text
    assert "Finished server process" in text
    for trouble in ("Task was destroyed", "Traceback", "ERROR", "never awaited"):
        assert trouble not in text, text
    assert _gone(calm_pid)
    assert _gone(over_pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(server.pid, 0)  # nothing left in the server's process group


def _health(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# -- the lifespan protocol, message by message -------------------------------------------


def _guard(app: ASGIApp) -> tuple[AdmissionMiddleware, SessionWatchdog]:
    watchdog = SessionWatchdog(config=AdmissionConfig(), registry=None)
    guard = AdmissionMiddleware(
        app, session_routes=["POST /s"], config=AdmissionConfig(), registry=None, watchdog=watchdog
    )
    return guard, watchdog


async def _drive(guard: AdmissionMiddleware, scope: Scope) -> list[str]:
    incoming: list[Message] = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[str] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message["type"])

    await guard(scope, receive, send)
    return sent


@pytest.mark.anyio
async def test_failed_startup_never_starts_the_watchdog() -> None:
    """An app whose startup fails leaves the watchdog stopped."""
    running: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "lifespan.startup.failed", "message": "no"})

    guard, watchdog = _guard(app)
    original = watchdog.start

    async def start() -> None:
        running.append(True)
        await original()

    watchdog.start = start  # type: ignore[method-assign]
    assert await _drive(guard, {"type": "lifespan", "state": {}}) == ["lifespan.startup.failed"]
    assert running == []
    assert not watchdog.running


@pytest.mark.anyio
async def test_watchdog_runs_between_startup_and_shutdown() -> None:
    """Started before startup.complete reaches the server, stopped before shutdown.complete."""
    observed: list[tuple[str, bool]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
                observed.append(("after startup", watchdog.running))
            else:
                observed.append(("at shutdown", watchdog.running))
                await send({"type": "lifespan.shutdown.complete"})
                observed.append(("after shutdown", watchdog.running))
                return

    guard, watchdog = _guard(app)
    state: dict[str, Any] = {}
    sent = await _drive(guard, {"type": "lifespan", "state": state})
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert observed == [("after startup", True), ("at shutdown", True), ("after shutdown", False)]
    assert state["asgi_admission.watchdog"] is watchdog


@pytest.mark.anyio
async def test_app_without_lifespan_support_leaves_nothing_running() -> None:
    """An app that raises on the lifespan scope propagates its error and starts nothing."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("lifespan is not supported")

    guard, watchdog = _guard(app)
    with pytest.raises(RuntimeError, match="not supported"):
        await _drive(guard, {"type": "lifespan"})  # and no state dict: tolerated
    assert not watchdog.running
    await asyncio.sleep(0)


def test_middleware_refuses_a_non_watchdog() -> None:
    """Passing something else as watchdog is a ValueError naming the setting."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("never called: the middleware is refused first")

    with pytest.raises(ValueError, match="watchdog must be a SessionWatchdog"):
        AdmissionMiddleware(
            app,
            session_routes=["POST /s"],
            config=AdmissionConfig(),
            registry=None,
            watchdog=object(),  # type: ignore[arg-type]
        )
