"""The latch's fast path: an upper-bound reading that admits is the exact decision."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asgi_admission import AdmissionController, MemoryReading

LIMIT = 1000


class BoundReader:
    """A reader with ``read_bound``: the working set ``used`` and its bound ``usage``."""

    def __init__(self, used: int, usage: int, limit: int | None = LIMIT) -> None:
        self.used, self.usage, self.limit = used, usage, limit
        self.full_reads = 0
        self.bound_reads = 0
        self.bound_raises = False
        self.bound_none = False

    def __call__(self) -> MemoryReading:
        self.full_reads += 1
        return MemoryReading(
            used_bytes=self.used,
            limit_bytes=self.limit,
            available=True,
            usage_bytes=self.usage,
            reclaimable_bytes=self.usage - self.used,
        )

    def read_bound(self) -> MemoryReading | None:
        self.bound_reads += 1
        if self.bound_raises:
            raise OSError("gone")
        if self.bound_none:
            return None
        return MemoryReading(
            used_bytes=self.usage, limit_bytes=self.limit, available=True, exact=False
        )


def controller(reader: BoundReader, reserve: int = 100) -> AdmissionController:
    return AdmissionController(
        high_watermark_percent=80,
        resume_threshold_percent=70,
        reserve_bytes=reserve,
        memory_reader=reader,
    )


def test_after_a_normal_decision_an_admitting_bound_skips_the_full_reading() -> None:
    """Once the latch is known clear, a bound far from the ceiling decides alone."""
    reader = BoundReader(used=200, usage=400)
    latch = controller(reader)
    first = latch.evaluate(0, 16)
    assert (first.allowed, first.state, first.memory.exact) == (True, "normal", True)
    assert reader.full_reads == 1
    second = latch.evaluate(0, 16)
    assert (second.allowed, second.state, second.reason, second.transition) == (
        True,
        "normal",
        None,
        None,
    )
    assert second.memory.exact is False
    assert second.memory.used_bytes == 400
    assert reader.full_reads == 1


def test_a_bound_near_the_ceiling_takes_the_full_reading() -> None:
    """Where the bound would not admit, the exact working set decides (and admits)."""
    reader = BoundReader(used=200, usage=750)  # bound: 750 + 100 > 800
    latch = controller(reader)
    latch.evaluate(0, 16)
    decision = latch.evaluate(0, 16)
    assert (decision.allowed, decision.state, decision.memory.exact) == (True, "normal", True)
    assert reader.full_reads == 2


@pytest.mark.parametrize(
    "case", ["first decision", "after pressure", "count cap", "no bound", "bound raises"]
)
def test_no_fast_path_where_it_could_decide_otherwise(case: str) -> None:
    """The full reading is taken before any normal decision, while latched, at the count
    cap, and when the reader has no bound to give."""
    reader = BoundReader(used=200, usage=300)
    latch = controller(reader)
    cap = 16
    if case != "first decision":
        latch.evaluate(0, cap)
    if case == "after pressure":
        reader.used = reader.usage = 900
        assert latch.evaluate(0, cap).state == "pressured"
        reader.used, reader.usage = 750, 760  # between resume and high: still latched
    elif case == "count cap":
        cap = 0
    elif case == "no bound":
        reader.bound_none = True
    elif case == "bound raises":
        reader.bound_raises = True
    before = reader.full_reads
    decision = latch.evaluate(0, cap)
    assert reader.full_reads == before + 1
    assert decision.memory.exact is True


def test_after_blind_decisions_the_full_reading_comes_first() -> None:
    """Telemetry lost and back: the first decision after it is a full one (and logged)."""
    reader = BoundReader(used=200, usage=300)
    latch = controller(reader)
    latch.evaluate(0, 16)
    reader.limit = None
    assert latch.evaluate(0, 16).state == "unavailable"
    reader.limit = LIMIT
    full = reader.full_reads
    assert latch.evaluate(0, 16).memory.exact is True
    assert reader.full_reads == full + 1


def test_a_reader_without_read_bound_always_reads_in_full() -> None:
    """Plain readers (any callable) keep the plain behaviour: one full reading each."""
    calls = []

    def plain() -> MemoryReading:
        calls.append(1)
        return MemoryReading(used_bytes=100, limit_bytes=LIMIT, available=True)

    latch = AdmissionController(memory_reader=plain, reserve_bytes=0)
    for _ in range(3):
        assert latch.evaluate(0, 16).allowed
    assert len(calls) == 3


def test_a_raising_reader_still_raises_from_evaluate() -> None:
    """evaluate() does not swallow a custom reader's error (the caller handles it)."""

    def broken() -> MemoryReading:
        raise OSError("unreadable")

    with pytest.raises(OSError, match="unreadable"):
        AdmissionController(memory_reader=broken).evaluate(0, 16)


