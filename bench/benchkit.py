"""Helpers shared by the benchmarks: timing calls, free ports, stopping servers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable


def timings_us(call: Callable[[], object], iterations: int, *, warmup: int) -> tuple[float, float]:
    """(median, p99) in microseconds over ``iterations`` calls, after ``warmup`` calls."""
    for _ in range(min(warmup, iterations)):
        call()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(iterations):
        start = clock()
        call()
        samples.append(clock() - start)
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process_group(proc: subprocess.Popen[bytes], *, timeout: float = 10) -> None:
    """SIGTERM ``proc``'s process group, then SIGKILL it if it has not ended in ``timeout``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
