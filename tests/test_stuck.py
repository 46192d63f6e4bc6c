"""The stuck-pressure detector over tables of checks, its attribution, its liveness delay
and its status file."""

from __future__ import annotations

import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asgi_admission import AdmissionController, MemoryReading
from asgi_admission._admission.decision.stuck import (
    LIVENESS_JITTER_SHARE,
    STUCK_FILE,
    StuckDetector,
    StuckFile,
    attribute_working_set,
    holds_latch,
    liveness_delay_s,
    read_stuck,
)

#: Internal on purpose: the detector is a private state machine the guard feeds.
INTERNAL = "the stuck-pressure detector and its attribution, on constant readings"

LIMIT = 1000  # bytes: used 850 is 85 %
AFTER_S = 300.0


def reading(used: int) -> MemoryReading:
    return MemoryReading(used_bytes=used, limit_bytes=LIMIT, available=True)


def latch(reserve: int = 100) -> AdmissionController:
    """High 80 %, resume 70 %, a fixed reserve; its reader is never called here."""
    return AdmissionController(
        high_watermark_percent=80,
        resume_threshold_percent=70,
        reserve_bytes=reserve,
        memory_reader=lambda: reading(0),
    )


def detector(
    reserve: int = 100, *, after_s: float = AFTER_S, delay_s: float = 0.0
) -> StuckDetector:
    return StuckDetector(controller=latch(reserve), after_s=after_s, liveness_delay_s=delay_s)


def test_a_latch_held_with_no_session_open_becomes_stuck_at_after_s() -> None:
    """Latched at 85 % with no session at all: watched at once, stuck exactly at after_s."""
    watch = detector()
    assert watch.observe(0.0, latched=True, memory=reading(850), active=0, pending=0) == "holding"
    assert watch.observe(299.0, latched=True, memory=reading(850), active=0, pending=0) is None
    assert not watch.status().stuck
    assert watch.observe(300.0, latched=True, memory=reading(850), active=0, pending=0) == "stuck"
    status = watch.status()
    assert status.stuck
    assert status.held_s == 300.0
    assert status.attribution is not None
    assert (status.attribution.attributed_bytes, status.attribution.unattributed_bytes) == (0, 850)
    # Said once: later checks change nothing.
    assert watch.observe(400.0, latched=True, memory=reading(850), active=0, pending=0) is None


