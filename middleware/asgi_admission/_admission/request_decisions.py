"""How one session request is decided beyond the latch alone: by its priority class's
ceiling, on an exact reading while its route is probed, and the ``Retry-After`` of a
refusal. The admission service (``service.py``) asks these inside the ledger's critical
section; nothing here takes a lock or awaits.
"""

from __future__ import annotations

import time

from asgi_admission._admission.decision.classes import ClassCeilings
from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    is_blind,
)
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy
from asgi_admission._admission.inputs import SafeReader
from asgi_admission._admission.reservations.pending import ReservationKeeper
from asgi_admission._admission.reservations.probing import Gate
from asgi_admission._memory.reading import MemoryReading


class RequestDecisions:
    """The parts of a decision that the controller's ``assess`` does not make: a class's
    ceiling (``ceilings``; ``None``: one class, the controller's), a probed route's gate
    (``keeper``) and a refusal's delay (``retry_after``)."""

    __slots__ = ("_ceilings", "_controller", "_keeper", "_read", "_retry_after", "_session_limit")

    def __init__(
        self,
        *,
        controller: AdmissionController,
        keeper: ReservationKeeper,
        read: SafeReader,
        session_limit: int | None,
        retry_after: RetryAfterPolicy,
        ceilings: ClassCeilings | None,
    ) -> None:
        self._controller = controller
        self._keeper = keeper
        self._read = read
        self._session_limit = session_limit
        self._retry_after = retry_after
        self._ceilings = ceilings

    def by_class(
        self, klass: str, memory: MemoryReading, route: str, current: int, pending: int
    ) -> CapacityDecision:
        """The decision for a request of priority class ``klass``: its class's ceiling
        and latch on ``memory``, the reserves as the controller counts them."""
        ceilings = self._ceilings
        assert ceilings is not None
        limit = memory.limit_bytes
        return ceilings.decide(
            klass,
            memory,
            current_sessions=current,
            session_limit=self._session_limit,
            pending_sessions=pending,
            held_bytes=self._controller.held(route, pending, limit) if limit else 0,
        )

    def probed(
        self, route: str, current: int, pending: int, expired: bool, klass: str
    ) -> tuple[CapacityDecision, Gate]:
        """A route not learned yet: the latch on an exact reading (a probe's growth counts
        from it), then whether the session is a probe, waits, or is decided as it is."""
        memory = self._read()
        blind = not memory.exact or is_blind(memory)
        # The gate first: this reading may conclude the probes, and raise the reserve.
        gate: Gate = "known" if blind else self._keeper.gate(route, memory.used_bytes)
        if self._ceilings is None:
            decision = self._controller.decide(
                memory, current, self._session_limit, pending, route=route
            )
        else:
            decision = self.by_class(klass, memory, route, current, pending)
        if not decision.allowed or blind:
            return decision, "known"  # refused anyway, or blind: nothing to probe with
        if gate == "hold" and expired:
            refused = CapacityDecision(
                False, decision.state, memory, "probing", decision.transition
            )
            return refused, "known"
        return decision, gate

    def retry_delay(self, decision: CapacityDecision, route: str) -> int:
        """Retry-After for a refusal: from the rate of session ends when memory is short,
        about the probes' ramp so far while probing."""
        if decision.reason in ("memory_pressure", "queue_timeout", "queue_full"):
            wait = self._keeper.expected_wait_s(time.monotonic())
            if wait is not None:
                return self._retry_after.delay_for(wait)
        elif decision.reason == "probing":
            ramp = self._keeper.expected_wait_s(time.monotonic(), probed=route)
            assert ramp is not None  # a probed route's ramp is always known
            return self._retry_after.delay_for(ramp)
        return self._retry_after.next_delay()
