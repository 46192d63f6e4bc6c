"""Sessions whose memory arrives after their ``201``: a burst in a real memory group.

    sudo .venv/bin/python bench/ramp_burst.py [--sessions 40] [--hold-mb 92] [--ramp-s 2]
        [--workers 1] [--warm-up sequential|overlapping] [--default-sharing]
        [--plot docs/img/ramp_burst.png]

Needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory.
Serves the demo under uvicorn inside a fresh memory group (768 MiB, no swap) and
fires ``--sessions`` concurrent ``POST /processes?hold_mb=&ramp_s=``: each answers
``201`` as soon as its child process is spawned, and the child's memory (the
interpreter plus ``--hold-mb`` MiB) arrives in steps over ``--ramp-s`` seconds.
Modes:

- ``bare``: the app without the guard;
- ``settle``: the guard, reserve set to one session's measured footprint, no app
  help, learning off (settling alone holds each reservation until its memory shows);
- ``learn``: reserve 12x too small, learning on (``raise``), after a few
  sequential warm-up sessions (``--warm-up overlapping``: four, each opened 0.6 s after
  the one before has ramped, all four closed together a second before the burst);
- ``ticket``: learning off, the app holds each session's ticket until its child is up.

With several workers they share a ledger in a temporary ``ADMISSION_SHARED_DIR``;
``--default-sharing`` sets neither that nor ``ADMISSION_CGROUP_ROOT``, so the
workers find their memory group and the place they share by themselves.

For each it prints the true capacity (what fits under the high watermark above
the baseline), how many were admitted, the kernel's OOM kills, whether the
server lived, whether every refusal was a 503 with ``Retry-After``, whether a
session is admitted again once the others end, and (``learn``) how long until the
learned footprint was within 15 % of the measured one. ``--plot`` writes a PNG
of the working set over time, guarded (settle) against bare (needs matplotlib,
a bench/docs dependency only). The tests in tests/middleware/test_ramp_burst.py
run the same code.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
import psutil

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
    working_set_bytes,
)

HIGH_WATERMARK = 80.0
RESUME = 70.0
WARMUPS = 3

Mode = Literal["bare", "settle", "learn", "ticket"]
MODES: tuple[Mode, ...] = ("bare", "settle", "learn", "ticket")
WarmUp = Literal["sequential", "overlapping"]
#: The overlapping warm-up: this many sessions, this long quiet after each ramp.
OVERLAPPING_SESSIONS = 4
QUIET_AFTER_RAMP_S = 0.6


def available() -> bool:
    """Whether this machine can run the burst: root and a writable v1 memory hierarchy."""
    return (
        os.geteuid() == 0
        and (V1_MEMORY / "memory.limit_in_bytes").is_file()
        and os.access(V1_MEMORY, os.W_OK)
    )


def session_footprint(hold_mb: int) -> int:
    """What one session's child adds to a memory group's working set, measured."""
    from asgi_admission.demo.processes import CHILD_SCRIPT

    with memory_group(4096, "ramp_probe") as group:
        before = working_set_bytes(group)
        with subprocess.Popen(
            [
                *joining(group),
                sys.executable,
                "-c",
                CHILD_SCRIPT,
                str(hold_mb),
                *("4", "0", "0"),  # grown in 4 MiB steps, no pause, no ramp: at once
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        ) as child:
            try:
                assert child.stdout is not None
                child.stdout.readline()
                time.sleep(0.2)
                return working_set_bytes(group) - before
            finally:
                child.kill()


@dataclass
class RampResult:
    mode: Mode
    workers: int
    limit_mb: int
    footprint_mb: float
    baseline_mb: float
    capacity: int
    statuses: list[int | str]
    oom_kills: int
    server_alive: bool
    retry_after_ok: bool
    readmitted: bool | None = None
    learned_within_15pct_s: float | None = None
    learned_footprint_mb: float | None = None
    #: The overlapping warm-up: what was learned before any of its sessions ended.
    learned_before_ends_mb: float | None = None
    trace: list[tuple[float, float]] = field(default_factory=list)
    #: The shared ledger file each worker has open (none: it counts alone).
    ledgers: dict[int, list[str]] = field(default_factory=dict)

    @property
    def admitted(self) -> int:
        return self.statuses.count(201)

    @property
    def refused(self) -> int:
        return self.statuses.count(503)

    def summary(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "workers": self.workers,
            "limit_mb": self.limit_mb,
            "footprint_mb": round(self.footprint_mb, 1),
            "baseline_mb": self.baseline_mb,
            "capacity": self.capacity,
            "admitted": self.admitted,
            "refused_503": self.refused,
            "failed": len(self.statuses) - self.admitted - self.refused,
            "oom_kills": self.oom_kills,
            "server_alive": self.server_alive,
            "retry_after_ok": self.retry_after_ok,
            "readmitted_after_end": self.readmitted,
            "learned_footprint_mb": self.learned_footprint_mb,
            "learned_within_15pct_s": self.learned_within_15pct_s,
            "learned_before_ends_mb": self.learned_before_ends_mb,
            "ledgers": sorted({path for paths in self.ledgers.values() for path in paths}),
        }


class _Tracer(threading.Thread):
    """Samples the group's working set every 50 ms, for the plot."""

    def __init__(self, group: Path) -> None:
        super().__init__(daemon=True)
        self.group = group
        self.samples: list[tuple[float, float]] = []
        self.stop_event = threading.Event()
        self.start_at = time.monotonic()

    def run(self) -> None:
        self.start_at = time.monotonic()
        while not self.stop_event.wait(0.05):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append(
                    (time.monotonic() - self.start_at, working_set_bytes(self.group) / MIB)
                )