def test_a_latch_set_by_sessions_that_are_ending_is_never_stuck() -> None:
    """Sessions ending one by one, each well within after_s: never stuck in 6000 s
    (twenty times after_s)."""
    watch = detector()
    changes = []
    for step in range(200):
        now = step * 30.0
        # Down from 9 sessions, one ending every 150 s; memory freed late, if at all.
        active = max(0, 9 - step // 5)
        if active == 0:
            break
        changes.append(
            watch.observe(now, latched=True, memory=reading(900), active=active, pending=0)
        )
        assert not watch.status().stuck, (now, active)
    assert "stuck" not in changes


def test_a_pending_session_keeps_it_from_being_stuck() -> None:
    """A session still settling holds a reserve that will be given back: never stuck."""
    watch = detector()
    for now in (0.0, 300.0, 1000.0):
        assert watch.observe(now, latched=True, memory=reading(900), active=0, pending=1) is None
    assert not watch.status().stuck


def test_open_sessions_whose_reserves_could_clear_it_are_not_stuck() -> None:
    """Two open sessions of 100 each at 85 %: their end would take it to 65 %, so it waits."""
    watch = detector()
    for now in (0.0, 300.0, 3000.0):
        assert watch.observe(now, latched=True, memory=reading(850), active=2, pending=0) is None
    assert not watch.status().stuck


def test_a_leak_beyond_what_the_open_sessions_account_for_is_stuck() -> None:
    """One open session of 100 at 90 %: 80 % is the server's own, so it is stuck in time."""
    watch = detector()
    assert watch.observe(0.0, latched=True, memory=reading(900), active=1, pending=0) == "holding"
    assert watch.observe(300.0, latched=True, memory=reading(900), active=1, pending=0) == "stuck"
    split = watch.status().attribution
    assert split is not None
    assert (split.attributed_bytes, split.unattributed_bytes) == (100, 800)


def test_a_reserve_that_no_longer_fits_holds_it_below_the_resume_threshold() -> None:
    """At 60 % with a reserve of 300 (no room under 80 %) and no session: stuck all the same."""
    watch = detector(reserve=300)
    watch.observe(0.0, latched=True, memory=reading(600), active=0, pending=0)
    assert watch.observe(300.0, latched=True, memory=reading(600), active=0, pending=0) == "stuck"


def test_it_clears_when_the_latch_clears() -> None:
    """Once memory falls and the latch clears, the pressure is no longer stuck, said once."""
    watch = detector()
    watch.observe(0.0, latched=True, memory=reading(850), active=0, pending=0)
    watch.observe(300.0, latched=True, memory=reading(850), active=0, pending=0)
    assert (
        watch.observe(310.0, latched=False, memory=reading(650), active=0, pending=0) == "cleared"
    )
    assert not watch.status().stuck
    assert watch.status().held_s == 0.0
    assert watch.observe(320.0, latched=False, memory=reading(650), active=0, pending=0) is None


def test_a_session_that_ends_while_stuck_starts_the_wait_again() -> None:
    """Sessions moving while stuck: cleared, and stuck again only a whole after_s later."""
    watch = detector()
    watch.observe(0.0, latched=True, memory=reading(950), active=1, pending=0)
    assert watch.observe(300.0, latched=True, memory=reading(950), active=1, pending=0) == "stuck"
    assert watch.observe(310.0, latched=True, memory=reading(950), active=0, pending=0) == "cleared"
    assert watch.observe(609.0, latched=True, memory=reading(950), active=0, pending=0) is None
    assert watch.observe(610.0, latched=True, memory=reading(950), active=0, pending=0) == "stuck"


def test_blind_readings_and_an_after_s_of_zero_are_never_stuck() -> None:
    """No limit to compare with, or detection off (0): nothing is ever called stuck."""
    blind = detector()
    unlimited = MemoryReading(used_bytes=900, limit_bytes=None, available=True)
    off = detector(after_s=0)
    for now in (0.0, 300.0, 900.0):
        assert blind.observe(now, latched=True, memory=unlimited, active=0, pending=0) is None
        assert off.observe(now, latched=True, memory=reading(900), active=0, pending=0) is None
    assert not blind.status().stuck
    assert not off.status().stuck


def test_liveness_fails_only_after_its_delay_past_after_s() -> None:
    """Stuck at 300 s; the liveness answer fails from 300 s plus its delay (40 s here)."""
    watch = detector(delay_s=40.0)
    watch.observe(0.0, latched=True, memory=reading(850), active=0, pending=0)
    watch.observe(300.0, latched=True, memory=reading(850), active=0, pending=0)
    assert watch.status().stuck
    assert not watch.status(339.0).liveness_failing
    assert watch.status(340.0).liveness_failing


@pytest.mark.parametrize("after_s", [2.0, 300.0])
def test_liveness_delays_lie_within_half_of_after_s_and_spread_over_it(after_s: float) -> None:
    """Over 2000 pod names: every delay in [0, after_s/2), the same name always the same,
    and the delays spread over the whole range (replicas do not fail at once)."""
    names = [f"terminals-7d9f-{n:05d}" for n in range(2000)]
    delays = [liveness_delay_s(after_s, name) for name in names]
    bound = after_s * LIVENESS_JITTER_SHARE
    assert all(0 <= d < bound for d in delays)
    assert delays == [liveness_delay_s(after_s, name) for name in names]
    assert min(delays) < 0.01 * bound
    assert max(delays) > 0.99 * bound
    assert abs(statistics.median(delays) - bound / 2) < 0.05 * bound
    assert len(set(delays)) == len(delays)


def test_attribution_counts_one_reserve_per_session_at_most_the_working_set() -> None:
    """Three sessions of reserve 400 in a working set of 700: all of it is theirs, none left."""
    split = attribute_working_set(latch(reserve=400), reading(700), 3)
    assert split is not None
    assert (split.attributed_bytes, split.unattributed_bytes) == (700, 0)
    assert not holds_latch(latch(reserve=400), split)
    assert (
        attribute_working_set(
            latch(), MemoryReading(used_bytes=None, limit_bytes=None, available=False), 0
        )
        is None
    )


def test_a_negative_after_s_is_an_error_naming_it() -> None:
    """An after_s below 0 is refused with a sentence naming it."""
    with pytest.raises(ValueError, match="after_s must be 0"):
        detector(after_s=-1)


def test_the_status_file_waits_for_a_lock_held_elsewhere(tmp_path: Path) -> None:
    """While another process holds the status file's lock the write is kept, not waited
    for; the next flush writes it."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    store = StuckFile(str(shared))
    watch = detector()
    watch.observe(0.0, latched=True, memory=reading(850), active=0, pending=0)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(shared / STUCK_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "locked\n"
        started = time.monotonic()
        store.write(AFTER_S, 0.0, watch.status())
        assert time.monotonic() - started < 0.5
        assert (shared / STUCK_FILE).read_text() == ""
    finally:
        holder.communicate("done\n", timeout=10)
    store.flush()
    report = read_stuck(str(shared))
    assert report is not None
    assert (report["stuck"], report["working_set_bytes"]) == (False, 850)


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.readline()
"""


def test_an_unusable_status_file_is_logged_once_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A symlink planted at the status file's name: writes log one warning and go on;
    once the file is usable again, that is said once and the status is written."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    (shared / STUCK_FILE).symlink_to(tmp_path / "elsewhere")
    store = StuckFile(str(shared))
    watch = detector()
    watch.observe(0.0, latched=True, memory=reading(850), active=0, pending=0)
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        for _ in range(3):
            store.write(AFTER_S, 0.0, watch.status())
        with pytest.raises(ValueError, match="is a symlink"):
            read_stuck(str(shared))
        (shared / STUCK_FILE).unlink()
        store.flush()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "cannot be used" in messages[0]
    assert "usable again" in messages[1]
    assert not (tmp_path / "elsewhere").exists()
    report = read_stuck(str(shared))
    assert report is not None
    assert report["working_set_bytes"] == 850
