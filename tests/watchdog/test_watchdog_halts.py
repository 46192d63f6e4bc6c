"""The watchdog against real children: budgets, container breaches, ends, deregistration."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

import psutil
import pytest
from prometheus_client import CollectorRegistry
from watchdogkit import FixedReader, Recorder, Spawn, reading

from asgi_admission import (
    AdmissionConfig,
    MemoryReading,
    ProcessGroupHalt,
    SessionHalt,
    SessionWatchdog,
)
from kits.suitekit import MIB

#: Internal on purpose: the escalations still waiting out their grace period.
INTERNAL = "the watchdog's halt tasks, for the escalations still pending"


def _watchdog(
    reader: FixedReader, registry: CollectorRegistry, halt: object = None, **kwargs: object
) -> SessionWatchdog:
    return SessionWatchdog(
        config=AdmissionConfig(),
        memory_reader=reader,
        registry=registry,
        halt=halt if halt is not None else Recorder(),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


def _gone(process: psutil.Process) -> bool:
    """Wait up to 10 s for a process we did not start to exit (a zombie counts as gone)."""
    for _ in range(100):
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _halted(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("asgi_admission_sessions_halted_total", {"reason": reason})


def _peaks(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("asgi_admission_session_memory_bytes_count")


def test_over_budget_is_halted(
    spawn: Spawn, calm: FixedReader, registry: CollectorRegistry
) -> None:
    """A session whose RSS grows past its budget is halted once, with budget_exceeded."""
    action, told = Recorder(), Recorder()
    watchdog = _watchdog(calm, registry, halt=action, on_halt=told)
    small, big = spawn(16), spawn(16)
    keep = watchdog.register(small.pid, budget_bytes=256 * MIB, session_id="small")
    over = watchdog.register(big.pid, budget_bytes=64 * MIB, session_id="big")
    assert watchdog.sample_once() == ()
    big.grow(96)
    (halt,) = watchdog.sample_once()
    assert (halt.reason, halt.session_id, halt.pid) == ("budget_exceeded", "big", big.pid)
    assert halt.rss_bytes > 96 * MIB
    assert halt.budget_bytes == 64 * MIB
    assert halt.memory is None
    assert "over its budget of 64 MiB" in halt.message
    assert action.events == [halt]
    assert told.events == [halt]
    assert over.halt is halt
    assert keep.halt is None
    assert watchdog.sample_once() == ()  # halted once, not every tick
    assert _halted(registry, "budget_exceeded") == 1
    assert _halted(registry, "container_headroom") == 0
    assert _peaks(registry) == 1


def test_default_halt_terminates_the_group(spawn: Spawn, calm: FixedReader) -> None:
    """Without an event loop the default action sends SIGTERM to the whole process group."""
    watchdog = _watchdog(calm, CollectorRegistry(), halt=ProcessGroupHalt())
    child = spawn(16, children=1, child_mib=8)
    grandchild = psutil.Process(child.pid).children()[0]
    watchdog.register(child.pid, budget_bytes=16 * MIB)
    (halt,) = watchdog.sample_once()
    assert halt.reason == "budget_exceeded"
    assert child.popen.wait(timeout=10) == -signal.SIGTERM
    assert _gone(grandchild)
    watchdog.sample_once()
    assert watchdog.sessions == ()


def test_default_halt_spares_our_own_group(spawn: Spawn, calm: FixedReader) -> None:
    """A session process in the server's own group is signalled alone, never the group."""
    watchdog = _watchdog(calm, CollectorRegistry(), halt=ProcessGroupHalt())
    child = spawn(16, new_session=False, children=1, child_mib=8)
    grandchild = psutil.Process(child.pid).children()[0]
    watchdog.register(child.pid, budget_bytes=20 * MIB)
    (halt,) = watchdog.sample_once()
    assert halt.session.descendant_pids == (grandchild.pid,)
    assert child.popen.wait(timeout=10) == -signal.SIGTERM
    assert _gone(grandchild)


