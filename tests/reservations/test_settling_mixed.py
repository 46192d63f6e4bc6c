"""The settler under mixed traffic: sessions built in their request beside ramping ones."""

from __future__ import annotations

from reskit import apply

from asgi_admission._admission.ledger.ledger import InProcessLedger
from asgi_admission._admission.reservations.settling import Learned, Reservation, Settler
from kits.suitekit import MIB

#: Internal on purpose: the settler's attribution, on tables of readings.
INTERNAL = "the settler's attribution, on tables of readings"

BASE = 500 * MIB
RAMPING, BUILT = "POST /processes", "POST /sessions"
SIZES = {RAMPING: 96 * MIB, BUILT: 48 * MIB}
#: 2 s ramps (settled by time at 4 s, stretched), and a route that builds its memory
#: inside the request.
LEARNED = Learned(footprint_bytes=SIZES, ramp_s={RAMPING: 2.0, BUILT: 0.05})


def make() -> tuple[Settler, InProcessLedger]:
    return Settler(timeout_s=120.0), InProcessLedger()


def admit(
    settler: Settler, ledger: InProcessLedger, route: str, used: int, now: float
) -> Reservation:
    with ledger.locked():
        return settler.admit(
            ledger.reserve(),
            kind="http",
            route=route,
            used_bytes=used,
            now=now,
            expected_bytes=SIZES[route],
        )


def measure(settler: Settler, ledger: InProcessLedger, entry: Reservation, mib: int) -> None:
    """The session's own memory measured at ``mib`` MiB (inside the ledger's lock, as
    the reservations do; what it decides is done after)."""
    with ledger.locked():
        actions = settler.measured(entry, mib * MIB)
    apply(actions)


def two_ramping(settler: Settler, ledger: InProcessLedger) -> tuple[Reservation, Reservation]:
    """Two ramping sessions past their response, admitted at 0 and 0.5 s, nothing grown."""
    older = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(older, 0.05, LEARNED))
    younger = admit(settler, ledger, RAMPING, BASE, 0.5)
    apply(settler.respond(younger, 0.55, LEARNED))
    return older, younger


def test_a_session_built_in_its_request_settles_behind_one_still_ramping() -> None:
    """A session built inside its request shows its memory at its response even while an
    older session ramps (the working set growing fast): it settles there, and its memory
    never counts as the older one's growth."""
    settler, ledger = make()
    ramping = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(ramping, 0.05, LEARNED))
    apply(settler.settle(BASE + 10 * MIB, 0.25, LEARNED))
    apply(settler.settle(BASE + 20 * MIB, 0.5, LEARNED))  # 40 MiB/s: visibly growing
    built = admit(settler, ledger, BUILT, BASE + 22 * MIB, 0.6)
    apply(settler.respond(built, 0.7, LEARNED))
    apply(settler.settle(BASE + 72 * MIB, 0.7, LEARNED))  # its 48 MiB, and 2 more of the ramp
    assert built.released
    assert not ramping.released
    # 96 MiB more than at the ramping session's admission, half of it the other's.
    apply(settler.settle(BASE + 96 * MIB, 1.0, LEARNED))
    assert not ramping.released
    apply(settler.settle(BASE + 48 * MIB + 90 * MIB, 1.5, LEARNED))
    assert ramping.released


def test_an_older_session_settles_by_its_ramp_while_a_younger_one_ramps() -> None:
    """Under churn the memory of an older session can be hidden by others' ends: past its
    learned ramp time it settles by time, though the working set grows, where that growth
    is what a younger session within its ramp brings."""
    settler, ledger = make()
    older = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(older, 0.05, LEARNED))
    # Its memory came while another session's went: the working set stays as it was.
    for step in range(1, 13):
        apply(settler.settle(BASE, 0.25 * step, LEARNED))
    younger = admit(settler, ledger, RAMPING, BASE, 3.0)
    apply(settler.respond(younger, 3.05, LEARNED))
    for step in range(1, 7):  # 40 MiB/s, the younger session's ramp
        apply(settler.settle(BASE + step * 10 * MIB, 3.0 + 0.25 * step, LEARNED))
    assert older.released  # 4.5 s after its admission, past its 4 s
    assert not younger.released


def test_a_session_built_in_its_request_does_not_hold_an_older_one_past_its_ramp() -> None:
    """The jump of a session built inside its request, at its response, is its own memory:
    it does not count as an older session's memory still arriving, which settles by its
    ramp time."""
    settler, ledger = make()
    older = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(older, 0.05, LEARNED))
    for step in range(1, 16):  # its memory hidden by others' ends, as above
        apply(settler.settle(BASE, 0.25 * step, LEARNED))
    built = admit(settler, ledger, BUILT, BASE, 3.9)
    apply(settler.respond(built, 4.0, LEARNED))
    apply(settler.settle(BASE + 48 * MIB, 4.0, LEARNED))
    assert built.released
    apply(settler.settle(BASE + 48 * MIB, 4.1, LEARNED))
    assert older.released


