"""The chaos soak's server: the demo app with a probe of its event loop's stalls.

``bench/soak.py`` serves ``soak_app:create_app`` (uvicorn ``--factory``) instead of the
demo's own factory. Each worker's probe sleeps ``TICK_S`` over and over on the event
loop and appends to ``stalls-<pid>.txt`` in ``SOAK_STALL_DIR``, on the monotonic clock
all processes share: when it started, a heartbeat every ``BEAT_S``, and every overshoot
above ``REPORT_S`` (when it ended and how long). The soak finds each worker's worst
stall outside the windows it was stopped in (a stopped worker stalls for as long as
it is stopped, by design) and checks that every live worker's loop still ticks (a
loop frozen for good writes no stall line at all).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asgi_admission.demo import create_app as create_demo_app

TICK_S = 0.01
BEAT_S = 1.0
#: Stalls shorter than this are not written (a loaded VM overshoots a 10 ms sleep often).
REPORT_S = 0.02
SETTING = "SOAK_STALL_DIR"


class LoopStallProbe:
    """ASGI wrapper that starts the probe with the app's lifespan."""

    def __init__(self, app: Any, directory: Path) -> None:
        self.app = app
        self.directory = directory
        self._task: asyncio.Task[None] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())
        await self.app(scope, receive, send)

    async def _watch(self) -> None:
        path = self.directory / f"stalls-{os.getpid()}.txt"
        with path.open("a", buffering=1) as out:
            next_beat = time.monotonic()
            out.write(f"start {next_beat:.3f}\n")
            while True:
                start = time.monotonic()
                await asyncio.sleep(TICK_S)
                end = time.monotonic()
                lag = end - start - TICK_S
                if lag > REPORT_S:
                    out.write(f"stall {end:.3f} {lag:.4f}\n")
                if end >= next_beat:
                    next_beat = end + BEAT_S
                    out.write(f"beat {end:.3f}\n")


def create_app() -> Any:
    """The demo app, its event loop watched (``SOAK_STALL_DIR`` must be set)."""
    return LoopStallProbe(create_demo_app(), Path(os.environ[SETTING]))


@dataclass
class Probe:
    """What one worker's probe wrote."""

    started: float = 0.0
    last_beat: float = 0.0
    stalls: list[tuple[float, float]] = field(default_factory=list)  # (ended at, seconds)


def read_probes(directory: Path) -> dict[int, Probe]:
    """Every worker's probe, by pid."""
    probes = {}
    for path in directory.glob("stalls-*.txt"):
        probe = probes[int(path.stem.removeprefix("stalls-"))] = Probe()
        for line in path.read_text().splitlines():
            kind, *values = line.split()
            if kind == "start":
                probe.started = float(values[0])
            elif kind == "beat":
                probe.last_beat = float(values[0])
            elif kind == "stall":
                probe.stalls.append((float(values[0]), float(values[1])))
    return probes