@pytest.mark.anyio
async def test_sigkill_after_grace(spawn: Spawn, calm: FixedReader) -> None:
    """A process that ignores SIGTERM is killed with SIGKILL once the grace period ends."""
    watchdog = _watchdog(calm, CollectorRegistry(), halt=ProcessGroupHalt(grace_s=0.3))
    child = spawn(16, ignore_term=True)
    watchdog.register(child.pid, budget_bytes=8 * MIB)
    started = time.monotonic()
    watchdog.sample_once()
    await asyncio.sleep(0.1)
    assert child.popen.poll() is None  # SIGTERM ignored, grace not over
    for _ in range(50):
        await asyncio.sleep(0.1)
        if child.popen.poll() is not None:
            break
    assert child.popen.returncode == -signal.SIGKILL
    assert time.monotonic() - started >= 0.3
    await watchdog.stop()


@pytest.mark.anyio
async def test_escalation_ends_early_when_the_process_leaves(
    spawn: Spawn, calm: FixedReader
) -> None:
    """A process that obeys SIGTERM is not waited on for the whole grace period."""
    watchdog = _watchdog(calm, CollectorRegistry(), halt=ProcessGroupHalt(grace_s=30))
    child = spawn(16, new_session=False)
    watchdog.register(child.pid, budget_bytes=8 * MIB)
    watchdog.sample_once()
    assert child.popen.wait(timeout=10) == -signal.SIGTERM
    for _ in range(50):
        await asyncio.sleep(0.1)
        if not watchdog._halt_tasks:
            break
    assert not watchdog._halt_tasks


@pytest.mark.anyio
async def test_stop_kills_a_pending_escalation(spawn: Spawn, calm: FixedReader) -> None:
    """Stopping the watchdog while a halt waits out its grace period kills at once."""
    watchdog = _watchdog(calm, CollectorRegistry(), halt=ProcessGroupHalt(grace_s=30))
    child = spawn(16, ignore_term=True)
    watchdog.register(child.pid, budget_bytes=8 * MIB)
    watchdog.sample_once()
    await asyncio.sleep(0.2)
    assert child.popen.poll() is None
    await watchdog.stop()
    assert child.popen.wait(timeout=10) == -signal.SIGKILL
    assert not watchdog._halt_tasks


def test_container_breach_halts_the_largest_first(
    spawn: Spawn, registry: CollectorRegistry
) -> None:
    """Above the critical watermark the largest session goes first, and only as many as needed."""
    limit = 1024 * MIB
    reader = FixedReader(reading(80.0, limit))
    told = Recorder()
    watchdog = _watchdog(reader, registry, on_halt=told, critical_watermark_percent=90)
    small, large, medium = spawn(16), spawn(112), spawn(48)
    sessions = {c.pid: watchdog.register(c.pid) for c in (small, large, medium)}
    assert watchdog.sample_once() == ()
    # 92%: freeing the largest (~120 MiB, ~12%) brings it under 90%.
    reader.reading = reading(92.0, limit)
    (halt,) = watchdog.sample_once()
    assert (halt.reason, halt.pid) == ("container_headroom", large.pid)
    assert halt.memory is reader.reading
    assert halt.budget_bytes is None
    assert halt.critical_watermark_percent == 90
    assert "largest session" in halt.message
    # Still 92% while the largest is exiting: its RSS counts as being freed.
    assert watchdog.sample_once() == ()
    # Worse: enough over that the medium and then the small one must go too.
    rss = {pid: s.last_sample.rss_bytes for pid, s in sessions.items() if s.last_sample}
    over = int(limit * 0.9) + rss[large.pid] + rss[medium.pid] + rss[small.pid] // 2
    reader.reading = MemoryReading(used_bytes=over, limit_bytes=limit, available=True)
    halts = watchdog.sample_once()
    assert [h.pid for h in halts] == [medium.pid, small.pid]
    assert [e.pid for e in told.events] == [large.pid, medium.pid, small.pid]
    assert all(s.halt is not None for s in sessions.values())
    assert _halted(registry, "container_headroom") == 3
    assert _peaks(registry) == 3