def test_a_burst_past_its_ramp_time_is_held_while_its_memory_still_arrives() -> None:
    """Sessions admitted together are of one age: once past their ramp time none is within
    it, so growth that goes on (a busy machine slowing their ramps) holds them all."""
    settler, ledger = make()
    burst = [admit(settler, ledger, RAMPING, BASE, 0.05 * k) for k in range(3)]
    for entry in burst:
        apply(settler.respond(entry, 0.2, LEARNED))
    for step in range(1, 18):  # 20 MiB/s, past the first one's 4 s: short of its 90 %
        apply(settler.settle(BASE + step * 5 * MIB, 0.25 * step, LEARNED))
        assert not any(entry.released for entry in burst), step


def test_a_record_left_early_long_past_every_ramp_leaves_for_a_later_session() -> None:
    """A session that settled by its ramp time without showing its memory (other
    sessions' ends hid it) claims the growth that follows only while an older session
    may still be ramping: once every ramp is past and the sessions behind it came
    later, a later session's memory is its own and settles it."""
    settler, ledger = make()
    first = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(first, 0.05, LEARNED))
    for step in range(1, 21):  # its memory hidden by others' ends, for 5 s
        apply(settler.settle(BASE, 0.25 * step, LEARNED))
    assert first.released  # by its ramp time: left early
    later = admit(settler, ledger, RAMPING, BASE, 6.0)
    apply(settler.respond(later, 6.05, LEARNED))
    for step in range(1, 11):  # its 96 MiB over 2.5 s
        apply(settler.settle(BASE + int(step * 9.6 * MIB), 6.0 + 0.25 * step, LEARNED))
    assert later.released


def test_a_record_left_early_still_claims_growth_for_sessions_admitted_in_its_ramp() -> None:
    """A session admitted while the memory of one left early may still have been arriving
    counts from a working set without it: the record left early keeps claiming the growth
    that follows, and the later session's reservation is held."""
    settler, ledger = make()
    first = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(first, 0.05, LEARNED))
    later = admit(settler, ledger, RAMPING, BASE, 2.5)
    apply(settler.respond(later, 2.55, LEARNED))
    for step in range(1, 19):
        apply(settler.settle(BASE, 0.25 * step, LEARNED))
    assert first.released
    apply(settler.settle(BASE + 96 * MIB, 4.75, LEARNED))
    assert not later.released


def test_a_session_shown_by_its_own_memory_is_no_older_sessions_growth() -> None:
    """A younger ramping session's own memory, measured, is all there while the older one
    has not grown: the younger settles, and the working set's 96 MiB of growth, its own,
    does not settle the older one, which settles once its own 96 MiB show on top."""
    settler, ledger = make()
    older, younger = two_ramping(settler, ledger)
    measure(settler, ledger, younger, 95)
    assert younger.released
    apply(settler.settle(BASE + 96 * MIB, 1.0, LEARNED))
    assert not older.released
    apply(settler.settle(BASE + 96 * MIB + 90 * MIB, 2.0, LEARNED))
    assert older.released


def test_the_head_counts_no_more_than_its_own_memory_has_still_to_add() -> None:
    """The queue's head, its growth hidden by ends (the working set flat), measured at
    60 MiB of its 96: the latch counts the 36 MiB still to come, at every pass."""
    settler, ledger = make()
    head = admit(settler, ledger, RAMPING, BASE, 0.0)
    apply(settler.respond(head, 0.05, LEARNED))
    apply(settler.settle(BASE, 0.25, LEARNED))
    assert settler.still_to_add() == (96 * MIB, 1)
    measure(settler, ledger, head, 60)
    for step in range(2, 6):
        apply(settler.settle(BASE, 0.25 * step, LEARNED))
        assert settler.still_to_add() == (36 * MIB, 1)
    assert not head.released


def test_a_session_counts_what_its_latest_measurement_leaves_to_come() -> None:
    """A session behind the queue's head measured at 80 MiB, then at 5 (a child of it
    exited): what it still has to add follows the latest measurement back up, never
    staying at the 16 MiB the first one left."""
    settler, ledger = make()
    _head, younger = two_ramping(settler, ledger)
    measure(settler, ledger, younger, 80)
    assert settler.still_to_add() == ((96 + 16) * MIB, 2)
    measure(settler, ledger, younger, 5)
    apply(settler.settle(BASE, 1.0, LEARNED))
    assert settler.still_to_add() == ((96 + 91) * MIB, 2)


def test_a_held_session_whose_memory_is_measured_holds_back_only_the_rest() -> None:
    """A session held by its app's ticket, measured at 95 of its 96 MiB: it stays held
    (the app says when it started), counting only the 1 MiB still to come."""
    settler, ledger = make()
    held = admit(settler, ledger, RAMPING, BASE, 0.0)
    with ledger.locked():
        assert settler.hold(held)
    apply(settler.respond(held, 0.05, LEARNED))
    measure(settler, ledger, held, 95)
    assert not held.released
    assert settler.still_to_add() == (1 * MIB, 1)
