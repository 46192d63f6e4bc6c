"""Memory freed by sessions that end, so that it does not hide the growth of others.

While sessions settle (``settling.py``) the working set must rise by what each is
expected to add above a floor. Under churn, sessions end while others ramp: the memory
they free makes the working set fall by as much as the others grow, and without this
the sessions still ramping would look as if nothing of theirs had come, their
reservations held until their ramp time or the timeout (docs/reservations.md,
"Settling under churn").

Notes:

- Each end the settler is told of *owes* a credit: at most what a session of its
  route is expected to free (its learned footprint, else its reserve), counted from
  a *mark*, the exact reading before which it cannot have ended (the last one for an
  end told as it happens; the previous sample's for one found by the app's count
  falling at a sample).
- At each exact reading, a fall of the working set since the mark is credited, up to
  what is owed, with the growth it hid: the sessions still ramping are taken to have
  gone on growing as slowly as in the slower of the last two steps that fell nothing.
  The bases of the sessions admitted no later than the mark, and the floor if it has
  not moved since the mark, fall by the credit; the mark moves to this reading. The
  memory left; it counts against no one.
- Only a fall actually seen is credited, never an end's footprint on its own: memory
  a server keeps after a session ends (a kernel kept for reconnection, a cache)
  credits nothing. An ended session's memory that had counted as another's growth
  stays counted (a reservation settles no earlier than it could have before the
  end). A credit not matched within ``CREDIT_S`` lapses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

#: How long after its end a session's freed memory is looked for.
CREDIT_S: Final = 3.0
#: Rates of growth are taken over steps at least this long (decisions read more often).
RATE_STEP_S: Final = 0.1


@dataclass(frozen=True, slots=True)
class Mark:
    """An exact reading, and the queue's floor once it was attributed."""

    used_bytes: int
    at: float
    floor: int | None


@dataclass(frozen=True, slots=True)
class Credit:
    """Memory seen freed: ``bytes`` off the bases admitted by ``mark.at``, and off the
    floor if it is still ``mark.floor``."""

    bytes: int
    mark: Mark


class FreedMemory:
    """What ended sessions may still free, matched against the readings' falls.

    One pool: ends told with different marks look from the oldest of them (a fall
    before an end is memory that left too, and is never counted twice)."""

    __slots__ = ("_bytes", "_last", "_mark", "_rates", "_until")

    def __init__(self) -> None:
        self._bytes = 0
        self._mark: Mark | None = None
        self._until = 0.0
        self._last: tuple[int, float] | None = None
        #: The working set's rate of change over the last two steps that fell nothing.
        self._rates = (0.0, 0.0)

    @property
    def owed(self) -> bool:
        return self._bytes > 0

    def ended(self, freed_bytes: int, since: Mark, now: float) -> None:
        """Sessions ended after the reading ``since``, freeing at most ``freed_bytes``."""
        if freed_bytes <= 0:
            return
        if self._bytes <= 0 or self._mark is None or since.at < self._mark.at:
            self._mark = since
        self._bytes += freed_bytes
        self._until = now + CREDIT_S

    def step(self, used_bytes: int, now: float) -> Credit | None:
        """Each exact reading: what it shows freed since the mark, if anything (the mark
        is moved on by :meth:`moved`)."""
        last = self._last
        credit = None
        mark = self._mark
        if self._bytes > 0 and mark is not None:
            fell = mark.used_bytes - used_bytes
            if fell > 0:
                # Sessions still ramping went on growing meanwhile, as slowly as in
                # either of the last steps before: that much of the fall is hidden.
                hidden = max(0.0, min(self._rates)) * max(0.0, now - mark.at)
                taken = min(self._bytes, int(fell + hidden))
                self._bytes -= taken
                credit = Credit(taken, mark)
            if now >= self._until:
                self._bytes = 0  # lapsed, after this last look
        if last is None or now - last[1] >= RATE_STEP_S or credit is not None:
            self._last = (used_bytes, now)
            if credit is None and last is not None and used_bytes >= last[0]:
                self._rates = (self._rates[1], (used_bytes - last[0]) / (now - last[1]))
        return credit

    def moved(self, mark: Mark) -> None:
        """What is still owed is looked for from ``mark`` on."""
        if self._bytes > 0:
            self._mark = mark


class AdmittedBase(Protocol):
    """A session in the attribution queue (``settling.QueueRecord``)."""

    admitted_at: float
    base_bytes: int


def credited(floor: int | None, records: Sequence[AdmittedBase], credit: Credit) -> int | None:
    """Memory freed since ``credit.mark`` leaves the bases of the sessions admitted by
    then, and the floor where it has not moved since; the floor."""
    for record in records:
        if record.admitted_at <= credit.mark.at:
            record.base_bytes = max(0, record.base_bytes - credit.bytes)
    if floor is not None and floor == credit.mark.floor:
        floor = max(0, floor - credit.bytes)
    return floor
