"""The attribution queue settling works on (``settling.py``): in one process, or
shared by the workers in a file (``shared_files.SharedSettleQueue``), and the changes
a settler makes to one record: find it, move it to the front as a placeholder, drop it
(the module notes of ``settling.py`` say why)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

#: The share of its expected bytes a session's growth must show to settle.
VISIBLE_FRACTION: Final = 0.9


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


def shown_in_request(
    floor: int | None,
    records: list[QueueRecord],
    pid: int,
    seqs: set[int],
    used_bytes: int,
    share: float = VISIBLE_FRACTION,
) -> tuple[int | None, list[QueueRecord]]:
    """Of worker ``pid``'s sessions ``seqs``, of routes that build their memory inside the
    request, at the first reading after their response: those the working set has grown
    by ``share`` of what they are expected to add since their admission have their memory
    there. Each leaves the queue wherever it stands, and the floor rises by what it was
    expected to add (above the head's starting point), so that none of it counts as an
    older session's growth. The floor, and the records taken off (``records`` is changed)."""
    taken: list[QueueRecord] = []
    if not seqs:
        return floor, taken
    for record in list(records):
        if record.pid != pid or record.seq not in seqs:
            continue
        if used_bytes - record.base_bytes < share * record.expected_bytes:
            continue
        floor = take_shown(floor, records, record)
        taken.append(record)
    return (floor if records else None), taken


def take_shown(floor: int | None, records: list[QueueRecord], record: QueueRecord) -> int | None:
    """Take ``record``, whose memory showed, off the queue wherever it stands: the floor
    rises by what it was expected to add (above the head's starting point), so that none
    of it counts as an older session's growth. The new floor (``records`` is changed)."""
    records.remove(record)
    if not records:
        return None
    head = records[0].base_bytes
    return (head if floor is None else max(floor, head)) + record.expected_bytes


def expect_learned(
    records: list[QueueRecord],
    pid: int,
    routes: dict[int, str],
    footprint_bytes: Callable[[str], int | None],
) -> tuple[dict[int, str], dict[int, int]]:
    """Worker ``pid``'s sessions in the queue (their ``routes`` by number) expect no more
    than their route is now learned to add: one admitted on a guess that proved too
    large would otherwise never show its memory, and, a placeholder at the queue's
    front, keep every later session from showing theirs until the timeout. The routes
    of those still queued, and the footprints the lowered ones now expect."""
    kept: dict[int, str] = {}
    lowered: dict[int, int] = {}
    for record in records:
        route = routes.get(record.seq) if record.pid == pid else None
        if route is None:
            continue
        kept[record.seq] = route
        footprint = footprint_bytes(route)
        if footprint is not None and footprint < record.expected_bytes:
            record.expected_bytes = lowered[record.seq] = footprint
    return kept, lowered


def drop_lapsed(
    records: list[QueueRecord],
    pid: int,
    now: float,
    routes: Mapping[int, str],
    seen: Iterable[str],
    ramp_s: Callable[[str], float | None],
) -> list[QueueRecord]:
    """``records`` less worker ``pid``'s placeholders (their ``routes`` by number) whose
    claim protects no one any longer: the longest ramp (``ramp_s``) of the routes ``seen``
    (all of them known) has passed since its admission, so every older session's memory
    has come, and the sessions still queued were admitted after its own ramp, so theirs
    is counted from a working set that held its memory. Each leaves without raising the
    floor: what it claimed is in their starting points."""
    if not records or not records[0].placeholder:
        return records
    ramps = [ramp_s(route) for route in seen]
    if not ramps or None in ramps:
        return records
    longest = max(r for r in ramps if r is not None)
    first = next((r.admitted_at for r in records if not r.placeholder), math.inf)
    kept = []
    for record in records:
        route = routes.get(record.seq) if record.pid == pid and record.placeholder else None
        ramp = None if route is None else ramp_s(route)
        lapsed = ramp is not None and first >= record.admitted_at + ramp
        if not (lapsed and now - record.admitted_at >= longest):
            kept.append(record)
    return kept


def attribute(
    floor: int | None,
    records: list[QueueRecord],
    used: int | None,
    now: float,
    *,
    timeout_s: float,
    alive: Callable[[int], bool],
    shared: bool,
    pid: int,
) -> tuple[int | None, list[QueueRecord], list[int], tuple[int, int] | None]:
    """One pass of first-in, first-out attribution at the exact working set ``used``
    (``None``: none, only placeholders past ``timeout_s`` leave): the new floor, the
    records kept, the sequence numbers of worker ``pid``'s sessions whose memory showed
    (in queue order), and, where the head that stopped the pass is ``pid``'s, its
    sequence number and what it still has to add. Records of workers not ``alive`` are
    skipped at the head, and (``shared``) dropped further back too."""
    start = 0
    count = len(records)
    shown_own: list[int] = []
    head_left: tuple[int, int] | None = None
    while start < count:
        head = records[start]
        if not alive(head.pid):
            start += 1
            continue
        base = head.base_bytes if floor is None else max(floor, head.base_bytes)
        shown = used is not None and used - base >= VISIBLE_FRACTION * head.expected_bytes
        if not shown and not (head.placeholder and now - head.admitted_at >= timeout_s):
            floor = base
            if head.pid == pid and used is not None:
                head_left = (head.seq, max(0, head.expected_bytes - max(0, used - base)))
            break
        floor = base + head.expected_bytes
        start += 1
        if head.pid == pid and not head.placeholder:
            shown_own.append(head.seq)
    kept = records[start:] if start else records
    if not kept:
        floor = None
    # Dead workers' records further back are dropped too: their sessions are gone.
    if shared and any(not alive(r.pid) for r in kept if r.pid != pid):
        kept = [r for r in kept if r.pid == pid or alive(r.pid)]
    return floor, kept, shown_own, head_left


def drop_record(queue: SettleQueue, pid: int, seq: int) -> None:
    """Take the record of session ``seq`` of worker ``pid`` off the queue, if it is there."""
    floor, records = queue.load()
    kept = [r for r in records if not (r.pid == pid and r.seq == seq)]
    if len(kept) != len(records):
        queue.store(floor if kept else None, kept)


def _not_placeholder(record: QueueRecord) -> bool:
    return not record.placeholder
