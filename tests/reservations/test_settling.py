"""The settler: reservations outlive the response until the session's memory shows."""

from __future__ import annotations

import logging

import pytest
from reskit import apply, counts

from asgi_admission._admission.ledger.ledger import InProcessLedger
from asgi_admission._admission.reservations.settling import (
    Learned,
    LocalSettleQueue,
    QueueRecord,
    Reservation,
    Settler,
)
from kits.suitekit import MIB

#: Internal on purpose: the settler's attribution, on tables of readings.
INTERNAL = "the settler's attribution, on tables of readings"

R = 100 * MIB
ROUTE = "POST /s"


def make(
    *, timeout_s: float = 120.0, ramp_s: float | None = None
) -> tuple[Settler, InProcessLedger, Learned]:
    """A settler, its ledger, and what was learned of the route (its ramp, if any)."""
    learned = Learned() if ramp_s is None else Learned(ramp_s={ROUTE: ramp_s})
    return Settler(timeout_s=timeout_s), InProcessLedger(), learned


def admit(
    settler: Settler,
    ledger: InProcessLedger,
    used: int | None,
    now: float,
    kind: str = "http",
    expected: int = R,
) -> Reservation:
    with ledger.locked():
        return settler.admit(
            ledger.reserve(),
            kind=kind,  # type: ignore[arg-type]
            route=ROUTE,
            used_bytes=used,
            now=now,
            expected_bytes=expected,
        )


def test_in_request_memory_settles_at_the_response() -> None:
    """Memory that arrived during the request settles the reservation at its response."""
    settler, ledger, learned = make()
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.settle(500 * MIB + R, 0.5, learned))
    assert entry.visible
    assert counts(ledger) == (0, 1)  # still inside its request
    apply(settler.respond(entry, 0.6, learned))
    assert counts(ledger) == (0, 0)


def test_a_session_expected_to_add_less_than_the_noise_settles_at_its_response() -> None:
    """A route learned to add a few kilobytes (a session that starts a short process)
    settles at its response, as one expecting nothing: so little can never be told from
    the working set's own movement, and waiting for it would pile sessions up pending."""
    settler, ledger, learned = make(ramp_s=4.0)
    entries = [admit(settler, ledger, 500 * MIB, 0.01 * n, expected=1205) for n in range(50)]
    for entry in entries:
        apply(settler.respond(entry, 0.6, learned))
    assert counts(ledger) == (0, 0)
    assert settler.responded == 0


def test_memory_arriving_after_the_response_holds_the_reservation() -> None:
    """After the response the reservation stays pending until 90 % of the reserve shows."""
    settler, ledger, learned = make()
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(entry, 0.1, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(500 * MIB + int(0.5 * R), 1.0, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(500 * MIB + int(0.9 * R), 2.0, learned))
    assert counts(ledger) == (0, 0)
    assert entry.released


def test_concurrent_sessions_are_attributed_first_in_first_out() -> None:
    """Three sessions, one reserve of growth: only the oldest settles; the rest wait."""
    settler, ledger, learned = make()
    entries = [admit(settler, ledger, 500 * MIB, 0.0) for _ in range(3)]
    for entry in entries:
        apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(500 * MIB + R, 1.0, learned))
    assert [e.released for e in entries] == [True, False, False]
    apply(settler.settle(500 * MIB + int(1.95 * R), 1.5, learned))
    assert [e.released for e in entries] == [True, True, False]
    apply(settler.settle(500 * MIB + 3 * R, 2.0, learned))
    assert counts(ledger) == (0, 0)


def test_growth_from_before_admission_is_not_the_sessions_own() -> None:
    """A session admitted at a higher working set must grow from there, not from what was
    accounted for."""
    settler, ledger, learned = make()
    first = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(first, 0.1, learned))
    later = admit(settler, ledger, 900 * MIB, 0.2)  # others' memory arrived meanwhile
    apply(settler.respond(later, 0.3, learned))
    apply(settler.settle(900 * MIB + int(0.5 * R), 1.0, learned))
    assert first.released  # its growth showed (and more)
    assert not later.released  # it counts from max(500+R, 900): 0.5 R is not enough
    apply(settler.settle(900 * MIB + R, 1.5, learned))
    assert later.released


def test_memory_freed_meanwhile_only_holds_longer() -> None:
    """Other sessions ending (the working set falls) never settles a reservation early."""
    settler, ledger, learned = make()
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(300 * MIB, 1.0, learned))
    assert not entry.released
    apply(settler.settle(500 * MIB + R, 2.0, learned))
    assert entry.released


