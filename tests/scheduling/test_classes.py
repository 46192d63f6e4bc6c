"""Class ceilings: each class its own latch, and the default class deciding as the latch does."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from asgi_admission import AdmissionController, MemoryReading, PriorityClass
from asgi_admission._admission.decision.latch import CapacityDecision, ClassCeilings
from asgi_admission._admission.scheduling.priority import classes_in_force
from kits.suitekit import GIB, MIB

#: Internal on purpose: the class ceilings, checked against the public latch.
INTERNAL = "the class ceilings, checked against the public latch"

LIMIT = 1000 * MIB


def three() -> ClassCeilings:
    return ClassCeilings(
        classes=(
            PriorityClass(name="critical", high_watermark_percent=90),
            PriorityClass(name="standard", high_watermark_percent=80),
            PriorityClass(name="batch", high_watermark_percent=65),
        ),
        high_watermark_percent=80,
        resume_threshold_percent=70,
    )


def decide(
    ceilings: ClassCeilings, name: str, percent: float, held_percent: float = 0
) -> CapacityDecision:
    memory = MemoryReading(used_bytes=int(LIMIT * percent / 100), limit_bytes=LIMIT, available=True)
    held = int(LIMIT * held_percent / 100)
    return ceilings.decide(
        name, memory, current_sessions=0, session_limit=None, pending_sessions=0, held_bytes=held
    )


def fits(ceilings: ClassCeilings, name: str, percent: float, held_percent: float = 0) -> bool:
    return decide(ceilings, name, percent, held_percent).allowed


def test_each_class_sets_at_its_own_ceiling() -> None:
    """At 70 % batch (65) is refused while standard and critical fit; at 85 % only critical."""
    ceilings = three()
    assert [fits(ceilings, n, 70) for n in ceilings.names] == [True, True, False]
    states = [decide(ceilings, n, 85).state for n in ceilings.names]
    assert states == ["normal", "pressured", "pressured"]


def test_a_class_latch_clears_at_its_ceiling_less_the_gap() -> None:
    """batch's latch, set at 65, holds at 60 and clears at 55 (65 less the 80/70 gap)."""
    ceilings = three()
    assert ceilings.resume_percent("batch") == 55
    assert not fits(ceilings, "batch", 66)
    assert not fits(ceilings, "batch", 60)
    assert not fits(ceilings, "batch", 55.01)
    assert fits(ceilings, "batch", 55)
    assert fits(ceilings, "batch", 60)


def test_the_reserves_count_against_the_class_ceiling() -> None:
    """50 % used with 20 % held back reaches standard's 80 only with critical's 90 to spare."""
    ceilings = three()
    assert not fits(ceilings, "batch", 50, held_percent=20)
    assert fits(ceilings, "standard", 50, held_percent=20)
    assert not fits(ceilings, "standard", 50, held_percent=31)
    assert fits(ceilings, "critical", 50, held_percent=31)


def test_going_blind_clears_every_class() -> None:
    """A blind reading clears every latch and reports the asked class's clearing: each
    class then admits between its resume point and its ceiling."""
    ceilings = three()
    fits(ceilings, "standard", 85)
    fits(ceilings, "batch", 85)
    blind = MemoryReading(used_bytes=None, limit_bytes=None, available=False)
    decision = ceilings.decide(
        "batch", blind, current_sessions=0, session_limit=None, pending_sessions=0, held_bytes=0
    )
    assert (decision.allowed, decision.state) == (True, "unavailable")
    assert decision.transition == "normal"
    between = zip(ceilings.names, (85, 75, 60), strict=True)
    assert [fits(ceilings, n, percent) for n, percent in between] == [True, True, True]


readings = st.one_of(
    st.builds(
        lambda used, limit: MemoryReading(used_bytes=used, limit_bytes=limit, available=True),
        st.integers(min_value=0, max_value=2 * GIB),
        st.integers(min_value=1, max_value=2 * GIB),
    ),
    st.builds(
        lambda fraction, limit: MemoryReading(
            used_bytes=int(limit * fraction), limit_bytes=limit, available=True
        ),
        st.floats(min_value=0.5, max_value=1.0),
        st.sampled_from([GIB, 512 * MIB, 3 * GIB + 7]),
    ),
    st.just(MemoryReading(used_bytes=None, limit_bytes=None, available=False)),
    st.just(MemoryReading(used_bytes=100 * MIB, limit_bytes=None, available=True)),
    st.just(MemoryReading(used_bytes=100 * MIB, limit_bytes=GIB, available=False)),
)
steps = st.lists(
    st.tuples(
        readings,
        st.integers(min_value=0, max_value=20),
        st.one_of(st.none(), st.integers(min_value=0, max_value=20)),
        st.integers(min_value=0, max_value=5),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=600, deadline=None)
@given(
    high=st.one_of(st.sampled_from([80.0, 90.0, 100.0, 33.33]), st.floats(1, 100)),
    gap=st.floats(min_value=0, max_value=60),
    reserve=st.one_of(st.none(), st.integers(min_value=0, max_value=400 * MIB)),
    sequence=steps,
    data=st.data(),
)
def test_the_default_class_decides_exactly_as_the_latch(
    high: float,
    gap: float,
    reserve: int | None,
    sequence: list[tuple[MemoryReading, int, int | None, int]],
    data: st.DataObject,
) -> None:
    """With no classes configured, the one default class gives AdmissionController.decide's
    answer, state, reason and transition on every reading of a random sequence (a third
    of them within 0.01 points of the high watermark or the resume threshold)."""
    resume = max(0.01, high - gap)
    near = st.builds(
        lambda bound, offset, limit: MemoryReading(
            used_bytes=max(0, int(limit * (bound + offset / 1000) / 100)),
            limit_bytes=limit,
            available=True,
        ),
        st.sampled_from([high, resume]),
        st.integers(min_value=-10, max_value=10),
        st.integers(min_value=GIB, max_value=4 * GIB),
    )
    for step, (_, current, session_limit, pending) in enumerate(sequence):
        if data.draw(st.integers(0, 2)) == 0:
            sequence[step] = (data.draw(near), current, session_limit, pending)
    controller = AdmissionController(
        high_watermark_percent=high, resume_threshold_percent=resume, reserve_bytes=reserve
    )
    ceilings = ClassCeilings(
        classes=classes_in_force((), high_watermark_percent=high),
        high_watermark_percent=high,
        resume_threshold_percent=resume,
    )
    [name] = ceilings.names
    for memory, current, session_limit, pending in sequence:
        expected = controller.decide(memory, current, session_limit, pending)
        held = (pending + 1) * controller.reserve_for(memory.limit_bytes)
        got = ceilings.decide(
            name,
            memory,
            current_sessions=current,
            session_limit=session_limit,
            pending_sessions=pending,
            held_bytes=held,
        )
        assert got == expected
