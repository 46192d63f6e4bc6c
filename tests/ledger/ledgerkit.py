"""Helpers for the ledger tests: worker processes that drive a shared ledger."""

from __future__ import annotations

import multiprocessing
import random
import time
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from asgi_admission._ledger import Reservation
from asgi_admission._shared_ledger import SharedLedger

__all__ = ["SPAWN", "hold_sessions", "random_worker"]

SPAWN = multiprocessing.get_context("spawn")


def random_worker(
    directory: str,
    seed: int,
    operations: int,
    start: Barrier,
    finish: Event,
    results: Any,
) -> None:
    """Reserve, activate and release at random, checking the counts after each step.

    Puts ``("held", active, pending, violations)`` once its operations are done,
    holds its reservations until ``finish`` is set, then releases them all and
    puts ``("released",)``.
    """
    rng = random.Random(seed)
    ledger = SharedLedger(directory)
    pending: list[Reservation] = []
    active: list[Reservation] = []
    violations = 0
    start.wait()
    for _ in range(operations):
        roll = rng.random()
        if roll < 0.4 or not (pending or active):
            with ledger.locked():
                pending.append(ledger.reserve())
        elif roll < 0.6 and pending:
            reservation = pending.pop(rng.randrange(len(pending)))
            reservation.activate()
            active.append(reservation)
        elif roll < 0.8 and pending:
            pending.pop(rng.randrange(len(pending))).release()
        elif active:
            reservation = active.pop(rng.randrange(len(active)))
            reservation.release()
            reservation.release()
        with ledger.locked():
            total_active, total_pending = ledger.counts()
        # Never below zero, and never less than this worker alone holds.
        if total_active < len(active) or total_pending < len(pending):
            violations += 1
    results.put(("held", len(active), len(pending), violations))
    finish.wait(60)
    for reservation in pending + active:
        reservation.release()
    ledger.close()
    results.put(("released",))


def hold_sessions(directory: str, pending: int, active: int, ready: Event) -> None:
    """Hold ``pending`` and ``active`` reservations until killed."""
    ledger = SharedLedger(directory)
    with ledger.locked():
        held = [ledger.reserve() for _ in range(pending + active)]
    for reservation in held[:active]:
        reservation.activate()
    ready.set()
    while True:
        time.sleep(1)
