"""How long one admission decision takes: a reading plus the latch.

Run as root on a machine with a writable cgroup v1 memory hierarchy (the
development and CI machines) to include a real memory group, which this script
creates, fills with a child process and removes again::

    .venv/bin/python bench/reader.py [--iterations 20000]

Each case times ``AdmissionController(memory_reader=CgroupMemoryReader(root))
.evaluate(0, 16)`` and, in the same run, a baseline that reads the same files
the way the guard this replaced did (``Path.read_text`` each time, open/read/close), and
prints medians and 99th percentiles in microseconds and their ratio. Fixture
trees live on an ordinary filesystem, so their figures show the parsing cost
more than the kernel's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from asgi_admission import (
    AdmissionConfig,
    AdmissionController,
    AdmissionMiddleware,
    AdmissionTicket,
    CgroupMemoryReader,
)
from benchkit import FIXTURES, V1_MEMORY, timings_us

TARGET_MEDIAN_US = 10.0
LEARNING_TARGET_US = 1.0

_CHILD = (
    "import sys\n"
    "sys.stdin.readline()\n"
    "block = bytearray(32 * 1024 * 1024)\n"
    "for i in range(0, len(block), 4096):\n"
    "    block[i] = 1\n"
    "print('ready', flush=True)\n"
    "sys.stdin.readline()\n"
)


@contextmanager
def real_v1_group() -> Iterator[Path | None]:
    """A fresh v1 memory group (1 GiB limit) holding a child with 32 MiB touched."""
    if os.geteuid() != 0 or not os.access(V1_MEMORY, os.W_OK):
        yield None
        return
    group = V1_MEMORY / f"asgi_admission_bench_{os.getpid()}"
    group.mkdir()
    child = None
    try:
        (group / "memory.limit_in_bytes").write_text(str(1024 * 1024 * 1024))
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert child.stdin is not None
        assert child.stdout is not None
        (group / "cgroup.procs").write_text(str(child.pid))
        child.stdin.write("go\n")
        child.stdin.flush()
        child.stdout.readline()
        yield group
    finally:
        if child is not None:
            child.kill()
            child.wait()
        # The kernel may take a moment to let go of an emptied group.
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.05)


def baseline(files: list[Path]) -> Callable[[], object]:
    """Open, read and close every file each time, as the guard this replaced did."""

    def read() -> object:
        return [path.read_text() for path in files]

    return read


def measure(name: str, root: Path, iterations: int) -> float:
    reader = CgroupMemoryReader(root)
    controller = AdmissionController(memory_reader=reader)
    decision = controller.evaluate(0, 16)
    files = [Path(path) for path in reader.files()]
    assert files, f"{root}: the reader opened no files"
    median, p99 = timings_us(lambda: controller.evaluate(0, 16), iterations, warmup=1000)
    read_only = timings_us(reader, iterations, warmup=1000)
    base_median, base_p99 = timings_us(baseline(files), iterations, warmup=1000)
    reader.close()
    print(
        f"{name:34} decision {median:6.2f} µs (p99 {p99:6.2f})  reading {read_only[0]:6.2f} µs  "
        f"read_text baseline {base_median:6.2f} µs (p99 {base_p99:6.2f})  "
        f"ratio {median / base_median:4.2f}  [{decision.state}, {len(files)} files]"
    )
    return median


async def _no_app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("not called")


def admission_cost(root: Path, iterations: int, rounds: int = 5) -> tuple[float, float]:
    """Median µs of one middleware admission and release, learning off and raise (the
    route learned already, so nothing is probing)."""
    guards = {
        mode: AdmissionMiddleware(
            _no_app,
            session_routes=["POST /sessions"],
            config=AdmissionConfig(
                cgroup_root=str(root),
                reserve_bytes=1024 * 1024,
                reserve_learning=mode,
                max_sessions=10**9,
            ),
            registry=None,
        )
        for mode in ("off", "raise")
    }
    scope = {"type": "http", "method": "POST", "path": "/sessions"}
    # A route is probed only until something is learned of it: the figure is the cost
    # while nothing is probing, so the route is taught a footprint first.
    guards["raise"].reservations.observe_peak("POST /sessions", 1024 * 1024)

    def admit_and_release(guard: AdmissionMiddleware) -> Callable[[], None]:
        def call() -> None:
            ticket = guard.service.admit("http", scope)
            assert isinstance(ticket, AdmissionTicket), "the benchmark decision must admit"
            ticket.release()

        return call

    medians: dict[str, list[float]] = {"off": [], "raise": []}
    for _ in range(rounds):
        for mode, guard in guards.items():
            medians[mode].append(
                timings_us(admit_and_release(guard), iterations // rounds, warmup=500)[0]
            )
    return statistics.median(medians["off"]), statistics.median(medians["raise"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {args.iterations} iterations per figure")
    with real_v1_group() as group:
        if group is None:
            print("real v1 group: skipped (needs root and a writable /sys/fs/cgroup/memory)")
            real = None
        else:
            real = measure("real v1 group (1 GiB, 32 MiB)", group, args.iterations)
    for name in (
        "local-firecracker-v1-hybrid",
        "elastic-agent-system-metrics/amzn2-k8s-v1",
        "telegraf/v2",
    ):
        measure(f"fixture {name.split('/')[-1]}", FIXTURES / name, args.iterations)
    if real is not None:
        verdict = "met" if real <= TARGET_MEDIAN_US else "MISSED"
        print(f"target <= {TARGET_MEDIAN_US:.0f} µs median on the real group: {verdict}")
    with real_v1_group() as group:
        root = group if group is not None else FIXTURES / "telegraf/v2"
        off, on = admission_cost(root, args.iterations)
        verdict = "met" if on - off <= LEARNING_TARGET_US else "MISSED"
        print(
            f"admission + release via the middleware ({'real v1 group' if group else root.name}): "
            f"learning off {off:6.2f} µs, raise {on:6.2f} µs, +{on - off:5.2f} µs "
            f"(target <= +{LEARNING_TARGET_US:.0f} µs: {verdict})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
