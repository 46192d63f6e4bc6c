"""The demo's process sessions: a real child that grows until the watchdog halts it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from typing import Any

import anyio
import psutil
import pytest
from prometheus_client import CollectorRegistry
from watchdogkit import FixedReader, TestClient, reading, record_children

from asgi_admission import AdmissionController, SessionWatchdog
from asgi_admission.demo import create_app
from asgi_admission.demo.processes import CHILD_SCRIPT, ProcessSessions
from kits.suitekit import MIB


def _poll(client: TestClient, path: str, done: Any, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(path).json()
        if done(body) or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def _app(reader: FixedReader, registry: CollectorRegistry, **options: Any) -> Any:
    return create_app(
        session_mb=0,
        controller=AdmissionController(memory_reader=reader),
        registry=registry,
        **options,
    )


def test_growing_past_the_budget_is_halted_and_counted() -> None:
    """A process session grown past its budget is halted, says why, and is counted in metrics."""
    registry = CollectorRegistry()
    app = _app(FixedReader(reading(10.0, 16 * 1024 * MIB)), registry)
    with TestClient(app) as client:
        opened = client.post("/processes", params={"hold_mb": 16, "budget_mb": 64})
        assert opened.status_code == 201
        session = opened.json()
        path = f"/processes/{session['id']}"
        assert session["halt"] is None
        grown = client.post(f"{path}/grow", params={"mb": 96})
        assert grown.status_code in (200, 409), grown.text
        body = _poll(client, path, lambda b: not b["running"])
        assert body["halt"]["reason"] == "budget_exceeded"
        assert "budget of 64 MiB" in body["halt"]["message"]
        assert body["peak_rss_bytes"] > 64 * MIB  # past the budget: halted while growing
        again = client.post(f"{path}/grow", params={"mb": 1})
        assert again.status_code == 409
        assert again.json()["detail"].startswith(
            f"Session {session['id']} was halted by the watchdog (budget_exceeded): "
        )
        metrics = client.get("/metrics").text
        assert 'asgi_admission_sessions_halted_total{reason="budget_exceeded"} 1.0' in metrics
        assert "asgi_admission_session_memory_bytes_count 1.0" in metrics
        assert len(client.get("/processes").json()["processes"]) == 1
        assert client.delete(path).status_code == 204
        assert client.get(path).status_code == 404


def test_container_breach_halts_the_largest_process() -> None:
    """With the container over the critical watermark, the bigger of two processes is halted."""
    reader = FixedReader(reading(10.0, 16 * 1024 * MIB))
    watchdog = SessionWatchdog(
        memory_reader=reader, interval_s=0.1, registry=None, critical_watermark_percent=90
    )
    app = _app(reader, CollectorRegistry(), watchdog=watchdog)
    with TestClient(app) as client:
        small = client.post("/processes", params={"hold_mb": 8}).json()
        large = client.post("/processes", params={"hold_mb": 64}).json()
        _poll(client, f"/processes/{large['id']}", lambda b: b["rss_bytes"] is not None)
        reader.reading = reading(95.0, 1024 * MIB)
        body = _poll(client, f"/processes/{large['id']}", lambda b: not b["running"])
        assert body["halt"]["reason"] == "container_headroom"
        assert client.get(f"/processes/{small['id']}").json()["halt"] is None
        pids = [small["pid"], large["pid"]]
    # The demo ends its children at shutdown.
    assert all(not psutil.pid_exists(pid) for pid in pids)


def test_growing_an_ended_process_is_410_not_500() -> None:
    """A session whose process died by itself answers 410 Gone with how it ended."""
    app = create_app(session_mb=0, guarded=False, registry=None)
    with TestClient(app) as client:
        body = client.post("/processes", params={"hold_mb": 1}).json()
        os.kill(body["pid"], signal.SIGKILL)
        gone = client.post(f"/processes/{body['id']}/grow", params={"mb": 1})
        assert gone.status_code == 410, gone.text
        assert gone.json()["detail"] == (
            f"Session {body['id']}'s process has ended (killed by signal {int(signal.SIGKILL)})."
        )
        assert client.post(f"/processes/{body['id']}/grow", params={"mb": 1}).status_code == 410


def test_unguarded_demo_runs_processes_unwatched() -> None:
    """Without the middleware there is no watchdog: the process runs and reports no figures."""
    app = create_app(session_mb=0, guarded=False, registry=None)
    with TestClient(app) as client:
        body = client.post("/processes", params={"hold_mb": 1}).json()
        assert (body["running"], body["peak_rss_bytes"], body["halt"]) == (True, None, None)
    assert not psutil.pid_exists(body["pid"])


def test_unknown_process_session_is_404() -> None:
    """Asking about or growing a session that does not exist answers 404."""
    app = create_app(session_mb=0, guarded=False, registry=None)
    with TestClient(app) as client:
        assert client.get("/processes/p99").status_code == 404
        assert client.post("/processes/p99/grow", params={"mb": 1}).status_code == 404
        assert client.delete("/processes/p99").status_code == 404


@pytest.mark.parametrize("params", [{"hold_mb": -1}, {"budget_mb": 0}])
def test_bad_parameters_are_422(params: dict[str, int]) -> None:
    """Negative holds and zero budgets are refused before any process starts."""
    app = create_app(session_mb=0, guarded=False, registry=None)
    with TestClient(app) as client:
        assert client.post("/processes", params=params).status_code == 422


def test_a_child_whose_worker_is_gone_exits_quietly() -> None:
    """A process session's child answering a worker that was killed (its pipe closed)
    exits with status 0 and no BrokenPipeError traceback in the server's log."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_SCRIPT, "1", "1", "0", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    assert child.stderr is not None
    assert child.stdout.readline() == b"ready\n"
    child.stdout.close()  # the worker is gone: nobody reads the next answer
    child.stdin.write(b"1\n")
    child.stdin.close()
    assert child.wait(timeout=10) == 0
    assert child.stderr.read() == b""
    child.stderr.close()


