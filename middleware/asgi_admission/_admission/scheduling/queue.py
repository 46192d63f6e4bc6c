"""The bounded wait for capacity: session requests that do not fit yet, served in order.

A waiter holds nothing (no count slot, no reserve): it holds an *attempt*, a callable
that decides the request again and returns its admission or a :class:`Verdict`
(docs/configuration.md). Waiters are served by class, then in arrival order; a pass
stops at the first that does not fit (``Verdict.FULL``), so nobody jumps the queue,
and skips one whose tenant holds its share (``Verdict.DEFERRED``).

Notes:

- ``wake()``, from any thread, never decides: it schedules one pass on the waiters'
  loop, and a burst of wakes costs one pass. Attempts never run under the caller's
  lock (a release under the ledger's lock must not find the ledger busy).
- The waiters' state is touched on their loop only, one loop at a time.
- A waiter that leaves gives back an admission handed to it in that same instant
  (``give_back``); where a pass stopped at it, the next pass runs.
- With an ``order`` (:class:`SharedOrder`) the queue publishes its first waiter
  (not one last ``DEFERRED``), stops a pass where another worker's waiter comes first,
  and tells the order after each pass. A wake before anyone waited adopts the running
  loop, so capacity this process frees still reaches other workers' waiters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, NamedTuple, Protocol, TypeVar

from asgi_admission._admission.decision.latch import CapacityDecision, Reason, State
from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.reservations.probing import Listener
from asgi_admission._admission.reservations.tickets import AdmissionTicket
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS
from asgi_admission._memory.reading import UNAVAILABLE, MemoryReading

if TYPE_CHECKING:
    from asgi_admission._admission.scheduling.shared_order import SharedOrder

T = TypeVar("T")

#: How a wait ended: ``full`` means the queue was full and nothing was waited.
WaitedOutcome = Literal["admitted", "timeout", "cancelled", "full"]
#: The outcomes a wait that took place ends with (the metrics' ``outcome`` label).
WaitOutcome = Literal["admitted", "timeout", "cancelled"]


class Verdict(enum.Enum):
    """What an attempt answers when it does not admit."""

    #: Does not fit: the pass stops here, nobody behind goes before it.
    FULL = "full"
    #: Not this waiter's turn (its tenant holds its share): it keeps its place and the
    #: next waiter is tried.
    DEFERRED = "deferred"


@dataclass(frozen=True, slots=True)
class Waited(Generic[T]):
    """The end of one wait: its outcome, the admission (exactly when ``admitted``), and
    how long it waited (by the queue's clock)."""

    outcome: WaitedOutcome
    admission: T | None
    waited_s: float


@dataclass(frozen=True, slots=True)
class WaitRecord:
    """One wait that took place, as the metrics observe it."""

    class_name: str
    outcome: WaitOutcome
    seconds: float


@dataclass(eq=False, slots=True)
class _Waiter(Generic[T]):
    class_name: str
    attempt: Callable[[], T | Verdict]
    give_back: Callable[[T], None]
    future: asyncio.Future[T]
    rank: int
    arrived: float
    deferred: bool = False  # its last attempt: not published as first meanwhile


class WaitQueue(Generic[T]):
    """The session requests of one process waiting for capacity.

    ``classes`` are the class names in serving order; ``clock`` measures the waits for
    the metrics (deadlines are the loop's timers); ``on_wait_end`` is told of each wait.
    """

    __slots__ = (
        "_blocker",
        "_clock",
        "_lines",
        "_loop",
        "_on_wait_end",
        "_order",
        "_schedule_lock",
        "_scheduled",
        "classes",
        "limit",
        "timeout_s",
    )

    def __init__(
        self,
        *,
        classes: Sequence[str],
        limit: int,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_wait_end: Callable[[WaitRecord], None] | None = None,
        order: SharedOrder | None = None,
    ) -> None:
        if not classes or len(set(classes)) != len(classes):
            raise ValueError(f"classes must name at least one class, each once; got {classes!r}.")
        if limit < 0:
            raise ValueError(f"limit must be 0 or more; got {limit!r}.")
        if not timeout_s > 0:
            raise ValueError(
                f"timeout_s must be above 0 (with 0, build no queue: refuse at once); "
                f"got {timeout_s!r}."
            )
        self.classes = tuple(classes)
        self.limit = limit
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._on_wait_end = on_wait_end
        self._order = order
        self._lines: dict[str, deque[_Waiter[T]]] = {name: deque() for name in self.classes}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._schedule_lock = threading.Lock()
        self._scheduled = False
        # The waiter the last pass stopped at: only its leaving can let those behind go.
        self._blocker: _Waiter[T] | None = None

    def total(self) -> int:
        """How many wait, in every class."""
        return sum(len(line) for line in self._lines.values())

    def waiting(self) -> dict[str, int]:
        """How many wait in each class, every class named (the metrics' gauge)."""
        return {name: len(line) for name, line in self._lines.items()}

    def ahead(self, class_name: str) -> int:
        """How many waiters a new request of ``class_name`` must let go first (0: none)."""
        found = 0
        for rank, name in enumerate(self.classes):
            found += len(self._lines[name])
            if name == class_name:
                order = self._order
                if order is not None and order.ahead(rank, order.now()):
                    found += 1
                return found
        raise ValueError(f"{class_name!r} is not one of the classes {self.classes!r}.")

    def wake(self) -> None:
        """Capacity may have freed: a pass over the waiters is run soon on their loop."""
        loop = self._loop
        if loop is None or loop.is_closed():
            if self._order is None or self.total():
                return
            # Nobody waits: adopt the running loop, so that the order is told of the pass.
            loop = self._loop = asyncio._get_running_loop()
            if loop is None:
                return
            with self._schedule_lock:
                self._scheduled = False  # one scheduled on the closed loop never ran
        with self._schedule_lock:
            if self._scheduled:
                return
            self._scheduled = True
        try:
            if asyncio._get_running_loop() is loop:
                loop.call_soon(self._scheduled_pass)
            else:
                loop.call_soon_threadsafe(self._scheduled_pass)
        except RuntimeError:  # the loop is closed: nobody is left to wait on it
            with self._schedule_lock:
                self._scheduled = False

    async def wait(
        self,
        *,
        class_name: str,
        attempt: Callable[[], T | Verdict],
        give_back: Callable[[T], None],
        listening: Listener | None = None,
    ) -> Waited[T]:
        """Wait in line until ``attempt`` admits, the deadline, or the client leaves;
        ``full`` at once where ``limit`` wait already."""
        line = self._lines.get(class_name)
        if line is None:
            raise ValueError(f"{class_name!r} is not one of the classes {self.classes!r}.")
        if self.total() >= self.limit:
            return Waited("full", None, 0.0)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self.total():
                raise RuntimeError("a WaitQueue serves the waiters of one event loop at a time.")
            self._loop = loop
            # A pass scheduled on a loop that stopped before running it never will.
            with self._schedule_lock:
                self._scheduled = False
        order = self._order
        waiter = _Waiter(
            class_name,
            attempt,
            give_back,
            loop.create_future(),
            self.classes.index(class_name),
            0.0 if order is None else order.now(),
        )
        since = self._clock()
        deadline = loop.time() + self.timeout_s
        line.append(waiter)
        if order is not None:
            self._publish(order)
        self.wake()
        try:
            outcome = await self._await(waiter, deadline, listening)
        except BaseException:
            self._leave(waiter)
            self._record(class_name, "cancelled", since)
            raise
        if outcome == "admitted" and waiter.future.exception() is not None:
            # The attempt raised: the wait ends with its error, counted as cancelled.
            self._record(class_name, "cancelled", since)
            waiter.future.result()
        waited = self._record(class_name, outcome, since)
        if outcome == "admitted":
            return Waited("admitted", waiter.future.result(), waited)
        return Waited(outcome, None, waited)

    async def _await(
        self, waiter: _Waiter[T], deadline: float, listening: Listener | None
    ) -> WaitOutcome:
        """``admitted`` once the future is done, else the waiter has left the line."""
        loop = asyncio.get_running_loop()
        while not waiter.future.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                self._leave(waiter)
                return "timeout"
            message = None if listening is None else listening.next_message()
            waits: set[asyncio.Future[Any]] = {waiter.future}
            if message is not None:
                waits.add(message)
            done, _ = await asyncio.wait(
                waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter.future.done():
                break
            if message is not None and message in done:
                assert listening is not None
                if listening.heard():
                    self._leave(waiter)
                    return "cancelled"
        return "admitted"

    def _leave(self, waiter: _Waiter[T]) -> None:
        """Take ``waiter`` out of its line, giving back an admission that just came."""
        line = self._lines[waiter.class_name]
        if waiter in line:
            line.remove(waiter)
            if self._order is not None:
                self._publish(self._order)
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            waiter.give_back(future.result())
        else:
            future.cancel()
        if self._blocker is waiter:
            self._blocker = None
            self.wake()

    def _record(self, class_name: str, outcome: WaitOutcome, since: float) -> float:
        seconds = max(0.0, self._clock() - since)
        if self._on_wait_end is not None:
            self._on_wait_end(WaitRecord(class_name, outcome, seconds))
        return seconds

    def _publish(self, order: SharedOrder) -> None:
        """Tell ``order`` this queue's first waiter that may take capacity, and how many wait."""
        waiting = 0
        head = None
        for line in self._lines.values():
            waiting += len(line)
            if head is None:
                for waiter in line:
                    if not waiter.deferred:
                        head = (waiter.rank, waiter.arrived)
                        break
        order.publish(head, waiting)

    def _scheduled_pass(self) -> None:
        """One pass, then the order told of the first waiter now."""
        with self._schedule_lock:
            self._scheduled = False
        self._blocker = None
        order = self._order
        if order is None:
            self._pass(None)
            return
        try:
            self._pass(order)
        finally:
            self._publish(order)
        order.passed()

    def _pass(self, order: SharedOrder | None) -> None:
        """Each class in order, each line from its head, until one does not fit or
        (``order``) another process's waiter goes first."""
        for name in self.classes:
            for waiter in list(self._lines[name]):
                if waiter.future.done():
                    continue  # left in this very instant; its wait removes it
                if order is not None and order.ahead(waiter.rank, waiter.arrived):
                    self._blocker = waiter
                    return
                try:
                    result = waiter.attempt()
                except Exception as error:
                    # Its wait ends with the error; those behind are not held up by it.
                    self._lines[name].remove(waiter)
                    waiter.future.set_exception(error)
                    continue
                waiter.deferred = result is Verdict.DEFERRED
                if result is Verdict.FULL:
                    self._blocker = waiter
                    return
                if result is Verdict.DEFERRED:
                    continue
                self._lines[name].remove(waiter)
                waiter.future.set_result(result)


# --------------------------------------------------------------------------------------
# A session request in the queue (docs/configuration.md, "Waiting and priority").
#
# The service answers a request that does not fit with :class:`Queued`; its attempt is
# a decision like any other (``AdmissionService.admit``). What may free capacity wakes
# the queue: reservations given back or activated (``ledger.tell_changes``), a probe's
# evidence (``_factory.py`` wires both), another worker's ring (``OrderBell``), and
# :class:`FreedWatch`, the fallback where a ring was lost or capacity freed elsewhere.


class Refused(NamedTuple):
    """A request refused: what its answer needs."""

    decision: CapacityDecision
    retry_after_s: int
    #: The sessions (active, pending) it was decided with.
    counts: tuple[int, int]


#: The refusals a wait for capacity may turn into an admission: those that sessions
#: ending, settling or being learned can lift.
WAITABLE: Final = frozenset(
    (
        "memory_pressure",
        "session_limit",
        "telemetry_unavailable",
        "no_memory_limit",
        "probing",
        "tenant_share",
    )
)
#: After a waiter's attempt found the shared ledger held by another worker: the next try.
BUSY_RETRY_S: Final = 0.005


class WaitWatcher(Protocol):
    """Told as a request joins the queue and leaves it (the metrics' gauge)."""

    def joined(self, class_name: str) -> None: ...

    def left(self, class_name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Queued:
    """The request does not fit now and may wait; ``refused``: its answer if it cannot."""

    refused: Refused
    #: The request's priority class, which it waits in.
    class_name: str = DEFAULT_CLASS
    #: The request's tenant (``None``: none).
    tenant: str | None = None


async def wait_in_line(
    queue: WaitQueue[AdmissionTicket],
    *,
    decide: Callable[[], object],
    give_back: Callable[[AdmissionTicket], None],
    queued: Queued,
    listening: Listener | None,
    watcher: WaitWatcher | None = None,
    freed: FreedWatch | None = None,
) -> tuple[Waited[AdmissionTicket], Refused]:
    """Wait in ``queue`` with ``decide`` as the attempt; how the wait ended, and the last
    refusal it was answered."""
    last = [queued.refused]
    loop = asyncio.get_running_loop()

    def attempt() -> AdmissionTicket | Verdict:
        try:
            outcome = decide()
        except LedgerBusy:
            loop.call_later(BUSY_RETRY_S, queue.wake)
            return Verdict.FULL
        if isinstance(outcome, AdmissionTicket):
            return outcome
        assert isinstance(outcome, Refused)  # a waiter's decision is never held nor queued
        last[0] = outcome
        # Its tenant holds its share: it keeps its place, and those behind are tried.
        return Verdict.DEFERRED if outcome.decision.reason == "tenant_share" else Verdict.FULL

    class_name = queued.class_name
    if freed is not None:
        freed.start()
    if watcher is not None:
        watcher.joined(class_name)
    try:
        waited = await queue.wait(
            class_name=class_name, attempt=attempt, give_back=give_back, listening=listening
        )
    finally:
        if watcher is not None:
            watcher.left(class_name)
    return waited, last[0]


def ran_out(outcome: str, last: Refused) -> tuple[CapacityDecision, tuple[int, int]]:
    """The refusal, and its counts, of a wait that ended ``timeout`` or ``full``."""
    decision = last.decision
    reason: Reason = "queue_full" if outcome == "full" else "queue_timeout"
    if decision.reason == "tenant_share":
        reason = "tenant_share"  # it waited for its tenant's share, not for capacity
    return dataclasses.replace(decision, reason=reason, transition=None), last.counts


class FreedWatch:
    """While anyone waits: every ``interval_s``, wake the queue where ``read_usage()`` (sessions
    counted, memory used) fell, or where ``first()`` (``SharedOrder.first``) just became
    true."""

    __slots__ = ("_first", "_interval_s", "_queue", "_read_usage", "_task")

    def __init__(
        self,
        queue: WaitQueue[AdmissionTicket],
        read_usage: Callable[[], tuple[int, int]],
        interval_s: float,
        *,
        first: Callable[[], bool] | None = None,
    ) -> None:
        self._queue = queue
        self._read_usage = read_usage
        self._interval_s = interval_s
        self._first = first
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """A request joins the queue: the watch runs (on the running loop) unless it does."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        queue = self._queue
        before = self._try_read()
        was_first = False
        while queue.total():
            await asyncio.sleep(self._interval_s)
            first = self._first is not None and self._first()
            if first and not was_first:
                queue.wake()  # in case the ring was lost
            was_first = first
            now = self._try_read()
            if now is None:
                continue
            if before is not None and (now[0] < before[0] or now[1] < before[1]):
                queue.wake()
            before = now

    def _try_read(self) -> tuple[int, int] | None:
        try:
            return self._read_usage()
        except LedgerBusy:
            return None


def behind_others(state: State) -> Refused:
    """The refusal of a request behind others that cannot wait: the latch as it stands."""
    reason: Reason = "memory_pressure" if state == "pressured" else "session_limit"
    return Refused(CapacityDecision(False, state, UNAVAILABLE, reason), 0, (0, 0))


def counted_and_used(
    attempt: AbstractContextManager[object],
    own: Callable[[], int | None],
    counts: Callable[[int | None], tuple[int, int]],
    read: Callable[[], MemoryReading],
) -> Callable[[], tuple[int, int]]:
    """The freed watch's reading: the sessions counted and the memory used (0: unread)."""

    def read_usage() -> tuple[int, int]:
        mine = own()
        with attempt:
            active, pending = counts(mine)
        memory = read()
        used = memory.used_bytes if memory.available else None
        return active + pending, used or 0

    return read_usage
