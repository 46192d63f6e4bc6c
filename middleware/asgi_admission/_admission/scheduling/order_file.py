"""The shared waiting order's file: its rows, and a look at them for operators and tests.

``<shared_dir>/asgi-admission.waiting`` has the session ledger's geometry (a 16-byte
header: magic, slot capacity, slots in use; 32-byte slots), so a worker's slot is
claimed and its liveness told by the ledger's own OFD byte-range lock helpers. A slot
holds ``(pid, class rank, how many wait, the first waiter's arrival, check)``; the
check (a hash of the rest) tells a row torn by a concurrent write, or garbage, from a
real one. ``order_hold.OrderHold`` reads and writes it for ``shared_order.SharedOrder``;
the wake sockets of the workers with waiters are named after their slots
(``order_bell.py``).
"""

from __future__ import annotations

import functools
import os
import struct
from dataclasses import dataclass
from typing import Final

from asgi_admission._admission.ledger.ledger_slots import SLOT as LEDGER_SLOT
from asgi_admission._admission.ledger.ledger_slots import read_rows, slot_held, slot_offset

ORDER_FILE_NAME: Final = "asgi-admission.waiting"
ORDER_MAGIC: Final = b"ASGIWAI1"
#: Slots in a new file: far more worker processes than one container runs.
ORDER_CAPACITY: Final = 256

ORDER_SLOT: Final = struct.Struct("=qiidq")  # pid, class rank, waiting, first arrival, check
# The ledger's slot locks cover its slots' byte ranges: the same geometry here.
assert ORDER_SLOT.size == LEDGER_SLOT.size

EMPTY: Final = bytes(ORDER_SLOT.size)


def check_of(pid: int, rank: int, waiting: int, arrived: float) -> int:
    # Deterministic across processes: numbers hash without the string hash's seed.
    return hash((pid, rank, waiting, arrived))


def row_of(pid: int, rank: int, arrived: float, waiting: int) -> bytes:
    return ORDER_SLOT.pack(pid, rank, waiting, arrived, check_of(pid, rank, waiting, arrived))


def live_rows(fd: int, capacity: int, own_slot: int) -> tuple[bytearray, int]:
    """Under the file's flock: a fresh file's bytes (its header left to fill) holding
    every whole row whose worker lives, and how many slots it uses. ``own_slot`` (-1:
    none) is the caller's, which it writes back itself."""
    old = os.pread(fd, slot_offset(capacity), 0)
    kept = bytearray(slot_offset(capacity))
    used = 0
    for slot in range(capacity):
        offset = slot_offset(slot)
        if slot == own_slot:
            used = slot + 1
            continue
        if not slot_held(fd, slot):
            continue
        used = slot + 1
        row = old[offset : offset + ORDER_SLOT.size]
        if len(row) == ORDER_SLOT.size:
            pid, rank, waiting, arrived, check = ORDER_SLOT.unpack(row)
            if check == check_of(pid, rank, waiting, arrived):
                kept[offset : offset + ORDER_SLOT.size] = row
    return kept, used


@functools.lru_cache(maxsize=64)
def waiting_layout(used: int) -> struct.Struct:
    """The ``waiting`` field of the first ``used`` slots: one ``unpack_from`` tells
    which slots have waiters."""
    return struct.Struct("=" + "12xi16x" * used)


@dataclass(frozen=True, slots=True)
class WaitingEntry:
    """One slot of a waiting file with waiters, as :func:`read_waiting` finds it."""

    slot: int
    pid: int
    rank: int
    waiting: int
    arrived: float
    alive: bool


def read_waiting(directory: str | os.PathLike[str]) -> list[WaitingEntry]:
    """The slots with waiters of the waiting file in ``directory``, each with its
    worker's liveness; for operators and tests (it takes no lock)."""
    return [
        WaitingEntry(slot, pid, rank, waiting, arrived, alive)
        for slot, (pid, rank, waiting, arrived, _), alive in read_rows(
            os.path.join(os.fspath(directory), ORDER_FILE_NAME), ORDER_SLOT
        )
        if waiting
    ]
