"""A halt whose signals are refused (``PermissionError``: the session process changed
user) keeps escalating, says so once, and leaves the session marked halted."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry
from watchdogkit import FixedReader, Spawn

from asgi_admission import AdmissionConfig, ProcessGroupHalt, SessionWatchdog
from kits.suitekit import MIB

#: Internal on purpose: the halt's handling of refused signals (it signals by os.killpg).
INTERNAL = "the halt's handling of refused signals"


def refusing(refused: Callable[[int], bool]) -> Callable[[int, int], None]:
    """``os.killpg`` as the kernel answers it when the group's owner is another user."""
    real = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        if refused(sig):
            raise PermissionError(1, "Operation not permitted")
        real(pgid, sig)

    return killpg


@pytest.mark.anyio
async def test_an_existence_check_refused_still_ends_in_sigkill(
    spawn: Spawn,
    calm: FixedReader,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """killpg(pgid, 0) raising PermissionError does not end the escalation: the process
    that ignores SIGTERM still gets SIGKILL after the grace period."""
    monkeypatch.setattr(os, "killpg", refusing(lambda sig: sig == 0))
    watchdog = SessionWatchdog(
        config=AdmissionConfig(),
        memory_reader=calm,
        registry=CollectorRegistry(),
        halt=ProcessGroupHalt(grace_s=0.3, poll_s=0.05),
    )
    child = spawn(16, ignore_term=True)
    session = watchdog.register(child.pid, budget_bytes=8 * MIB)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        (halt,) = watchdog.sample_once()
        for _ in range(100):
            await asyncio.sleep(0.05)
            if child.popen.poll() is not None:
                break
    assert child.popen.returncode == -signal.SIGKILL
    assert session.halt is halt
    assert caplog.text.count("cannot tell whether") == 1
    assert "A halt callback failed" not in caplog.text
    await watchdog.stop()


@pytest.mark.anyio
async def test_a_group_that_cannot_be_signalled_stays_halted(
    spawn: Spawn,
    calm: FixedReader,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """When every signal is refused the halt is logged once as 'cannot signal', never
    raised, and the session stays registered and marked halted."""
    monkeypatch.setattr(os, "killpg", refusing(lambda sig: True))
    watchdog = SessionWatchdog(
        config=AdmissionConfig(),
        memory_reader=calm,
        registry=CollectorRegistry(),
        halt=ProcessGroupHalt(grace_s=0.1, poll_s=0.05),
    )
    child = spawn(16)
    session = watchdog.register(child.pid, budget_bytes=8 * MIB)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        (halt,) = watchdog.sample_once()
        await asyncio.sleep(0.3)
        assert watchdog.sample_once() == ()
    assert child.popen.poll() is None  # nothing could signal it
    assert session.halt is halt
    assert watchdog.sessions == (session,)
    assert caplog.text.count("cannot signal") == 1
    assert "A halt callback failed" not in caplog.text
    await watchdog.stop()
