"""The watchdog's settings, metrics, callbacks and lifespan task, without a server."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Generator
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.requests import HTTPConnection
from starlette.types import Scope
from watchdogkit import FixedReader, Recorder, Spawn

from asgi_admission import (
    AdmissionConfig,
    CgroupMemoryReader,
    HostMemoryReader,
    ProcessGroupHalt,
    SessionHalt,
    SessionWatchdog,
    session_watchdog,
)
from asgi_admission._watchdog.metrics import SESSION_MEMORY_BUCKETS, watchdog_metrics
from kits.suitekit import MIB

#: Internal on purpose: the watchdog's per-registry metrics cache.
INTERNAL = "the watchdog's per-registry metrics cache and its halt tasks"


@pytest.mark.parametrize(
    ("high", "critical", "interval"),
    [
        (80.0, 80.0, 0.5),  # not above the high watermark
        (80.0, 100.5, 0.5),
        (80.0, math.nan, 0.5),
        (95.0, 90.0, 0.5),
        (80.0, 90.0, 0.0),
        (80.0, 90.0, math.inf),
    ],
)
def test_inconsistent_settings_raise(high: float, critical: float, interval: float) -> None:
    """A critical watermark not in (high, 100] or a non-positive interval is a ValueError."""
    config = AdmissionConfig(high_watermark_percent=high, resume_threshold_percent=50)
    with pytest.raises(ValueError, match=r"must .*; got"):
        SessionWatchdog(
            config=config,
            critical_watermark_percent=critical,
            interval_s=interval,
            registry=None,
        )


def test_reader_follows_the_memory_source() -> None:
    """Without a reader the config's source decides: cgroup by default, host only when asked."""
    cgroup = SessionWatchdog(config=AdmissionConfig(), registry=None)
    host = SessionWatchdog(config=AdmissionConfig(memory_source="host"), registry=None)
    assert isinstance(cgroup.memory_reader, CgroupMemoryReader)
    assert isinstance(host.memory_reader, HostMemoryReader)


