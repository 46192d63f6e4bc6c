"""A replica's capacity for more sessions, in the forms proxies read (docs/containers.md).

What each form says, and why never ``down``: docs/containers.md. One check is the
readiness probe's latch on an exact reading and the admissible sessions the metrics
report, taken at most every ``MAX_AGE_S`` however many agent checks or session
responses ask.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Final

from starlette.types import Message, Send

from asgi_admission._admission.decision.latch import CapacityDecision
from asgi_admission._admission.ledger.ledger import LedgerBusy, when_free
from asgi_admission._admission.service import AdmissionService
from asgi_admission._metrics.collector import admissible_sessions, held_by

logger = logging.getLogger("asgi_admission")

#: The oldest check an answer is given from.
MAX_AGE_S: Final = 0.1
#: HAProxy's cap on a server's weight; ``ready N%`` says at most this much.
MAX_PERCENT: Final = 256
#: The percentage said where nothing bounds the sessions (no count cap, a reserve of 0):
#: the server's configured weight.
UNBOUNDED_PERCENT: Final = 100


@dataclass(frozen=True, slots=True)
class Capacity:
    """The replica's capacity at one check."""

    #: More sessions that would be admitted now, one after another; ``None``: nothing
    #: bounds them (no count cap and a reserve of 0).
    admissible: int | None
    #: Whether the next session would be refused (latch set, none fit, ledger busy).
    full: bool
    #: The working set's share of the limit (0-1); ``None`` while blind.
    utilization: float | None


#: The capacity while the workers' shared ledger cannot be had: sessions are refused then.
BUSY: Final = Capacity(admissible=0, full=True, utilization=None)


def capacity_of(decision: CapacityDecision, admissible: int | None) -> Capacity:
    """The :class:`Capacity` a check found."""
    memory = decision.memory
    utilization = None
    if memory.available and memory.used_bytes is not None and memory.limit_bytes:
        utilization = min(1.0, max(0.0, memory.used_bytes / memory.limit_bytes))
    full = not decision.allowed or admissible == 0
    return Capacity(admissible=0 if full else admissible, full=full, utilization=utilization)


def agent_line(capacity: Capacity) -> bytes:
    """HAProxy's agent-check answer for ``capacity``: ``drain``, or ``ready N%``."""
    if capacity.full:
        return b"drain\n"
    if capacity.admissible is None:
        return b"ready %d%%\n" % UNBOUNDED_PERCENT
    return b"ready %d%%\n" % min(capacity.admissible, MAX_PERCENT)


def load_metrics(capacity: Capacity) -> bytes | None:
    """The ``endpoint-load-metrics`` header's value (ORCA's TEXT form) for ``capacity``;
    ``None`` where there is nothing to report (blind and unbounded)."""
    parts = []
    if capacity.utilization is not None:
        parts.append(b"mem_utilization=%.4f" % capacity.utilization)
    if capacity.admissible is not None:
        parts.append(b"named_metrics.admissible_sessions=%d" % capacity.admissible)
    if not parts:
        return None
    return b"TEXT " + b", ".join(parts)


class CapacityView:
    """The capacity of ``service``'s guard, checked no more often than every ``MAX_AGE_S``."""

    def __init__(self, service: AdmissionService) -> None:
        self._service = service
        self._capacity: Capacity | None = None
        self._at = 0.0
        # The check in flight, shared by every caller that came while it ran.
        self._pending: asyncio.Task[Capacity] | None = None
        self._failed = False

    def _check(self) -> tuple[CapacityDecision, int | None]:
        """The readiness probe's check and the admissible sessions, on an exact reading:
        the fast path's bound would understate the capacity."""
        service = self._service
        decision, counts = service.checks.check_with_counts()
        memory = decision.memory if decision.memory.exact else service.read()
        held = held_by(service, counts[1], memory)
        fits = admissible_sessions(
            service.controller, memory, counts, service.session_limit, held_bytes=held
        )
        return decision, fits

    def fresh(self) -> Capacity | None:
        """The last check's capacity if it is recent enough, else ``None``."""
        if self._capacity is not None and time.monotonic() - self._at < MAX_AGE_S:
            return self._capacity
        return None

    async def now(self) -> Capacity:
        """A recent capacity: the last check's, or one new check shared by concurrent callers
        (:data:`BUSY` while the shared ledger stays busy)."""
        capacity = self.fresh()
        if capacity is not None:
            return capacity
        task = self._pending
        if task is None or task.done():
            task = self._pending = asyncio.get_running_loop().create_task(self._take())
            task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    def now_or_last(self) -> Capacity | None:
        """For a response on its way: a recent capacity, one check if the ledger is free now,
        else the last one (``None``: none yet). Never waits."""
        capacity = self.fresh()
        if capacity is not None:
            return capacity
        try:
            return self._store(capacity_of(*self._check()))
        except LedgerBusy:
            return self._capacity
        except Exception:
            self._log_failure()
            return self._capacity

    async def _take(self) -> Capacity:
        try:
            checked = await when_free(self._check)
        except LedgerBusy:
            return self._store(BUSY)
        except Exception:
            self._log_failure()
            raise
        return self._store(capacity_of(*checked))

    def _store(self, capacity: Capacity) -> Capacity:
        self._capacity, self._at = capacity, time.monotonic()
        if self._failed:
            self._failed = False
            logger.info("asgi-admission: the replica's capacity can be checked again.")
        return capacity

    def _log_failure(self) -> None:
        if not self._failed:
            self._failed = True
            logger.exception(
                "asgi-admission: checking the replica's capacity failed; the proxy gets no "
                "answer from the agent check (it keeps the last weight) until it works again."
            )


def _retrieve(task: asyncio.Task[Capacity]) -> None:
    # Its callers may all have left (their connections closed): the failure was logged.
    if not task.cancelled():
        task.exception()


#: The messages that start what a proxy sees as a response, headers and all.
_STARTS: Final = frozenset(
    ("http.response.start", "websocket.accept", "websocket.http.response.start")
)


def reporting(view: CapacityView, send: Send) -> Send:
    """``send`` with an ``endpoint-load-metrics`` header added to the response's start, a
    WebSocket's accept (its ``101``) or its denial response."""

    async def send_with_report(message: Message) -> None:
        if message["type"] in _STARTS:
            capacity = view.now_or_last()
            value = None if capacity is None else load_metrics(capacity)
            if value is not None:
                headers = [*message.get("headers", ()), (b"endpoint-load-metrics", value)]
                message = {**message, "headers": headers}
        await send(message)

    return send_with_report
