"""Building the middleware: defaults from the environment, eager full-sentence errors."""

from __future__ import annotations

from typing import Any

import pytest
from mwkit import SettableReader, controller

from asgi_admission import AdmissionConfig, AdmissionController, AdmissionMiddleware


async def app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover
    return None


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Without config or controller, both are built from ADMISSION_* variables."""
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "7")
    monkeypatch.setenv("ADMISSION_SESSION_RESERVE_MB", "32")
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tmp_path))
    mw = AdmissionMiddleware(app, session_routes=["POST /sessions"])
    assert mw.session_limit == 7
    assert mw.config.reserve_bytes == 32 * 1024 * 1024
    assert isinstance(mw.controller, AdmissionController)
    assert mw.controller.reserve_bytes == 32 * 1024 * 1024
    assert mw.retry_after.base_s == 5
    assert mw.session_counts() == (0, 0)


def test_explicit_max_sessions_wins() -> None:
    """max_sessions given to the middleware overrides the config's."""
    mw = AdmissionMiddleware(
        app,
        session_routes=["POST /s"],
        config=AdmissionConfig(max_sessions=3),
        controller=controller(SettableReader()),
        max_sessions=0,
    )
    assert mw.session_limit == 0


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
        ({"session_routes": ["POST /x"], "retry_after": 0}, "base_s"),
        ({"session_routes": ["POST /x"], "retry_after": 2.5}, "retry_after"),
    ],
)
def test_bad_settings_raise(kwargs: dict[str, Any], message: str) -> None:
    """Each invalid setting fails at construction with a sentence naming it."""
    with pytest.raises(ValueError, match=message):
        AdmissionMiddleware(
            app, config=AdmissionConfig(), controller=controller(SettableReader()), **kwargs
        )