def test_defaults_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no config the admission settings are read from ADMISSION_* variables."""
    monkeypatch.setenv("ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT", "85")
    monkeypatch.setenv("ADMISSION_MEMORY_SOURCE", "host")
    watchdog = SessionWatchdog(registry=None)
    assert watchdog.config.high_watermark_percent == 85
    assert isinstance(watchdog.memory_reader, HostMemoryReader)
    from_env = SessionWatchdog.from_env(registry=None)
    assert (from_env.critical_watermark_percent, from_env.interval_s) == (90.0, 0.5)
    given = AdmissionConfig(high_watermark_percent=92, resume_threshold_percent=80)
    assert SessionWatchdog.from_env({}, config=given, registry=None).config is given


@pytest.mark.parametrize(
    ("env", "critical", "interval", "warned"),
    [
        ({}, 90.0, 0.5, None),
        (
            {
                "ADMISSION_CRITICAL_WATERMARK_PERCENT": "95",
                "ADMISSION_WATCHDOG_INTERVAL_SECONDS": "0.25",
            },
            95.0,
            0.25,
            None,
        ),
        ({"ADMISSION_CRITICAL_WATERMARK_PERCENT": "lots"}, 90.0, 0.5, "CRITICAL"),
        ({"ADMISSION_CRITICAL_WATERMARK_PERCENT": "75"}, 90.0, 0.5, "CRITICAL"),
        ({"ADMISSION_CRITICAL_WATERMARK_PERCENT": "101"}, 90.0, 0.5, "CRITICAL"),
        (
            {
                "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": "92",
                "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": "80",
            },
            96.0,
            0.5,
            "CRITICAL",
        ),
        ({"ADMISSION_WATCHDOG_INTERVAL_SECONDS": "-1"}, 90.0, 0.5, "INTERVAL"),
        ({"ADMISSION_WATCHDOG_INTERVAL_SECONDS": "soon"}, 90.0, 0.5, "INTERVAL"),
    ],
)
def test_from_env_table(
    env: dict[str, str],
    critical: float,
    interval: float,
    warned: str | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Bad values fall back with one warning naming the variable; good ones are used."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        watchdog = SessionWatchdog.from_env(env, registry=None)
    assert (watchdog.critical_watermark_percent, watchdog.interval_s) == (critical, interval)
    messages = [r.getMessage() for r in caplog.records]
    if warned is None:
        assert messages == []
    else:
        assert len(messages) == 1
        assert f"ADMISSION_{warned}" in messages[0] or warned in messages[0]


def test_metrics_cached_per_registry() -> None:
    """Two watchdogs on one registry share its metrics instead of raising Duplicated timeseries."""
    registry = CollectorRegistry()
    first = SessionWatchdog(config=AdmissionConfig(), registry=registry)
    second = SessionWatchdog(config=AdmissionConfig(), registry=registry)
    assert first._metrics is second._metrics
    assert watchdog_metrics(REGISTRY) is watchdog_metrics(REGISTRY)
    for reason in ("budget_exceeded", "container_headroom"):
        labels = {"reason": reason}
        assert registry.get_sample_value("asgi_admission_sessions_halted_total", labels) == 0
    assert registry.get_sample_value("asgi_admission_session_memory_bytes_count") == 0


def test_no_registry_registers_nothing() -> None:
    """registry=None builds working metrics that no registry exposes."""
    watchdog = SessionWatchdog(config=AdmissionConfig(), registry=None)
    watchdog._metrics.halted.labels(reason="budget_exceeded").inc()
    assert watchdog_metrics(None) is not watchdog._metrics


def test_histogram_buckets_span_16mib_to_16gib() -> None:
    """The session-memory buckets are the powers of two from 16 MiB to 16 GiB."""
    assert SESSION_MEMORY_BUCKETS[0] == 16 * MIB
    assert SESSION_MEMORY_BUCKETS[-1] == 16 * 1024 * MIB
    assert all(b == a * 2 for a, b in itertools.pairwise(SESSION_MEMORY_BUCKETS))


def test_register_validates_and_handles_gone_pids(spawn: Spawn, calm: FixedReader) -> None:
    """A bad budget is refused; a pid that is already gone gives an ended handle."""
    watchdog = SessionWatchdog(config=AdmissionConfig(), memory_reader=calm, registry=None)
    with pytest.raises(ValueError, match="budget_bytes"):
        watchdog.register(1, budget_bytes=0)
    child = spawn(0)
    child.finish()
    session = watchdog.register(child.pid, session_id="late")
    assert session.ended
    assert not session.is_running()
    assert session.descendant_pids == ()
    assert watchdog.sessions == ()
    assert "late" in repr(session)
    session.unregister()


class Ticket:
    """An admission ticket as the watchdog sees one: a route, told its session's memory."""

    route = "POST /processes"

    def __init__(self) -> None:
        self.told: list[int] = []
        self.state = "pending"
        self.awaiting_memory = True

        self.released = 0

    def measured(self, used_bytes: int) -> None:
        self.told.append(used_bytes)

    def release(self) -> None:
        self.released += 1
        self.state = "released"


def test_a_pending_ticket_is_told_its_sessions_memory(spawn: Spawn, calm: FixedReader) -> None:
    """A process registered with its admission ticket: while the ticket is pending each
    tick tells it the memory the process alone holds, and no longer once it is not; the
    session's peak is learned under the ticket's route."""
    watchdog = SessionWatchdog(config=AdmissionConfig(), memory_reader=calm, registry=None)
    learned: list[tuple[str, int]] = []
    watchdog.learn_peaks_with(lambda route, peak, exact=False: learned.append((route, peak)))
    child = spawn(48)
    ticket = Ticket()
    session = watchdog.register(child.pid, ticket=ticket)
    assert session.route == ticket.route
    watchdog.sample_once()
    child.grow(32)
    watchdog.sample_once()
    sample = session.last_sample
    assert sample is not None
    assert sample.unique_bytes is not None
    assert ticket.told[-1] == sample.unique_bytes
    assert ticket.told[1] - ticket.told[0] >= 30 * MIB
    ticket.awaiting_memory = False  # settled: its memory is no longer measured
    watchdog.sample_once()
    assert len(ticket.told) == 2
    session.unregister()
    assert learned
    assert learned[0][0] == ticket.route


