"""The scheduler's parts on their own: what the class check adds to a decision, and how
long a waiter takes to be admitted once a slot frees.

    .venv/bin/python bench/wait_queue.py [--iterations 20000] [--wakes 2000]

1. The decision: ``AdmissionController.decide`` on a fixed reading, against the same
   reading decided through the one default class (``ClassCeilings.decide``) and the
   empty queue's ``ahead`` a request with the queue on would ask first.
2. Wake latency: one waiter at a time, a slot freed by ``wake()`` from another thread
   (a ticket released on a thread pool) or on the loop (a session that ended), timed
   from the ``wake()`` call to the waiter's ``wait`` returning ``admitted``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from asgi_admission import AdmissionController, MemoryReading
from asgi_admission._admission.decision.latch import ClassCeilings
from asgi_admission._admission.scheduling.priority import classes_in_force
from asgi_admission._admission.scheduling.queue import Verdict, WaitQueue
from benchkit import MIB, timings_us

#: Internal on purpose: the scheduler's class ceilings and wait queue, timed on their own.
INTERNAL = "the scheduler's class ceilings and wait queue, timed on their own"


def decision_costs(iterations: int) -> None:
    reading = MemoryReading(used_bytes=300 * MIB, limit_bytes=1024 * MIB, available=True)
    controller = AdmissionController(reserve_bytes=64 * MIB)
    ceilings = ClassCeilings(
        classes=classes_in_force((), high_watermark_percent=80.0),
        high_watermark_percent=80.0,
        resume_threshold_percent=70.0,
    )
    line: WaitQueue[object] = WaitQueue(classes=ceilings.names, limit=256, timeout_s=10.0)
    held = controller.reserve_for(reading.limit_bytes)

    def by_class() -> object:
        line.ahead("default")
        return ceilings.decide(
            "default",
            reading,
            current_sessions=3,
            session_limit=None,
            pending_sessions=0,
            held_bytes=held,
        )

    latch = timings_us(lambda: controller.decide(reading, 3, None, 0), iterations, warmup=1000)
    classes = timings_us(by_class, iterations, warmup=1000)
    print(f"controller.decide            median {latch[0]:.2f} us  p99 {latch[1]:.2f} us")
    print(f"ahead + default class decide median {classes[0]:.2f} us  p99 {classes[1]:.2f} us")


async def wake_latencies(wakes: int, *, from_thread: bool) -> list[float]:
    line: WaitQueue[int] = WaitQueue(classes=("default",), limit=4, timeout_s=10.0)
    free = [0]

    def attempt() -> int | Verdict:
        if free[0] < 1:
            return Verdict.FULL
        free[0] -= 1
        return 1

    def release() -> None:
        free[0] += 1
        line.wake()

    latencies = []
    started = [0.0]

    def timed_release() -> None:
        started[0] = time.perf_counter()
        release()

    for _ in range(wakes):
        waiter = asyncio.ensure_future(
            line.wait(class_name="default", attempt=attempt, give_back=lambda _: None)
        )
        for _ in range(3):
            await asyncio.sleep(0)  # it has joined and been tried once
        if from_thread:
            thread = threading.Thread(target=timed_release)
            thread.start()
            waited = await waiter
            thread.join()
        else:
            timed_release()
            waited = await waiter
        assert waited.outcome == "admitted"
        latencies.append(time.perf_counter() - started[0])
    return latencies


def report(name: str, latencies: list[float]) -> None:
    latencies.sort()
    median = statistics.median(latencies) * 1e6
    p99 = latencies[int(len(latencies) * 0.99)] * 1e6
    print(f"wake to admission, {name:<12} median {median:.0f} us  p99 {p99:.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--wakes", type=int, default=2000)
    args = parser.parse_args()
    decision_costs(args.iterations)
    report("on the loop", asyncio.run(wake_latencies(args.wakes, from_thread=False)))
    report("from a thread", asyncio.run(wake_latencies(args.wakes, from_thread=True)))


if __name__ == "__main__":
    main()