def _serve_argv(group: Path, port: int, workers: int, guarded: bool) -> list[str]:
    join = joining(group)
    if workers > 1:
        return [
            *join,
            sys.executable,
            "-m",
            "uvicorn",
            "asgi_admission.demo:create_app",
            "--factory",
            "--workers",
            str(workers),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    serve = (
        "import sys, uvicorn\n"
        "from asgi_admission.demo import create_app\n"
        "uvicorn.run(create_app(guarded=sys.argv[1] == 'guarded'), host='127.0.0.1',\n"
        "            port=int(sys.argv[2]), log_level='warning')\n"
    )
    return [*join, sys.executable, "-c", serve, "guarded" if guarded else "bare", str(port)]


def _wait_ready(base_url: str, proc: subprocess.Popen[bytes], workers: int) -> None:
    deadline = time.monotonic() + 60
    ok = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the server exited before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                ok += 1
                # Several workers: give every one of them time to finish starting.
                if ok >= (1 if workers == 1 else 10):
                    return
        time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


async def _burst(
    base_url: str, n: int, params: dict[str, int | float]
) -> list[httpx.Response | str]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:

        async def one(i: int) -> httpx.Response | str:
            await asyncio.sleep(i * 0.005)  # spread over the workers' accept queues
            try:
                return await client.post("/processes", params=params)
            except httpx.HTTPError as exc:
                return type(exc).__name__

        return await asyncio.gather(*(one(i) for i in range(n)))


def _learned_mb(base_url: str) -> float | None:
    """The learned footprint the guard shows in a refusal's details (metrics otherwise)."""
    with contextlib.suppress(httpx.HTTPError, ValueError):
        text = httpx.get(base_url + "/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith("asgi_admission_session_footprint_bytes{"):
                return float(line.rsplit(" ", 1)[1]) / MIB
    return None


def run_ramp_burst(
    mode: Mode,
    *,
    sessions: int = 40,
    hold_mb: int = 92,
    ramp_s: float = 2.0,
    limit_mb: int = 768,
    workers: int = 1,
    footprint: int | None = None,
    shared_dir: str | None = None,
    warm_up: WarmUp = "sequential",
    default_sharing: bool = False,
) -> RampResult:
    """Serve the demo in a fresh memory group in ``mode``, fire the burst, report.

    ``default_sharing`` leaves out every setting of where the workers share their
    counts and of which cgroup to read: the guard finds both itself.
    """
    footprint = footprint if footprint is not None else session_footprint(hold_mb)
    footprint_mb = footprint / MIB
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    reserve_mb = math.ceil(footprint_mb) if mode != "learn" else max(1, round(footprint_mb / 12))
    params: dict[str, int | float] = {"hold_mb": hold_mb, "ramp_s": ramp_s}
    if mode == "ticket":
        params["ticket"] = 1
    with (
        memory_group(limit_mb, f"ramp_{mode}") as group,
        tempfile.TemporaryFile() as log,
        tempfile.TemporaryDirectory() as tmp,
    ):
        env = {
            **os.environ,
            "ADMISSION_CGROUP_ROOT": str(group),
            "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": str(HIGH_WATERMARK),
            "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": str(RESUME),
            "ADMISSION_SESSION_RESERVE_MB": str(reserve_mb),
            "ADMISSION_SESSION_RESERVE_LEARNING": "raise" if mode == "learn" else "off",
            "ADMISSION_MAX_SESSIONS": "1000",
        }
        if default_sharing:
            for name in ("ADMISSION_SHARED_DIR", "ADMISSION_CGROUP_ROOT"):
                env.pop(name, None)
        elif workers > 1 or shared_dir is not None:
            env["ADMISSION_SHARED_DIR"] = shared_dir or os.path.join(tmp, "shared")
        proc = subprocess.Popen(
            _serve_argv(group, port, workers, mode != "bare"),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        tracer = _Tracer(group)
        try:
            _wait_ready(base_url, proc, workers)
            ledgers = _open_ledgers(proc)
            learned_at = learned = learned_before_ends = None
            if mode == "learn" and warm_up == "overlapping":
                learned_before_ends, learned = _warm_up_overlapping(
                    base_url, group, hold_mb, ramp_s, footprint
                )
            elif mode == "learn":
                learned_at, learned = _warm_up(base_url, hold_mb, ramp_s, footprint_mb)
            time.sleep(0.5)
            baseline = working_set_bytes(group)
            ceiling = limit_mb * MIB * HIGH_WATERMARK / 100
            capacity = max(0, math.floor((ceiling - baseline) / footprint))
            tracer.start()
            responses = asyncio.run(_burst(base_url, sessions, params))
            # Every admitted session has built its memory (the demo's child grows in
            # 4 MiB steps 50 ms apart, so a ramp takes about a second more than ramp_s).
            time.sleep(ramp_s + 2.5)
            statuses, retry_after_ok = burst_outcome(responses)
            alive = server_alive(proc, base_url)
            result = RampResult(
                mode=mode,
                workers=workers,
                limit_mb=limit_mb,
                footprint_mb=footprint_mb,
                baseline_mb=round(baseline / MIB, 1),
                capacity=capacity,
                statuses=statuses,
                oom_kills=oom_kills(group),
                server_alive=alive,
                retry_after_ok=retry_after_ok,
                learned_within_15pct_s=learned_at,
                learned_footprint_mb=learned,
                learned_before_ends_mb=learned_before_ends,
                ledgers=ledgers,
            )
            if mode != "bare" and alive:
                result.readmitted = _end_all_and_reopen(base_url, responses, params, ramp_s)
            tracer.stop_event.set()
            tracer.join(timeout=2)
            result.trace = tracer.samples
            return result
        finally:
            tracer.stop_event.set()
            stop_process_group(proc)


def _open_ledgers(proc: subprocess.Popen[bytes]) -> dict[int, list[str]]:
    """Each serving process's open shared ledger files (uvicorn's workers, or the one)."""
    server = psutil.Process(proc.pid)
    serving = [c for c in server.children() if "spawn_main" in " ".join(c.cmdline())] or [server]
    return {
        p.pid: sorted(f.path for f in p.open_files() if f.path.endswith(".ledger")) for p in serving
    }


def _warm_up(
    base_url: str, hold_mb: int, ramp_s: float, footprint_mb: float
) -> tuple[float | None, float | None]:
    """Sequential sessions until the learned footprint is within 15 % (at most WARMUPS+2).

    Returns the seconds that took (``None``: never) and the last learned footprint.
    """
    start = time.monotonic()
    learned = None
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for _ in range(WARMUPS + 2):
            opened = client.post("/processes", params={"hold_mb": hold_mb, "ramp_s": ramp_s})
            time.sleep(ramp_s + 3.5)  # the memory arrives, then the episode goes quiet
            learned = _learned_mb(base_url)
            if opened.status_code == 201:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(opened.json()["pid"], 9)  # ids are per worker: see below
                client.delete(f"/processes/{opened.json()['id']}")
            time.sleep(0.5)
            if learned is not None and abs(learned - footprint_mb) <= 0.15 * footprint_mb:
                return round(time.monotonic() - start, 1), round(learned, 1)
    return None, None if learned is None else round(learned, 1)


def _warm_up_overlapping(
    base_url: str, group: Path, hold_mb: int, ramp_s: float, footprint: int
) -> tuple[float | None, float | None]:
    """Sessions opened one after another, each 0.6 s after the one before has ramped (its
    memory all there), so that the working set is never quiet for long; then all closed
    together. Returns half a second after the closes (the burst comes half a second
    later), with the footprint learned just before the closes and the one learned then
    (``None``: nothing learned)."""
    opened = []
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for _ in range(OVERLAPPING_SESSIONS):
            before = working_set_bytes(group)
            answer = client.post("/processes", params={"hold_mb": hold_mb, "ramp_s": ramp_s})
            if answer.status_code == 201:
                opened.append(answer.json())
            deadline = time.monotonic() + ramp_s + 5.0
            while working_set_bytes(group) < before + 0.97 * footprint:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            time.sleep(QUIET_AFTER_RAMP_S)
        before_ends = _learned_mb(base_url)
        for session in opened:
            # Closed by the app (one worker: the DELETE reaches it), which stops
            # watching the child first: what is learned is from the working set alone,
            # not from the watchdog's peaks.
            client.delete(f"/processes/{session['id']}")
    time.sleep(0.5)
    learned = _learned_mb(base_url)
    return (
        None if before_ends is None else round(before_ends, 1),
        None if learned is None else round(learned, 1),
    )


def _end_all_and_reopen(
    base_url: str,
    responses: list[httpx.Response | str],
    params: dict[str, int | float],
    ramp_s: float,
) -> bool:
    opened = [r.json() for r in responses if not isinstance(r, str) and r.status_code == 201]
    with httpx.Client(base_url=base_url, timeout=30) as client:
        for session in opened:
            # Session ids are per worker, and a DELETE may reach another worker: the
            # child is ended directly, which frees its memory wherever it was opened.
            with contextlib.suppress(ProcessLookupError):
                os.kill(session["pid"], 9)
            client.delete(f"/processes/{session['id']}")
        for _ in range(20):
            time.sleep(0.5)
            reopened = client.post("/processes", params=params)
            if reopened.status_code == 201:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(reopened.json()["pid"], 9)
                return True
    return False


def plot(results: list[RampResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for result in results:
        if result.trace:
            times, used = zip(*result.trace, strict=True)
            label = f"{result.mode}: {result.admitted} admitted, {result.oom_kills} OOM kills"
            axes.plot(times, used, label=label)
    limit = results[0].limit_mb
    axes.axhline(limit, color="black", linestyle=":", label=f"limit {limit} MiB")
    axes.axhline(limit * HIGH_WATERMARK / 100, color="grey", linestyle="--", label="high watermark")
    axes.set_xlabel("seconds since the burst")
    axes.set_ylabel("working set (MiB)")
    axes.set_title("A burst of sessions whose memory arrives after their 201")
    axes.legend(loc="lower right", fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=40)
    parser.add_argument("--hold-mb", type=int, default=92)
    parser.add_argument("--ramp-s", type=float, default=2.0)
    parser.add_argument("--limit-mb", type=int, default=768)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--default-sharing",
        action="store_true",
        help="set neither ADMISSION_SHARED_DIR nor ADMISSION_CGROUP_ROOT",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--warm-up", choices=("sequential", "overlapping"), default="sequential")
    parser.add_argument("--plot", default=None, help="write a PNG of working set over time")
    args = parser.parse_args()
    if not available():
        print("needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory")
        return 2
    footprint = session_footprint(args.hold_mb)
    results = []
    for mode in args.modes.split(","):
        result = run_ramp_burst(
            mode,
            sessions=args.sessions,
            hold_mb=args.hold_mb,
            ramp_s=args.ramp_s,
            limit_mb=args.limit_mb,
            workers=args.workers,
            footprint=footprint,
            warm_up=args.warm_up,
            default_sharing=args.default_sharing,
        )
        results.append(result)
        print(json.dumps(result.summary()), flush=True)
    if args.plot:
        plot([r for r in results if r.mode in ("bare", "settle")] or results, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