def test_container_check_skipped_without_a_usable_reading(
    spawn: Spawn, registry: CollectorRegistry
) -> None:
    """A blind or unlimited reading halts nothing; with no sessions nothing is read at all."""
    reader = FixedReader(reading(10.0))
    watchdog = _watchdog(reader, registry)
    assert watchdog.sample_once() == ()
    assert reader.calls == 0
    child = spawn(16)
    watchdog.register(child.pid)
    for blind in (
        MemoryReading(used_bytes=None, limit_bytes=None, available=False),
        MemoryReading(used_bytes=10**12, limit_bytes=None, available=True),
    ):
        reader.reading = blind
        assert watchdog.sample_once() == ()
    assert reader.calls == 2


def test_exit_by_itself_is_a_normal_end(
    spawn: Spawn, calm: FixedReader, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """A child that exits on its own is dropped, its peak recorded, and nothing logged."""
    watchdog = _watchdog(calm, registry)
    child = spawn(32)
    session = watchdog.register(child.pid, budget_bytes=512 * MIB)
    watchdog.sample_once()
    peak = session.peak_rss_bytes
    assert child.finish() == 0
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="asgi_admission"):
        assert watchdog.sample_once() == ()
    assert caplog.records == []
    assert session.ended
    assert watchdog.sessions == ()
    assert peak is not None
    assert peak > 32 * MIB
    assert _peaks(registry) == 1
    assert registry.get_sample_value("asgi_admission_session_memory_bytes_sum") == peak
    session.unregister()  # after the end: harmless, not observed twice
    assert _peaks(registry) == 1


def test_halted_session_leaves_when_its_process_does(
    spawn: Spawn, calm: FixedReader, registry: CollectorRegistry
) -> None:
    """A halted session stays (counted as freeing memory) until its process is gone."""
    watchdog = _watchdog(calm, registry)
    child = spawn(32)
    session = watchdog.register(child.pid, budget_bytes=8 * MIB)
    watchdog.sample_once()
    watchdog.sample_once()
    # A local, not the property: mypy would keep this narrowing past the next sample.
    halted = watchdog.sessions
    assert halted == (session,)
    assert not session.ended
    child.finish()
    watchdog.sample_once()
    assert watchdog.sessions == ()
    assert session.ended
    assert _peaks(registry) == 1  # observed at the halt, not again at the end


