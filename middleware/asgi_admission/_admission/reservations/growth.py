"""Whether memory is still arriving: a working set growing fast holds settling by time.

Sessions ramp slower when many start at once on a busy machine than the ramp learned
from calmer ones; releasing them by time while their memory is visibly still coming
would admit a burst past capacity. So the settler (``settling.py``) settles no session
by its ramp time while the working set grows at least ``GROWING_BYTES_PER_S`` faster
than what can be explained (over readings at least ``GROWTH_WINDOW_S`` apart), nor
until it has been quiet for ``GROWTH_QUIET_S``.

What can be explained: the memory of sessions built inside their request, at their
response (:meth:`Growth.explain`), and the sessions still within their ramp, as fast as
their learned ramp brings their memory (the ``young_bytes_per_s`` of each reading).
Under churn some session is nearly always ramping: without this, no older session
would ever settle by its ramp time. In a burst the sessions are of one age, none is
within its ramp once the first is past it, and the growth holds them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from asgi_admission._admission.reservations.settlement import Settlement

GROWING_BYTES_PER_S: Final = 16 * 1024 * 1024
GROWTH_WINDOW_S: Final = 0.25
GROWTH_QUIET_S: Final = 1.0
#: A route settling waits for this little (its learned ramp, stretched) builds its memory
#: inside the request (``window_records.quick``): it is there at its response.
QUICK_RAMP_S: Final = 0.4
#: A learned ramp time is stretched this much before it settles a reservation: under
#: CPU contention a burst ramps slower than the sessions it was learned from, and a
#: reservation held a little long costs less than one released before its memory.
#: Within the stretched ramp, a session's memory arrives at the pace of the one learned.
RAMP_MARGIN: Final = 2.0


def quick(ramp_s: float | None) -> bool:
    """Whether a route whose sessions settle by ``ramp_s`` builds them inside the request."""
    return ramp_s is not None and ramp_s <= QUICK_RAMP_S


def young_bytes_per_s(
    entries: Iterable[Settlement], ramp_s: Callable[[str], float | None], now: float
) -> float:
    """How fast the unsettled ``entries`` still within their learned ramp (``ramp_s`` of
    their route is stretched by ``RAMP_MARGIN``) may add memory: what each still adds,
    over that ramp. One past it has nothing left to explain: its memory is as late as
    that of the sessions waiting for their ramp time."""
    total = 0.0
    for entry in entries:
        ramp = ramp_s(entry.route)
        if ramp is not None and not quick(ramp):
            learned = ramp / RAMP_MARGIN
            if now - entry.admitted_at < learned:
                total += entry.remaining / learned
    return total


class Growth:
    """The working set's growth, as the exact readings settling sees show it."""

    __slots__ = ("_explained", "_growing_until", "_ref")

    def __init__(self) -> None:
        self._ref: tuple[int, float] | None = None
        self._growing_until = 0.0
        #: Growth since the reference reading that sessions built in their request made.
        self._explained = 0

    def explain(self, grown_bytes: int) -> None:
        """A session built inside its request showed ``grown_bytes`` at its response."""
        self._explained += grown_bytes

    def note(self, used_bytes: int, now: float, young_bytes_per_s: float = 0.0) -> None:
        """An exact reading of the working set, while the sessions within their ramp may
        add ``young_bytes_per_s``."""
        ref = self._ref
        if ref is not None and now - ref[1] < GROWTH_WINDOW_S:
            return
        if ref is not None:
            rate = (used_bytes - ref[0] - self._explained) / (now - ref[1])
            if rate >= GROWING_BYTES_PER_S + young_bytes_per_s:
                self._growing_until = now + GROWTH_QUIET_S
        self._ref = (used_bytes, now)
        self._explained = 0

    def quiet(self, now: float) -> bool:
        """Whether no memory has been seen arriving for ``GROWTH_QUIET_S``."""
        return now >= self._growing_until
