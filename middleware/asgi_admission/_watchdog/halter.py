"""Carrying out the watchdog's halts: the event, its count and log line, then the halt
action and ``on_halt``, each awaited as a task of its own when it returns an awaitable.

Every halt records the session's peak first, before its process is signalled.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from asgi_admission._config import MIB
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._watchdog.halt import HaltAction, HaltReason, SessionHalt
from asgi_admission._watchdog.metrics import WatchdogMetrics
from asgi_admission._watchdog.session import SessionWatch

logger = logging.getLogger("asgi_admission")


class Halter:
    """Halts sessions for the watchdog: ``action`` carries a halt out, ``on_halt`` is
    told of it (either may be a coroutine function)."""

    __slots__ = ("_action", "_metrics", "_observe_peak", "_on_halt", "_tasks")

    def __init__(
        self,
        *,
        action: HaltAction,
        on_halt: HaltAction | None,
        metrics: WatchdogMetrics,
        observe_peak: Callable[[SessionWatch], None],
    ) -> None:
        self._action = action
        self._on_halt = on_halt
        self._metrics = metrics
        self._observe_peak = observe_peak
        self._tasks: set[asyncio.Task[Any]] = set()

    def pending(self) -> tuple[asyncio.Task[Any], ...]:
        """The halt callbacks still running, as tasks."""
        return tuple(self._tasks)

    def container_halts(
        self, sessions: list[SessionWatch], reading: MemoryReading, critical_percent: float
    ) -> list[SessionHalt]:
        """While the working set in ``reading`` is at or above ``critical_percent`` of the
        limit: halt the largest of ``sessions`` until what they free brings it under."""
        percent, used, limit = reading.percent, reading.used_bytes, reading.limit_bytes
        if percent is None or used is None or limit is None:
            return []
        if percent < critical_percent:
            return []
        critical_bytes = limit * critical_percent / 100
        freeing = sum(s.last_sample.rss_bytes for s in sessions if s.halt and s.last_sample)
        candidates = sorted(
            (s for s in sessions if s.halt is None and s.last_sample is not None),
            key=lambda s: s.last_sample.rss_bytes if s.last_sample else 0,
            reverse=True,
        )
        halts: list[SessionHalt] = []
        for session in candidates:
            if used - freeing < critical_bytes:
                break
            last = session.last_sample
            assert last is not None
            freeing += last.rss_bytes
            halts.append(
                self.halt(
                    session,
                    "container_headroom",
                    reading,
                    "The session was halted because the service ran short of memory "
                    f"({percent:.1f}% of its limit in use) and it was the largest session.",
                    critical_percent=critical_percent,
                )
            )
        return halts

    def memory_limit(self, session: SessionWatch, critical_percent: float) -> SessionHalt:
        """The kernel killed in the session's group: report it as a halt."""
        group = session.group
        assert group is not None
        peak = group.peak_bytes()
        budget = group.budget_bytes
        event = self.halt(
            session,
            "memory_limit",
            None,
            "The session was stopped because it reached its memory limit of "
            f"{budget / MIB:.0f} MiB.",
            critical_percent=critical_percent,
            group_peak_bytes=peak,
        )
        logger.warning(
            "Session %s (pid %d) reached the limit of its memory group %s: the kernel killed "
            "%d of its processes (budget %d bytes, group peak %s bytes, last RSS %d bytes).",
            session.session_id,
            session.pid,
            group.path,
            group.oom_kills(),
            budget,
            peak,
            event.rss_bytes,
        )
        return event

    def halt(
        self,
        session: SessionWatch,
        reason: HaltReason,
        reading: MemoryReading | None,
        message: str,
        *,
        critical_percent: float,
        group_peak_bytes: int | None = None,
    ) -> SessionHalt:
        """Halt ``session`` for ``reason``: the event, its peak, its count and log line,
        then the halt action and ``on_halt``."""
        last = session.last_sample
        event = SessionHalt(
            session=session,
            reason=reason,
            rss_bytes=last.rss_bytes if last is not None else group_peak_bytes or 0,
            budget_bytes=session.budget_bytes,
            memory=reading,
            critical_watermark_percent=critical_percent,
            message=message,
            group_peak_bytes=group_peak_bytes,
        )
        session.halted(event)
        self._observe_peak(session)
        self._metrics.halted.labels(reason=reason).inc()
        if reason != "memory_limit":  # that one has a line of its own, with the group's figures
            logger.warning(
                "Halting session %s (pid %d, RSS %d bytes, budget %s): %s",
                session.session_id,
                session.pid,
                event.rss_bytes,
                session.budget_bytes,
                reason,
            )
        self._dispatch(self._action, event)
        if self._on_halt is not None:
            self._dispatch(self._on_halt, event)
        return event

    def _dispatch(
        self, callback: Callable[[SessionHalt], Awaitable[None] | None], event: SessionHalt
    ) -> None:
        try:
            result = callback(event)
        except Exception:
            logger.exception("A halt callback failed for session %s.", event.session_id)
            return
        if result is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if inspect.iscoroutine(result):
                result.close()
            logger.error(
                "A halt callback for session %s returned an awaitable, but no event loop "
                "is running to await it.",
                event.session_id,
            )
            return
        task = loop.create_task(_await(result))
        self._tasks.add(task)
        task.add_done_callback(self._callback_done)

    def _callback_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("A halt callback failed.", exc_info=task.exception())


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable
