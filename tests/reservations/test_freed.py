"""Memory freed by ended sessions, matched against the readings' falls (pure, fake times)."""

from __future__ import annotations

from asgi_admission._admission.reservations.settling import (
    FREED_WITHIN_S,
    ExactReading,
    FreedMemory,
    QueueRecord,
    without_freed,
)
from kits.suitekit import MIB

INTERNAL = "the freed memory of settling, on synthetic readings"


def readings(freed: FreedMemory, values_mb: list[int], *, start: float, step: float) -> list[int]:
    """Feed readings ``step`` apart from ``start``; what they showed freed (MiB)."""
    found: list[int] = []
    for i, value in enumerate(values_mb):
        now = start + i * step
        seen = freed.step(value * MIB, now)
        if seen is not None:
            found.append(seen.bytes // MIB)
        freed.moved(ExactReading(value * MIB, now, None))
    return found


def test_only_a_fall_counts_as_freed_never_the_footprint_alone() -> None:
    """An end owing 96 MiB while the working set stays flat (nothing growing before)
    frees nothing; a later fall of 40 MiB frees 40."""
    freed = FreedMemory()
    readings(freed, [200, 200], start=0.0, step=0.25)
    freed.ended(96 * MIB, ExactReading(200 * MIB, 0.25, None), 0.3)
    assert readings(freed, [200, 200, 160], start=0.5, step=0.25) == [40]
    # The other 56 MiB are still owed, for a while: the next fall frees them.
    assert readings(freed, [100], start=1.25, step=0.25) == [56]


def test_growth_hidden_by_the_fall_counts_as_freed_at_the_slower_recent_rate() -> None:
    """Memory rising 32 MiB a step, then a step in which 96 MiB were freed: the fall of 64
    and the 32 it hid count as freed, capped by what was owed."""
    freed = FreedMemory()
    readings(freed, [100, 132, 164, 196], start=0.0, step=0.25)
    freed.ended(96 * MIB, ExactReading(196 * MIB, 0.75, None), 0.8)
    assert readings(freed, [132], start=1.0, step=0.25) == [96]
    assert readings(freed, [100], start=1.25, step=0.25) == []  # nothing more owed


def test_freed_memory_owed_lapses_when_no_fall_comes() -> None:
    """An end whose memory is kept (a kernel held for a reconnect) lapses after FREED_WITHIN_S:
    a fall long after it frees nothing."""
    freed = FreedMemory()
    readings(freed, [200], start=0.0, step=0.25)
    freed.ended(96 * MIB, ExactReading(200 * MIB, 0.0, None), 0.1)
    steps = int(FREED_WITHIN_S / 0.25) + 2
    assert readings(freed, [200] * steps, start=0.25, step=0.25) == []
    assert readings(freed, [100], start=0.25 * (steps + 1), step=0.25) == []


def test_ends_told_since_two_readings_are_never_counted_twice() -> None:
    """Two ends, one since an older reading: one pool, looked for from the older reading, so
    one fall of 50 MiB counts as freed once."""
    freed = FreedMemory()
    readings(freed, [300, 300], start=0.0, step=0.25)
    freed.ended(96 * MIB, ExactReading(300 * MIB, 0.25, None), 0.3)
    freed.ended(96 * MIB, ExactReading(300 * MIB, 0.0, None), 0.3)
    assert readings(freed, [250], start=0.5, step=0.25) == [50]


def test_freed_memory_lowers_the_bases_admitted_by_then_and_what_was_accounted_for() -> None:
    """Sessions admitted after the reading were admitted without the freed memory: their
    bases stay; what is accounted for, if it moved since the reading, stays too."""
    since = ExactReading(300 * MIB, 1.0, 250 * MIB)
    rows = [
        QueueRecord(1, seq, at, base * MIB, 100 * MIB)
        for seq, (at, base) in enumerate([(0.5, 200), (1.0, 280), (1.2, 210)])
    ]
    freed = FreedMemory()
    freed.ended(50 * MIB, since, 1.1)
    found = freed.step(250 * MIB, 1.25)
    assert found is not None
    assert without_freed(250 * MIB, rows, found) == 200 * MIB
    assert [r.base_bytes // MIB for r in rows] == [150, 230, 210]
    assert without_freed(260 * MIB, [], found) == 260 * MIB  # what is accounted for moved: kept
