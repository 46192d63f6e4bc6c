"""The attribution queue settling works on (``settling.py``): in one process, or
shared by the workers in a file (``shared_files.SharedSettleQueue``)."""

from __future__ import annotations

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