def test_a_ticketed_sessions_own_memory_is_what_is_learned(spawn: Spawn, calm: FixedReader) -> None:
    """A session registered under its ticket is measured by its own memory all its life,
    after its ticket settled too: learning is handed the peak of that, not of its RSS
    (which counts the interpreter's pages it shares); a session registered without a
    ticket is learned by its RSS."""
    watchdog = SessionWatchdog(config=AdmissionConfig(), memory_reader=calm, registry=None)
    learned: list[tuple[str, int]] = []
    watchdog.learn_peaks_with(lambda route, peak, exact=False: learned.append((route, peak)))
    ticketed, plain = spawn(16), spawn(16)
    ticket = Ticket()
    session = watchdog.register(ticketed.pid, ticket=ticket)
    other = watchdog.register(plain.pid, route="POST /plain")
    watchdog.sample_once()
    ticket.awaiting_memory = False  # settled: later growth still counts toward its peak
    ticketed.grow(64)
    watchdog.sample_once()
    told_while_pending = max(ticket.told)
    session.unregister()
    other.unregister()
    own, rss = session.peak_own_bytes, session.peak_rss_bytes
    assert own is not None
    assert rss is not None
    assert own >= told_while_pending + 60 * MIB
    assert own < rss
    assert learned == [(ticket.route, own), ("POST /plain", other.peak_rss_bytes)]


@pytest.mark.parametrize(
    ("how", "state", "released"),
    [("unregistered", "pending", 1), ("unregistered", "active", 0), ("exited", "pending", 0)],
)
def test_a_session_unregistered_while_its_ticket_is_pending_releases_it(
    spawn: Spawn, calm: FixedReader, state: str, released: int, how: str
) -> None:
    """A session unregistered before its ticket settled: the ticket is released (nothing
    more will come of it), once; a ticket that has started is left to the app, and so is
    one whose process exits on its own (a launcher may leave its session running) until
    the app unregisters it."""
    watchdog = SessionWatchdog(config=AdmissionConfig(), memory_reader=calm, registry=None)
    child = spawn(1)
    ticket = Ticket()
    ticket.state = state
    session = watchdog.register(child.pid, ticket=ticket)
    if how == "unregistered":
        session.unregister()
    else:
        child.finish()
        watchdog.sample_once()
    assert session.ended
    assert ticket.released == released
    session.unregister()
    assert ticket.released == (1 if state == "pending" else 0)


def test_process_of_a_gone_pid_raises(spawn: Spawn, calm: FixedReader) -> None:
    """Asking an ended-at-birth handle for its psutil process raises NoSuchProcess."""
    import psutil

    watchdog = SessionWatchdog(config=AdmissionConfig(), memory_reader=calm, registry=None)
    child = spawn(0)
    child.finish()
    session = watchdog.register(child.pid)
    with pytest.raises(psutil.NoSuchProcess):
        _ = session.process


def test_failing_halt_action_is_logged_not_raised(
    spawn: Spawn, calm: FixedReader, caplog: pytest.LogCaptureFixture
) -> None:
    """A halt action that raises is logged, and on_halt is still told."""

    def broken(event: SessionHalt) -> None:
        raise RuntimeError("boom")

    told = Recorder()
    watchdog = SessionWatchdog(
        config=AdmissionConfig(), memory_reader=calm, halt=broken, on_halt=told, registry=None
    )
    child = spawn(16)
    watchdog.register(child.pid, budget_bytes=MIB)
    with caplog.at_level(logging.ERROR, logger="asgi_admission"):
        (halt,) = watchdog.sample_once()
    assert told.events == [halt]
    assert any("halt callback failed" in r.getMessage() for r in caplog.records)


def test_async_callback_without_a_loop_is_reported(
    spawn: Spawn, calm: FixedReader, caplog: pytest.LogCaptureFixture
) -> None:
    """A coroutine callback with no running loop is closed (not leaked) and logged."""

    async def tell(event: SessionHalt) -> None:
        raise AssertionError("never awaited")

    class Later:
        def __await__(self) -> Generator[None, None, None]:
            yield None

    watchdog = SessionWatchdog(
        config=AdmissionConfig(),
        memory_reader=calm,
        halt=lambda event: Later(),
        on_halt=tell,
        registry=None,
    )
    child = spawn(16)
    watchdog.register(child.pid, budget_bytes=MIB)
    with caplog.at_level(logging.ERROR, logger="asgi_admission"):
        watchdog.sample_once()
    assert sum("no event loop" in r.getMessage() for r in caplog.records) == 2


