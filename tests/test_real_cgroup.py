"""The reader against real cgroup v1 memory groups that these tests create and remove.

Needs root and a writable /sys/fs/cgroup/memory (true on the development and CI
machines: cgroup v1 hybrid, no cgroup namespace); skipped elsewhere, and failed
under ``CI=true`` (the ``real_cgroup`` marker, ``tests/conftest.py``).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asgi_admission import AdmissionController, CgroupMemoryReader
from kits.suitekit import MIB, V1_MEMORY

LIMIT = 256 * MIB
TOUCHED = 64 * MIB
TOLERANCE = 2 * MIB


pytestmark = [pytest.mark.real_cgroup]

_numbers = itertools.count()


@dataclass
class Group:
    """A memory group made for one test, and the children started in it."""

    path: Path
    children: list[subprocess.Popen[str]] = field(default_factory=list)

    def make(self, limit: int = LIMIT) -> None:
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def remove(self) -> None:
        # rmdir fails with EBUSY while the kernel still holds the emptied group briefly.
        for _ in range(100):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.02)
        self.path.rmdir()


@pytest.fixture
def v1_group() -> Iterator[Group]:
    """A fresh, uniquely named v1 memory group, emptied and removed even when the test fails."""
    group = Group(V1_MEMORY / f"asgi_admission_test_{os.getpid()}_{next(_numbers)}")
    try:
        yield group
    finally:
        for child in group.children:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=30)
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
        if group.path.exists():
            # Nothing of ours should be left; move any straggler out so the group can go.
            for pid in (group.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # it exited meanwhile
                    (V1_MEMORY / "cgroup.procs").write_text(pid)
            group.remove()


def kernel_working_set(group: Path) -> int:
    """usage_in_bytes minus both total_ file LRUs, straight from the kernel's files."""
    usage = int((group / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return usage - int(stat["total_inactive_file"]) - int(stat["total_active_file"])


CHILD = f"""
import dataclasses, json, sys
from pathlib import Path
from asgi_admission import CgroupMemoryReader

def kernel(group):
    usage = int((group / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return usage - int(stat["total_inactive_file"]) - int(stat["total_active_file"])

sys.stdin.readline()  # wait until the parent has moved us into the group
block = bytearray({TOUCHED})
for offset in range(0, len(block), 4096):
    block[offset] = 1
print("allocated", flush=True)
sys.stdin.readline()
reader = CgroupMemoryReader()  # discovery from this process's own /proc/self
group = Path(reader.location.v1[0])
before = kernel(group)
reading = reader()
after = kernel(group)
print(json.dumps({{"reading": dataclasses.asdict(reading), "how": reader.location.how,
                  "before": before, "after": after}}), flush=True)
sys.stdin.readline()
"""


def start_child_in(group: Group) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    group.children.append(child)
    # Move it before it allocates: v1 does not move charges with a task by default.
    (group.path / "cgroup.procs").write_text(str(child.pid))
    return child


def tell(child: subprocess.Popen[str]) -> str:
    assert child.stdin is not None
    assert child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    return child.stdout.readline()


def test_reader_matches_the_kernel_explicitly_and_by_discovery(v1_group: Group) -> None:
    """A child touching 64 MiB in a 256 MiB group: exact limit, working set within 2 MiB."""
    v1_group.make()
    child = start_child_in(v1_group)
    assert str(child.pid) in (v1_group.path / "cgroup.procs").read_text().split()
    assert tell(child) == "allocated\n"

    reader = CgroupMemoryReader(v1_group.path)
    before = kernel_working_set(v1_group.path)
    reading = reader()
    after = kernel_working_set(v1_group.path)
    assert reading.available
    assert reading.source == "cgroup-v1"
    assert reading.limit_bytes == LIMIT
    assert reading.limit_file == str(v1_group.path / "memory.limit_in_bytes")
    assert reading.used_bytes is not None
    assert min(before, after) - TOLERANCE <= reading.used_bytes <= max(before, after) + TOLERANCE
    assert TOUCHED <= reading.used_bytes <= TOUCHED + 32 * MIB

    report = json.loads(tell(child))
    inside = report["reading"]
    assert report["how"] == "discovered"
    assert inside["path"] == str(v1_group.path)
    assert inside["limit_bytes"] == LIMIT
    low, high = sorted((report["before"], report["after"]))
    assert low - TOLERANCE <= inside["used_bytes"] <= high + TOLERANCE
    assert TOUCHED <= inside["used_bytes"] <= TOUCHED + 32 * MIB

    decision = AdmissionController(reserve_bytes=64 * MIB, memory_reader=reader).evaluate(0, 4)
    assert (decision.allowed, decision.state) == (True, "normal")
    assert tell(child) == ""  # the child exits after its last line
    assert child.wait(timeout=30) == 0


def test_removed_and_recreated_group_is_reopened(v1_group: Group) -> None:
    """After rmdir the kept descriptors fail with ENODEV; readings are unavailable, then recover."""
    v1_group.make()
    reader = CgroupMemoryReader(v1_group.path)
    first = reader()
    assert (first.available, first.limit_bytes) == (True, LIMIT)
    stale = os.open(v1_group.path / "memory.usage_in_bytes", os.O_RDONLY)
    try:
        v1_group.remove()
        with pytest.raises(OSError, match="No such device") as raised:
            os.pread(stale, 64, 0)
        assert raised.value.errno == errno.ENODEV
    finally:
        os.close(stale)
    for _ in range(3):
        assert not reader().available
    v1_group.make(limit=128 * MIB)
    recovered = reader()
    assert (recovered.available, recovered.limit_bytes) == (True, 128 * MIB)
    assert reader().limit_bytes == 128 * MIB


def test_bound_on_a_real_group_has_the_kernels_limit_and_usage(v1_group: Group) -> None:
    """On this machine's v1 hierarchy (whole, no cgroup namespace) the bound reads the
    group's exact limit and raw usage without memory.stat, and fast-path decisions match."""
    v1_group.make()
    child = start_child_in(v1_group)
    assert tell(child) == "allocated\n"
    reader = CgroupMemoryReader(v1_group.path)
    full = reader()
    bound = reader.read_bound()
    usage = int((v1_group.path / "memory.usage_in_bytes").read_text())
    assert bound is not None
    assert (bound.limit_bytes, bound.exact, bound.path) == (LIMIT, False, str(v1_group.path))
    assert bound.used_bytes is not None
    assert full.used_bytes is not None
    assert abs(bound.used_bytes - usage) <= TOLERANCE
    assert bound.used_bytes >= full.used_bytes - TOLERANCE
    latch = AdmissionController(reserve_bytes=64 * MIB, memory_reader=reader)
    assert latch.evaluate(0, 4).memory.exact  # the first decision reads in full
    fast = latch.evaluate(0, 4)
    assert (fast.allowed, fast.state, fast.memory.exact) == (True, "normal", False)
    assert json.loads(tell(child))["reading"]["limit_bytes"] == LIMIT  # its own report
    assert tell(child) == ""
    assert child.wait(timeout=30) == 0
