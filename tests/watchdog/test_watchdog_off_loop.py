"""The running watchdog measures in a thread of its own and decides on the event loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from watchdogkit import FixedReader, Spawn

from asgi_admission import AdmissionConfig, SessionWatchdog
from asgi_admission._watchdog.sampler import ProcessTreeSampler
from kits.suitekit import MIB

#: Internal on purpose: the watchdog's measuring thread.
INTERNAL = "the watchdog's measuring thread"


@pytest.mark.anyio
async def test_sampling_runs_off_the_loop_and_halts_on_it(
    spawn: Spawn, calm: FixedReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every process sample of the running watchdog is taken outside the event loop's
    thread, while halt actions are still called on the loop."""
    sampled_in: set[int] = set()
    real_sample = ProcessTreeSampler.sample

    def spy(self: ProcessTreeSampler, *args: Any, **kwargs: Any) -> Any:
        sampled_in.add(threading.get_ident())
        return real_sample(self, *args, **kwargs)

    monkeypatch.setattr(ProcessTreeSampler, "sample", spy)
    halted_in: list[int] = []
    watchdog = SessionWatchdog(
        config=AdmissionConfig(),
        memory_reader=calm,
        registry=CollectorRegistry(),
        interval_s=0.05,
        halt=lambda event: halted_in.append(threading.get_ident()),
    )
    within, over = spawn(8), spawn(8)
    watchdog.register(within.pid, budget_bytes=512 * MIB)
    session = watchdog.register(over.pid, budget_bytes=1 * MIB)
    await watchdog.start()
    try:
        for _ in range(100):
            await asyncio.sleep(0.05)
            if session.halt is not None:
                break
    finally:
        await watchdog.stop()
    loop_thread = threading.get_ident()
    assert sampled_in
    assert loop_thread not in sampled_in
    assert halted_in == [loop_thread]
    assert session.halt is not None
