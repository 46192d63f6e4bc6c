"""Whether memory is still arriving: a working set growing fast holds settling by time.

Sessions ramp slower when many start at once on a busy machine than the ramp learned
from calmer ones; releasing them by time while their memory is visibly still coming
would admit a burst past capacity. So the settler (``settling.py``) settles no session
by its ramp time while the working set grows at least ``GROWING_BYTES_PER_S`` (over
readings at least ``GROWTH_WINDOW_S`` apart), nor until it has been quiet for
``GROWTH_QUIET_S``.
"""

from __future__ import annotations

from typing import Final

GROWING_BYTES_PER_S: Final = 16 * 1024 * 1024
GROWTH_WINDOW_S: Final = 0.25
GROWTH_QUIET_S: Final = 1.0


class Growth:
    """The working set's growth, as the exact readings settling sees show it."""

    __slots__ = ("_growing_until", "_ref")

    def __init__(self) -> None:
        self._ref: tuple[int, float] | None = None
        self._growing_until = 0.0

    def note(self, used_bytes: int, now: float) -> None:
        """An exact reading of the working set."""
        ref = self._ref
        if ref is not None and now - ref[1] < GROWTH_WINDOW_S:
            return
        if ref is not None and (used_bytes - ref[0]) / (now - ref[1]) >= GROWING_BYTES_PER_S:
            self._growing_until = now + GROWTH_QUIET_S
        self._ref = (used_bytes, now)

    def quiet(self, now: float) -> bool:
        """Whether no memory has been seen arriving for ``GROWTH_QUIET_S``."""
        return now >= self._growing_until
