"""Memory freed by ended sessions, credited against the readings' falls (pure, fake times)."""

from __future__ import annotations

from dataclasses import dataclass

from asgi_admission._admission.reservations.settling import CREDIT_S, FreedMemory, Mark, credited
from kits.suitekit import MIB

INTERNAL = "the freed-memory credits of settling, on synthetic readings"


@dataclass
class Row:
    admitted_at: float
    base_bytes: int


def readings(freed: FreedMemory, values_mb: list[int], *, start: float, step: float) -> list[int]:
    """Feed readings ``step`` apart from ``start``; the credits (MiB) they gave."""
    found: list[int] = []
    for i, value in enumerate(values_mb):
        now = start + i * step
        credit = freed.step(value * MIB, now)
        if credit is not None:
            found.append(credit.bytes // MIB)
        freed.moved(Mark(value * MIB, now, None))
    return found


def test_only_a_fall_is_credited_never_the_footprint_alone() -> None:
    """An end owing 96 MiB while the working set stays flat (nothing growing before)
    credits nothing; a later fall of 40 MiB is credited 40."""
    freed = FreedMemory()
    readings(freed, [200, 200], start=0.0, step=0.25)
    freed.ended(96 * MIB, Mark(200 * MIB, 0.25, None), 0.3)
    assert readings(freed, [200, 200, 160], start=0.5, step=0.25) == [40]
    assert freed.owed  # 56 MiB still owed, for a while


def test_growth_hidden_by_the_fall_is_credited_at_the_slower_recent_rate() -> None:
    """Memory rising 32 MiB a step, then a step in which 96 MiB were freed: the fall of 64
    and the 32 it hid are credited, capped by what was owed."""
    freed = FreedMemory()
    readings(freed, [100, 132, 164, 196], start=0.0, step=0.25)
    freed.ended(96 * MIB, Mark(196 * MIB, 0.75, None), 0.8)
    assert readings(freed, [132], start=1.0, step=0.25) == [96]
    assert not freed.owed


def test_a_credit_lapses_when_no_fall_comes() -> None:
    """An end whose memory is kept (a kernel held for a reconnect) lapses after CREDIT_S:
    a fall long after it is credited nothing."""
    freed = FreedMemory()
    readings(freed, [200], start=0.0, step=0.25)
    freed.ended(96 * MIB, Mark(200 * MIB, 0.0, None), 0.1)
    steps = int(CREDIT_S / 0.25) + 2
    assert readings(freed, [200] * steps, start=0.25, step=0.25) == []
    assert not freed.owed
    assert readings(freed, [100], start=0.25 * (steps + 1), step=0.25) == []


def test_ends_told_with_two_marks_are_never_credited_twice() -> None:
    """Two ends, one from an older mark: one pool, looked for from the older mark, so one
    fall of 50 MiB is credited once."""
    freed = FreedMemory()
    readings(freed, [300, 300], start=0.0, step=0.25)
    freed.ended(96 * MIB, Mark(300 * MIB, 0.25, None), 0.3)
    freed.ended(96 * MIB, Mark(300 * MIB, 0.0, None), 0.3)
    assert readings(freed, [250], start=0.5, step=0.25) == [50]


def test_the_credit_lowers_the_bases_admitted_by_the_mark_and_an_unmoved_floor() -> None:
    """Sessions admitted after the mark were admitted without the freed memory: their
    bases stay; a floor that moved since the mark stays too."""
    mark = Mark(300 * MIB, 1.0, 250 * MIB)
    rows = [Row(0.5, 200 * MIB), Row(1.0, 280 * MIB), Row(1.2, 210 * MIB)]
    credit = FreedMemory()
    credit.ended(50 * MIB, mark, 1.1)
    found = credit.step(250 * MIB, 1.25)
    assert found is not None
    assert credited(250 * MIB, rows, found) == 200 * MIB
    assert [r.base_bytes // MIB for r in rows] == [150, 230, 210]
    assert credited(260 * MIB, [], found) == 260 * MIB  # the floor moved: kept
