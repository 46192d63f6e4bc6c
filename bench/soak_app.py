"""The chaos soak's server: the demo app with a probe of its event loop's stalls.

``bench/soak.py`` serves ``soak_app:create_app`` (uvicorn ``--factory``) instead of the
demo's own factory. Each worker's probe sleeps ``TICK_S`` over and over on the event
loop and appends every overshoot above ``REPORT_S`` (when it ended, on the monotonic
clock all processes share, and how long) to ``stalls-<pid>.txt`` in ``SOAK_STALL_DIR``:
the soak then finds the worst stall outside its fault windows (a stopped worker stalls
for as long as it is stopped, by design).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from asgi_admission.demo import create_app as create_demo_app

TICK_S = 0.01
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
            while True:
                start = time.monotonic()
                await asyncio.sleep(TICK_S)
                end = time.monotonic()
                lag = end - start - TICK_S
                if lag > REPORT_S:
                    out.write(f"{end:.3f} {lag:.4f}\n")


def create_app() -> Any:
    """The demo app, its event loop watched (``SOAK_STALL_DIR`` must be set)."""
    return LoopStallProbe(create_demo_app(), Path(os.environ[SETTING]))


def read_stalls(directory: Path) -> list[tuple[float, float]]:
    """Every reported stall of every worker: ``(ended at, seconds)``."""
    stalls = []
    for path in directory.glob("stalls-*.txt"):
        for line in path.read_text().splitlines():
            ended, lag = line.split()
            stalls.append((float(ended), float(lag)))
    return stalls
