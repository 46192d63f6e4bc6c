"""The guard's log lines: telemetry lost and recovered, the latch set and cleared.

Each is logged once per change, with the figures; nothing is logged per request.
"""

from __future__ import annotations

import logging
from typing import Final

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    count_cap,
)

logger = logging.getLogger("asgi_admission")

_MIB: Final = 1024 * 1024


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
                    (memory.used_bytes or 0) / _MIB,
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
            (memory.used_bytes or 0) / _MIB,
            (memory.limit_bytes or 0) / _MIB,
            memory.percent or 0.0,
        )
    if decision.transition == "pressured":
        logger.warning(
            "asgi-admission: memory pressure: refusing new sessions at working set "
            "%.1f MiB of %.1f MiB (%.2f%%; high watermark %.1f%%, reserve %.1f MiB).",
            (memory.used_bytes or 0) / _MIB,
            (memory.limit_bytes or 0) / _MIB,
            memory.percent or 0.0,
            controller.high_watermark_percent,
            controller.reserve_for(memory.limit_bytes) / _MIB,
        )
    elif decision.transition == "normal":
        logger.info(
            "asgi-admission: memory pressure cleared: admitting sessions again at "
            "working set %.1f MiB of %.1f MiB (%.2f%%; resume threshold %.1f%%).",
            (memory.used_bytes or 0) / _MIB,
            (memory.limit_bytes or 0) / _MIB,
            memory.percent or 0.0,
            controller.resume_threshold_percent,
        )