def test_learned_ramp_time_settles_without_growth() -> None:
    """Where a ramp time was learned, a reservation settles once it has passed, stretched
    (``RAMP_MARGIN``: a 1 s ramp settles at 2 s)."""
    settler, ledger, learned = make(ramp_s=1.0)
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(500 * MIB, 1.9, learned))
    assert not entry.released
    apply(settler.settle(500 * MIB, 2.0, learned))
    assert entry.released
    # Its reserve still counts for a session queued behind it (left early).
    second = admit(settler, ledger, 500 * MIB, 2.1)
    apply(settler.respond(second, 2.1, learned))
    apply(settler.settle(500 * MIB + R, 2.5, learned))
    assert not second.released


def test_no_reservation_settles_by_time_while_memory_is_still_arriving() -> None:
    """Past its learned ramp time, a session whose memory is visibly still coming in (the
    working set growing fast: sessions ramp slower in a burst on a busy machine than the
    ramp learned from calmer ones) keeps its reservation until growth has been quiet for
    a second, or its memory shows."""
    settler, ledger, learned = make(ramp_s=0.5, timeout_s=10.0)
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(entry, 0.1, learned))
    for step in range(1, 6):  # 10 MiB every 0.3 s: 33 MiB/s, still short of the 90 %
        apply(settler.settle(500 * MIB + step * 10 * MIB, 0.3 * step, learned))
        assert not entry.released, step
    apply(settler.settle(550 * MIB, 2.4, learned))  # quiet since 1.5 s, but not for a second yet
    assert not entry.released
    apply(settler.settle(550 * MIB, 2.6, learned))
    assert entry.released


def test_the_pending_timeout_bounds_every_reservation() -> None:
    """With no growth and no ramp learned, the timeout releases the reservation."""
    settler, ledger, learned = make(timeout_s=5.0)
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(500 * MIB, 4.9, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(500 * MIB, 5.0, learned))
    assert counts(ledger) == (0, 0)
    # Its record, left early, leaves the queue once the timeout has passed at the head.
    apply(settler.settle(500 * MIB, 5.1, learned))
    assert settler._queue.load() == (None, [])


def test_a_held_ticket_waits_for_started_even_when_memory_shows() -> None:
    """A held ticket is pending until started() (then active), whatever the readings say."""
    settler, ledger, learned = make()
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    assert settler.hold(entry)
    apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(500 * MIB + 2 * R, 1.0, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.started(entry, learned))
    assert counts(ledger) == (1, 0)
    apply(settler.started(entry, learned))  # idempotent
    assert counts(ledger) == (1, 0)
    apply(settler.release(entry))
    apply(settler.release(entry))
    assert counts(ledger) == (0, 0)


def test_a_ticket_started_on_memory_counted_as_an_older_sessions_keeps_its_reserve() -> None:
    """A ticket started after first-in-first-out attribution counted its memory as an
    older session's still ramping keeps its reserve until growth has paid for both, then
    becomes active: the older session was released on the ticket's memory."""
    settler, ledger, learned = make()
    older = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(older, 0.1, learned))
    ticket = admit(settler, ledger, 500 * MIB, 0.1)
    assert settler.hold(ticket)
    apply(settler.respond(ticket, 0.2, learned))
    # The ticket's session is up (0.95 R), the older one has shown 0.05 R of its own:
    # attribution counts it as the oldest's, which settles.
    apply(settler.settle(500 * MIB + R, 0.5, learned))
    assert older.released
    apply(settler.started(ticket, learned))
    assert counts(ledger) == (0, 1)  # its reserve covers the older one's 0.95 R to come
    apply(settler.settle(500 * MIB + int(1.5 * R), 1.0, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(500 * MIB + int(1.95 * R), 1.5, learned))
    assert counts(ledger) == (1, 0)
    apply(settler.release(ticket))
    assert counts(ledger) == (0, 0)
    assert settler.unsettled == 0


def test_a_covering_ticket_waits_for_every_record_left_early_ahead_of_growth() -> None:
    """A started ticket covering an older session is not freed by growth that a later
    started ticket's memory paid its own record with: it waits until every record left
    early in the queue has been paid for."""
    settler, ledger, learned = make()
    older = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(older, 0.1, learned))
    covering = admit(settler, ledger, 500 * MIB, 0.1)
    settler.hold(covering)
    apply(settler.respond(covering, 0.2, learned))
    apply(
        settler.settle(500 * MIB + R, 0.5, learned)
    )  # the covering ticket's memory counts as `older`'s
    assert older.released
    apply(settler.started(covering, learned))
    later = admit(settler, ledger, 500 * MIB + R, 0.6)
    settler.hold(later)
    apply(settler.respond(later, 0.7, learned))
    # Up before a reading shows it, with nothing counted as older sessions' since its
    # admission: active at once, its record left early behind the covering one's.
    apply(settler.started(later, learned))
    assert counts(ledger) == (1, 1)
    # Its memory arrives and pays for the covering ticket's record, not its own.
    apply(settler.settle(500 * MIB + 2 * R, 0.8, learned))
    assert counts(ledger) == (1, 1)
    apply(settler.settle(500 * MIB + int(2.95 * R), 1.5, learned))  # the older one's memory
    assert counts(ledger) == (2, 0)


