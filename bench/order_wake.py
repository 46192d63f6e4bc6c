"""Cross-worker wake latency: a slot freed in one worker process, the waiter of another admitted.

    .venv/bin/python bench/order_wake.py [--wakes 300]

Two worker processes (spawned), each a guard as in ``service_wait.py`` (raw ASGI calls
on its own event loop, a settable reading, a count cap of 1,
``ADMISSION_QUEUE_TIMEOUT_SECONDS=10``) over one shared ledger and waiting order. A
WebSocket holds the one slot in one worker, a second waits before its accept in the
other; the holder's client disconnects and the time from then (``time.monotonic()``,
one clock for both processes) to the waiter's ``websocket.accept`` is taken. Then the
roles swap, one waiter at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection

from service_wait import Socket, guard


def worker(shared: str, commands: Connection) -> None:
    """Serve ``hold``, ``wait`` and ``free`` from the parent until ``stop``."""
    asyncio.run(_serve(shared, commands))


async def _serve(shared: str, commands: Connection) -> None:
    mw = guard(shared)
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()
    held: list[Socket] = []
    tasks: set[asyncio.Task[None]] = set()

    async def admitted(session: Socket, accepted: asyncio.Event) -> None:
        await accepted.wait()
        held.append(session)
        commands.send(("admitted", session.accepted_at))

    def on_command() -> None:
        command = commands.recv()
        if command == "stop":
            loop.remove_reader(commands.fileno())
            stopped.set_result(None)
        elif command in ("hold", "wait"):
            accepted = asyncio.Event()
            session = Socket(mw, accepted)
            task = loop.create_task(admitted(session, accepted))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if command == "wait":
                loop.call_later(0.005, commands.send, ("joined", 0.0))  # it is in line
        elif command == "free":
            session = held.pop()
            freed = time.monotonic()
            session.leave.set()
            commands.send(("freed", freed))

    loop.add_reader(commands.fileno(), on_command)
    await stopped
    for session in held:
        session.leave.set()
        await session.task


def expect(pipe: Connection, kind: str) -> float:
    assert pipe.poll(10), f"no {kind!r} from a worker"
    got, at = pipe.recv()
    assert got == kind, (got, kind)
    return float(at)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--wakes", type=int, default=300)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, load {os.getloadavg()[0]:.2f}")
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shared:
        pipes, processes = [], []
        for _ in range(2):
            mine, theirs = spawn.Pipe()
            process = spawn.Process(target=worker, args=(shared, theirs))
            process.start()
            pipes.append(mine)
            processes.append(process)
        pipes[0].send("hold")
        expect(pipes[0], "admitted")
        latencies = []
        holder = 0
        for _ in range(args.wakes):
            waiter = 1 - holder
            pipes[waiter].send("wait")
            expect(pipes[waiter], "joined")
            pipes[holder].send("free")
            freed = expect(pipes[holder], "freed")
            latencies.append(expect(pipes[waiter], "admitted") - freed)
            holder = waiter
        for pipe in pipes:
            pipe.send("stop")
        for process in processes:
            process.join(10)
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    print(
        f"slot freed in one worker -> waiter admitted in the other: median "
        f"{statistics.median(ms):.3f} ms, p99 {p99:.3f} ms, max {ms[-1]:.3f} ms "
        f"({len(ms)} wakes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
