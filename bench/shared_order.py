"""What the shared waiting order adds to an attempt, and to a waiter's joining or leaving.

    .venv/bin/python bench/shared_order.py [--iterations 20000] [--dir /dev/shm]

The other workers are other ``SharedOrder``s opened in this process (each its own open
file description, so its own slot lock, as a worker's), in a fresh directory under
``--dir`` (memory-backed, as ``ADMISSION_SHARED_DIR`` should be).

1. ``ahead()``, the question each attempt asks first: alone in the file; with three other
   workers whose waiters are all behind this one (each slot's row checked, no lock
   probed); with one of them ahead (its slot lock probed: the answer is yes).
2. ``publish()``, on every join, leave and admission: the row unchanged (nothing
   written) and changed (one ``pwrite``).
3. A wait queue's pass over one waiter that does not fit, with and without the order.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
from collections.abc import Callable

from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue
from asgi_admission._admission.scheduling.shared_order import SharedOrder
from benchkit import timings_us

#: Internal on purpose: the shared waiting order and the wait queue, timed on their own.
INTERNAL = "the shared waiting order and the wait queue, timed on their own"


def line(name: str, call: Callable[[], object], iterations: int) -> None:
    median, p99 = timings_us(call, iterations, warmup=1000)
    print(f"{name:<60} median {median:.2f} us  p99 {p99:.2f} us")


def costs(directory: str, iterations: int) -> None:
    mine = SharedOrder(directory)
    mine.publish((1, 1000.0), 1)
    others = [SharedOrder(directory) for _ in range(3)]
    line("ahead(), alone in the file", lambda: mine.ahead(1, 1000.0), iterations)
    for index, other in enumerate(others):
        other.publish((1, 2000.0 + index), 2)
    line("ahead(), 3 other workers waiting, all behind", lambda: mine.ahead(1, 1000.0), iterations)
    others[0].publish((0, 3000.0), 1)
    line("ahead(), 3 other workers waiting, one ahead", lambda: mine.ahead(1, 1000.0), iterations)
    line("publish(), row unchanged", lambda: mine.publish((1, 1000.0), 1), iterations)
    flip = [1, 2]

    def changed() -> None:
        flip.reverse()
        mine.publish((1, 1000.0), flip[0])

    line("publish(), row changed (one pwrite)", changed, iterations)
    for order in [mine, *others]:
        order.close()


def pass_costs(directory: str, iterations: int) -> None:
    """One waiter that does not fit, its pass run directly (as a wake's callback is)."""

    async def timed(order: SharedOrder | None) -> tuple[float, float]:
        queue: WaitQueue[int] = WaitQueue(
            classes=("default",), limit=4, timeout_s=600.0, order=order
        )
        waiter = asyncio.ensure_future(
            queue.wait(class_name="default", attempt=lambda: Verdict.FULL, give_back=print)
        )
        for _ in range(3):
            await asyncio.sleep(0)
        result = timings_us(queue._scheduled_pass, iterations, warmup=1000)
        waiter.cancel()
        return result

    for name, order in [("without the order", None), ("with the order", SharedOrder(directory))]:
        median, p99 = asyncio.run(timed(order))
        print(
            f"{'a pass, one waiter that does not fit, ' + name:<60} median {median:.2f} us  "
            f"p99 {p99:.2f} us"
        )
        if order is not None:
            order.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--dir", default="/dev/shm")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="asgi-admission-bench-", dir=args.dir)
    try:
        costs(directory, args.iterations)
        pass_costs(directory, args.iterations)
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
