"""The admission latch: a pure state machine over memory readings.

It knows nothing of ASGI, files or Prometheus. Given the session counts and one
reading, it decides whether one more session may start.

Notes:

- The set and clear conditions are exact complements, so one evaluation can never
  clear the latch and re-arm it (docs/how-it-decides.md).
- A reserve of R bytes makes the effective admission ceiling ``high - R``: one
  more session is only admitted while its reserve (and those of sessions already
  admitted but not yet started) still fits under the high watermark. R is
  ``reserve_for(limit)``: the configured reserve, or one derived from the limit.
- The fast path (``assess``): every condition of the latch is monotone in the
  working set. So where the last decision was "normal" and an upper bound of the
  working set (raw usage, from a reader's ``read_bound``, without the costly
  ``memory.stat``) with the exact limit already admits without setting the
  latch, the exact working set would have decided the same: admit, normal, no
  transition. Anything else (near the ceiling, latched, blind, after a blind
  decision) takes the full reading. Only ``decision.memory`` differs: the bound,
  marked ``exact=False``.
- The count cap (``session_limit``) is the operator's: ``None`` sets none while
  memory is readable, so memory alone decides there, and ``BLIND_MAX_SESSIONS``
  while the guard is blind, where the count is all it has (``count_cap``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from asgi_admission._admission.decision.reserve import derived_reserve_bytes
from asgi_admission._config import (
    DEFAULT_HIGH_WATERMARK_PERCENT,
    DEFAULT_RESUME_THRESHOLD_PERCENT,
    check_watermarks,
)
from asgi_admission._config_env import BLIND_MAX_SESSIONS
from asgi_admission._memory.cgroup import read_cgroup_memory
from asgi_admission._memory.reading import MemoryReader, MemoryReading, draft_class

State = Literal["normal", "pressured", "unavailable"]
#: ``ledger_busy``, ``probing``, ``queue_timeout``, ``queue_full`` and ``tenant_share`` are
#: the middleware's own: the shared ledger could not be had in time, a request's wait for a
#: probe's evidence ran out, its wait for capacity ran out, too many waited already to wait
#: at all, or its tenant holds its share while others wait or are refused.
Reason = Literal[
    "memory_pressure",
    "session_limit",
    "telemetry_unavailable",
    "no_memory_limit",
    "ledger_busy",
    "probing",
    "queue_timeout",
    "queue_full",
    "tenant_share",
]


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


# Decisions are made on the request path: written as a draft (see draft_class);
# tests/test_latch.py checks the result equals the constructor's.
_Draft = draft_class(CapacityDecision)
_new = object.__new__


def _decision(
    allowed: bool,
    state: State,
    memory: MemoryReading,
    reason: Reason | None,
    transition: Literal["pressured", "normal"] | None,
) -> CapacityDecision:
    decision = _new(_Draft)
    decision.allowed = allowed
    decision.state = state
    decision.memory = memory
    decision.reason = reason
    decision.transition = transition
    decision.__class__ = CapacityDecision
    built: CapacityDecision = decision
    return built


# The latch compares the percentage rounded to two decimals, as the guard it replaced
# did, so that both decide alike at the bounds.
# round() is slow (bench/README.md), and it can only move a value by 0.005: further
# than 0.01 from the bound, the unrounded value gives the same answer.
def _rounded_at_least(percent: float, bound: float) -> bool:
    """``round(percent, 2) >= bound``."""
    if percent >= bound + 0.01:
        return True
    if percent < bound - 0.01:
        return False
    return round(percent, 2) >= bound


def _rounded_at_most(percent: float, bound: float) -> bool:
    """``round(percent, 2) <= bound``."""
    if percent <= bound - 0.01:
        return True
    if percent > bound + 0.01:
        return False
    return round(percent, 2) <= bound


def has_no_limit(memory: MemoryReading) -> bool:
    """Whether ``memory`` was read but is simply unlimited: blind, yet no telemetry failure."""
    return memory.available and memory.used_bytes is not None and memory.limit_bytes is None


def is_blind(memory: MemoryReading | None) -> bool:
    """Whether the latch decides blind on ``memory``: no usable reading, or no limit."""
    return memory is None or memory.percent is None


def count_cap(session_limit: int | None, blind: bool) -> int | None:
    """The count cap in force: ``session_limit`` when set; else ``BLIND_MAX_SESSIONS``
    while the guard is blind, and none (``None``: memory alone decides) while it reads."""
    if session_limit is not None:
        return session_limit
    return BLIND_MAX_SESSIONS if blind else None


def count_cap_from(
    session_limit: int | None, blind: bool
) -> Literal["max_sessions", "blind_fallback"] | None:
    """Where :func:`count_cap` comes from: the setting, the blind fallback, or nowhere."""
    if session_limit is not None:
        return "max_sessions"
    return "blind_fallback" if blind else None


class HeldBytes(Protocol):
    """``(route, pending_sessions, limit_bytes) -> bytes``: what the pending sessions and
    one more of ``route`` (``None``: of the largest reserve) hold back; ``None``: one
    reserve each."""

    def __call__(self, route: str | None, pending: int, limit: int, /) -> int | None: ...


class AdmissionController:
    """High-watermark/resume hysteresis latch with per-session memory reserves.

    Thread-safe: one lock covers the reading and the latch update, so concurrent
    callers see a consistent sequence of decisions.
    """

    __slots__ = (
        "_bound_of",
        "_last_state",
        "_lock",
        "_pressured",
        "_read_bound",
        "held_bytes",
        "high_watermark_percent",
        "learned_replaces",
        "learned_reserve_bytes",
        "memory_reader",
        "reserve_bytes",
        "resume_threshold_percent",
    )

    def __init__(
        self,
        *,
        high_watermark_percent: float = DEFAULT_HIGH_WATERMARK_PERCENT,
        resume_threshold_percent: float = DEFAULT_RESUME_THRESHOLD_PERCENT,
        reserve_bytes: int | None = None,
        memory_reader: MemoryReader | None = None,
    ) -> None:
        check_watermarks(high_watermark_percent, resume_threshold_percent, reserve_bytes)
        self.high_watermark_percent = float(high_watermark_percent)
        self.resume_threshold_percent = float(resume_threshold_percent)
        #: The configured reserve; ``None`` derives it from each reading's limit.
        self.reserve_bytes = None if reserve_bytes is None else int(reserve_bytes)
        #: What the guard learned one session adds (``docs/reservations.md``): it
        #: raises the reserve, or replaces it where ``learned_replaces``; ``None``:
        #: nothing learned, or learning off.
        self.learned_reserve_bytes: int | None = None
        self.learned_replaces = False
        #: What the pending sessions and one more of ``route`` hold, given the pending
        #: count and the limit (the guard's settling knows what each still adds);
        #: ``None``: one reserve each.
        self.held_bytes: HeldBytes | None = None
        self.memory_reader: MemoryReader = memory_reader or read_cgroup_memory
        self._pressured = False
        # The state of the last full decision: the fast path follows only "normal".
        self._last_state: State | None = None
        # memory_reader's read_bound (None: it has none), looked up once per reader.
        self._bound_of: object = None
        self._read_bound: Callable[[], MemoryReading | None] | None = None
        self._lock = threading.Lock()

    def learned(self, reserve_bytes: int | None, *, replaces: bool) -> bool:
        """What the guard learned one session adds (``None``: nothing, or learning
        off), and whether it replaces the configured reserve or only raises it;
        whether the learned reserve changed."""
        self.learned_replaces = replaces
        if reserve_bytes == self.learned_reserve_bytes:
            return False
        self.learned_reserve_bytes = reserve_bytes
        return True

    def held_by(self, held: HeldBytes) -> None:
        """Count what the pending sessions hold with ``held`` (the guard's settling
        knows what each still adds) instead of one reserve each."""
        self.held_bytes = held

    @property
    def pressure_state(self) -> Literal["normal", "pressured"]:
        """Whether the latch is set right now."""
        return "pressured" if self._pressured else "normal"

    def reserve_for(self, limit_bytes: int | None) -> int:
        """The reserve held back per session at this memory limit.

        The configured ``reserve_bytes``, or (``None``) an eighth of the limit, at
        most 768 MiB; then what was learned of a session's footprint
        (``learned_reserve_bytes``) raises it, or replaces it where
        ``learned_replaces``. Every use of the reserve goes through here.
        """
        reserve = self.reserve_bytes
        if reserve is None:
            reserve = derived_reserve_bytes(limit_bytes)
        learned = self.learned_reserve_bytes
        if learned is None or (learned <= reserve and not self.learned_replaces):
            return reserve
        return learned

    def ceiling_bytes(self, limit_bytes: int, pending_sessions: int = 0) -> float:
        """Working set above which one more session is refused (high minus what the
        pending sessions and one more hold back)."""
        return limit_bytes * self.high_watermark_percent / 100 - self.held(
            None, pending_sessions, limit_bytes
        )

    def memory_room(self, memory: MemoryReading | None, pending_sessions: int = 0) -> int | None:
        """How many more sessions memory admits now, one after another; moves nothing.

        The reserves that still fit under the high watermark above the working set
        and the ``pending_sessions``' reserves; 0 while the latch is set. ``None``
        where memory sets no bound in sessions: blind, or a reserve of 0 while the
        working set is below the high watermark.
        """
        if memory is None or memory.used_bytes is None or not memory.limit_bytes:
            return None
        if not memory.available:
            return None
        if self._pressured:
            return 0
        used, limit = memory.used_bytes, memory.limit_bytes
        reserve = self.reserve_for(limit)
        if reserve <= 0:
            return 0 if _rounded_at_least(used * 100 / limit, self.high_watermark_percent) else None
        free = self.ceiling_bytes(limit, pending_sessions) + reserve - used
        return max(0, int(free // reserve))

    def evaluate(
        self,
        current_sessions: int,
        session_limit: int | None,
        pending_sessions: int = 0,
    ) -> CapacityDecision:
        """Take one reading and decide whether one more session may be admitted.

        ``session_limit`` caps active plus pending sessions, readable or blind;
        ``None`` sets no cap while memory is readable and ``BLIND_MAX_SESSIONS``
        (16) while the guard is blind. ``pending_sessions`` are sessions already
        admitted that have not grown into their memory yet: each holds a count
        slot and a reserve.
        """
        with self._lock:
            return self.assess(current_sessions, session_limit, pending_sessions)

    def assess(
        self,
        current_sessions: int,
        session_limit: int | None,
        pending_sessions: int = 0,
        *,
        read: Callable[[], MemoryReading] | None = None,
        route: str | None = None,
    ) -> CapacityDecision:
        """:meth:`evaluate` for callers that hold their own lock, with the fast path.

        ``read`` replaces ``memory_reader`` for the full reading (the middleware
        passes one that never raises). Where the reader offers ``read_bound`` and
        the last decision was normal, a bound that admits is the decision.
        """
        if self._last_state == "normal" and (
            session_limit is None or current_sessions + pending_sessions < session_limit
        ):
            if self.memory_reader is not self._bound_of:
                self._look_up_bounds()
            read_bound = self._read_bound
            if read_bound is not None:
                try:
                    bound: MemoryReading | None = read_bound()
                except Exception:
                    bound = None
                if (
                    bound is not None
                    and bound.used_bytes is not None
                    and bound.limit_bytes is not None
                    and bound.available
                    and self._bound_admits(
                        bound.used_bytes, bound.limit_bytes, pending_sessions, route
                    )
                ):
                    return _decision(True, "normal", bound, None, None)
        memory = (read or self.memory_reader)()
        return self.decide(memory, current_sessions, session_limit, pending_sessions, route=route)

    def _look_up_bounds(self) -> None:
        # memory_reader may be replaced: look its bound methods up again then.
        reader = self.memory_reader
        self._bound_of = reader
        self._read_bound = getattr(reader, "read_bound", None)

    def _bound_admits(
        self, used: int, limit: int, pending_sessions: int, route: str | None = None
    ) -> bool:
        """Whether the latch stays clear even at an upper bound ``used`` of the working set.

        The conditions of :meth:`decide` (percent rounded as ``MemoryReading.percent``
        rounds it), which are monotone in the working set: where the bound admits,
        so would the exact working set. Callers have checked that the last decision
        was normal, so the latch is clear.
        """
        if limit <= 0:
            return False
        high = self.high_watermark_percent
        percent = used * 100 / limit
        # Far below high (the common case) needs no rounding.
        if percent >= high - 0.01 and _rounded_at_least(percent, high):
            return False
        # What held() returns; keep the two in step.
        held_bytes = self.held_bytes
        held = None if held_bytes is None else held_bytes(route, pending_sessions, limit)
        if held is None:
            held = (pending_sessions + 1) * self.reserve_for(limit)
        return used + held <= limit * high / 100

    def held(self, route: str | None, pending_sessions: int, limit: int) -> int:
        """What the pending sessions and one more (of ``route``) hold back under ``limit``
        bytes: the ``held_bytes`` a priority class's ceiling is checked with."""
        held = self.held_bytes
        value = None if held is None else held(route, pending_sessions, limit)
        return (pending_sessions + 1) * self.reserve_for(limit) if value is None else value

    def decide(
        self,
        memory: MemoryReading,
        current_sessions: int,
        session_limit: int | None,
        pending_sessions: int = 0,
        *,
        route: str | None = None,
    ) -> CapacityDecision:
        """Like :meth:`evaluate`, with a reading the caller already took.

        Callers that share the controller between threads hold their own lock
        around this (``evaluate`` does).
        """
        used_slots = current_sessions + pending_sessions
        was_pressured = self._pressured
        used, limit = memory.used_bytes, memory.limit_bytes
        # Blind exactly where MemoryReading.percent is None (no reading, no limit).
        if used is None or not limit or not memory.available:
            # Blind: fall back to the count cap and forget the latch, so that
            # recovering telemetry starts from a fresh evaluation.
            self._pressured = False
            self._last_state = "unavailable"
            allowed = used_slots < (BLIND_MAX_SESSIONS if session_limit is None else session_limit)
            reason: Reason | None = None
            if not allowed:
                # A readable cgroup that is simply unlimited is not a telemetry failure.
                reason = "no_memory_limit" if has_no_limit(memory) else "telemetry_unavailable"
            return _decision(
                allowed, "unavailable", memory, reason, "normal" if was_pressured else None
            )

        high = self.high_watermark_percent
        reserve_fits = used + self.held(route, pending_sessions, limit) <= limit * high / 100
        # Compared as MemoryReading.percent (rounded to two decimals) would be.
        unrounded = used * 100 / limit
        if was_pressured:
            if reserve_fits and _rounded_at_most(unrounded, self.resume_threshold_percent):
                self._pressured = False
        elif not reserve_fits or _rounded_at_least(unrounded, high):
            self._pressured = True

        transition: Literal["pressured", "normal"] | None = None
        if self._pressured != was_pressured:
            transition = "pressured" if self._pressured else "normal"
        self._last_state = "pressured" if self._pressured else "normal"
        if self._pressured:
            return _decision(False, "pressured", memory, "memory_pressure", transition)
        if session_limit is None or used_slots < session_limit:
            return _decision(True, "normal", memory, None, transition)
        return _decision(False, "normal", memory, "session_limit", transition)
