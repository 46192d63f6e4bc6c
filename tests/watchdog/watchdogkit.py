"""Helpers for the watchdog tests: children holding known memory, fixture readers."""

from __future__ import annotations

import asyncio
import subprocess
import textwrap
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from asgi_admission import MemoryReading
from kits.suitekit import MIB

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork for its TestClient and warns when it
    # falls back to httpx; the fallback works, and httpx is what the project pins.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient


__all__ = [
    "CHILD",
    "Child",
    "FixedReader",
    "Recorder",
    "Spawn",
    "TestClient",
    "reading",
    "record_children",
    "vm_rss_bytes",
]

# Holds argv[1] MiB (every page written), spawns argv[2] children holding argv[3] MiB
# each, says "ready" and then holds another N MiB per line read on stdin. It exits
# when stdin closes. "spin" on stdin burns CPU until the next line.
CHILD = textwrap.dedent(
    """
    import signal, subprocess, sys
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    held = [b"x" * (int(sys.argv[1]) * 1048576)]
    kids = [
        subprocess.Popen([sys.executable, "-c", sys.argv[4], sys.argv[3], "0", "0", sys.argv[4]],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(int(sys.argv[2]))
    ]
    for kid in kids:
        kid.stdout.readline()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "spin":
            end = __import__("time").monotonic() + 1.5
            while __import__("time").monotonic() < end:
                pass
        else:
            held.append(b"x" * (int(line) * 1048576))
        print("ready", flush=True)
    for kid in kids:
        kid.stdin.close()
        kid.wait()
    """
)


class Child:
    """One spawned child: its Popen, and ways to make it grow or leave."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.pid = popen.pid

    def grow(self, mib: int) -> None:
        assert self.popen.stdin is not None
        assert self.popen.stdout is not None
        self.popen.stdin.write(f"{mib}\n")
        self.popen.stdin.flush()
        assert self.popen.stdout.readline().strip() == "ready"

    def spin(self) -> None:
        """Burn one CPU for about 1.5 s (returns when done)."""
        assert self.popen.stdin is not None
        assert self.popen.stdout is not None
        self.popen.stdin.write("spin\n")
        self.popen.stdin.flush()
        assert self.popen.stdout.readline().strip() == "ready"

    def finish(self) -> int:
        """Close stdin so the child exits by itself; returns its exit status."""
        assert self.popen.stdin is not None
        self.popen.stdin.close()
        return self.popen.wait(timeout=10)


def vm_rss_bytes(pid: int) -> int:
    """The kernel's ``VmRSS`` for ``pid`` from ``/proc/<pid>/status``."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


Spawn = Callable[..., Child]


class FixedReader:
    """A memory reader returning whatever reading the test set."""

    def __init__(self, reading: MemoryReading) -> None:
        self.reading = reading
        self.calls = 0

    def __call__(self) -> MemoryReading:
        self.calls += 1
        return self.reading


def reading(percent: float, limit: int = 1024 * MIB) -> MemoryReading:
    """A cgroup-like reading at ``percent`` of ``limit``."""
    return MemoryReading(used_bytes=int(limit * percent / 100), limit_bytes=limit, available=True)


class Recorder:
    """A halt action or callback that only records what it was given."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def __call__(self, event: Any) -> None:
        self.events.append(event)


def record_children(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.subprocess.Process]:
    """Every child ``asyncio.create_subprocess_exec`` starts from now on, in order, so a
    test can see whether the code that started it also reaped it."""
    children: list[asyncio.subprocess.Process] = []
    spawn = asyncio.create_subprocess_exec

    async def recording(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        child = await spawn(*args, **kwargs)
        children.append(child)
        return child

    monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
    return children
