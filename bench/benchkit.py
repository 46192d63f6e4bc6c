"""Helpers shared by the benchmarks: timing calls, and the tests' helpers they reuse.

The benchmarks run from a checkout, like the tests: free ports, stopping servers, real
memory groups and fake cgroup v2 trees come from the tests' own helpers rather than copies of them.
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kits.cgroup_trees import FIXTURES, write_v2_tree
from kits.cgroupkit import joining, memory_group, oom_kills, working_set_bytes
from kits.processkit import free_port, stop_process_group
from kits.suitekit import MIB, V1_MEMORY

__all__ = [
    "FIXTURES",
    "MIB",
    "V1_MEMORY",
    "burst_outcome",
    "free_port",
    "joining",
    "memory_group",
    "oom_kills",
    "server_alive",
    "stop_process_group",
    "timings_us",
    "working_set_bytes",
    "write_v2_tree",
]


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


def burst_outcome(responses: Sequence[httpx.Response | str]) -> tuple[list[int | str], bool]:
    """A burst's statuses (a string for a request that failed) and whether every 503
    carried a whole ``Retry-After`` of at least one second."""
    statuses: list[int | str] = [r if isinstance(r, str) else r.status_code for r in responses]
    refusals = [r for r in responses if not isinstance(r, str) and r.status_code == 503]
    retry_after_ok = all(
        r.headers.get("retry-after", "").isdigit() and int(r.headers["retry-after"]) >= 1
        for r in refusals
    )
    return statuses, retry_after_ok


def server_alive(proc: subprocess.Popen[bytes], base_url: str) -> bool:
    """Whether the server process still runs, and does not answer ``/health`` with
    anything but 200 (a health request that fails outright leaves it counted alive)."""
    if proc.poll() is not None:
        return False
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(base_url + "/health", timeout=5).status_code == 200
    return True


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """Until ``base_url/health`` answers 200; ``RuntimeError`` if ``proc`` exits first or
    ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise RuntimeError("the server did not become ready")
