"""The keeper's looks at memory: when one is due, what a reading settles and teaches.

A :class:`Looks` holds what the keeper needs between two readings (when the last
was taken, the settling queue's mark at the last sample, the session ends already
told by their route, the memory limit of the last admission) and takes the
readings: a decision's own, one due after a sample interval, and the periodic
sample's step inside the ledger's critical section.

Notes:

- Every method runs inside the ledger's critical section (the keeper enters it):
  the actions returned release or activate reservations, which take the same lock,
  so the keeper applies them after leaving it.
- The sample reads memory only while something is unsettled, being learned or
  probed, or waits in the workers' shared queue, and the active count (for the rate
  of session ends) every time: it never blocks on anything slower than the ledger's
  lock.
- A session end told by its route (a WebSocket that closed, a ticket released) is
  counted here, so that the active count falling for it at the next sample is not
  taken for a second, anonymous end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from asgi_admission._admission.reservations.freed import Mark
from asgi_admission._admission.reservations.keeper_parts import KeeperParts
from asgi_admission._admission.reservations.session_ends import SessionEnds
from asgi_admission._admission.reservations.settlement import Action
from asgi_admission._admission.reservations.shared_files import SharedSettleQueue
from asgi_admission._memory.reading import MemoryReading

#: How often the periodic sample looks, and the least time between two looks that
#: a stream of decisions takes for learning.
SAMPLE_INTERVAL_S: Final = 0.25


class Looks:
    """The readings behind one keeper's settling and learning (see the module notes).

    ``read`` takes an exact reading and never raises; ``active_count(own)`` is the
    container's active sessions, given the app's own count ``own``; ``ends`` records
    how often sessions end.
    """

    def __init__(
        self,
        *,
        parts: KeeperParts,
        read: Callable[[], MemoryReading],
        active_count: Callable[[int | None], int],
        ends: SessionEnds,
    ) -> None:
        self._parts = parts
        self._read = read
        self._active_count = active_count
        self._ends = ends
        self._learning = parts.view.learning != "off"
        self._next_look = 0.0
        self._sample_mark: Mark | None = None
        #: Active sessions seen ending by their route since the last sample.
        self._named_ends = 0
        #: The memory limit of the last admission.
        self.limit: int | None = None

    def note_limit(self, limit_bytes: int) -> None:
        """An admission was decided under the memory limit ``limit_bytes``."""
        self.limit = limit_bytes

    def named_end(self) -> None:
        """An active session ended and was told by its route."""
        self._named_ends += 1

    def due(self) -> Sequence[Action]:
        """Settle from a fresh reading when the last look is a sample interval old.

        For decisions that read no exact working set themselves: where the app
        runs without lifespan (no periodic sample), traffic still settles.
        """
        settler = self._parts.settler
        if not settler.past_response:
            return ()
        now = self._parts.clock()
        if now < self._next_look:
            return ()
        memory = self._read()
        if not memory.available or memory.used_bytes is None:
            return settler.settle(None, now)
        return self.take(memory.used_bytes, now)

    def settle_with(self, memory: MemoryReading) -> Sequence[Action]:
        """A decision's own reading settles what it shows (exact readings only).

        Used at once while sessions wait past their response; otherwise (for
        learning) at most once per sample interval, so that a stream of decisions
        costs no more than the sample would. An unavailable reading settles what is
        timed out, at most once per sample interval.
        """
        if memory.used_bytes is None or not memory.available:
            return self._timed_out()
        if not memory.exact:
            return ()
        now = self._parts.clock()
        if not self._parts.settler.past_response and now < self._next_look:
            return ()
        return self.take(memory.used_bytes, now)

    def _timed_out(self) -> Sequence[Action]:
        # Memory unreadable: nothing shows, but what is due by time (a held ticket, a
        # request past its timeout) still ends where no periodic sample runs.
        settler = self._parts.settler
        now = self._parts.clock()
        if not settler.unsettled or now < self._next_look:
            return ()
        self._next_look = now + SAMPLE_INTERVAL_S
        return settler.settle(None, now)

    def take(self, used_bytes: int, now: float) -> list[Action]:
        """The working set ``used_bytes`` read at ``now``: teach it, settle by it."""
        parts = self._parts
        self._next_look = now + SAMPLE_INTERVAL_S
        if self._learning:
            busy = parts.probing and parts.board.busy
            parts.learner.on_reading(used_bytes, now, others=parts.queue.others)
            if busy:
                parts.board.on_reading(used_bytes, now, parts.learner)
            parts.sharing.publish()
        return parts.settler.settle(used_bytes, now)

    def sample(self, own: int | None, now: float) -> list[Action]:
        """The periodic sample's step, given the app's own count ``own``."""
        parts = self._parts
        settler, learner, board, holds = parts.settler, parts.learner, parts.board, parts.holds
        actions: list[Action] = []
        probing = parts.probing and (board.busy or bool(holds))
        ended = self._ends.on_active(self._active_count(own), now)
        # Ends whose route is known were told already; the others are the app's count
        # falling (or other workers' sessions), of a route the learner shares out.
        named, self._named_ends = self._named_ends, 0
        anonymous = max(0, ended - named)
        # The container's count has the other workers' ends in it too.
        shared = parts.queue.shared
        mine = self._ends.own_share(anonymous, named, own) if shared else anonymous
        if anonymous:
            # Found by a count: they ended since the last sample's reading.
            freed = anonymous * parts.controller.reserve_for(self.limit)
            settler.ended(freed, now, since=self._sample_mark)
        if anonymous and self._learning:
            if mine:
                learner.on_session_end(now, count=mine)
            if anonymous > mine:
                learner.on_foreign_end()
        if ended and probing:
            board.session_ended(now)
        if settler.unsettled or learner.observing or self._queue_busy() or probing:
            memory = self._read()
            if memory.available and memory.used_bytes is not None:
                actions += self.take(memory.used_bytes, now)
            else:
                actions += settler.settle(None, now)
        self._sample_mark = settler.mark
        # While requests wait for another worker's probe, what it learned is looked
        # for at every sample.
        parts.sharing.refresh(now, urgent=probing and bool(holds))
        if holds:
            # Requests that may go on now: their route is known, or (another worker's
            # probe having left or concluded) a probe's slot is free.
            for route in board.ready(holds.routes(), parts.view.known(), now):
                holds.wake(route)
        return actions

    def _queue_busy(self) -> bool:
        # Other workers' sessions in a shared queue need this worker's samples too.
        queue = self._parts.queue
        return isinstance(queue, SharedSettleQueue) and bool(queue.load()[1])
