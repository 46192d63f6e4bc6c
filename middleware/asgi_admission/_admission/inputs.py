"""What the admission service reads from outside it: memory and the app's own count.

Both are the operator's or the app's code, and neither may turn a session request
into a 500: a reader that raises reads as unavailable (the decision is blind and
falls back to the fixed session cap), a count that fails is left out (the ledger
counts the sessions the guard admitted itself) until it answers again.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._memory.reading import UNAVAILABLE, MemoryReading

logger = logging.getLogger("asgi_admission")


class SafeReader:
    """The controller's memory reader, never raising."""

    __slots__ = ("_controller",)

    def __init__(self, controller: AdmissionController) -> None:
        self._controller = controller

    def __call__(self) -> MemoryReading:
        try:
            return self._controller.memory_reader()
        except Exception:
            return UNAVAILABLE


class AppCount:
    """``current_sessions()``, or ``None`` (the ledger's own count) when it fails.

    A broken counter must not turn every session request into a 500: the memory
    latch still guards, and the count falls back to the sessions the guard
    admitted itself until the app's counter answers again (logged once each way).
    """

    __slots__ = ("_failed", "current_sessions")

    def __init__(self, current_sessions: Callable[[], int] | None) -> None:
        #: The app's own count of its sessions; ``None``: the guard counts them.
        self.current_sessions = current_sessions
        self._failed = False

    def __call__(self) -> int | None:
        current_sessions = self.current_sessions
        if current_sessions is None:
            return None
        try:
            count = operator.index(current_sessions())
        except Exception:
            if not self._failed:
                self._failed = True
                logger.exception(
                    "asgi-admission: current_sessions() failed or returned no whole number; "
                    "counting the sessions this middleware admitted until it answers again."
                )
            return None
        if self._failed:
            self._failed = False
            logger.info("asgi-admission: current_sessions() answers again.")
        return count
