"""Why the product exists: a burst of session openings in a 768 MiB memory group.

    sudo .venv/bin/python bench/oom_burst.py [--sessions 40] [--session-mb 48] [--plot PNG]

Needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory.
Runs the demo service under uvicorn inside a fresh memory group with a limit,
fires ``--sessions`` concurrent ``POST /sessions?hold_s=1`` (each session then
allocates and touches ``--session-mb`` MiB), and reports the kernel's OOM-kill
counter, whether the server survived and what the clients got, twice: the bare
app (the kernel OOM-kills the server), then the same app guarded by
``AdmissionMiddleware`` with the reserve set to one session's size (no OOM
kill; the burst is cut at the capacity the watermark leaves). The guarded run is
also the real-cgroup end-to-end test (tests/middleware/test_cgroup_e2e.py).

``--plot docs/img/burst.png`` also samples the group's working set every 20 ms
during each burst and draws both runs over time (matplotlib, from the ``docs``
extra): the picture on the documentation's front page.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchkit import (
    MIB,
    V1_MEMORY,
    burst_outcome,
    free_port,
    joining,
    memory_group,
    oom_kills,
    server_alive,
    stop_process_group,
    wait_healthy,
    working_set_bytes,
)

HIGH_WATERMARK = 80.0
RESUME = 70.0

_SERVE = """
import sys, uvicorn
from asgi_admission.demo import create_app
uvicorn.run(create_app(guarded=sys.argv[1] == "guarded"), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="warning")
"""


def available() -> bool:
    """Whether this machine can run the burst: root and a writable v1 memory hierarchy."""
    return (
        os.geteuid() == 0
        and (V1_MEMORY / "memory.limit_in_bytes").is_file()
        and os.access(V1_MEMORY, os.W_OK)
    )


@dataclass
class BurstResult:
    guarded: bool
    limit_mb: int
    session_mb: int
    baseline_mb: float
    capacity: int
    statuses: list[int | str]
    oom_kills: int
    server_alive: bool
    retry_after_ok: bool
    readmitted_after_close: bool | None = None
    notes: list[str] = field(default_factory=list)
    #: (seconds since the burst began, working set in bytes), when sampled.
    samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def admitted(self) -> int:
        return self.statuses.count(201)

    @property
    def refused(self) -> int:
        return self.statuses.count(503)


@contextlib.contextmanager
def sampling(group: Path, interval_s: float | None) -> Iterator[list[tuple[float, int]]]:
    """The group's working set every ``interval_s`` from a thread while the block runs."""
    samples: list[tuple[float, int]] = []
    if interval_s is None:
        yield samples
        return
    stop = threading.Event()
    start = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                samples.append((time.monotonic() - start, working_set_bytes(group)))
            stop.wait(interval_s)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


async def _burst(base_url: str, sessions: int, hold_s: float) -> list[httpx.Response | str]:
    limits = httpx.Limits(max_connections=sessions + 5)
    async with httpx.AsyncClient(base_url=base_url, timeout=30, limits=limits) as client:

        async def one() -> httpx.Response | str:
            try:
                return await client.post("/sessions", params={"hold_s": hold_s})
            except httpx.HTTPError as exc:
                return type(exc).__name__

        return await asyncio.gather(*(one() for _ in range(sessions)))


