"""A session as the watchdog keeps it: what its tick and halts record, and what the
handle then shows."""

from __future__ import annotations

from asgi_admission import ProcessSample, SessionHalt, WatchedSession
from asgi_admission._watchdog.session import SessionWatch
from kits.suitekit import MIB

INTERNAL = "the watchdog's own side of a session handle (what it records in it)"


class Table:
    """Stands in for the watchdog the handle unregisters from."""

    def unregister(self, session: WatchedSession) -> None:
        pass


def watch() -> SessionWatch:
    return SessionWatch(
        Table(), None, pid=1, session_id="s", budget_bytes=None, include_children=True
    )


def sample(rss_mb: int) -> ProcessSample:
    return ProcessSample(rss_bytes=rss_mb * MIB, cpu_percent=0.0, processes=1, at=0.0)


def test_each_sample_is_the_last_and_the_highest_is_the_peak() -> None:
    session = watch()
    assert (session.last_sample, session.peak_rss_bytes) == (None, None)
    for rss_mb in (10, 30, 20):
        session.record(sample(rss_mb))
    assert session.last_sample == sample(20)
    assert session.peak_rss_bytes == 30 * MIB


def test_a_sample_outside_the_peak_is_only_the_last() -> None:
    """A sample taken as the kernel killed in the session's memory group is its last,
    and leaves the peak alone (the group's own peak is the session's)."""
    session = watch()
    session.record(sample(10))
    session.record(sample(40), peak=False)
    assert session.last_sample == sample(40)
    assert session.peak_rss_bytes == 10 * MIB


def test_a_halt_and_an_end_show_on_the_handle() -> None:
    session = watch()  # no sampler: its process was gone at registration
    assert session.ended is True
    running = SessionWatch(
        Table(), None, pid=2, session_id="t", budget_bytes=None, include_children=True
    )
    halt = SessionHalt(
        session=running,
        reason="budget_exceeded",
        rss_bytes=0,
        budget_bytes=None,
        memory=None,
        critical_watermark_percent=95.0,
        message="halted",
    )
    running.halted(halt)
    running.end()
    assert (running.halt, running.ended) == (halt, True)


def test_a_peak_is_claimed_once() -> None:
    session = watch()
    assert [session.claim_peak() for _ in range(3)] == [True, False, False]
