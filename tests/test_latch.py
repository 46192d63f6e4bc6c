"""The latch over tables of reading sequences, its validation and its lock."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asgi_admission import AdmissionController, CapacityDecision, MemoryReading
from asgi_admission._memory.reading import read_cgroup_memory
from kits.suitekit import MIB

#: Internal on purpose: the latch's default reader and its rounding shortcuts.
INTERNAL = "the latch's default reader and its rounding shortcuts"

LIMIT = 1000  # bytes, so that percentages are easy to read off: used 800 is 80 %


@dataclass(frozen=True)
class Step:
    """One evaluation: the reading and counts in, the decision expected out."""

    used: int | None
    allowed: bool
    state: str
    reason: str | None = None
    transition: str | None = None
    current: int = 0
    pending: int = 0
    cap: int | None = 16
    limit: int | None = LIMIT
    available: bool = True


# (high %, resume %, reserve bytes, steps). Defaults: high 80, resume 70, reserve 100.
SEQUENCES: dict[str, tuple[float, float, int, list[Step]]] = {
    "below both conditions admits": (80, 70, 100, [Step(500, True, "normal")]),
    "at the high watermark sets the latch": (
        80,
        70,
        0,
        [Step(800, False, "pressured", "memory_pressure", "pressured")],
    ),
    "just below the high watermark with no reserve admits": (
        80,
        70,
        0,
        [Step(799, True, "normal")],
    ),
    "reserve that no longer fits sets the latch below high": (
        80,
        70,
        100,
        [Step(701, False, "pressured", "memory_pressure", "pressured")],
    ),
    "reserve that fits exactly admits": (80, 70, 100, [Step(700, True, "normal")]),
    "pending reserves count against the ceiling": (
        80,
        70,
        100,
        [Step(601, False, "pressured", "memory_pressure", "pressured", pending=1)],
    ),
    "hysteresis: stays set between resume and high, clears at resume": (
        80,
        70,
        100,
        [
            Step(850, False, "pressured", "memory_pressure", "pressured"),
            Step(750, False, "pressured", "memory_pressure"),
            Step(701, False, "pressured", "memory_pressure"),
            Step(700, True, "normal", None, "normal"),
            Step(750, False, "pressured", "memory_pressure", "pressured"),
        ],
    ),
    "at resume but the reserve does not fit: stays set": (
        80,
        70,
        200,
        [
            Step(900, False, "pressured", "memory_pressure", "pressured"),
            Step(650, False, "pressured", "memory_pressure"),
            Step(600, True, "normal", None, "normal"),
        ],
    ),
    "clearing never re-arms within the same evaluation": (
        80,
        80,
        0,
        [
            Step(800, False, "pressured", "memory_pressure", "pressured"),
            Step(799, True, "normal", None, "normal"),
        ],
    ),
    "count cap while normal": (
        80,
        70,
        100,
        [
            Step(100, False, "normal", "session_limit", current=16),
            Step(100, False, "normal", "session_limit", current=15, pending=1),
            Step(100, True, "normal", current=14, pending=1),
        ],
    ),
    "no count cap while readable: memory alone decides": (
        80,
        70,
        100,
        [
            Step(100, True, "normal", current=1000, cap=None),
            Step(100, True, "normal", current=5, pending=5, cap=None),
            Step(201, False, "pressured", "memory_pressure", "pressured", pending=5, cap=None),
        ],
    ),
    "no count cap while blind: the fallback of 16": (
        80,
        70,
        100,
        [
            Step(None, True, "unavailable", available=False, limit=None, current=15, cap=None),
            Step(
                None,
                False,
                "unavailable",
                "telemetry_unavailable",
                available=False,
                limit=None,
                current=15,
                pending=1,
                cap=None,
            ),
            Step(999, True, "unavailable", limit=None, current=15, cap=None),
            Step(999, False, "unavailable", "no_memory_limit", limit=None, current=16, cap=None),
        ],
    ),
    "a set count cap binds while blind too, above the fallback": (
        80,
        70,
        100,
        [
            Step(999, True, "unavailable", limit=None, current=19, cap=20),
            Step(999, False, "unavailable", "no_memory_limit", limit=None, current=20, cap=20),
        ],
    ),
    "latched refuses even with free slots": (
        80,
        70,
        100,
        [Step(950, False, "pressured", "memory_pressure", "pressured", current=0, cap=100)],
    ),
    "telemetry unavailable: count decides, reason only when refused": (
        80,
        70,
        100,
        [
            Step(None, True, "unavailable", available=False, limit=None, current=15),
            Step(None, False, "unavailable", "telemetry_unavailable", available=False, current=16),
        ],
    ),
    "unlimited or zero limit is treated as blind": (
        80,
        70,
        100,
        [
            Step(999, True, "unavailable", limit=None),
            Step(999, True, "unavailable", limit=0),
            Step(999, False, "unavailable", "no_memory_limit", limit=None, cap=0),
            Step(999, False, "unavailable", "telemetry_unavailable", limit=0, cap=0),
        ],
    ),
    "blindness clears the latch, recovery starts afresh": (
        80,
        70,
        100,
        [
            Step(900, False, "pressured", "memory_pressure", "pressured"),
            Step(None, True, "unavailable", None, "normal", available=False),
            Step(650, True, "normal"),
        ],
    ),
    "zero reserve: only the watermarks matter": (
        90,
        50,
        0,
        [
            Step(899, True, "normal"),
            Step(900, False, "pressured", "memory_pressure", "pressured"),
            Step(501, False, "pressured", "memory_pressure"),
            Step(500, True, "normal", None, "normal"),
        ],
    ),
}


@pytest.mark.parametrize(("high", "resume", "reserve", "steps"), SEQUENCES.values(), ids=SEQUENCES)
def test_latch_sequence(high: float, resume: float, reserve: int, steps: list[Step]) -> None:
    """Each reading in the sequence gives exactly the decision, reason and transition listed."""
    readings: list[MemoryReading] = []
    controller = AdmissionController(
        high_watermark_percent=high,
        resume_threshold_percent=resume,
        reserve_bytes=reserve,
        memory_reader=lambda: readings[-1],
    )
    for number, step in enumerate(steps):
        reading = MemoryReading(
            used_bytes=step.used, limit_bytes=step.limit, available=step.available
        )
        readings.append(reading)
        decision = controller.evaluate(step.current, step.cap, step.pending)
        got = (decision.allowed, decision.state, decision.reason, decision.transition)
        assert got == (step.allowed, step.state, step.reason, step.transition), f"step {number}"
        assert decision.memory is reading
        latched = decision.state == "pressured"
        assert controller.pressure_state == ("pressured" if latched else "normal")


def test_decide_uses_the_given_reading_without_calling_the_reader() -> None:
    """decide() takes a reading the caller already has and leaves the reader alone."""

    def reader() -> MemoryReading:
        raise AssertionError("decide() must not take a reading")

    controller = AdmissionController(reserve_bytes=0, memory_reader=reader)
    reading = MemoryReading(used_bytes=900, limit_bytes=LIMIT, available=True)
    assert controller.decide(reading, 0, 1) == CapacityDecision(
        False, "pressured", reading, "memory_pressure", "pressured"
    )


@pytest.mark.parametrize(
    ("pending", "expected"), [(0, 800 * 1.0 - 100), (2, 800 - 300)], ids=["none", "two"]
)
def test_ceiling_is_high_minus_reserves(pending: int, expected: float) -> None:
    """The admission ceiling is the high watermark minus one reserve per pending session + 1."""
    controller = AdmissionController(reserve_bytes=100, memory_reader=lambda: UNUSED)
    assert controller.ceiling_bytes(LIMIT, pending) == expected


UNUSED = MemoryReading(used_bytes=None, limit_bytes=None, available=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"resume_threshold_percent": 0},
            "resume_threshold_percent and high_watermark_percent must satisfy "
            "0 < resume <= high <= 100; got resume=0, high=80.0.",
        ),
        (
            {"resume_threshold_percent": 90, "high_watermark_percent": 80},
            "resume_threshold_percent and high_watermark_percent must satisfy "
            "0 < resume <= high <= 100; got resume=90, high=80.",
        ),
        (
            {"high_watermark_percent": 101},
            "resume_threshold_percent and high_watermark_percent must satisfy "
            "0 < resume <= high <= 100; got resume=70.0, high=101.",
        ),
        (
            {"reserve_bytes": -1},
            "reserve_bytes must be 0 or more, or None to derive it from the memory limit; got -1.",
        ),
    ],
    ids=["resume zero", "resume above high", "high above 100", "negative reserve"],
)
def test_invalid_settings_raise_full_sentences(kwargs: dict[str, float], message: str) -> None:
    """Settings outside 0 < resume <= high <= 100 or a negative reserve raise ValueError."""
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        AdmissionController(memory_reader=lambda: UNUSED, **kwargs)  # type: ignore[arg-type]


def test_default_reader_is_read_cgroup_memory() -> None:
    """Without a reader the controller reads the cgroup (not called here: no real /sys)."""
    controller = AdmissionController()
    assert controller.memory_reader is read_cgroup_memory
    assert (controller.high_watermark_percent, controller.resume_threshold_percent) == (80.0, 70.0)
    assert controller.reserve_bytes is None
    assert controller.reserve_for(512 * MIB) == 64 * MIB


@pytest.mark.parametrize(
    ("configured_mib", "limit_mib", "reserve_mib"),
    [
        (None, 512, 64),
        (None, 2048, 256),
        (None, 6144, 768),
        (None, 65536, 768),
        (None, None, 768),
        (100, 512, 100),
        (0, 512, 0),
        (2000, 512, 2000),
    ],
)
def test_reserve_for_derives_an_eighth_of_the_limit_at_most_768_mib(
    configured_mib: int | None, limit_mib: int | None, reserve_mib: int
) -> None:
    """Unset, the reserve is an eighth of the limit (at most 768 MiB); set, it is the setting."""
    controller = AdmissionController(
        reserve_bytes=None if configured_mib is None else configured_mib * MIB,
        memory_reader=lambda: UNUSED,
    )
    assert controller.reserve_for(None if limit_mib is None else limit_mib * MIB) == (
        reserve_mib * MIB
    )


def test_derived_reserve_admits_sessions_in_a_small_container() -> None:
    """In 512 MiB with the defaults, 64 MiB sessions are admitted up to the 80% ceiling."""
    used = 34 * MIB
    controller = AdmissionController(
        memory_reader=lambda: MemoryReading(used_bytes=used, limit_bytes=512 * MIB, available=True)
    )
    admitted = 0
    while controller.evaluate(admitted, 1000).allowed:
        admitted += 1
        used += 64 * MIB
    # One more session needs the working set plus a 64 MiB reserve within 80% of 512 MiB
    # (409.6 MiB): admitted at 34, 98, 162, 226 and 290 MiB, refused at 354 MiB.
    assert admitted == 5
    assert controller.pressure_state == "pressured"


def test_concurrent_evaluations_keep_transitions_balanced() -> None:
    """Threads hammering one latch see set/clear transitions that alternate and match its state."""
    cycle = [900, 750, 650, 500, 850, 600]
    position = 0

    def reader() -> MemoryReading:
        nonlocal position
        position += 1  # safe: evaluate() holds the controller's lock around the reading
        return MemoryReading(
            used_bytes=cycle[position % len(cycle)], limit_bytes=LIMIT, available=True
        )

    controller = AdmissionController(reserve_bytes=100, memory_reader=reader)
    transitions: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(500):
            decision = controller.evaluate(0, 16)
            assert decision.allowed == (decision.state == "normal")
            if decision.transition is not None:
                with lock:
                    transitions.append(decision.transition)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert position == 4000
    sets, clears = transitions.count("pressured"), transitions.count("normal")
    assert sets > 100
    assert sets - clears == (1 if controller.pressure_state == "pressured" else 0)


def test_request_path_decision_matches_the_dataclass() -> None:
    """The latch's fast-built decisions equal, hash and freeze like CapacityDecision(...)."""
    reading = MemoryReading(used_bytes=100, limit_bytes=LIMIT, available=True)
    decision = AdmissionController(reserve_bytes=0, memory_reader=lambda: reading).evaluate(0, 1)
    expected = CapacityDecision(True, "normal", reading, None, None)
    assert decision == expected
    assert type(decision) is CapacityDecision
    assert hash(decision) == hash(expected)
    assert repr(decision) == repr(expected)
    assert [f.name for f in dataclasses.fields(CapacityDecision)] == [
        "allowed",
        "state",
        "memory",
        "reason",
        "transition",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decision.allowed = False  # type: ignore[misc]


def _reference_decide(
    pressured: bool, high: float, resume: float, reserve: int, memory: MemoryReading, pending: int
) -> bool:
    """The latch's set/clear step as the guard it replaced wrote it, on
    MemoryReading.percent (rounded)."""
    percent = memory.percent
    assert percent is not None
    assert memory.used_bytes is not None
    assert memory.limit_bytes
    reserve_fits = memory.used_bytes + (pending + 1) * reserve <= memory.limit_bytes * high / 100
    if pressured:
        return not (percent <= resume and reserve_fits)
    return percent >= high or not reserve_fits


@settings(max_examples=3000, deadline=None)
@given(
    high=st.one_of(
        st.sampled_from([80.0, 70.0, 90.0, 99.99, 100.0, 33.33]),
        st.floats(min_value=1, max_value=100),
    ),
    gap=st.floats(min_value=0, max_value=50),
    limit=st.integers(min_value=1, max_value=2**40),
    fraction=st.floats(min_value=0, max_value=1.2),
    nudge=st.integers(min_value=-3, max_value=3),
    offset=st.integers(min_value=-9, max_value=9),
    reserve=st.integers(min_value=0, max_value=2**20),
    pending=st.integers(min_value=0, max_value=4),
    pressured=st.booleans(),
)
def test_the_latch_compares_the_rounded_percent_exactly(
    high: float,
    gap: float,
    limit: int,
    fraction: float,
    nudge: int,
    offset: int,
    reserve: int,
    pending: int,
    pressured: bool,
) -> None:
    """decide() skips round() away from the bounds; next to them it must agree to the byte."""
    resume = max(0.01, high - gap)
    # Aim at the bounds, up to 0.009 points either side (where rounding can flip the
    # answer), and a few bytes off, as often as anywhere else.
    near = offset * 0.001 / 100
    aim = {0: fraction, 1: high / 100 + near, 2: resume / 100 + near}[nudge % 3]
    used = max(0, int(limit * aim) + nudge)
    memory = MemoryReading(used_bytes=used, limit_bytes=limit, available=True)
    controller = AdmissionController(
        high_watermark_percent=high, resume_threshold_percent=resume, reserve_bytes=reserve
    )
    if pressured:  # set the latch the way a reading does: at the limit
        full = MemoryReading(used_bytes=limit, limit_bytes=limit, available=True)
        controller.decide(full, 0, 10)
        assert controller.pressure_state == "pressured"
    decision = controller.decide(memory, 0, 10, pending)
    expected = _reference_decide(pressured, high, resume, reserve, memory, pending)
    assert (decision.state == "pressured") is expected


@pytest.mark.parametrize("bound", [80.0, 70.0, 80.0037, 66.666, 99.995, 0.01, 33.333333, 100.0])
def test_internal_rounded_comparisons_agree_with_round_next_to_the_bound(bound: float) -> None:
    """Internal on purpose (the latch's private shortcuts): within a hundredth of a point
    either side, they give round()'s answer."""
    from asgi_admission._admission.decision.latch import _rounded_at_least, _rounded_at_most

    for step in range(-40, 41):
        percent = bound + step * 0.0005
        assert _rounded_at_least(percent, bound) is (round(percent, 2) >= bound), percent
        assert _rounded_at_most(percent, bound) is (round(percent, 2) <= bound), percent


def test_admissible_by_memory_counts_the_reserves_that_still_fit() -> None:
    """admissible_by_memory is the reserves that fit under the high watermark above the
    working set and the pending ones; 0 while latched, None blind or with no reserve
    below high."""
    reading = MemoryReading(used_bytes=300, limit_bytes=LIMIT, available=True)
    latch = AdmissionController(reserve_bytes=100, memory_reader=lambda: reading)
    assert latch.admissible_by_memory(reading) == 5  # (800 - 300) // 100
    assert latch.admissible_by_memory(reading, pending_sessions=2) == 3
    assert (
        latch.admissible_by_memory(MemoryReading(used_bytes=300, limit_bytes=None, available=True))
        is None
    )
    assert latch.admissible_by_memory(None) is None
    unreserved = AdmissionController(reserve_bytes=0, memory_reader=lambda: reading)
    assert unreserved.admissible_by_memory(reading) is None
    assert (
        unreserved.admissible_by_memory(
            MemoryReading(used_bytes=800, limit_bytes=LIMIT, available=True)
        )
        == 0
    )
    latch.decide(MemoryReading(used_bytes=900, limit_bytes=LIMIT, available=True), 0, None)
    assert (latch.pressure_state, latch.admissible_by_memory(reading)) == ("pressured", 0)


def test_the_old_name_of_admissible_by_memory_answers_the_same_with_a_warning() -> None:
    """The public method's earlier name (``memory_room``) still answers, the same, and
    says its new one."""
    reading = MemoryReading(used_bytes=300, limit_bytes=LIMIT, available=True)
    latch = AdmissionController(reserve_bytes=100, memory_reader=lambda: reading)
    with pytest.warns(DeprecationWarning, match="admissible_by_memory"):
        assert latch.memory_room(reading, 2, held_bytes=250) == 3
    assert latch.admissible_by_memory(reading, 2, held_bytes=250) == 3
