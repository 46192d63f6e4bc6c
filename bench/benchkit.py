"""Helpers shared by the benchmarks: timing calls, and the tests' helpers they reuse.

The benchmarks run from a checkout, like the tests: free ports, stopping servers, real
memory groups and fake cgroup v2 trees come from the tests' own helpers rather than copies of them.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cgroup_trees import write_v2_tree
from cgroupkit import memory_group, oom_kills, working_set_bytes
from processkit import free_port, stop_process_group

__all__ = [
    "free_port",
    "memory_group",
    "oom_kills",
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