def test_a_covering_ticket_is_active_by_the_timeout() -> None:
    """A started ticket kept covering an older session becomes active at the pending
    timeout, however little has grown."""
    settler, ledger, learned = make(timeout_s=5.0)
    older = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.respond(older, 0.1, learned))
    ticket = admit(settler, ledger, 500 * MIB, 0.1)
    settler.hold(ticket)
    apply(settler.respond(ticket, 0.2, learned))
    apply(settler.settle(500 * MIB + R, 0.5, learned))
    apply(settler.started(ticket, learned))
    apply(settler.settle(500 * MIB + R, 5.0, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(500 * MIB + R, 5.1, learned))
    assert counts(ledger) == (1, 0)
    assert settler.unsettled == 0


def test_a_held_ticket_never_started_expires_once_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The timeout releases a held ticket never started: one warning, one count."""
    settler, ledger, learned = make(timeout_s=3.0)
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    settler.hold(entry)
    apply(settler.respond(entry, 0.1, learned))
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        apply(settler.settle(None, 3.0, learned))
        apply(settler.settle(None, 4.0, learned))
    assert counts(ledger) == (0, 0)
    assert settler.expired == 1
    assert entry.expired
    assert sum("never started" in r.getMessage() for r in caplog.records) == 1
    assert not settler.hold(entry)  # too late


def test_hold_after_settling_is_refused() -> None:
    """hold() on a reservation that already settled says so and changes nothing."""
    settler, ledger, learned = make()
    entry = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.settle(500 * MIB + R, 0.1, learned))
    apply(settler.respond(entry, 0.2, learned))
    assert not settler.hold(entry)
    assert counts(ledger) == (0, 0)


def test_a_failed_request_releases_at_once_and_leaves_the_queue() -> None:
    """An exception or disconnect before the response releases outright (nothing left early)."""
    settler, ledger, learned = make()
    failed = admit(settler, ledger, 500 * MIB, 0.0)
    behind = admit(settler, ledger, 500 * MIB, 0.0)
    apply(settler.abandon(failed))
    assert counts(ledger) == (0, 1)
    apply(settler.respond(behind, 0.1, learned))
    apply(settler.settle(500 * MIB + R, 1.0, learned))
    assert behind.released


def test_a_websocket_settles_to_active_and_its_close_releases() -> None:
    """A WebSocket is pending until its memory shows, then active until it closes."""
    settler, ledger, learned = make()
    entry = admit(settler, ledger, 500 * MIB, 0.0, kind="websocket")
    apply(settler.respond(entry, 0.1, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(500 * MIB + R, 1.0, learned))
    assert counts(ledger) == (1, 0)
    apply(settler.abandon(entry, session_over=True))
    assert counts(ledger) == (0, 0)


def test_a_session_admitted_blind_settles_by_time() -> None:
    """With no reading ever taken there is nothing to attribute: the timeout settles it."""
    settler, ledger, learned = make(timeout_s=2.0)
    entry = admit(settler, ledger, None, 0.0)
    assert not entry.queued
    apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(None, 1.0, learned))
    assert counts(ledger) == (0, 1)
    apply(settler.settle(None, 2.0, learned))
    assert counts(ledger) == (0, 0)


def test_fewer_sessions_counted_by_the_app_settles_the_oldest_responded() -> None:
    """The app's count below the sessions waiting means some ended: the oldest settle."""
    settler, ledger, learned = make()
    entries = [admit(settler, ledger, 500 * MIB, 0.0) for _ in range(3)]
    for entry in entries:
        apply(settler.respond(entry, 0.1, learned))
    assert settler.responded == 3
    apply(settler.counted(1, learned))
    assert [e.released for e in entries] == [True, True, False]
    assert settler.responded == 1


def test_records_of_a_dead_worker_are_dropped() -> None:
    """A shared queue's records whose worker died no longer hold the queue."""

    class Queue(LocalSettleQueue):
        def owner_alive(self, pid: int) -> bool:
            return pid != 999_999

    queue = Queue()
    queue.store(500 * MIB, [QueueRecord(999_999, 1, 0.0, 500 * MIB, R)])
    settler, learned = Settler(queue=queue), Learned()
    ledger = InProcessLedger()
    with ledger.locked():
        entry = settler.admit(
            ledger.reserve(),
            kind="http",
            route=ROUTE,
            used_bytes=500 * MIB,
            now=0.0,
            expected_bytes=R,
        )
    apply(settler.respond(entry, 0.1, learned))
    apply(settler.settle(500 * MIB + R, 1.0, learned))
    assert entry.released
    assert queue.load() == (None, [])


def test_a_timeout_of_zero_or_less_is_refused() -> None:
    """The pending timeout must be positive; the error names the variable."""
    with pytest.raises(ValueError, match="ADMISSION_PENDING_TIMEOUT_SECONDS"):
        Settler(timeout_s=0)
