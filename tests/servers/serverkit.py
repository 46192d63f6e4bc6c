"""A real server started inside a real memory group, its footprint and a first burst:
the shared part of the tests of servers nobody here wrote (jupyverse, marimo)."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kits.cgroupkit import joining, memory_group, working_set_bytes
from kits.processkit import free_port, stop_process_group
from kits.requirekit import require, require_cgroup_v1
from kits.suitekit import MIB

HIGH_WATERMARK = 0.80  # the guard's default


def require_server(module: str) -> None:
    """Skip (fail under ``CI=true``) without root, a writable v1 memory hierarchy or
    ``module`` (installed by the ``servers`` extra)."""
    require_cgroup_v1()
    found = importlib.util.find_spec(module) is not None
    require(found, f"needs {module}: pip install -e '.[servers]'")


def default_environment() -> dict[str, str]:
    """This process's environment less every ``ADMISSION_*`` setting, the suite's own
    included: a server started with it runs the guard with its defaults, as a new user's
    does (its shared place, under the memory group's own name, goes with the group)."""
    return {key: value for key, value in os.environ.items() if not key.startswith("ADMISSION_")}


@dataclass
class Served:
    group: Path
    base_url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self, ready_path: str) -> bool:
        """Whether the server still runs and answers ``ready_path`` with 200."""
        if self.proc.poll() is not None:
            return False
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(self.base_url + ready_path, timeout=10).status_code == 200
        return False


@contextlib.contextmanager
def serve_in_group(
    argv: list[str], *, limit_mb: int, name: str, ready_path: str, env: dict[str, str], cwd: Path
) -> Iterator[Served]:
    """``argv`` (``{port}`` filled in) started in ``cwd`` inside a fresh memory group with
    the guard's default settings (``env`` added), once it answers ``ready_path``;
    stopped and removed after."""
    port = free_port()
    with memory_group(limit_mb, name) as group, tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "server.log")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*joining(group), *(part.format(port=port) for part in argv)],
                env={**default_environment(), **env},
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        served = Served(group, f"http://127.0.0.1:{port}", proc, log)
        try:
            deadline = time.monotonic() + 60
            while not served.alive(ready_path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the server did not start: {log.read_text()[-3000:]}")
                time.sleep(0.3)
            yield served
        finally:
            stop_process_group(proc)


def settled_peak(group: Path, *, quiet_s: float = 2.0, limit_s: float = 30.0) -> int:
    """The group's working set once it has made no new peak for ``quiet_s``."""
    peak = working_set_bytes(group)
    last_rise = start = time.monotonic()
    while time.monotonic() - last_rise < quiet_s and time.monotonic() - start < limit_s:
        time.sleep(0.2)
        now = working_set_bytes(group)
        if now > peak + MIB:
            peak, last_rise = now, time.monotonic()
    return peak


def capacity(limit_mb: int, baseline: int, footprint: int) -> int:
    """How many sessions of ``footprint`` fit under the default high watermark."""
    return max(0, math.floor((HIGH_WATERMARK * limit_mb * MIB - baseline) / footprint))


@dataclass
class BurstResult:
    footprint_mb: float
    baseline_mb: float
    capacity: int
    sessions: int
    admitted: int
    alive_kernels: int
    refused: int
    retry_after_ok: bool
    other: list[str]
    oom_kills: int
    server_alive: bool
    settled_mb: float
    #: How many refusals gave each reason (``memory_pressure``, ``probing``, ...).
    reasons: dict[str, int] = field(default_factory=dict)
    #: Seconds from the burst's last answer until no reservation was pending, where read.
    all_settled_s: float | None = None

    def summary(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
