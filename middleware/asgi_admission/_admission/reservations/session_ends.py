"""How often sessions end: the evidence for a ``Retry-After`` that means something.

When memory is short, the next session fits once one session's worth of memory
is freed. The guard sees sessions end (its count of active sessions falling, or
the app's ``current_sessions``), so the mean interval between recent ends says
how long that is likely to take. Without enough recent ends there is no
evidence, and the configured base delay is used.
"""

from __future__ import annotations

from collections import deque
from typing import Final

#: Ends older than this are no evidence of the current rate.
WINDOW_S: Final = 600.0
#: At least this many recent ends before their rate is trusted.
MIN_ENDS: Final = 3
_KEEP: Final = 64


class SessionEnds:
    """Recent session ends, from successive active counts. Not thread-safe alone."""

    __slots__ = ("_ends", "_last_active", "_last_own")

    def __init__(self) -> None:
        self._ends: deque[float] = deque(maxlen=_KEEP)
        self._last_active: int | None = None
        self._last_own: int | None = None

    def own_share(self, anonymous: int, named: int, own: int | None) -> int:
        """Of ``anonymous`` ends found by a container-wide count (a shared ledger), how
        many were this worker's: as many as the app's own count ``own`` fell, less the
        ``named`` ends already told (none where the app gives no count). Called at
        every sample, with its own count."""
        last, self._last_own = self._last_own, own
        if own is None or last is None:
            return 0
        return max(0, min(anonymous, last - own - named))

    def on_active(self, active: int, now: float) -> int:
        """The active count now; each one fewer than last time is a session that ended.

        Returns how many ended.
        """
        last = self._last_active
        self._last_active = active
        if last is None or active >= last:
            return 0
        self._ends.extend([now] * min(_KEEP, last - active))
        return last - active

    def expected_wait_s(self, now: float) -> float | None:
        """Seconds until the next session end is expected; ``None`` without evidence."""
        ends = self._ends
        while ends and now - ends[0] > WINDOW_S:
            ends.popleft()
        if len(ends) < MIN_ENDS:
            return None
        # Never less than a second: clients coming back at once are only refused again.
        return max(1.0, (ends[-1] - ends[0]) / (len(ends) - 1))
