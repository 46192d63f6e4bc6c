"""The examples run as written: each app answers and guards its session routes."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType

import pytest
from mwkit import TestClient, write_v2_tree

from asgi_admission import AdmissionMiddleware
from kits.suitekit import ROOT

EXAMPLES = ROOT / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tight_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(write_v2_tree(tmp_path / "cg")))
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "1")
    monkeypatch.setenv("ADMISSION_SESSION_RESERVE_MB", "1")
    monkeypatch.setenv("DEMO_SESSION_MB", "1")


@pytest.mark.usefixtures("tight_env")
def test_starlette_example_guards_jobs_and_shells() -> None:
    """The Starlette example admits one job, refuses the next, and keeps /health open."""
    module = load("starlette_app")
    with TestClient(module.app) as client:
        job = client.post("/jobs")
        assert job.status_code == 201
        refused = client.post("/jobs")
        assert refused.status_code == 503
        assert refused.headers["retry-after"].isdigit()
        assert client.get("/health").status_code == 200
        assert client.delete(f"/jobs/{job.json()['id']}").status_code == 204
        with client.websocket_connect("/shell/a") as ws:
            ws.send_text("ls")
            assert ws.receive_text() == "ls"
        assert client.get("/admission/ready").json()["ready"] is True


@pytest.mark.usefixtures("tight_env")
def test_demo_service_example_serves_the_demo() -> None:
    """examples/demo_service.py is the demo app, configured from the environment."""
    module = load("demo_service")
    with TestClient(module.app) as client:
        assert client.post("/sessions").status_code == 201
        assert client.post("/sessions").json()["reason"] == "session_limit"


@pytest.mark.usefixtures("tight_env")
def test_fastapi_tickets_example_holds_until_the_child_is_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ticket example's reservation is pending until its real child boots, then active."""
    module = load("fastapi_tickets")
    # The child boots only once told to, so the test sees it pending however fast it is.
    go = tmp_path / "go"
    wait = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
    monkeypatch.setattr(module, "BOOT", wait + module.BOOT)
    with TestClient(module.app) as client:
        guard = client.app.middleware_stack  # built on the first request's lifespan
        while not isinstance(guard, AdmissionMiddleware):
            guard = guard.app
        created = client.post("/sessions")
        assert created.status_code == 201
        session_id = created.json()["id"]
        # Pending (the child boots in the background), and not counted twice.
        assert guard.session_counts() == (0, 1)
        go.touch()
        deadline = time.monotonic() + 30
        while guard.session_counts() != (1, 0):
            assert time.monotonic() < deadline, guard.session_counts()
            time.sleep(0.05)
        process, ticket = module.sessions[session_id]
        assert ticket.state == "active"
        assert process.returncode is None
        assert client.delete(f"/sessions/{session_id}").status_code == 204
        assert ticket.state == "released"
        assert guard.session_counts() == (0, 0)
