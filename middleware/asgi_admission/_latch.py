"""The admission latch: a pure state machine over memory readings.

It knows nothing of ASGI, files or Prometheus. Given the session counts and one
reading, it decides whether one more session may start.

Notes:

- The set and clear conditions are exact complements, so one evaluation can never
  clear the latch and re-arm it (the reference's ``resource_capacity.py``).
- A reserve of R bytes makes the effective admission ceiling ``high - R``: one
  more session is only admitted while its reserve (and those of sessions already
  admitted but not yet started) still fits under the high watermark.
- The fast path (``assess``): every condition of the latch is monotone in the
  working set. So where the last decision was "normal" and an upper bound of the
  working set (raw usage, from a reader's ``read_bound``, without the costly
  ``memory.stat``) with the exact limit already admits without setting the
  latch, the exact working set would have decided the same: admit, normal, no
  transition. Anything else (near the ceiling, latched, blind, after a blind
  decision) takes the full reading. Only ``decision.memory`` differs: the bound,
  marked ``exact=False``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from ._reading import MemoryReader, MemoryReading, slot_setters

State = Literal["normal", "pressured", "unavailable"]
Reason = Literal["memory_pressure", "session_limit", "telemetry_unavailable"]

MIB: Final = 1024 * 1024
DEFAULT_HIGH_WATERMARK_PERCENT: Final = 80.0
DEFAULT_RESUME_THRESHOLD_PERCENT: Final = 70.0
DEFAULT_RESERVE_BYTES: Final = 768 * MIB


@dataclass(frozen=True, slots=True)
class CapacityDecision:
    """What the latch decided for one more session, and the reading it used."""

    allowed: bool
    state: State
    memory: MemoryReading
    #: Machine-readable reason, set exactly when the session is refused.
    reason: Reason | None = None
    #: ``"pressured"`` or ``"normal"`` when this evaluation set or cleared the latch.
    transition: Literal["pressured", "normal"] | None = None


# Decisions are made on the request path: written slot by slot (see slot_setters);
# tests/test_latch.py checks the result equals the constructor's.
_SETTERS = slot_setters(CapacityDecision)
_set_allowed = _SETTERS["allowed"]
_set_state = _SETTERS["state"]
_set_memory = _SETTERS["memory"]
_set_reason = _SETTERS["reason"]
_set_transition = _SETTERS["transition"]


def _decision(
    allowed: bool,
    state: State,
    memory: MemoryReading,
    reason: Reason | None,
    transition: Literal["pressured", "normal"] | None,
) -> CapacityDecision:
    decision: CapacityDecision = object.__new__(CapacityDecision)
    _set_allowed(decision, allowed)
    _set_state(decision, state)
    _set_memory(decision, memory)
    _set_reason(decision, reason)
    _set_transition(decision, transition)
    return decision


def _default_reader() -> MemoryReader:
    from ._cgroup import read_cgroup_memory

    return read_cgroup_memory


class AdmissionController:
    """High-watermark/resume hysteresis latch with per-session memory reserves.

    Thread-safe: one lock covers the reading and the latch update, so concurrent
    callers see a consistent sequence of decisions.
    """

    __slots__ = (
        "_last_state",
        "_lock",
        "_pressured",
        "high_watermark_percent",
        "memory_reader",
        "reserve_bytes",
        "resume_threshold_percent",
    )

    def __init__(
        self,
        *,
        high_watermark_percent: float = DEFAULT_HIGH_WATERMARK_PERCENT,
        resume_threshold_percent: float = DEFAULT_RESUME_THRESHOLD_PERCENT,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        memory_reader: MemoryReader | None = None,
    ) -> None:
        if not 0 < resume_threshold_percent <= high_watermark_percent <= 100:
            raise ValueError(
                "resume_threshold_percent and high_watermark_percent must satisfy "
                f"0 < resume <= high <= 100; got resume={resume_threshold_percent!r}, "
                f"high={high_watermark_percent!r}."
            )
        if reserve_bytes < 0:
            raise ValueError(f"reserve_bytes must be 0 or more; got {reserve_bytes!r}.")
        self.high_watermark_percent = float(high_watermark_percent)
        self.resume_threshold_percent = float(resume_threshold_percent)
        self.reserve_bytes = int(reserve_bytes)
        self.memory_reader: MemoryReader = memory_reader or _default_reader()
        self._pressured = False
        # The state of the last full decision: the fast path follows only "normal".
        self._last_state: State | None = None
        self._lock = threading.Lock()

    @property
    def pressure_state(self) -> Literal["normal", "pressured"]:
        """Whether the latch is set right now."""
        return "pressured" if self._pressured else "normal"

    def ceiling_bytes(self, limit_bytes: int, pending_sessions: int = 0) -> float:
        """Working set above which one more session is refused (high minus reserves)."""
        return limit_bytes * self.high_watermark_percent / 100 - (
            (pending_sessions + 1) * self.reserve_bytes
        )

    def evaluate(
        self,
        current_sessions: int,
        session_limit: int,
        pending_sessions: int = 0,
    ) -> CapacityDecision:
        """Take one reading and decide whether one more session may be admitted.

        ``pending_sessions`` are sessions already admitted that have not grown into
        their memory yet: each holds a count slot and a reserve.
        """
        with self._lock:
            return self.assess(current_sessions, session_limit, pending_sessions)

    def assess(
        self,
        current_sessions: int,
        session_limit: int,
        pending_sessions: int = 0,
        *,
        read: Callable[[], MemoryReading] | None = None,
    ) -> CapacityDecision:
        """:meth:`evaluate` for callers that hold their own lock, with the fast path.

        ``read`` replaces ``memory_reader`` for the full reading (the middleware
        passes one that never raises). Where the reader offers ``read_bound`` and
        the last decision was normal, a bound that admits is the decision.
        """
        used_slots = current_sessions + pending_sessions
        if self._last_state == "normal" and used_slots < session_limit:
            read_bound = getattr(self.memory_reader, "read_bound", None)
            if read_bound is not None:
                try:
                    bound: MemoryReading | None = read_bound()
                except Exception:
                    bound = None
                if bound is not None and self._admits_unchanged(bound, pending_sessions):
                    return _decision(True, "normal", bound, None, None)
        memory = (read or self.memory_reader)()
        return self.decide(memory, current_sessions, session_limit, pending_sessions)

    def _admits_unchanged(self, bound: MemoryReading, pending_sessions: int) -> bool:
        """Whether the latch stays clear even at ``bound``'s (upper bound) working set."""
        used, limit, percent = bound.used_bytes, bound.limit_bytes, bound.percent
        if self._pressured or used is None or limit is None or percent is None:
            return False
        high = self.high_watermark_percent
        needed = (pending_sessions + 1) * self.reserve_bytes
        return percent < high and used + needed <= limit * high / 100

    def decide(
        self,
        memory: MemoryReading,
        current_sessions: int,
        session_limit: int,
        pending_sessions: int = 0,
    ) -> CapacityDecision:
        """Like :meth:`evaluate`, with a reading the caller already took.

        Callers that share the controller between threads hold their own lock
        around this (``evaluate`` does).
        """
        used_slots = current_sessions + pending_sessions
        was_pressured = self._pressured
        percent = memory.percent
        if memory.used_bytes is None or memory.limit_bytes is None or percent is None:
            # Blind: fall back to the fixed cap and forget the latch, so that
            # recovering telemetry starts from a fresh evaluation.
            self._pressured = False
            self._last_state = "unavailable"
            allowed = used_slots < session_limit
            return _decision(
                allowed,
                "unavailable",
                memory,
                None if allowed else "telemetry_unavailable",
                "normal" if was_pressured else None,
            )

        needed = (pending_sessions + 1) * self.reserve_bytes
        reserve_fits = (
            memory.used_bytes + needed <= memory.limit_bytes * self.high_watermark_percent / 100
        )
        if was_pressured:
            if percent <= self.resume_threshold_percent and reserve_fits:
                self._pressured = False
        elif percent >= self.high_watermark_percent or not reserve_fits:
            self._pressured = True

        transition: Literal["pressured", "normal"] | None = None
        if self._pressured != was_pressured:
            transition = "pressured" if self._pressured else "normal"
        self._last_state = "pressured" if self._pressured else "normal"
        if self._pressured:
            return _decision(False, "pressured", memory, "memory_pressure", transition)
        allowed = used_slots < session_limit
        return _decision(
            allowed, "normal", memory, None if allowed else "session_limit", transition
        )
