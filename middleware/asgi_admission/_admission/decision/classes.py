"""Priority classes' ceilings: the latch's hysteresis, once per class.

Each class (``ADMISSION_PRIORITY_CLASSES``) has its own ceiling, a high watermark
of its own, and its own latch: it sets where the class's ceiling is reached (the
working set alone, or with the pending reserves and one more reserve) and clears
at or below the ceiling less the configured gap between the high watermark and the
resume threshold, once one more reserve fits again. So a lower class is refused
first and a higher one keeps its headroom (docs/configuration.md).

Notes:

- The conditions are exactly those of ``AdmissionController.decide``
  (``latch.py``), percentages rounded to two decimals as ``MemoryReading.percent``
  rounds them, with the class's ceiling and resume point for the high watermark
  and the resume threshold. With no classes configured there is one, ``default``,
  at the high watermark, and :meth:`ClassCeilings.decide` answers exactly as the
  controller does (tests/scheduling/test_classes.py checks it on random readings).
- A class's latch moves on the readings its own requests are decided on: a class
  asked rarely keeps its latch set until one of its requests finds the working set
  at or below its resume point, as the single latch does between requests.
- Not thread-safe by itself: callers hold the lock they hold around the
  controller's ``decide``.
"""

from __future__ import annotations

from typing import Literal

from asgi_admission._admission.decision.latch import (
    CapacityDecision,
    Reason,
    count_cap,
    has_no_limit,
)
from asgi_admission._admission.scheduling.priority import PriorityClass
from asgi_admission._memory.reading import MemoryReading

Transition = Literal["pressured", "normal"]


class ClassCeilings:
    """The ceiling, resume point and latch of each priority class, in serving order."""

    __slots__ = ("_ceiling", "_pressured", "_resume", "names")

    def __init__(
        self,
        *,
        classes: tuple[PriorityClass, ...],
        high_watermark_percent: float,
        resume_threshold_percent: float,
    ) -> None:
        if not classes:
            raise ValueError("ClassCeilings needs at least one class (classes_in_force).")
        gap = high_watermark_percent - resume_threshold_percent
        #: The class names, first served first.
        self.names = tuple(entry.name for entry in classes)
        self._ceiling = {entry.name: float(entry.high_watermark_percent) for entry in classes}
        # A class at the high watermark clears at the resume threshold itself, so the
        # default class compares with the very same float as the single latch.
        self._resume = {
            name: resume_threshold_percent if ceiling == high_watermark_percent else ceiling - gap
            for name, ceiling in self._ceiling.items()
        }
        self._pressured = dict.fromkeys(self.names, False)

    def ceiling_percent(self, name: str) -> float:
        """The class's ceiling: its latch sets at this percentage of the limit."""
        return self._ceiling[name]

    def resume_percent(self, name: str) -> float:
        """Where the class's latch clears (with one more reserve fitting)."""
        return self._resume[name]

    def pressured(self, name: str) -> bool:
        """Whether the class's latch is set right now."""
        return self._pressured[name]

    def forget(self) -> None:
        """Clear every class's latch: the guard went blind, and a reading that comes back
        starts afresh, as the single latch does."""
        for name in self.names:
            self._pressured[name] = False

    def fits(self, name: str, *, used_bytes: int, held_bytes: int, limit_bytes: int) -> bool:
        """Move the class's latch on this reading and say whether a request of the class
        fits: the working set ``used_bytes`` and ``held_bytes`` (what the pending sessions
        and one more hold back: the controller's reserves) under the class's ceiling of
        ``limit_bytes`` (above 0), its latch clear."""
        return self._move(name, used_bytes, held_bytes, limit_bytes)[0]

    def bound_admits(
        self, name: str, *, used_bytes: int, held_bytes: int, limit_bytes: int
    ) -> bool:
        """Whether an upper bound ``used_bytes`` of the working set admits a request of the
        class with its latch left alone: the latch is clear and stays clear even at the
        bound, so the exact working set would decide the same (the controller's fast path,
        per class). Moves nothing."""
        if limit_bytes <= 0 or self._pressured[name]:
            return False
        ceiling = self._ceiling[name]
        if round(used_bytes * 100 / limit_bytes, 2) >= ceiling:
            return False
        return used_bytes + held_bytes <= limit_bytes * ceiling / 100

    def _move(self, name: str, used: int, held: int, limit: int) -> tuple[bool, Transition | None]:
        was = self._pressured[name]
        ceiling = self._ceiling[name]
        reserve_fits = used + held <= limit * ceiling / 100
        percent = round(used * 100 / limit, 2)
        now = was
        if was:
            if reserve_fits and percent <= self._resume[name]:
                now = False
        elif not reserve_fits or percent >= ceiling:
            now = True
        self._pressured[name] = now
        transition: Transition | None = None
        if now != was:
            transition = "pressured" if now else "normal"
        return not now, transition

    def decide(
        self,
        name: str,
        memory: MemoryReading,
        *,
        current_sessions: int,
        session_limit: int | None,
        pending_sessions: int,
        held_bytes: int,
    ) -> CapacityDecision:
        """``AdmissionController.decide`` for a request of class ``name``: the class's
        latch in place of the single one, the count cap as ever.

        ``held_bytes`` is what the pending sessions and one more hold back at this
        reading's limit (the controller's reserves for the request's route). Blind, every
        class's latch is cleared and the count cap alone decides; the transition is then
        this class's latch clearing, if it was set.
        """
        used_slots = current_sessions + pending_sessions
        used, limit = memory.used_bytes, memory.limit_bytes
        if used is None or not limit or not memory.available:
            was = self._pressured[name]
            self.forget()
            cap = count_cap(session_limit, blind=True)
            allowed = cap is None or used_slots < cap
            reason: Reason | None = None
            if not allowed:
                reason = "no_memory_limit" if has_no_limit(memory) else "telemetry_unavailable"
            return CapacityDecision(
                allowed, "unavailable", memory, reason, "normal" if was else None
            )
        fits, transition = self._move(name, used, held_bytes, limit)
        if not fits:
            return CapacityDecision(False, "pressured", memory, "memory_pressure", transition)
        if session_limit is None or used_slots < session_limit:
            return CapacityDecision(True, "normal", memory, None, transition)
        return CapacityDecision(False, "normal", memory, "session_limit", transition)