@pytest.mark.parametrize(("measured", "with_ticket"), [("1", True), ("0", False)])
def test_a_process_session_is_watched_under_its_ticket_unless_asked_not_to(
    measured: str, with_ticket: bool
) -> None:
    """The demo hands the watchdog each process session's admission ticket, so that its
    reservation settles by the child's own memory; ``measured=0`` hands it the route alone
    (the working set settles it). Either way the route is known for learning."""
    reader = FixedReader(reading(10.0, 16 * 1024 * MIB))
    watchdog = SessionWatchdog(memory_reader=reader, registry=None)
    app = _app(reader, CollectorRegistry(), watchdog=watchdog)
    with TestClient(app) as client:
        opened = client.post("/processes", params={"hold_mb": 1, "measured": measured})
        assert opened.status_code == 201
        (session,) = watchdog.sessions
        assert session.route == "POST /processes"
        assert (session.ticket is not None) is with_ticket
        assert client.delete(f"/processes/{opened.json()['id']}").status_code == 204


def _pending(client: TestClient) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith('asgi_admission_sessions{state="pending"}'):
            return float(line.split()[-1])
    raise AssertionError("no pending sessions gauge")


def test_a_process_session_closed_before_it_settles_holds_nothing() -> None:
    """A process session closed young, its memory never shown (the reading here never
    moves): the watchdog sees its process go and releases its ticket, so its
    reservation is not held on until its ramp time or the pending timeout."""
    registry = CollectorRegistry()
    app = _app(FixedReader(reading(10.0, 16 * 1024 * MIB)), registry)
    with TestClient(app) as client:
        opened = client.post("/processes", params={"hold_mb": 1, "ramp_s": 5})
        assert opened.status_code == 201
        assert _pending(client) == 1
        assert client.delete(f"/processes/{opened.json()['id']}").status_code == 204
        assert _pending(client) == 0


def test_a_cancelled_open_or_close_still_reaps_its_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A handler cancelled by its server (an anyio cancel scope, as Starlette's test client
    and task groups use) while it starts or ends a child still kills and reaps it, so no
    child outlives the loop unreaped or is left running with nothing to stop it."""
    children = record_children(monkeypatch)

    async def main() -> tuple[int | None, int | None, int]:
        sessions = ProcessSessions()
        # 256 MiB in 4 MiB steps 50 ms apart: still building when cancelled.
        with anyio.move_on_after(0.3):
            await sessions.open(None, hold_mb=256, budget_mb=512)
        cancelled_open = children[0].returncode
        ramping = await sessions.open(None, hold_mb=8, budget_mb=512, ramp_s=5)
        with anyio.CancelScope() as scope:
            scope.cancel()
            await sessions.close(ramping.session_id)
        return cancelled_open, children[1].returncode, len(sessions)

    assert asyncio.run(main()) == (-signal.SIGKILL, -signal.SIGKILL, 0)