def test_default_halt_validates() -> None:
    """ProcessGroupHalt refuses a negative grace period and a zero poll interval."""
    with pytest.raises(ValueError, match="grace_s"):
        ProcessGroupHalt(grace_s=-1)
    with pytest.raises(ValueError, match="poll_s"):
        ProcessGroupHalt(poll_s=0)


@pytest.mark.anyio
async def test_async_callbacks_run_as_tasks(spawn: Spawn, calm: FixedReader) -> None:
    """Coroutine halt actions and callbacks run on the loop; a failing one is only logged."""
    seen: list[str] = []

    async def halt(event: SessionHalt) -> None:
        await asyncio.sleep(0)
        seen.append(f"halt {event.session_id}")

    async def tell(event: SessionHalt) -> None:
        seen.append(f"told {event.reason}")
        raise RuntimeError("the user's socket is closed")

    watchdog = SessionWatchdog(
        config=AdmissionConfig(), memory_reader=calm, halt=halt, on_halt=tell, registry=None
    )
    child = spawn(16)
    watchdog.register(child.pid, budget_bytes=MIB, session_id="s1")
    watchdog.sample_once()
    for _ in range(20):
        await asyncio.sleep(0.01)
        if not watchdog._halt_tasks:
            break
    assert sorted(seen) == ["halt s1", "told budget_exceeded"]
    assert not watchdog._halt_tasks


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + 0.1
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_run_samples_on_its_interval(spawn: Spawn, calm: FixedReader) -> None:
    """The task samples every interval (less the tick's own time) until stopped."""
    clock = _Clock()
    watchdog = SessionWatchdog(
        config=AdmissionConfig(),
        memory_reader=calm,
        interval_s=0.5,
        clock=clock,
        sleep=clock.sleep,
        registry=None,
    )
    child = spawn(16)
    await watchdog.start()
    await watchdog.start()  # idempotent
    session = watchdog.register(child.pid)
    assert watchdog.running
    for _ in range(500):  # each tick measures in the watchdog's thread: real time
        await asyncio.sleep(0.01)
        if len(clock.sleeps) >= 3 and session.last_sample is not None:
            break
    await watchdog.stop()
    assert not watchdog.running
    assert session.last_sample is not None
    assert clock.sleeps[:3] == [0.5, 0.5, 0.5]
    count = len(clock.sleeps)
    await asyncio.sleep(0.01)
    assert len(clock.sleeps) == count  # stopped means stopped
    await watchdog.stop()  # and stopping twice is harmless


@pytest.mark.anyio
async def test_a_failing_tick_does_not_stop_the_task(
    spawn: Spawn, caplog: pytest.LogCaptureFixture
) -> None:
    """A memory reader that raises is logged and the next tick runs anyway."""
    calls: list[int] = []

    def broken() -> Any:
        calls.append(1)
        raise OSError("cgroup gone")

    watchdog = SessionWatchdog(
        config=AdmissionConfig(), memory_reader=broken, interval_s=0.01, registry=None
    )
    child = spawn(0)
    watchdog.register(child.pid)
    with caplog.at_level(logging.ERROR, logger="asgi_admission"):
        await watchdog.start()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(calls) >= 2:
                break
        await watchdog.stop()
    assert len(calls) >= 2
    assert any("tick failed" in r.getMessage() for r in caplog.records)


def _connection(scope: Scope) -> HTTPConnection:
    """A request's connection over ``scope`` (the helper reads only its scope)."""
    return HTTPConnection({"type": "http", **scope})


def test_session_watchdog_helper() -> None:
    """The helper finds the watchdog in the lifespan state, or says clearly that it is absent."""
    watchdog = SessionWatchdog(config=AdmissionConfig(), registry=None)
    found = session_watchdog(_connection({"state": {"asgi_admission.watchdog": watchdog}}))
    assert found is watchdog
    scopes: list[Scope] = [{}, {"state": {}}, {"state": {"asgi_admission.watchdog": object()}}]
    for scope in scopes:
        with pytest.raises(LookupError, match="No session watchdog"):
            session_watchdog(_connection(scope))
