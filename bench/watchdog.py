"""What one watchdog tick costs, and what the running watchdog takes from the event loop.

    .venv/bin/python bench/watchdog.py [--ticks 200] [--sessions 1 4 16 64]
        [--stall-sessions 128] [--stall-seconds 10] [--rounds 2]

Starts N real idle children (each holding 8 MiB, each with one grandchild), registers
them with a ``SessionWatchdog`` whose container reading is calm, and times
``sample_once()``: the whole tick on the event loop, which is what the sampler
takes from the application every ``interval_s``. Also times the one ``/proc`` scan
per tick that finding descendants needs, which grows with the number of processes
on the machine, not with the sessions.

Then the loop's stalls: an asyncio ticker sleeping 1 ms and recording how late each
wake-up is (worst and p99), run for ``--stall-seconds`` with no watchdog (the
baseline), with the running watchdog (its measuring in its own thread) watching
``--stall-sessions`` sessions (a shell with one child each), and with the same
tick run on the loop (``sample_once`` every 0.5 s, how it ran before). Rounds
alternate the three so that machine noise hits each alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

from prometheus_client import CollectorRegistry

from asgi_admission import AdmissionConfig, MemoryReading, SessionWatchdog
from asgi_admission._watchdog.sampler import read_children_map

CHILD = (
    "import subprocess, sys\n"
    "held = b'x' * (8 * 1048576)\n"
    "kid = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'],"
    " stdin=subprocess.PIPE)\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
    "kid.stdin.close(); kid.wait()\n"
)
CALM = MemoryReading(used_bytes=1 << 30, limit_bytes=16 << 30, available=True)


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def _tick_times(watchdog: SessionWatchdog, ticks: int) -> list[float]:
    watchdog.sample_once()  # psutil baselines
    times = []
    for _ in range(ticks):
        started = time.perf_counter()
        watchdog.sample_once()
        times.append(time.perf_counter() - started)
    return times


def _shells(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` shells with one child each, in sessions of their own."""
    return [
        subprocess.Popen(["sh", "-c", "sleep 100000 & wait"], start_new_session=True)
        for _ in range(count)
    ]


async def _lateness(seconds: float) -> list[float]:
    """How late each 1 ms sleep of a ticker on this loop wakes up, for ``seconds``."""
    late: list[float] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
    return late


async def _on_loop(watchdog: SessionWatchdog) -> None:
    # How the watchdog ticked before: the whole tick on the loop, every interval.
    while True:
        watchdog.sample_once()
        await asyncio.sleep(watchdog.interval_s)


async def _stall(mode: str, pids: list[int], seconds: float) -> list[float]:
    watchdog = SessionWatchdog(
        config=AdmissionConfig(), memory_reader=lambda: CALM, registry=CollectorRegistry()
    )
    if mode != "none":
        for pid in pids:
            watchdog.register(pid)
    task = None
    if mode == "thread":
        await watchdog.start()
    elif mode == "loop":
        task = asyncio.ensure_future(_on_loop(watchdog))
    try:
        return await _lateness(seconds)
    finally:
        await watchdog.stop()
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _p99_ms(late: list[float]) -> float:
    return statistics.quantiles(late, n=100)[98] * 1e3


def stall_table(sessions: int, seconds: float, rounds: int) -> None:
    shells = _shells(sessions)
    try:
        time.sleep(0.5)  # every shell has started its child
        pids = [shell.pid for shell in shells]
        results: dict[str, list[float]] = {"none": [], "thread": [], "loop": []}
        for _ in range(rounds):
            for mode in results:
                results[mode] += asyncio.run(_stall(mode, pids, seconds))
    finally:
        for shell in shells:
            os.killpg(shell.pid, 9)
            shell.wait()
    base = results["none"]
    print()
    print(f"Event-loop stalls, {sessions} sessions (a shell with one child each), ")
    print(f"{rounds} rounds of {seconds:g} s per mode, 1 ms ticker:")
    print()
    print("| watchdog | wake-ups | worst stall | p99 | worst vs none | p99 vs none |")
    print("|---|---|---|---|---|---|")
    labels = {
        "none": "none",
        "thread": "running (measures in a thread)",
        "loop": "tick on the loop",
    }
    for mode, late in results.items():
        worst, p99 = max(late) * 1e3, _p99_ms(late)
        print(
            f"| {labels[mode]} | {len(late)} | {worst:.1f} ms | {p99:.2f} ms | "
            f"{worst - max(base) * 1e3:+.1f} ms | {p99 - _p99_ms(base):+.2f} ms |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--stall-sessions", type=int, default=128)
    parser.add_argument("--stall-seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    scans = []
    for _ in range(args.ticks):
        started = time.perf_counter()
        read_children_map()
        scans.append(time.perf_counter() - started)
    processes = sum(1 for name in os.listdir("/proc") if name.isdigit())
    print(f"CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, {processes} processes")
    print(f"/proc scan for descendants: {_median_us(scans):.0f} µs per tick")
    print()
    print(
        "| sessions | tick, with descendants | per session | tick, own process only | per session |"
    )
    print("|---|---|---|---|---|")
    for count in args.sessions:
        children = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            for _ in range(count)
        ]
        try:
            for child in children:
                assert child.stdout is not None
                child.stdout.readline()
            row = [str(count)]
            for include_children in (True, False):
                watchdog = SessionWatchdog(
                    config=AdmissionConfig(),
                    memory_reader=lambda: CALM,
                    registry=CollectorRegistry(),
                )
                for child in children:
                    watchdog.register(child.pid, include_children=include_children)
                tick = _median_us(_tick_times(watchdog, args.ticks))
                row += [f"{tick:.0f} µs", f"{tick / count:.0f} µs"]
            print("| " + " | ".join(row) + " |")
        finally:
            for child in children:
                assert child.stdin is not None
                child.stdin.close()
            for child in children:
                child.wait()
                assert child.stdout is not None
                child.stdout.close()
    stall_table(args.stall_sessions, args.stall_seconds, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