def run_burst(
    *,
    guarded: bool,
    sessions: int = 40,
    session_mb: int = 48,
    limit_mb: int = 768,
    hold_s: float = 1.0,
    sample_interval_s: float | None = None,
) -> BurstResult:
    """Serve the demo in a fresh memory group, fire the burst, and report what happened."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with memory_group(limit_mb, "burst", swap_too=False) as group, tempfile.TemporaryFile() as log:
        env = {
            **os.environ,
            "ADMISSION_CGROUP_ROOT": str(group),
            "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": str(HIGH_WATERMARK),
            "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": str(RESUME),
            "ADMISSION_SESSION_RESERVE_MB": str(session_mb),
            "ADMISSION_MAX_SESSIONS": "1000",
            "DEMO_SESSION_MB": str(session_mb),
        }
        # The shell joins the group first, so the server and everything it
        # allocates are charged to it from the start.
        argv = [
            *joining(group),
            sys.executable,
            "-c",
            _SERVE,
            "guarded" if guarded else "bare",
            str(port),
        ]
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_healthy(base_url, proc)
            time.sleep(0.3)
            baseline = working_set_bytes(group)
            ceiling = limit_mb * MIB * HIGH_WATERMARK / 100
            capacity = max(0, math.floor((ceiling - baseline) / (session_mb * MIB)))
            with sampling(group, sample_interval_s) as samples:
                responses = asyncio.run(_burst(base_url, sessions, hold_s))
                time.sleep(0.5)
            statuses, retry_after_ok = burst_outcome(responses)
            alive = server_alive(proc, base_url)
            result = BurstResult(
                guarded=guarded,
                limit_mb=limit_mb,
                session_mb=session_mb,
                baseline_mb=round(baseline / MIB, 1),
                capacity=capacity,
                statuses=statuses,
                oom_kills=oom_kills(group),
                server_alive=alive,
                retry_after_ok=retry_after_ok,
                samples=samples,
            )
            if guarded and alive:
                result.readmitted_after_close = _close_most_and_reopen(base_url, responses)
            return result
        finally:
            stop_process_group(proc)


def _close_most_and_reopen(base_url: str, responses: list[httpx.Response | str]) -> bool:
    opened = [r.json()["id"] for r in responses if not isinstance(r, str) and r.status_code == 201]
    with httpx.Client(base_url=base_url, timeout=10) as client:
        for session_id in opened[2:]:
            client.delete(f"/sessions/{session_id}")
        time.sleep(0.2)
        return client.post("/sessions").status_code == 201


def plot(results: list[BurstResult], path: Path) -> None:
    """Draw each run's working set over time against the limit and the high watermark."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.2), dpi=120)
    for result in results:
        label = (
            f"guarded: {result.admitted} admitted, {result.refused} refused, "
            f"{result.oom_kills} OOM kills"
            if result.guarded
            else f"bare: {result.oom_kills} OOM kill(s), server "
            f"{'alive' if result.server_alive else 'killed'}"
        )
        axes.plot(
            [t for t, _ in result.samples],
            [used / MIB for _, used in result.samples],
            label=label,
            color="tab:green" if result.guarded else "tab:red",
        )
    limit_mb = results[0].limit_mb
    axes.axhline(limit_mb, color="black", linestyle="-", linewidth=1, label="memory limit")
    axes.axhline(
        limit_mb * HIGH_WATERMARK / 100,
        color="grey",
        linestyle="--",
        linewidth=1,
        label=f"high watermark ({HIGH_WATERMARK:.0f}%)",
    )
    axes.set_xlabel("seconds since the burst began")
    axes.set_ylabel("working set of the server's cgroup (MiB)")
    axes.set_title(
        f"{len(results[0].statuses)} concurrent sessions of {results[0].session_mb} MiB "
        f"in a {limit_mb} MiB cgroup"
    )
    axes.set_ylim(0, limit_mb * 1.1)
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--session-mb", type=int, default=48)
    parser.add_argument("--limit-mb", type=int, default=768)
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="draw the working set over time into this file"
    )
    args = parser.parse_args()
    if not available():
        print("needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
        return 2
    results = []
    for guarded in (False, True):
        r = run_burst(
            guarded=guarded,
            sessions=args.sessions,
            session_mb=args.session_mb,
            limit_mb=args.limit_mb,
            sample_interval_s=0.02 if args.plot else None,
        )
        results.append(r)
        other = [s for s in r.statuses if s not in (201, 503)]
        print(
            json.dumps(
                {
                    "app": "guarded" if guarded else "bare",
                    "limit_mb": r.limit_mb,
                    "session_mb": r.session_mb,
                    "burst": len(r.statuses),
                    "baseline_mb": r.baseline_mb,
                    "capacity": r.capacity,
                    "admitted": r.admitted,
                    "refused_503": r.refused,
                    "failed": len(other),
                    "oom_kills": r.oom_kills,
                    "server_alive": r.server_alive,
                    "readmitted_after_close": r.readmitted_after_close,
                }
            )
        )
    if args.plot:
        plot(results, args.plot)
        print(f"plotted to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
