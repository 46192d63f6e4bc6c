"""The reservations on its own: the sample, a failing reading, a fork, and the learned reserve."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from reskit import counts

from asgi_admission import (
    AdmissionController,
    AdmissionMiddleware,
    AdmissionTicket,
    MemoryReading,
)
from asgi_admission._admission.ledger.ledger import InProcessLedger, LedgerBusy
from asgi_admission._admission.ledger.shared_ledger import FILE_NAME
from asgi_admission._admission.reservations import pending
from asgi_admission._admission.reservations.learning import SessionLearner
from asgi_admission._admission.reservations.pending import (
    SAMPLE_INTERVAL_S,
    Reservations,
    build_parts,
)
from asgi_admission._admission.reservations.settling import Reservation, apply
from asgi_admission._admission.reservations.tickets import reservation_of
from asgi_admission._memory.reading import UNAVAILABLE
from kits.suitekit import MIB

#: Internal on purpose: the reservation reservations, as a unit below the middleware.
INTERNAL = "the reservation reservations, as a unit below the middleware"
#: The memory limit of every reading and admission here.
LIMIT = 1000 * MIB


class Memory:
    """A reading the test sets; ``None`` is an unavailable one."""

    def __init__(self, used_mb: float | None) -> None:
        self.used_mb = used_mb

    def __call__(self) -> MemoryReading:
        if self.used_mb is None:
            return UNAVAILABLE
        return MemoryReading(used_bytes=int(self.used_mb * MIB), limit_bytes=LIMIT, available=True)


class Clock:
    """A clock the test moves on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(
    memory: Memory,
    *,
    learning: str = "off",
    shared_dir: str | None = None,
    active: Callable[[int | None], int] = lambda own: 0,
    app_count: Callable[[], int | None] = lambda: None,
    learner: SessionLearner | None = None,
    ledger: InProcessLedger | None = None,
    attempt: AbstractContextManager[object] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[Reservations, InProcessLedger]:
    ledger = InProcessLedger() if ledger is None else ledger
    controller = AdmissionController(reserve_bytes=10 * MIB, memory_reader=memory)
    reservations = Reservations(
        attempt=ledger.locked() if attempt is None else attempt,
        read=memory,
        active_count=active,
        app_count=app_count,
        route_of=lambda scope: "POST /s",
        parts=build_parts(
            controller=controller,
            learning=learning,  # type: ignore[arg-type]
            min_reserve_bytes=16 * MIB,
            timeout_s=120.0,
            shared_dir=shared_dir,
            clock=clock,
            learner=learner,
        ),
    )
    return reservations, ledger


def admit(reservations: Reservations, ledger: InProcessLedger, used_mb: float) -> object:
    with ledger.locked():
        return reservations.admitted(ledger.reserve(), "http", None, int(used_mb * MIB), LIMIT)


def test_due_settles_without_a_sample_once_an_interval_has_passed() -> None:
    """A decision that read no exact working set settles through due(), at most 4 times a second."""
    memory, clock = Memory(100), Clock()
    reservations, ledger = make(memory, clock=clock)
    entry = admit(reservations, ledger, 100)
    reservations.respond(entry)  # type: ignore[arg-type]
    assert counts(ledger) == (0, 1)
    memory.used_mb = 110
    with ledger.locked():
        assert reservations.due() == ()  # the response's own reading is not a sample interval old
    clock.now += SAMPLE_INTERVAL_S
    with ledger.locked():
        actions = reservations.due()
    apply(actions)
    assert counts(ledger) == (0, 0)


def test_an_unavailable_reading_settles_by_time_only() -> None:
    """With no reading, due() and the sample settle nothing but what is timed out."""
    memory, clock = Memory(100), Clock()
    reservations, ledger = make(memory, clock=clock)
    entry = admit(reservations, ledger, 100)
    reservations.respond(entry)  # type: ignore[arg-type]
    memory.used_mb = None
    clock.now += SAMPLE_INTERVAL_S
    with ledger.locked():
        apply(reservations.due())
    reservations.sample()
    assert counts(ledger) == (0, 1)


def test_a_failing_sample_is_logged_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception in one sample is logged; the next sample still runs."""
    reservations, _ = make(Memory(100))
    calls = []
    second = asyncio.Event()

    def failing() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        second.set()

    monkeypatch.setattr(reservations, "sample", failing)

    async def run() -> None:
        task = asyncio.create_task(pending.run(reservations, 0.001))
        await asyncio.wait_for(second.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.ERROR, logger="asgi_admission"):
        asyncio.run(run())
    assert "the reservation sample failed" in caplog.text


class Ends(SessionLearner):
    """A learner that records the session ends it is told of."""

    __slots__ = ("told",)

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[str | None, float | None, int]] = []

    def on_session_end(
        self,
        now: float,
        *,
        route: str | None = None,
        admitted_at: float | None = None,
        count: int = 1,
    ) -> None:
        self.told.append((route, admitted_at, count))
        super().on_session_end(now, route=route, admitted_at=admitted_at, count=count)


def test_session_ends_reach_the_learner_once() -> None:
    """The active count falling is an end of unknown route; a WebSocket that closes is an
    end of its route, told once: the count falling for it at the next sample is not
    told again."""
    memory = Memory(100)
    active, learner = [3], Ends()
    reservations, ledger = make(
        memory, learning="raise", learner=learner, active=lambda own: active[0]
    )
    reservations.sample()
    active[0] = 2
    reservations.sample()
    assert learner.told == [(None, None, 1)]
    with ledger.locked():
        entry = reservations.admitted(ledger.reserve(), "websocket", None, 100 * MIB, LIMIT)
    memory.used_mb = 120  # its memory shows: settled at its accept, active
    reservations.respond(entry)
    assert counts(ledger) == (1, 0)
    reservations.abandon(entry, session_over=True)
    assert learner.told[1:] == [("unnamed", entry.admitted_at, 1)]
    active[0] = 1
    reservations.sample()
    assert learner.told[2:] == []


class ForeignEnds(Ends):
    """The learner, recording the ends it is told of as other workers'."""

    def on_foreign_end(self) -> None:
        self.told.append(("other worker", None, 0))
        super().on_foreign_end()


def test_other_workers_ends_are_not_taken_for_this_workers_own(tmp_path: Path) -> None:
    """With a shared ledger the container's active count falls for every worker's ends:
    only as much as the app's own count fell is an end of this worker's (of unknown
    route); the rest is told as another worker's, which teaches no freed memory."""
    memory = Memory(100)
    active, own, learner = [5], [2], ForeignEnds()
    reservations, _ledger = make(
        memory,
        learning="raise",
        shared_dir=str(tmp_path / "shared"),
        learner=learner,
        active=lambda count: active[0],
        app_count=lambda: own[0],  # none pending past a response: its own count
    )
    reservations.sample()
    active[0], own[0] = 3, 1  # two ended: one of this worker's, one of another's
    reservations.sample()
    assert learner.told == [(None, None, 1), ("other worker", None, 0)]
    active[0] = 2  # another worker's alone
    reservations.sample()
    assert learner.told[2:] == [("other worker", None, 0)]


def _child_sees_nothing(
    reservations: Reservations, result: multiprocessing.Queue[tuple[int, int, int]]
) -> None:
    result.put((reservations.settler.unsettled, reservations.settler.responded, os.getpid()))


def test_a_forked_worker_starts_with_none_of_its_parents_sessions(tmp_path: Path) -> None:
    """After a fork the child's settler holds nothing of the parent's sessions."""
    reservations, ledger = make(Memory(100), shared_dir=str(tmp_path / "shared"))
    entry = admit(reservations, ledger, 100)
    reservations.respond(entry)  # type: ignore[arg-type]
    assert reservations.settler.unsettled == 1
    context = multiprocessing.get_context("fork")
    result = context.Queue()
    child = context.Process(target=_child_sees_nothing, args=(reservations, result))
    child.start()
    unsettled, waiting, pid = result.get(timeout=30)
    child.join(30)
    assert (unsettled, waiting) == (0, 0)
    assert pid != os.getpid()
    assert reservations.settler.unsettled == 1


def test_learning_off_ignores_the_watchdogs_peaks() -> None:
    """With learning off a peak changes nothing."""
    reservations, _ = make(Memory(100))
    reservations.observe_peak("POST /s", 500 * MIB)
    assert reservations.estimates() == []
    assert reservations.route(None) == "unnamed"


class Busy:
    """A ledger lock that another worker holds while ``held`` (an ``attempt()``)."""

    def __init__(self, ledger: InProcessLedger) -> None:
        self.inner = ledger.locked()
        self.held = False

    def __enter__(self) -> object:
        if self.held:
            raise LedgerBusy("held by another worker")
        return self.inner.__enter__()

    def __exit__(self, *exc: object) -> None:
        self.inner.__exit__(None, None, None)


def test_events_wait_in_order_while_the_shared_ledger_is_held() -> None:
    """While another worker holds the ledger, a response, a ticket's hold and its
    release neither raise nor wait: they are kept, in order, and the next sample
    applies them once the ledger is free (nothing lost, nothing released early); the
    release gives the reservation back at once, only its bookkeeping waits."""
    memory, ledger = Memory(100), InProcessLedger()
    lock = Busy(ledger)
    reservations, _ = make(memory, ledger=ledger, attempt=lock)
    with ledger.locked():
        entry = reservations.admitted(ledger.reserve(), "http", None, 100 * MIB, LIMIT)
    lock.held = True
    assert reservations.ticket("hold", entry) is True  # taken on trust, applied first later
    reservations.respond(entry)
    assert reservations.kept_events == 2
    reservations.sample()  # still held: skipped, nothing applied
    assert (reservations.kept_events, counts(ledger)) == (2, (0, 1))
    lock.held = False
    reservations.sample()
    assert reservations.kept_events == 0
    assert counts(ledger) == (0, 1)  # held past its response: still pending
    lock.held = True
    reservations.ticket("release", entry)
    assert (reservations.kept_events, counts(ledger)) == (1, (0, 0))
    lock.held = False
    reservations.sample()
    assert (reservations.kept_events, counts(ledger)) == (0, (0, 0))
    assert reservations.settler.unsettled == 0


def test_what_was_learned_survives_the_shared_directory_being_deleted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The shared directory deleted under a running worker: a watchdog peak is still
    learned (no error), and the next refresh writes what the worker knows back into the
    file made again, so a worker starting now learns it too."""
    shared = tmp_path / "shared"
    reservations, _ = make(Memory(100), learning="raise", shared_dir=str(shared))
    reservations.observe_peak("POST /s", 300 * MIB)
    shutil.rmtree(shared)
    reservations.observe_peak("POST /s", 310 * MIB)
    assert [e.observations for e in reservations.estimates()] == [2]
    (shared / "asgi-admission.learned").unlink()
    reservations.sharing.refresh(0.0, urgent=True)
    fresh, _ = make(Memory(100), learning="raise", shared_dir=str(shared))
    assert fresh.estimates() == reservations.estimates()
    assert "Traceback" not in caplog.text


@contextmanager
def held_by_another_worker(directory: Path) -> Iterator[None]:
    """The shared ledger's ``flock``, taken on an open file description of its own, as
    another worker's would be."""
    fd = os.open(directory / FILE_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


def test_a_decision_nets_out_the_apps_count_after_the_kept_events(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A response kept while the ledger was held is applied before the app's count is
    netted out: the session is counted once (pending), so one more fits under a cap of two."""
    monkeypatch.setenv("ADMISSION_PROBE_SESSIONS", "0")  # decided one after another
    monkeypatch.setenv("ADMISSION_SHARED_DIR", str(tmp_path))

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("not called")

    store: list[str] = []
    guard = AdmissionMiddleware(
        app,
        session_routes=["POST /s"],
        controller=AdmissionController(reserve_bytes=10 * MIB, memory_reader=Memory(100)),
        current_sessions=lambda: len(store),
        max_sessions=2,
        registry=None,
    )
    scope = {"type": "http", "method": "POST", "path": "/s"}
    first = guard.service.admit("http", scope)
    assert isinstance(first, AdmissionTicket)
    store.append("first")  # the app counts its session once it has answered
    reservations = guard.reservations
    with held_by_another_worker(tmp_path):
        reservations.respond(reservation_of(first))  # kept: its memory has not shown yet
        assert reservations.kept_events == 1
    second = guard.service.admit("http", scope)
    assert reservations.kept_events == 0
    assert isinstance(second, AdmissionTicket), second


def test_a_sessions_end_is_told_once_however_many_say_so() -> None:
    """A pending session released by its watchdog (its process unregistered) and then by
    its app, and a WebSocket whose close is seen twice: each end reaches the learner
    (and what it frees, told in the same step) once."""
    memory = Memory(100)
    learner = Ends()
    reservations, ledger = make(memory, learning="raise", learner=learner)
    with ledger.locked():
        pending = reservations.admitted(ledger.reserve(), "http", None, 100 * MIB, LIMIT)
    reservations.respond(pending)
    reservations.ticket("release", pending)  # the watchdog's
    reservations.ticket("release", pending)  # the app's
    with ledger.locked():
        socket = reservations.admitted(ledger.reserve(), "websocket", None, 100 * MIB, LIMIT)
    reservations.respond(socket)
    reservations.abandon(socket, session_over=True)
    reservations.abandon(socket, session_over=True)
    assert [route for route, _, _ in learner.told] == ["unnamed", "unnamed"]
    assert counts(ledger) == (0, 0)


class Taken:
    """A critical section that records each time it is entered, under its name."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def __enter__(self) -> None:
        self.log.append(self.name)

    def __exit__(self, *exc: object) -> None:
        return None


def test_a_response_that_settles_nothing_shared_takes_only_the_own_section() -> None:
    """A session expecting no memory settles at its response under attempt_own; one whose
    reserve waits to show in the (shared) settling queue, or held by its ticket, under attempt."""
    memory, log = Memory(100), list[str]()
    ledger = InProcessLedger()
    reservations = Reservations(
        attempt=Taken("attempt", log),
        attempt_own=Taken("own", log),
        read=memory,
        active_count=lambda own: 0,
        route_of=lambda scope: "POST /s",
        parts=build_parts(
            controller=AdmissionController(reserve_bytes=10 * MIB, memory_reader=memory),
            learning="off",
            min_reserve_bytes=16 * MIB,
            timeout_s=120.0,
            shared_dir=None,
        ),
    )

    def admitted(limit: int | None) -> Reservation:
        return reservations.admitted(ledger.reserve(), "http", None, 100 * MIB, limit)

    blind = admitted(None)  # no limit yet: nothing is expected of it
    reservations.respond(blind)
    assert log == ["own"]
    assert counts(ledger) == (0, 0)
    log.clear()
    queued = admitted(LIMIT)  # its reserve waits to show
    reservations.respond(queued)
    assert log == ["attempt"]
    log.clear()
    held = admitted(None)
    held.held = True
    reservations.respond(held)
    assert log == ["attempt"]
