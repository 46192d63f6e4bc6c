"""Building the middleware: defaults from the environment, eager full-sentence errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from mwkit import SettableReader, TestClient, controller
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from asgi_admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionMiddleware,
    SessionWatchdog,
)
from kits.suitekit import MIB


async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
    return None


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Without config or controller, both are built from ADMISSION_* variables."""
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "7")
    monkeypatch.setenv("ADMISSION_SESSION_RESERVE_MB", "32")
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tmp_path))
    mw = AdmissionMiddleware(app, session_routes=["POST /sessions"])
    assert mw.session_limit == 7
    assert mw.config.reserve_bytes == 32 * MIB
    assert isinstance(mw.controller, AdmissionController)
    assert mw.controller.reserve_bytes == 32 * MIB
    assert mw.retry_after.base_s == 5
    assert mw.session_counts() == (0, 0)


def test_explicit_max_sessions_wins() -> None:
    """max_sessions given to the middleware overrides the config's."""
    mw = AdmissionMiddleware(
        app, session_routes=["POST /s"], config=AdmissionConfig(max_sessions=3), max_sessions=7
    )
    assert mw.session_limit == 7


def test_a_watchdog_handed_in_teaches_the_guard_its_sessions_peaks() -> None:
    """A watchdog given to the middleware is told where the peaks go as the guard is
    built: a session's peak it hands on is learned for the session's route."""
    config = AdmissionConfig(reserve_learning="raise")
    watchdog = SessionWatchdog(config=config, registry=None)
    mw = AdmissionMiddleware(
        app, session_routes=["POST /s"], config=config, registry=None, watchdog=watchdog
    )
    assert mw.reservations.estimates() == []
    assert watchdog.on_peak is not None
    watchdog.on_peak("POST /s", 64 * MIB)
    learned = [(e.route, e.footprint_bytes, e.observations) for e in mw.reservations.estimates()]
    assert learned == [("POST /s", 64 * MIB, 1)]


def test_explicit_scalars_win_over_the_environment_beside_a_controller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With controller=, max_sessions= and retry_after= win over the ADMISSION_* environment."""
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "3")
    monkeypatch.setenv("ADMISSION_RETRY_AFTER_SECONDS", "9")
    beside = controller(SettableReader())
    mw = AdmissionMiddleware(
        app, session_routes=["POST /s"], controller=beside, max_sessions=7, retry_after=2
    )
    assert (mw.session_limit, mw.retry_after.base_s, mw.controller) == (7, 2, beside)
    from_env = AdmissionMiddleware(app, session_routes=["POST /s"], controller=beside)
    assert (from_env.session_limit, from_env.retry_after.base_s) == (3, 9)


def test_config_and_controller_are_mutually_exclusive() -> None:
    """config= with controller= raises a sentence naming both, rather than mixing thresholds."""
    with pytest.raises(ValueError, match=r"^Pass config or controller, not both: ") as raised:
        AdmissionMiddleware(
            app,
            session_routes=["POST /s"],
            config=AdmissionConfig(high_watermark_percent=95),
            controller=AdmissionController(
                high_watermark_percent=60,
                resume_threshold_percent=50,
                memory_reader=SettableReader(),
            ),
            max_sessions=9,
            retry_after=2,
        )
    assert str(raised.value).endswith(".")


def test_max_sessions_zero_refuses_every_session_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """max_sessions=0 is a drain: one warning at startup, every session refused, others pass."""

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    service = Starlette(routes=[Route("/sessions", ok, methods=["POST"]), Route("/health", ok)])
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        mw = AdmissionMiddleware(
            service,
            session_routes=["POST /sessions"],
            controller=controller(SettableReader()),
            max_sessions=0,
        )
    warnings = [r.getMessage() for r in caplog.records if "max_sessions is 0" in r.getMessage()]
    assert len(warnings) == 1
    with TestClient(mw) as client:
        refused = client.post("/sessions")
        assert refused.status_code == 503
        assert refused.json()["reason"] == "session_limit"
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs session_routes"),
        ({"session_routes": ["GRAB /x"]}, "unknown method"),
        ({"session_routes": ["POST /x"], "max_sessions": -1}, "max_sessions"),
        ({"session_routes": ["POST /x"], "max_sessions": True}, "max_sessions"),
        ({"session_routes": ["POST /x"], "readiness_path": "ready"}, "readiness_path"),
        ({"session_routes": ["POST /x"], "current_sessions": 3}, "current_sessions"),
        ({"session_predicate": "yes"}, "session_predicate"),
        ({"session_routes": ["POST /x"], "priority": "high"}, "priority must be a callable"),
        ({"session_routes": ["POST /x"], "tenant": "acme"}, "tenant must be a callable"),
        ({"session_routes": ["POST /x"], "watchdog": object()}, "watchdog must be a"),
        ({"session_routes": ["POST /x"], "retry_after": 0}, "base_s"),
        ({"session_routes": ["POST /x"], "retry_after": 2.5}, "retry_after"),
    ],
)
def test_bad_settings_raise(kwargs: dict[str, Any], message: str) -> None:
    """Each invalid setting fails at construction with a sentence naming it."""
    with pytest.raises(ValueError, match=message):
        AdmissionMiddleware(app, controller=controller(SettableReader()), **kwargs)
