"""The demo service in-process, and the `asgi-admission demo` command's wiring."""

from __future__ import annotations

import os
from typing import Any

import pytest
import uvicorn
from mwkit import SettableReader, TestClient, controller

from asgi_admission import cli
from asgi_admission.cli.demo import KEEP_ALIVE_S
from asgi_admission.demo import create_app, hold_memory


def test_demo_sessions_open_list_close_and_echo() -> None:
    """Sessions open, list and close; the terminal echoes; /health is always 200."""
    app = create_app(
        session_mb=1,
        controller=controller(SettableReader()),
        registry=None,
    )
    with TestClient(app) as client:
        assert client.get("/health").json() == {"status": "ok"}
        session_id = client.post("/sessions", params={"hold_s": 0.01}).json()["id"]
        assert client.get("/sessions").json() == {"sessions": [session_id], "session_mb": 1}
        assert client.delete(f"/sessions/{session_id}").status_code == 204
        assert client.delete(f"/sessions/{session_id}").status_code == 404
        with client.websocket_connect("/terminal/x") as ws:
            assert ws.receive_text().startswith("session t")
            ws.send_text("hello")
            assert ws.receive_text() == "hello"
        assert client.get("/admission/ready").status_code == 200


def test_demo_refuses_beyond_max_sessions() -> None:
    """With max_sessions=1 the second open session is refused with a 503."""
    app = create_app(
        session_mb=0,
        controller=controller(SettableReader()),
        max_sessions=1,
        registry=None,
    )
    with TestClient(app) as client:
        assert client.post("/sessions").status_code == 201
        assert client.post("/sessions").status_code == 503


@pytest.mark.parametrize(("raw", "expected"), [("3", 3), ("junk", 64), ("-2", 64), ("", 64)])
def test_unguarded_demo_reads_session_size_from_env(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: int
) -> None:
    """DEMO_SESSION_MB sets the session size; a bad value falls back to 64."""
    monkeypatch.setenv("DEMO_SESSION_MB", raw)
    app = create_app(guarded=False)
    with TestClient(app) as client:
        assert client.get("/sessions").json()["session_mb"] == expected


def test_hold_memory_touches_every_page() -> None:
    """The held block has a non-zero byte on every page, so it is really resident."""
    block = hold_memory(5 * 4096 + 10)
    assert len(block) == 5 * 4096 + 10
    assert all(block[i] == 1 for i in range(0, len(block), 4096))


def test_demo_command_runs_uvicorn(monkeypatch: pytest.MonkeyPatch) -> None:
    """`asgi-admission demo` serves the demo factory with the given address and size."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setenv("DEMO_SESSION_MB", "64")  # restored after the command overwrites it
    argv = ["demo", "--port", "8123", "--session-mb", "5", "--workers", "2"]
    assert cli.main(argv) == 0
    ((args, kwargs),) = calls
    assert args == ("asgi_admission.demo:create_app",)
    assert kwargs["factory"] is True
    assert (kwargs["host"], kwargs["port"], kwargs["workers"]) == ("127.0.0.1", 8123, 2)
    assert os.environ["DEMO_SESSION_MB"] == "5"
    # Longer than a proxy keeps its connections to a pod (ingress-nginx: 60 s).
    assert kwargs["timeout_keep_alive"] == KEEP_ALIVE_S > 60
    # The guard's latch messages reach the console at INFO; uvicorn's own config is untouched.
    assert kwargs["log_config"]["loggers"]["asgi_admission"]["level"] == "INFO"
    assert "asgi_admission" not in uvicorn.config.LOGGING_CONFIG["loggers"]


@pytest.mark.parametrize("argv", [["demo", "--session-mb", "-1"], ["demo", "--workers", "0"]])
def test_demo_command_rejects_bad_arguments(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad demo arguments exit 64 (EX_USAGE) with one line naming the option."""
    assert cli.main(argv) == 64
    assert "demo: error: --" in capsys.readouterr().err


def test_demo_command_without_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without uvicorn installed the command says which extra to install (exit 70)."""
    import sys

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert cli.main(["demo"]) == 70
    assert "asgi-admission[demo]" in capsys.readouterr().err
