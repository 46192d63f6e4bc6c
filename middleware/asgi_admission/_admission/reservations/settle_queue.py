"""The attribution queue settling works on (``settling.py``): in one process, or
shared by the workers in a file (``shared_files.SharedSettleQueue``), and the changes
a settler makes to one record: find it, move it to the front as a placeholder, drop it
(the module notes of ``settling.py`` say why)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True)
class QueueRecord:
    """One unsettled session in the attribution queue (the file's row when shared)."""

    pid: int
    seq: int
    admitted_at: float
    base_bytes: int
    expected_bytes: int
    #: Left without showing its memory; still counts its expected bytes.
    placeholder: bool = False


class SettleQueue(Protocol):
    """The attribution queue: in this process, or shared by the workers in a file.

    Called only inside the ledger's critical section.
    """

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        """The floor (``None`` while empty) and the records in admission order."""
        ...

    def store(self, floor: int | None, records: list[QueueRecord]) -> None: ...

    def owner_alive(self, pid: int) -> bool:
        """Whether the worker that queued a record still runs."""
        ...

    @property
    def shared(self) -> bool:
        """Whether other workers' passes may take this worker's records off the queue."""
        ...

    @property
    def others(self) -> tuple[float, ...]:
        """When the other workers' sessions on the queue at the last load were admitted
        (``time.monotonic()``, one clock for every process of the machine)."""
        ...


class LocalSettleQueue:
    """The queue of one process."""

    __slots__ = ("_floor", "_records")

    def __init__(self) -> None:
        self._floor: int | None = None
        self._records: list[QueueRecord] = []

    def load(self) -> tuple[int | None, list[QueueRecord]]:
        return self._floor, self._records

    def store(self, floor: int | None, records: list[QueueRecord]) -> None:
        self._floor, self._records = floor, records

    def owner_alive(self, pid: int) -> bool:
        return True

    @property
    def shared(self) -> bool:
        return False

    @property
    def others(self) -> tuple[float, ...]:
        return ()


def own_record(records: list[QueueRecord], pid: int, seq: int) -> QueueRecord | None:
    """The record of session ``seq`` of worker ``pid``, if it is queued."""
    # Most changes concern recent sessions: search from the newest.
    for record in reversed(records):
        if record.pid == pid and record.seq == seq:
            return record
    return None


def make_placeholder(
    queue: SettleQueue,
    pid: int,
    seq: int,
    *,
    route: str,
    footprint_bytes: Callable[[str], int | None],
) -> bool:
    """Move the record of session ``seq`` of worker ``pid`` to the front of the queue
    (behind the other placeholders) as a placeholder, claiming what a session of its
    ``route`` was learned to add if less than its reserve; a claim of nothing leaves the
    queue at once. Whether it stays, as a placeholder."""
    floor, records = queue.load()
    record = own_record(records, pid, seq)
    if record is None:
        return False
    records.remove(record)
    footprint = footprint_bytes(route)
    if footprint is not None:
        record.expected_bytes = min(record.expected_bytes, footprint)
    if record.expected_bytes > 0:
        record.placeholder = True
        # Placeholders are a prefix of the queue.
        records.insert(bisect.bisect_left(records, True, key=_not_placeholder), record)
    queue.store(floor if records else None, records)
    return record.placeholder


def drop_record(queue: SettleQueue, pid: int, seq: int) -> None:
    """Take the record of session ``seq`` of worker ``pid`` off the queue, if it is there."""
    floor, records = queue.load()
    kept = [r for r in records if not (r.pid == pid and r.seq == seq)]
    if len(kept) != len(records):
        queue.store(floor if kept else None, kept)


def _not_placeholder(record: QueueRecord) -> bool:
    return not record.placeholder
