"""The README example works: a terminal session, echoed, then halted with a reason."""

from __future__ import annotations

import gc
import signal
import sys
import weakref
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY
from watchdogkit import TestClient, record_children


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The example imported afresh, and forgotten after the test: as in the docs, its
    guard is on the default REGISTRY, and a module kept in ``sys.modules`` would keep it
    there for the rest of the run, counted in what later tests read of that registry
    (a blind guard adds its fallback count cap to ``asgi_admission_session_limit``)."""
    for name in ("ADMISSION_WATCHDOG_INTERVAL_SECONDS", "ADMISSION_CRITICAL_WATERMARK_PERCENT"):
        monkeypatch.delenv(name, raising=False)
    sys.modules.pop("readme_example", None)
    import readme_example

    gone = weakref.ref(readme_example)
    # A proxy: pytest keeps a fixture's value until its teardown has run.
    yield weakref.proxy(readme_example)
    sys.modules.pop("readme_example", None)
    del readme_example
    gc.collect()  # the module's functions and its dict hold one another
    assert gone() is None, "the README example is still referenced: its guard lives on"


def test_readme_terminal_echoes_and_is_told_why_it_was_halted(example: object) -> None:
    """Within budget the terminal echoes; over it the user is sent the halt reason."""
    app = example.app  # type: ignore[attr-defined]
    before = REGISTRY.get_sample_value(
        "asgi_admission_sessions_halted_total", {"reason": "budget_exceeded"}
    )
    with TestClient(app) as client:
        with client.websocket_connect("/terminal/roomy") as websocket:
            websocket.send_text("hello")
            assert websocket.receive_text() == "hello\n"
        with client.websocket_connect("/terminal/tight?budget_mb=1") as websocket:
            told = websocket.receive_json()
        assert told["halted"] == "budget_exceeded"
        assert "over its budget of 1 MiB" in told["message"]
    after = REGISTRY.get_sample_value(
        "asgi_admission_sessions_halted_total", {"reason": "budget_exceeded"}
    )
    assert after == (before or 0) + 1


def test_readme_terminal_reaps_its_shell_when_its_handler_is_cancelled(
    example: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test client cancels the handler as the socket closes: the shell is reaped first.

    Were it left unreaped, the loop could close before the child's exit was read, and its
    pipes and process would be reported unclosed at the end of the run."""
    shells = record_children(monkeypatch)
    with TestClient(example.app) as client:  # type: ignore[attr-defined]
        for name in ("first", "second"):
            with client.websocket_connect(f"/terminal/{name}") as websocket:
                websocket.send_text("hello")
                assert websocket.receive_text() == "hello\n"
            # The handler has finished: its shell was killed and waited for.
            assert [shell.returncode for shell in shells] == [-signal.SIGKILL] * len(shells)
    assert len(shells) == 2