# Mostly readings with a limit and room under the count cap, working sets often near
# the ceiling, and caches often small: where the fast path runs and could be wrong.
step = st.tuples(
    st.one_of(st.integers(0, 1100), st.integers(450, 950)),  # working set
    st.one_of(st.integers(0, 20), st.integers(0, 300)),  # cache on top: usage = used + cache
    st.integers(0, 3),  # pending
    st.integers(0, 3),  # current
    st.sampled_from([LIMIT] * 9 + [None]),  # a limit, or none (blind)
)


# A latch's settings and a sequence of readings: what both fast paths are checked over.
latch_sequences = given(
    high=st.integers(50, 100),
    gap=st.integers(0, 40),
    reserve=st.integers(0, 200),
    cap=st.one_of(st.integers(0, 12), st.none()),  # None: no count cap while readable
    steps=st.lists(step, min_size=2, max_size=25),
)


@settings(max_examples=500, deadline=None)
@latch_sequences
def test_fast_path_decides_exactly_as_the_full_reading_would(
    high: int,
    gap: int,
    reserve: int,
    cap: int | None,
    steps: list[tuple[int, int, int, int, int | None]],
) -> None:
    """Over any sequence of readings, the fast path's decisions and latch states equal
    those of a latch that always reads the exact working set."""
    resume = max(1, high - gap)
    fast_reader = BoundReader(used=0, usage=0)
    fast = AdmissionController(
        high_watermark_percent=high,
        resume_threshold_percent=resume,
        reserve_bytes=reserve,
        memory_reader=fast_reader,
    )
    exact = AdmissionController(
        high_watermark_percent=high,
        resume_threshold_percent=resume,
        reserve_bytes=reserve,
        memory_reader=fast_reader,
    )
    for used, cache, pending, current, limit in steps:
        fast_reader.used, fast_reader.usage, fast_reader.limit = used, used + cache, limit
        got = fast.evaluate(current, cap, pending)
        want = exact.decide(fast_reader(), current, cap, pending)
        assert dataclasses.astuple(got)[:2] + dataclasses.astuple(got)[3:] == (
            dataclasses.astuple(want)[:2] + dataclasses.astuple(want)[3:]
        )
        assert fast.pressure_state == exact.pressure_state


def fast(latch: AdmissionController, current: int = 0, pending: int = 0) -> bool:
    """Whether ``assess`` decided on the bound (the fast path) rather than a full reading."""
    return latch.assess(current, 16, pending).memory.exact is False


def test_the_fast_path_declines_whatever_is_uncertain() -> None:
    """No full decision yet, a latch set, the count cap, a reader error or no bound:
    the full reading decides."""
    reader = BoundReader(used=100, usage=150)
    latch = controller(reader)
    assert not fast(latch)  # nothing decided in full yet
    assert fast(latch)
    assert not fast(latch, current=10, pending=6)  # at the cap
    reader.bound_raises = True
    assert not fast(latch)
    reader.bound_raises, reader.bound_none = False, True
    assert not fast(latch)
    reader.bound_none = False
    reader.limit = 0  # a bound with no limit to take a share of: blind, decided in full
    assert not fast(latch)
    reader.limit = LIMIT
    assert not fast(latch)  # the last full decision was blind
    assert fast(latch)
    reader.used = reader.usage = 900
    assert latch.evaluate(0, 16).state == "pressured"
    reader.used = reader.usage = 100
    assert not fast(latch)  # latched: only a full reading clears (and this one does)
    assert fast(latch)


def test_without_a_count_cap_the_fast_path_runs_at_any_count() -> None:
    """With no count cap (None) and memory far below the ceiling, a thousand sessions are
    admitted on the bound; while blind the fallback cap of 16 refuses, read in full."""
    reader = BoundReader(used=100, usage=150)
    latch = controller(reader)
    latch.evaluate(0, None)
    decision = latch.assess(1000, None, 5)
    assert (decision.allowed, decision.memory.exact) == (True, False)
    reader.limit = None
    blind = latch.assess(16, None)
    assert (blind.allowed, blind.reason, blind.memory.exact) == (False, "no_memory_limit", True)
