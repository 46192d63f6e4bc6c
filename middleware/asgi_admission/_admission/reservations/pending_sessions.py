"""This process's unsettled sessions, their phases counted, and each way one leaves.

Notes:

- The settler (``settling.py``) decides when a session leaves; this says what its
  leaving does: settled (its reservation released or made active by its kind),
  given back (released, its memory still expected as a placeholder), activated (a
  started session) or dropped (it failed or ended: released, its record taken off
  the attribution queue). Each returns the reservation changes to make once the
  ledger's critical section is left, as the settler's own methods do.
- The counts of sessions waiting past their response, and of those and the held
  tickets, follow every change of phase: reading them costs no pass over the entries.
- A session that leaves without showing its memory moves to the front of the queue
  as a placeholder (``settle_queue.make_placeholder``; the settler's module notes say
  why). Entries are kept in admission order, the order ``settlement.due`` reads them in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from asgi_admission._admission.reservations.settle_queue import (
    SettleQueue,
    drop_record,
    make_placeholder,
)
from asgi_admission._admission.reservations.settlement import (
    PAST_RESPONSE,
    Action,
    Phase,
    Settlement,
)


class PendingSessions:
    """The settlements of one process not yet settled, by number in admission order.

    ``queue`` is the attribution queue their records are in, ``pid`` the process's,
    ``footprint_bytes(route)`` a route's learned footprint or ``None``. Changed only
    inside the ledger's critical section."""

    __slots__ = ("_entries", "_footprint_bytes", "_pid", "_queue", "past_response", "waiting")

    def __init__(
        self, queue: SettleQueue, pid: int, footprint_bytes: Callable[[str], int | None]
    ) -> None:
        self._queue = queue
        self._pid = pid
        self._footprint_bytes = footprint_bytes
        self._entries: dict[int, Settlement] = {}
        #: Sessions past their response, not held, not yet settled.
        self.waiting = 0
        #: Those and the held tickets past their response, not yet started.
        self.past_response = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Settlement]:
        return iter(self._entries.values())

    def add(self, entry: Settlement) -> None:
        self._entries[entry.seq] = entry

    def get(self, seq: int) -> Settlement | None:
        return self._entries.get(seq)

    def held(self) -> tuple[int, int]:
        """What the sessions are still expected to add, and how many there are."""
        entries = self._entries.values()
        return sum(entry.remaining for entry in entries), len(entries)

    def oldest_waiting(self, count: int) -> list[Settlement]:
        """The oldest ``count`` sessions waiting past their response (fewer if fewer wait)."""
        oldest: list[Settlement] = []
        for entry in self._entries.values():
            if len(oldest) >= count:
                break
            if entry.phase == "waiting":
                oldest.append(entry)
        return oldest

    def phase(self, entry: Settlement, phase: Phase) -> None:
        self.waiting += (phase == "waiting") - (entry.phase == "waiting")
        self.past_response += (phase in PAST_RESPONSE) - (entry.phase in PAST_RESPONSE)
        entry.phase = phase

    def settle(self, entry: Settlement) -> list[Action]:
        self.phase(entry, "done")
        self._entries.pop(entry.seq, None)
        outcome = entry.settle_outcome
        entry.released = outcome == "release"
        return [(entry.reservation, outcome)]

    def give_back(self, entry: Settlement) -> list[Action]:
        self.mark_placeholder(entry)
        self.phase(entry, "done")
        entry.released = True
        self._entries.pop(entry.seq, None)
        return [(entry.reservation, "release")]

    def activate(self, entry: Settlement) -> list[Action]:
        # A started session: active from now on, until its app releases it.
        self._entries.pop(entry.seq, None)
        return [(entry.reservation, "activate")]

    def activate_started(self) -> list[Action]:
        """Every started session kept pending becomes active."""
        covering = [entry for entry in self._entries.values() if entry.phase == "started"]
        return [action for entry in covering for action in self.activate(entry)]

    def drop(self, entry: Settlement) -> list[Action]:
        # Releasing is idempotent: a settled session (an active WebSocket, a started
        # ticket) is released here too when it ends.
        entry.released = True
        if entry.phase != "done":
            self.phase(entry, "done")
            self._entries.pop(entry.seq, None)
            if entry.queued:
                drop_record(self._queue, self._pid, entry.seq)
        return [(entry.reservation, "release")]

    def mark_placeholder(self, entry: Settlement) -> bool:
        """Move the session's record to the front of the queue as a placeholder; whether
        it stays there (``settle_queue.make_placeholder``)."""
        # It may have all its memory by now, ahead of older sessions still ramping: at
        # the front, growth pays for it before crediting anyone.
        if not entry.queued:
            return False
        return make_placeholder(
            self._queue,
            self._pid,
            entry.seq,
            route=entry.route,
            footprint_bytes=self._footprint_bytes,
        )
