"""Worker processes for the shared waiting order's tests: each its own wait queue on its own
event loop, taking capacity from the shared ledger, told by a pipe whom to queue."""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection
from typing import Any

from asgi_admission._admission.ledger.ledger import CountedSession, LedgerBusy
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from asgi_admission._admission.reservations.pending import SAMPLE_INTERVAL_S
from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue
from asgi_admission._admission.scheduling.shared_order import SharedOrder

#: Internal on purpose: worker processes drive the wait queue, the shared order and the
#: shared ledger themselves, below the middleware.
INTERNAL = "the wait queue, the shared waiting order and the shared ledger, in processes"

CLASSES = ("critical", "batch")


def order_worker(directory: str, limit: int, commands: Connection, results: Any) -> None:
    """Serve ``("join", name, class)`` commands (answered ``("joined", name)`` once the
    waiter is in line) until ``("stop",)``; each admission is put on ``results`` as
    ``("admitted", name, time.monotonic())``. Capacity: the ledger's sessions, container
    wide, at most ``limit``. As the reservations' periodic sample will, every sample
    interval it wakes its queue when :meth:`SharedOrder.first` says its first waiter
    is the container's."""
    asyncio.run(_serve(directory, limit, commands, results))


async def _serve(directory: str, limit: int, commands: Connection, results: Any) -> None:
    loop = asyncio.get_running_loop()
    ledger = SharedLedger(directory)
    order = SharedOrder(directory)
    queue: WaitQueue[CountedSession] = WaitQueue(
        classes=CLASSES, limit=64, timeout_s=120.0, order=order
    )
    held: list[CountedSession] = []
    waits: set[asyncio.Task[None]] = set()
    stopped = loop.create_future()

    def attempt() -> CountedSession | Verdict:
        try:
            with ledger.attempt():
                active, pending = ledger.counts()
                if active + pending >= limit:
                    return Verdict.FULL
                return ledger.reserve()
        except LedgerBusy:
            return Verdict.FULL  # the next wake or sample tries again

    async def wait(name: str, class_name: str) -> None:
        waited = await queue.wait(class_name=class_name, attempt=attempt, give_back=_release)
        assert waited.admission is not None, waited
        held.append(waited.admission)
        results.put(("admitted", name, time.monotonic()))

    def on_command() -> None:
        command = commands.recv()
        if command[0] == "stop":
            loop.remove_reader(commands.fileno())
            stopped.set_result(None)
            return
        _, name, class_name = command
        task = loop.create_task(wait(name, class_name))
        waits.add(task)
        task.add_done_callback(waits.discard)
        # After the task's first step, which puts the waiter in line and publishes it.
        loop.call_soon(commands.send, ("joined", name))

    async def sample() -> None:
        while True:
            await asyncio.sleep(SAMPLE_INTERVAL_S)
            if order.first():
                queue.wake()

    loop.add_reader(commands.fileno(), on_command)
    sampling = loop.create_task(sample())
    await stopped
    sampling.cancel()
    for task in list(waits):
        task.cancel()
    await asyncio.gather(sampling, *waits, return_exceptions=True)
    for reservation in held:
        reservation.release()
    order.close()
    ledger.close()


def _release(reservation: CountedSession) -> None:
    reservation.release()
