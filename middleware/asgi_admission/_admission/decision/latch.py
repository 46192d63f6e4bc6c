"""The admission latch: a pure state machine over memory readings.

It knows nothing of ASGI, files or Prometheus. Given the session counts and one
reading, it decides whether one more session may start (docs/how-it-decides.md).

Notes:

- The set and clear conditions are exact complements, so one evaluation can never
  clear the latch and re-arm it.
- The fast path (``assess``, docs/how-it-decides.md, "The fast path"): where an upper
  bound of the working set admits, so would the exact one; only ``decision.memory``
  differs (the bound, ``exact=False``).
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.scheduling.priority import PriorityClass
from asgi_admission._config import (
    DEFAULT_HIGH_WATERMARK_PERCENT,
    DEFAULT_RESUME_THRESHOLD_PERCENT,
    MIB,
    check_watermarks,
)
from asgi_admission._config_env import BLIND_MAX_SESSIONS
from asgi_admission._memory.reading import (
    MemoryReader,
    MemoryReading,
    draft_class,
    read_cgroup_memory,
)

#: The largest derived reserve, and the reserve shown while no limit is known.
RESERVE_CAP_BYTES: Final = 768 * MIB
#: A derived reserve is this fraction of the limit.
RESERVE_SHARE_OF_LIMIT: Final = 8

logger = logging.getLogger("asgi_admission")


def derived_reserve_bytes(limit_bytes: int | None) -> int:
    """An eighth of ``limit_bytes``, at most 768 MiB; 768 MiB without a limit."""
    if not limit_bytes or limit_bytes <= 0:
        return RESERVE_CAP_BYTES
    share = limit_bytes // RESERVE_SHARE_OF_LIMIT
    return share if share < RESERVE_CAP_BYTES else RESERVE_CAP_BYTES


def never_admits(
    *,
    limit_bytes: int | None,
    high_watermark_percent: float,
    reserve_bytes: int,
    reserve_configured: bool,
) -> str | None:
    """Why nothing can ever be admitted at this limit, naming the setting; ``None`` if it can.

    One reserve at or above the high watermark's share of the limit refuses every session.
    """
    if not limit_bytes or reserve_bytes < limit_bytes * high_watermark_percent / 100:
        return None
    ceiling_mib = limit_bytes * high_watermark_percent / 100 / MIB
    if reserve_configured:
        return (
            f"ADMISSION_SESSION_RESERVE_MB (reserve_bytes) is {reserve_bytes / MIB:.0f} MiB, at or "
            f"above the admission ceiling of the memory limit {limit_bytes / MIB:.1f} MiB "
            f"({high_watermark_percent:g}% high watermark = {ceiling_mib:.1f} MiB): no session "
            f"can ever be admitted. Set it below {ceiling_mib:.0f} MiB, or unset it to derive "
            f"the reserve from the limit ({derived_reserve_bytes(limit_bytes) / MIB:.0f} MiB "
            "here)."
        )
    return (
        f"ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT (high_watermark_percent) is "
        f"{high_watermark_percent:g}%, which leaves {ceiling_mib:.1f} MiB of the memory limit "
        f"{limit_bytes / MIB:.1f} MiB, not more than the derived session reserve "
        f"{reserve_bytes / MIB:.1f} MiB: no session can ever be admitted. Raise the high "
        "watermark, or set ADMISSION_SESSION_RESERVE_MB to what one session needs."
    )


State = Literal["normal", "pressured", "unavailable"]
Transition = Literal["pressured", "normal"]
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
    transition: Transition | None = None


# Decisions are made on the request path: see draft_class.
_Draft = draft_class(CapacityDecision)
_new = object.__new__


def _decision(
    allowed: bool,
    state: State,
    memory: MemoryReading,
    reason: Reason | None,
    transition: Transition | None,
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


# The latch compares the percentage rounded to two decimals, as MemoryReading.percent
# does. round() is slow (bench/README.md) and moves a value by at most 0.005, so
# further than 0.01 from the bound the unrounded value gives the same answer.
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


def latched(was: bool, used: int, held: int, limit: int, high: float, resume: float) -> bool:
    """The latch after one reading: set where ``held`` does not fit under ``high`` or the
    working set reaches it; cleared where it fits and the working set is at most ``resume``."""
    reserve_fits = used + held <= limit * high / 100
    percent = used * 100 / limit
    if was:
        return not (reserve_fits and _rounded_at_most(percent, resume))
    return not reserve_fits or _rounded_at_least(percent, high)


def _latch_decision(
    memory: MemoryReading, was: bool, pressured: bool, used_slots: int, session_limit: int | None
) -> CapacityDecision:
    """The decision on a usable reading, the latch moved from ``was`` to ``pressured``."""
    transition: Transition | None = None
    if pressured != was:
        transition = "pressured" if pressured else "normal"
    if pressured:
        return _decision(False, "pressured", memory, "memory_pressure", transition)
    if session_limit is None or used_slots < session_limit:
        return _decision(True, "normal", memory, None, transition)
    return _decision(False, "normal", memory, "session_limit", transition)


def _blind_decision(
    memory: MemoryReading, used_slots: int, session_limit: int | None, was_pressured: bool
) -> CapacityDecision:
    """The count cap alone decides; the latch, if it was set, clears."""
    allowed = used_slots < (BLIND_MAX_SESSIONS if session_limit is None else session_limit)
    reason: Reason | None = None
    if not allowed:
        # A readable cgroup that is simply unlimited is not a telemetry failure.
        reason = "no_memory_limit" if has_no_limit(memory) else "telemetry_unavailable"
    return _decision(allowed, "unavailable", memory, reason, "normal" if was_pressured else None)


def has_no_limit(memory: MemoryReading) -> bool:
    """Whether ``memory`` was read but is simply unlimited: blind, yet no telemetry failure."""
    return memory.available and memory.used_bytes is not None and memory.limit_bytes is None


def is_blind(memory: MemoryReading | None) -> bool:
    """Whether the latch decides blind on ``memory``: no usable reading, or no limit."""
    return memory is None or memory.percent is None


def count_cap(session_limit: int | None, blind: bool) -> int | None:
    """The count cap in force: ``session_limit``, else ``BLIND_MAX_SESSIONS`` while blind."""
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


class AdmissionController:
    """High-watermark/resume hysteresis latch with per-session memory reserves.

    Thread-safe: one lock covers the reading and the latch update, so concurrent
    callers see a consistent sequence of decisions.
    """

    __slots__ = (
        "_bound_of",
        "_bound_read",
        "_last_state",
        "_lock",
        "_pressured",
        "_read_bound",
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
        #: What the guard learned one session adds (``docs/reservations.md``).
        self.learned_reserve_bytes: int | None = None
        self.learned_replaces = False
        self.memory_reader: MemoryReader = memory_reader or read_cgroup_memory
        self._pressured = False
        # The state of the last full decision: the fast path follows only "normal".
        self._last_state: State | None = None
        # memory_reader's read_bound (None: it has none), looked up once per reader.
        self._bound_of: object = None
        self._read_bound: Callable[[], MemoryReading | None] | None = None
        # Whether the last read_bound() gave a usable bound.
        self._bound_read = False
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

    def ceiling_bytes(
        self, limit_bytes: int, pending_sessions: int = 0, *, held_bytes: int | None = None
    ) -> float:
        """Working set above which one more session is refused (high minus what the
        pending sessions and one more hold back: ``held_bytes``, or a reserve each)."""
        if held_bytes is None:
            held_bytes = self.held(pending_sessions, limit_bytes)
        return limit_bytes * self.high_watermark_percent / 100 - held_bytes

    def memory_room(
        self,
        memory: MemoryReading | None,
        pending_sessions: int = 0,
        *,
        held_bytes: int | None = None,
    ) -> int | None:
        """Deprecated: the earlier name of :meth:`admissible_by_memory` (the same answer)."""
        warnings.warn(
            "AdmissionController.memory_room is deprecated; use admissible_by_memory",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.admissible_by_memory(memory, pending_sessions, held_bytes=held_bytes)

    def admissible_by_memory(
        self,
        memory: MemoryReading | None,
        pending_sessions: int = 0,
        *,
        held_bytes: int | None = None,
    ) -> int | None:
        """How many more sessions memory admits now, one after another; moves nothing.

        The reserves that still fit under the high watermark above the working set
        and what the ``pending_sessions`` and one more hold (``held_bytes``, or a
        reserve each); 0 while the latch is set. ``None`` where memory sets no bound
        in sessions: blind, or a reserve of 0 while the working set is below the high
        watermark.
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
        free = self.ceiling_bytes(limit, pending_sessions, held_bytes=held_bytes) + reserve - used
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
    ) -> CapacityDecision:
        """:meth:`evaluate` for callers that hold their own lock, with the fast path.

        ``read`` replaces ``memory_reader`` for the full reading. Where the reader
        offers ``read_bound`` and the last decision was normal, a bound that admits
        is the decision. Each pending session and one more hold a reserve.
        """
        if self.bound_may_admit(current_sessions, session_limit, pending_sessions):
            bound = self.read_bound()
            if bound is not None:
                used, limit = bound.used_bytes, bound.limit_bytes
                assert used is not None  # read_bound() returns usable bounds only
                assert limit is not None
                if self.bound_admits(used, limit, self.held(pending_sessions, limit)):
                    return self.admitted_on(bound)
        memory = (read or self.memory_reader)()
        return self.decide(memory, current_sessions, session_limit, pending_sessions)

    def bound_may_admit(
        self, current_sessions: int, session_limit: int | None, pending_sessions: int
    ) -> bool:
        """Whether an upper bound of the working set may decide (the fast path): the last
        decision was normal and the count cap allows one more."""
        return self._last_state == "normal" and (
            session_limit is None or current_sessions + pending_sessions < session_limit
        )

    def bound_in_use(self) -> bool:
        """Whether the last decision was normal and the last upper bound read was usable:
        the next decision is likely made on a bound. A hint for what to count first, never
        a decision."""
        return self._bound_read and self._last_state == "normal"

    def admitted_on(self, bound: MemoryReading) -> CapacityDecision:
        """The decision where :meth:`bound_admits` admitted on ``bound``."""
        return _decision(True, "normal", bound, None, None)

    def read_bound(self) -> MemoryReading | None:
        """An upper bound of the working set with the exact limit, where ``memory_reader``
        offers one (``read_bound``: two small reads) and it is usable; else ``None``.
        Never raises."""
        reader = self.memory_reader
        if reader is not self._bound_of:  # the reader may be replaced: look again then
            self._bound_of = reader
            self._read_bound = getattr(reader, "read_bound", None)
        read_bound = self._read_bound
        bound = None
        if read_bound is not None:
            try:
                bound = read_bound()
            except Exception:
                bound = None
            if bound is not None and (
                bound.used_bytes is None or bound.limit_bytes is None or not bound.available
            ):
                bound = None
        self._bound_read = bound is not None
        return bound

    def bound_admits(self, used: int, limit: int, held_bytes: int) -> bool:
        """Whether the latch stays clear even at an upper bound ``used`` of the working set,
        with ``held_bytes`` held for the pending sessions and one more.

        The conditions of :meth:`decide` (percent rounded as ``MemoryReading.percent``
        rounds it), which are monotone in the working set: where the bound admits,
        so would the exact working set. Callers have checked :meth:`bound_may_admit`,
        so the latch is clear.
        """
        if limit <= 0:
            return False
        high = self.high_watermark_percent
        percent = used * 100 / limit
        # Far below high (the common case) needs no rounding.
        if percent >= high - 0.01 and _rounded_at_least(percent, high):
            return False
        return used + held_bytes <= limit * high / 100

    def held(self, pending_sessions: int, limit: int) -> int:
        """What the pending sessions and one more hold back under ``limit`` bytes where
        nothing better is known: a reserve each."""
        return (pending_sessions + 1) * self.reserve_for(limit)

    def decide(
        self,
        memory: MemoryReading,
        current_sessions: int,
        session_limit: int | None,
        pending_sessions: int = 0,
        *,
        held_bytes: int | None = None,
    ) -> CapacityDecision:
        """Like :meth:`evaluate`, with a reading the caller already took and what the
        pending sessions and one more hold back (``held_bytes``; ``None``: a reserve
        each).

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
            return _blind_decision(memory, used_slots, session_limit, was_pressured)

        # latched() and _latch_decision() written out: on the request path the two calls
        # added a tenth to a full decision. tests/scheduling/test_classes.py pins them equal.
        high = self.high_watermark_percent
        if held_bytes is None:
            held_bytes = self.held(pending_sessions, limit)
        reserve_fits = used + held_bytes <= limit * high / 100
        unrounded = used * 100 / limit
        if was_pressured:
            if reserve_fits and _rounded_at_most(unrounded, self.resume_threshold_percent):
                self._pressured = False
        elif not reserve_fits or _rounded_at_least(unrounded, high):
            self._pressured = True
        transition: Transition | None = None
        if self._pressured != was_pressured:
            transition = "pressured" if self._pressured else "normal"
        self._last_state = "pressured" if self._pressured else "normal"
        if self._pressured:
            return _decision(False, "pressured", memory, "memory_pressure", transition)
        if session_limit is None or used_slots < session_limit:
            return _decision(True, "normal", memory, None, transition)
        return _decision(False, "normal", memory, "session_limit", transition)


# --------------------------------------------------------------------------------------
# Priority classes: the latch once per class (docs/configuration.md).
#
# Each class has its own ceiling and latch, which clears at its ceiling less the gap
# between the high watermark and the resume threshold; so a lower class is refused
# first. The conditions are those of ``AdmissionController.decide``; with no classes
# configured the one class, ``default``, answers exactly as the controller does
# (tests/scheduling/test_classes.py). A class's latch moves only on its own requests'
# readings. Not thread-safe: callers hold the controller's lock.


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

    def resume_percent(self, name: str) -> float:
        """Where the class's latch clears (with one more reserve fitting)."""
        return self._resume[name]

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
        """``AdmissionController.decide`` with the class's latch in place of the single one."""
        used_slots = current_sessions + pending_sessions
        used, limit = memory.used_bytes, memory.limit_bytes
        was = self._pressured[name]
        if used is None or not limit or not memory.available:
            self._pressured = dict.fromkeys(self.names, False)
            return _blind_decision(memory, used_slots, session_limit, was)
        pressured = self._pressured[name] = latched(
            was, used, held_bytes, limit, self._ceiling[name], self._resume[name]
        )
        return _latch_decision(memory, was, pressured, used_slots, session_limit)