def test_no_sampling_after_unregister(
    spawn: Spawn, calm: FixedReader, registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After unregistering, no tick reads the process's memory again."""
    read: list[int] = []
    original = psutil.Process.memory_info

    def spy(self: psutil.Process) -> object:
        read.append(self.pid)
        return original(self)

    # psutil's oneshot() caches memory_info through attributes of the original.
    spy.cache_activate = original.cache_activate  # type: ignore[attr-defined]
    spy.cache_deactivate = original.cache_deactivate  # type: ignore[attr-defined]
    monkeypatch.setattr(psutil.Process, "memory_info", spy)
    watchdog = _watchdog(calm, registry)
    child, other = spawn(16), spawn(16)
    with watchdog.register(child.pid) as session:
        watchdog.register(other.pid)
        watchdog.sample_once()
        last = session.last_sample
    assert child.pid in read
    read.clear()
    watchdog.sample_once()
    watchdog.sample_once()
    assert child.pid not in read
    assert other.pid in read
    assert session.ended
    assert session.last_sample is last
    assert _peaks(registry) == 1


def test_children_excluded_on_request(
    spawn: Spawn, calm: FixedReader, registry: CollectorRegistry
) -> None:
    """include_children=False measures the session's own process only."""
    watchdog = _watchdog(calm, registry)
    child = spawn(16, children=1, child_mib=64)
    alone = watchdog.register(child.pid, include_children=False)
    tree = watchdog.register(child.pid)
    watchdog.sample_once()
    assert alone.last_sample is not None
    assert tree.last_sample is not None
    assert (alone.last_sample.processes, tree.last_sample.processes) == (1, 2)
    assert tree.last_sample.rss_bytes - alone.last_sample.rss_bytes > 64 * MIB


def test_unregistered_during_a_tick_is_not_sampled(
    spawn: Spawn, calm: FixedReader, registry: CollectorRegistry
) -> None:
    """A session unregistered by an on_halt callback mid-tick is skipped for the rest of it."""
    first, second = spawn(16), spawn(16)
    later: list[Any] = []

    def end_the_other(event: SessionHalt) -> None:
        later[0].unregister()

    watchdog = _watchdog(calm, registry, on_halt=end_the_other)
    watchdog.register(first.pid, budget_bytes=MIB)
    later.append(watchdog.register(second.pid, budget_bytes=MIB))
    halts = watchdog.sample_once()
    assert [h.pid for h in halts] == [first.pid]
    assert later[0].ended
    assert later[0].last_sample is None
    assert _peaks(registry) == 1


class _Stub:
    """Stands in for a WatchedSession, to put the default halt in states races produce."""

    def __init__(self, pid: int, process: psutil.Process | None = None, kids: Any = ()) -> None:
        self.pid = pid
        self.session_id = str(pid)
        self.process = process
        self.descendant_pids = tuple(kids)

    def is_running(self) -> bool:
        return True


def _event(session: Any) -> SessionHalt:
    return SessionHalt(
        session=session,
        reason="budget_exceeded",
        rss_bytes=1,
        budget_bytes=None,
        memory=None,
        critical_watermark_percent=90,
        message="",
    )


def test_default_halt_of_a_gone_session_is_quiet(spawn: Spawn, calm: FixedReader) -> None:
    """Halting a session whose process has left (or never was) does nothing and raises nothing."""
    watchdog = _watchdog(calm, CollectorRegistry())
    child = spawn(0)
    session = watchdog.register(child.pid)
    child.finish()
    halt = ProcessGroupHalt()
    assert halt(_event(session)) is None
    assert halt(_event(_Stub(2**22 + 1))) is None  # getpgid finds nobody
    # The pid is in a group, but the process psutil knew has gone: nobody to signal.
    lone, bystander = spawn(0, new_session=False), spawn(0, new_session=False)
    process = psutil.Process(lone.pid)
    lone.finish()
    assert halt(_event(_Stub(bystander.pid, process))) is None
    assert bystander.popen.poll() is None


def test_default_halt_skips_descendants_already_gone(spawn: Spawn) -> None:
    """A descendant that left since the last sample is skipped; the process itself is signalled."""
    child = spawn(0, new_session=False)
    stub = _Stub(child.pid, psutil.Process(child.pid), kids=[2**22 + 1])
    assert ProcessGroupHalt()(_event(stub)) is None  # no loop: SIGTERM only
    assert child.popen.wait(timeout=10) == -signal.SIGTERM


@pytest.mark.anyio
async def test_sigkill_after_grace_outside_a_group(spawn: Spawn, calm: FixedReader) -> None:
    """A process in our own group that ignores SIGTERM is killed alone after the grace period."""
    watchdog = _watchdog(calm, CollectorRegistry(), halt=ProcessGroupHalt(grace_s=0.3))
    child = spawn(16, new_session=False, ignore_term=True)
    watchdog.register(child.pid, budget_bytes=8 * MIB)
    watchdog.sample_once()
    for _ in range(50):
        await asyncio.sleep(0.1)
        if child.popen.poll() is not None:
            break
    assert child.popen.returncode == -signal.SIGKILL
    await watchdog.stop()


@pytest.mark.parametrize("method", ["status", "memory_info"])
def test_access_denied_is_a_normal_end(
    spawn: Spawn,
    calm: FixedReader,
    registry: CollectorRegistry,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
) -> None:
    """A process psutil may no longer read ends its session quietly, like one that exited."""
    watchdog = _watchdog(calm, registry)
    child = spawn(16)
    session = watchdog.register(child.pid)
    watchdog.sample_once()

    def denied(self: psutil.Process) -> Any:
        raise psutil.AccessDenied(self.pid)

    denied.cache_activate = psutil.Process.memory_info.cache_activate  # type: ignore[attr-defined]
    denied.cache_deactivate = psutil.Process.memory_info.cache_deactivate  # type: ignore[attr-defined]
    monkeypatch.setattr(psutil.Process, method, denied)
    assert watchdog.sample_once() == ()
    assert session.ended
    assert _peaks(registry) == 1
