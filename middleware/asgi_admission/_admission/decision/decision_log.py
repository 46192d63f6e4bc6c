"""The guard's log lines: telemetry lost and back, the latch set and cleared.

Each is logged once per change, with the figures; nothing is logged per request.
:class:`DecisionLog` adds, once each, a reserve the limit can never hold and the
first refusal for a busy shared ledger.
"""

from __future__ import annotations

import logging

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    count_cap,
)
from asgi_admission._admission.decision.reserve import never_admits
from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._config import MIB
from asgi_admission._memory.reading import MemoryReading

logger = logging.getLogger("asgi_admission")


def log_change(
    decision: CapacityDecision,
    blind_changed: bool,
    controller: AdmissionController,
    session_limit: int | None,
) -> None:
    """Log what ``decision`` changed: telemetry lost or back, the latch set or cleared.

    ``session_limit`` is the configured count cap (``None``: none while memory reads).
    """
    memory = decision.memory
    if blind_changed:
        if decision.state == "unavailable":
            cap = count_cap(session_limit, True)
            origin = "max_sessions" if session_limit is not None else "the fallback while blind"
            if memory.available:
                # Readable, but nothing to take a percentage of: no memory limit.
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
        logger.info(
            "asgi-admission: memory telemetry recovered: working set %.1f MiB of "
            "%.1f MiB (%.2f%%).",
            (memory.used_bytes or 0) / MIB,
            (memory.limit_bytes or 0) / MIB,
            memory.percent or 0.0,
        )
    if decision.transition == "pressured":
        logger.warning(
            "asgi-admission: memory pressure: refusing new sessions at working set "
            "%.1f MiB of %.1f MiB (%.2f%%; high watermark %.1f%%, reserve %.1f MiB).",
            (memory.used_bytes or 0) / MIB,
            (memory.limit_bytes or 0) / MIB,
            memory.percent or 0.0,
            controller.high_watermark_percent,
            controller.reserve_for(memory.limit_bytes) / MIB,
        )
    elif decision.transition == "normal":
        logger.info(
            "asgi-admission: memory pressure cleared: admitting sessions again at "
            "working set %.1f MiB of %.1f MiB (%.2f%%; resume threshold %.1f%%).",
            (memory.used_bytes or 0) / MIB,
            (memory.limit_bytes or 0) / MIB,
            memory.percent or 0.0,
            controller.resume_threshold_percent,
        )


class DecisionLog:
    """What one guard's decisions changed, logged once per change: telemetry lost and
    back, the latch set and cleared, a reserve that can never fit, a busy ledger.

    ``session_limit`` is the configured count cap (``None``: none while memory reads).
    """

    __slots__ = ("_blind", "_busy_logged", "_controller", "_never_admits_logged", "_session_limit")

    def __init__(self, controller: AdmissionController, session_limit: int | None) -> None:
        self._controller = controller
        self._session_limit = session_limit
        # Shared, lock-protected: whether the last decision was blind.
        self._blind = False
        # Whether the ERROR for a configuration that can never admit has been logged.
        self._never_admits_logged = False
        # Whether a ledger_busy refusal was logged (once: the ledger logs its outages).
        self._busy_logged = False

    def note_blind(self, decision: CapacityDecision) -> bool:
        """Record whether ``decision`` was blind; whether that changed. Under the lock."""
        blind = decision.state == "unavailable"
        changed = blind != self._blind
        self._blind = blind
        return changed

    def changed(self, decision: CapacityDecision, blind_changed: bool) -> None:
        """Log what ``decision`` changed (outside the lock)."""
        if decision.transition == "pressured":
            self._never_admits(decision.memory)
        log_change(decision, blind_changed, self._controller, self._session_limit)

    def busy(self, exc: LedgerBusy) -> None:
        """A ``ledger_busy`` refusal: logged the first time."""
        if not self._busy_logged:
            self._busy_logged = True
            logger.warning(
                "asgi-admission: refusing sessions with ledger_busy: %s. Logged once.", exc
            )

    def _never_admits(self, memory: MemoryReading) -> None:
        # A latch that sets at the first reading of a limit may be set for good: a
        # reserve the limit cannot hold. Said once, at ERROR, naming the setting.
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
