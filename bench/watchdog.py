"""What one watchdog tick costs: per session, with and without descendants.

    .venv/bin/python bench/watchdog.py [--ticks 200] [--sessions 1 4 16 64]

Starts N real idle children (each holding 8 MiB, each with one grandchild), registers
them with a ``SessionWatchdog`` whose container reading is calm, and times
``sample_once()``: the whole tick on the event loop, which is what the sampler
takes from the application every ``interval_s``. Also times the one ``/proc`` scan
per tick that finding descendants needs, which grows with the number of processes
on the machine, not with the sessions.
"""

from __future__ import annotations

import argparse
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4, 16, 64])
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