# --------------------------------------------------------------------------------------
# The guard's log lines: once per change, never per request.


class DecisionLog:
    """What one guard's decisions changed, logged once: also a reserve that can never
    fit, and a busy ledger."""

    __slots__ = ("_blind", "_busy_logged", "_controller", "_never_admits_logged", "_session_limit")

    def __init__(self, controller: AdmissionController, session_limit: int | None) -> None:
        self._controller = controller
        self._session_limit = session_limit
        self._blind = False  # under the service's lock
        self._never_admits_logged = False
        # Once: the ledger logs its own outages.
        self._busy_logged = False

    def note_blind(self, decision: CapacityDecision) -> bool:
        """Record whether ``decision`` was blind; whether that changed. Under the lock."""
        blind = decision.state == "unavailable"
        changed = blind != self._blind
        self._blind = blind
        return changed

    def changed(self, decision: CapacityDecision, blind_changed: bool) -> None:
        """Log what ``decision`` changed (outside the lock): telemetry lost or back, the
        latch set or cleared."""
        memory, controller, session_limit = decision.memory, self._controller, self._session_limit
        if decision.transition == "pressured":
            self._never_admits(memory)
        at = (
            f"working set {(memory.used_bytes or 0) / MIB:.1f} MiB of "
            f"{(memory.limit_bytes or 0) / MIB:.1f} MiB ({memory.percent or 0.0:.2f}%"
        )
        if blind_changed:
            if decision.state == "unavailable":
                cap = count_cap(session_limit, True)
                origin = "max_sessions" if session_limit is not None else "the fallback while blind"
                if memory.available:
                    logger.warning(
                        "asgi-admission: %s has no memory limit (working set %.1f MiB); "
                        "admitting up to %d sessions (%s) until it has one.",
                        memory.path or "the memory source",
                        (memory.used_bytes or 0) / MIB,
                        cap,
                        origin,
                    )
                    return
                logger.warning(
                    "asgi-admission: memory telemetry lost (%s); admitting up to %d "
                    "sessions (%s) until readings return.",
                    memory.path or "no readable cgroup memory files",
                    cap,
                    origin,
                )
                return
            logger.info("asgi-admission: memory telemetry recovered: %s).", at)
        if decision.transition == "pressured":
            logger.warning(
                "asgi-admission: memory pressure: refusing new sessions at %s; high watermark "
                "%.1f%%, reserve %.1f MiB).",
                at,
                controller.high_watermark_percent,
                controller.reserve_for(memory.limit_bytes) / MIB,
            )
        elif decision.transition == "normal":
            logger.info(
                "asgi-admission: memory pressure cleared: admitting sessions again at %s; "
                "resume threshold %.1f%%).",
                at,
                controller.resume_threshold_percent,
            )

    def busy(self, exc: LedgerBusy) -> None:
        """A ``ledger_busy`` refusal: logged the first time."""
        if not self._busy_logged:
            self._busy_logged = True
            logger.warning(
                "asgi-admission: refusing sessions with ledger_busy: %s. Logged once.", exc
            )

    def _never_admits(self, memory: MemoryReading) -> None:
        if self._never_admits_logged:
            return
        controller = self._controller
        problem = never_admits(
            limit_bytes=memory.limit_bytes,
            high_watermark_percent=controller.high_watermark_percent,
            reserve_bytes=controller.reserve_for(memory.limit_bytes),
            reserve_configured=controller.reserve_bytes is not None,
        )
        if problem is not None:
            self._never_admits_logged = True
            logger.error("asgi-admission: %s", problem)
