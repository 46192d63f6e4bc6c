"""Waiting for capacity: a session request that does not fit, in the queue until it does.

With ``ADMISSION_QUEUE_TIMEOUT_SECONDS`` above 0 the admission service answers a
request that does not fit (memory, the count cap, a probe's wait run out) with
:class:`Queued` instead of a refusal, and the request waits here, holding nothing
(``scheduling/queue.py``), until a decision admits it, its wait runs out, or its client
leaves (docs/configuration.md, "Waiting and priority").

Notes:

- A waiter's attempt is a decision like any other (``AdmissionService.admit``), on the
  loop, inside the ledger's critical section; one that does not admit stops the pass
  (``Verdict.FULL``), so nobody behind it goes first. A ledger held by another worker
  stops the pass too, and the queue is woken again a few milliseconds later.
- What may free capacity wakes the queue: this process's reservations given back or
  activated (what the ledger tells of, ``tell_changes``) and a probe's evidence
  (``_factory.py`` wires both), another worker's ring where the waiting order is
  shared (``scheduling/order_bell.py``), and :class:`FreedWatch`, a look every sample
  interval while anyone waits that finds fewer sessions or less memory used than the
  look before (other workers' sessions ending, the app's own count falling, memory the
  app freed) or this worker's first waiter first in the container's order: the
  fallback where a ring was lost.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Final, Protocol

from asgi_admission._admission.decision.latch import CapacityDecision, Reason, State
from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.reservations.tickets import AdmissionTicket
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS
from asgi_admission._admission.scheduling.queue import ClientListener, Verdict, Waited, WaitQueue
from asgi_admission._memory.reading import UNAVAILABLE, MemoryReading

#: What a refusal needs: the decision, the Retry-After delay, (active, pending).
Refused = tuple[CapacityDecision, int, tuple[int, int]]

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
    """The request does not fit now and may wait for capacity (:func:`wait_in_line`):
    ``refused`` is what it would be answered if it could not wait at all."""

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
    listening: ClientListener | None,
    watcher: WaitWatcher | None = None,
    freed: FreedWatch | None = None,
) -> tuple[Waited[AdmissionTicket], Refused]:
    """Wait in ``queue`` with ``decide`` as the attempt (``LedgerBusy`` where the ledger is
    held elsewhere); how the wait ended, and the last refusal it was answered (the one it
    was ``queued`` with where it was never tried). ``watcher`` is told of the wait;
    ``freed`` watches for capacity freed elsewhere while anyone waits."""
    last = [queued.refused]
    loop = asyncio.get_running_loop()

    def attempt() -> AdmissionTicket | Verdict:
        try:
            outcome = decide()
        except LedgerBusy:
            # Another worker holds the shared ledger for microseconds: try again then.
            loop.call_later(BUSY_RETRY_S, queue.wake)
            return Verdict.FULL
        if isinstance(outcome, AdmissionTicket):
            return outcome
        assert isinstance(outcome, tuple)  # a waiter's decision is never held nor queued
        last[0] = outcome
        # Its tenant holds its share: it keeps its place, and those behind are tried.
        return Verdict.DEFERRED if outcome[0].reason == "tenant_share" else Verdict.FULL

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
    """The refusal of a wait that ended without an admission (``timeout`` or ``full``),
    from the ``last`` refusal it was answered, and the counts it was decided with."""
    decision, _, counts = last
    reason: Reason = "queue_full" if outcome == "full" else "queue_timeout"
    if decision.reason == "tenant_share":
        reason = "tenant_share"  # it waited for its tenant's share, not for room
    return dataclasses.replace(decision, reason=reason, transition=None), counts


class FreedWatch:
    """While anyone waits in ``queue``: every ``interval_s``, ``look()`` (the sessions
    counted and the memory used, ``LedgerBusy`` while the ledger is held elsewhere), and a
    wake where either fell since the look before, or where ``first()`` says this worker's
    first waiter has just become the container's first (``SharedOrder.first``; ``None``:
    no order)."""

    __slots__ = ("_first", "_interval_s", "_look", "_queue", "_task")

    def __init__(
        self,
        queue: WaitQueue[AdmissionTicket],
        look: Callable[[], tuple[int, int]],
        interval_s: float,
        *,
        first: Callable[[], bool] | None = None,
    ) -> None:
        self._queue = queue
        self._look = look
        self._interval_s = interval_s
        self._first = first
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """A request joins the queue: the watch runs (on the running loop) unless it does."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        queue = self._queue
        before = self._try_look()
        was_first = False
        while queue.total():
            await asyncio.sleep(self._interval_s)
            first = self._first is not None and self._first()
            if first and not was_first:
                # Just became the container's first: its worker rang it, or (this) the
                # ring was lost. While it stays first the counts below say when to try.
                queue.wake()
            was_first = first
            now = self._try_look()
            if now is None:
                continue
            if before is not None and (now[0] < before[0] or now[1] < before[1]):
                queue.wake()
            before = now

    def _try_look(self) -> tuple[int, int] | None:
        try:
            return self._look()
        except LedgerBusy:
            return None


def behind_others(state: State) -> Refused:
    """What a request that waits behind others would be answered if it could not wait:
    the latch as it stands (``state``), without a reading (the attempt's to take)."""
    reason: Reason = "memory_pressure" if state == "pressured" else "session_limit"
    return CapacityDecision(False, state, UNAVAILABLE, reason), 0, (0, 0)


def counted_and_used(
    attempt: AbstractContextManager[object],
    own: Callable[[], int | None],
    counts: Callable[[int | None], tuple[int, int]],
    read: Callable[[], MemoryReading],
) -> Callable[[], tuple[int, int]]:
    """The freed watch's look: the sessions counted (``counts`` of the app's own count
    ``own()``, asked before the ledger's critical section, which is only tried:
    ``LedgerBusy``) and the memory used (0: unread)."""

    def look() -> tuple[int, int]:
        mine = own()
        with attempt:
            active, pending = counts(mine)
        memory = read()
        used = memory.used_bytes if memory.available else None
        return active + pending, used or 0

    return look
