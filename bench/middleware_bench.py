"""What AdmissionMiddleware costs, against the bare app and starlette-exporter.

    .venv/bin/python bench/middleware_bench.py [--rounds 40] [--calls 2000] [--wrk-seconds 5]

(a) In-process: ASGI calls straight into a Starlette app with a non-session
route (``GET /plain``) and a session route (``POST /sessions``), bare, wrapped
in ``AdmissionMiddleware`` (no metrics, and with metrics on a fresh registry)
and wrapped in starlette-exporter's ``PrometheusMiddleware`` instead. The guard
reads a cgroup v2 tree in a temporary directory through ``CgroupMemoryReader``
(kept descriptors, ``os.pread``) with a generous limit (a real cgroup v1 memory
group where the script may create one, as root on this project's machines), so
every session is admitted (a "fixed" variant uses a constant reading, to show the
guard's own cost apart from the reader's; a "floor" reference does only what any
guard must: a ``pread`` of usage and of limit, a count and a watched ``send``), and
released when its response completes. Rounds are interleaved so machine drift hits
every variant alike; the figures are medians of per-round means, and ratios to bare
the medians of per-round ratios. (b) ``wrk`` against uvicorn on 127.0.0.1, bare and guarded,
alternating, best of two runs each. Prints the ratios and the targets:

- off the session path: <= 3% slower than bare, <= 1/20 of starlette-exporter's added cost;
- on the session path: added cost <= 1/4 of starlette-exporter's (in-process),
  >= 0.9x bare throughput under uvicorn.

(b) also measures ``POST /spawn``, a session route that starts a process (``true``)
the way a terminal or a kernel route does, for the guard's cost in proportion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from asgi_admission import (
    AdmissionController,
    AdmissionMiddleware,
    CgroupMemoryReader,
    MemoryReading,
)
from benchkit import MIB, V1_MEMORY, free_port, stop_process_group, write_v2_tree

ROOT_ENV = "BENCH_CGROUP_ROOT"


@contextlib.contextmanager
def cgroup_root(tmp: str) -> Any:
    """A real cgroup v1 memory group (8 GiB limit) where root may make one, else a tmp tree.

    The real group is what a container's reader reads (cgroupfs, no ``fstat`` checks);
    the tmp tree's regular files cost the reader a few µs more per reading.
    """
    group = V1_MEMORY / f"asgi_admission_bench_{os.getpid()}"
    try:
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(str(8 * 1024 * MIB))
    except OSError:
        print("reader: a cgroup v2 tree of regular files in a temporary directory")
        yield str(write_v2_tree(Path(tmp) / "cgroup", used_mb=200, limit_mb=64 * 1024))
        return
    print(f"reader: the real cgroup v1 memory group {group}")
    try:
        yield str(group)
    finally:
        group.rmdir()


def base_app() -> Starlette:
    async def plain(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def spawn_session(request: Request) -> Response:
        # What a real session route does at the least: start a process (here `true`).
        process = await asyncio.create_subprocess_exec("true")
        await process.wait()
        return PlainTextResponse("started", status_code=201)

    async def open_session(request: Request) -> Response:
        return PlainTextResponse("opened", status_code=201)

    return Starlette(
        routes=[
            Route("/plain", plain),
            Route("/sessions", open_session, methods=["POST"]),
            Route("/spawn", spawn_session, methods=["POST"]),
        ]
    )


FIXED_READING = MemoryReading(used_bytes=200 * MIB, limit_bytes=64 * 1024 * MIB, available=True)


def fixed_reader() -> MemoryReading:
    return FIXED_READING


def guarded(app: Any, root: str | None, registry: CollectorRegistry | None = None) -> Any:
    """The guard over ``root``'s cgroup files, or over a fixed reading when ``root`` is None."""
    # The bench's sessions hold no memory, so they reserve none: a reserve would keep
    # each one pending until that much memory showed (docs/reservations.md), and at
    # thousands of sessions a second that is a pile of reservations, not a decision cost.
    controller = AdmissionController(
        high_watermark_percent=90,
        resume_threshold_percent=80,
        reserve_bytes=0,
        memory_reader=CgroupMemoryReader(root) if root is not None else fixed_reader,
    )
    guard = AdmissionMiddleware(
        app,
        session_routes=["POST /sessions", "POST /spawn", "WS /terminal/*"],
        controller=controller,
        max_sessions=1_000_000,
        registry=registry,
    )
    # What is timed is a session request of a route the guard knows: a route nothing is
    # known of is probed first (docs/reservations.md), one session at a time, which is
    # what a first burst costs, not what every request does.
    for route in ("POST /sessions", "POST /spawn"):
        guard.reservations.observe_peak(route, 0)
    return guard


class PassThrough:
    """The least any pure-ASGI middleware costs: one more awaited call, no work."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


class Floor:
    """A reference, not a guard: the least any guard of session requests must do.

    One reading as docs/how-it-decides.md defines it at its cheapest (a ``pread`` each of the
    cgroup's usage and limit files, parsed), one pending count, and a watched
    ``send`` that gives the slot back when the response ends. No lock, latch,
    ledger, disconnect watch, refusal or metrics. Its cost is what reading the
    kernel and knowing when a session request ends cost on this machine.
    """

    def __init__(self, app: Any, root: str) -> None:
        self.app = app
        self.pending = 0
        pairs = (
            ("memory.current", "memory.max"),
            ("memory.usage_in_bytes", "memory.limit_in_bytes"),
        )
        usage, limit = next(p for p in pairs if os.path.exists(os.path.join(root, p[0])))
        self._usage = os.open(os.path.join(root, usage), os.O_RDONLY)
        self._limit = os.open(os.path.join(root, limit), os.O_RDONLY)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        int(os.pread(self._usage, 64, 0))
        int(os.pread(self._limit, 64, 0))
        self.pending += 1
        done = False

        async def watched(message: Any) -> None:
            nonlocal done
            await send(message)
            ended = message["type"] == "http.response.body" and not message.get("more_body")
            if ended and not done:
                done = True
                self.pending -= 1

        try:
            await self.app(scope, receive, watched)
        finally:
            if not done:
                self.pending -= 1


def exporter(app: Any) -> Any:
    from starlette_exporter import PrometheusMiddleware

    return PrometheusMiddleware(app, app_name="bench", group_paths=True)


# uvicorn factories for part (b)
def bare_app() -> Starlette:
    return base_app()


def guarded_app() -> Any:
    return guarded(base_app(), os.environ[ROOT_ENV])


def guarded_fixed_app() -> Any:
    return guarded(base_app(), None)


def floor_app() -> Any:
    return Floor(base_app(), os.environ[ROOT_ENV])


# -- (a) in-process ------------------------------------------------------------------


def scope_for(method: str, path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def time_calls(app: Any, scope: dict[str, Any], calls: int) -> float:
    request = {"type": "http.request", "body": b"", "more_body": False}

    async def receive() -> dict[str, Any]:
        return request

    async def send(message: dict[str, Any]) -> None:
        return None

    start = time.perf_counter()
    for _ in range(calls):
        await app(dict(scope), receive, send)
    return (time.perf_counter() - start) / calls


def in_process(rounds: int, calls: int, root: str) -> dict[tuple[str, str], float]:
    apps: dict[str, Any] = {
        "bare": base_app(),
        "pass-through": PassThrough(base_app()),
        "guard": guarded(base_app(), root),
        "guard+metrics": guarded(base_app(), root, CollectorRegistry()),
        "guard(fixed)": guarded(base_app(), None),
        "floor": Floor(base_app(), root),
        "exporter": exporter(base_app()),
    }
    routes = {"plain": scope_for("GET", "/plain"), "session": scope_for("POST", "/sessions")}
    samples: dict[tuple[str, str], list[float]] = {(a, r): [] for a in apps for r in routes}

    async def run() -> None:
        for app in apps.values():  # warm up
            for scope in routes.values():
                await time_calls(app, scope, calls // 4)
        for _ in range(rounds):
            for route, scope in routes.items():
                for name, app in apps.items():
                    samples[name, route].append(await time_calls(app, scope, calls))

    asyncio.run(run())
    result = {key: statistics.median(values) for key, values in samples.items()}
    # Ratios to bare are taken round by round (the same moment of the machine) and
    # their median kept: far steadier than a ratio of two independent medians.
    for (name, route), values in samples.items():
        result[name + "/bare", route] = statistics.median(
            value / bare for value, bare in zip(values, samples["bare", route], strict=True)
        )
    return result


# -- (b) wrk against uvicorn ---------------------------------------------------------


def serve(factory: str, root: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "--factory",
            f"middleware_bench:{factory}",
            "--app-dir",
            str(Path(__file__).parent),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env={**os.environ, ROOT_ENV: root},
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return proc, port
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"uvicorn {factory} did not start")


def wrk(port: int, route: tuple[str, str], seconds: int, script_dir: Path) -> float:
    argv = ["wrk", "-t1", "-c16", f"-d{seconds}s", f"http://127.0.0.1:{port}{route[1]}"]
    if route[0] == "POST":
        script = script_dir / "post.lua"
        script.write_text('wrk.method = "POST"\n')
        argv[1:1] = ["-s", str(script)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    match = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if match is None or "Non-2xx" in out:
        raise RuntimeError(f"wrk output unexpected:\n{out}")
    return float(match.group(1))


def under_uvicorn(seconds: int, root: str) -> dict[tuple[str, str], float]:
    routes = {
        "plain": ("GET", "/plain"),
        "session": ("POST", "/sessions"),
        "spawn": ("POST", "/spawn"),
    }
    results: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        factories = ("bare_app", "guarded_app", "guarded_fixed_app", "floor_app") * 2
        for factory in factories:
            proc, port = serve(factory, root)
            try:
                wrk(port, routes["plain"], 1, Path(tmp))  # warm up
                for name, route in routes.items():
                    rps = wrk(port, route, seconds, Path(tmp))
                    key = (factory.removesuffix("_app"), name)
                    results[key] = max(results.get(key, 0.0), rps)
            finally:
                stop_process_group(proc)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--wrk-seconds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, cgroup_root(tmp) as root:
        t = in_process(args.rounds, args.calls, root)
        us: Callable[[str, str], float] = lambda a, r: t[a, r] * 1e6  # noqa: E731
        print("(a) in-process, µs per call (median of per-round means)")
        for route in ("plain", "session"):
            print(
                f"  {route:8}"
                + "".join(
                    f"  {name} {us(name, route):6.2f}"
                    for name in (
                        "bare",
                        "pass-through",
                        "guard",
                        "guard+metrics",
                        "guard(fixed)",
                        "floor",
                        "exporter",
                    )
                )
            )
        plain_added = us("guard", "plain") - us("bare", "plain")
        exporter_plain = us("exporter", "plain") - us("bare", "plain")
        session_added = us("guard", "session") - us("bare", "session")
        metrics_added = us("guard+metrics", "session") - us("bare", "session")
        exporter_session = us("exporter", "session") - us("bare", "session")
        fixed_added = us("guard(fixed)", "session") - us("bare", "session")
        floor_added = us("floor", "session") - us("bare", "session")
        print(
            f"  off path: guard/bare = {t['guard/bare', 'plain']:.3f}"
            f" (target <= 1.03; an empty pass-through middleware is "
            f"{t['pass-through/bare', 'plain']:.3f});"
            f" added/exporter's added = {plain_added / exporter_plain:.3f} (target <= 0.05)"
        )
        print(
            f"  session: added {session_added:.2f} µs = {session_added / exporter_session:.3f}"
            " of exporter's added (target <= 0.25); with metrics "
            f"{metrics_added:.2f} µs = {metrics_added / exporter_session:.3f}; with a fixed "
            f"reading (the guard alone) {fixed_added:.2f} µs = "
            f"{fixed_added / exporter_session:.3f}; the floor (two preads, a count, a "
            f"watched send) {floor_added:.2f} µs"
        )
        if shutil.which("wrk") is None:
            print("(b) skipped: wrk is not installed")
            return 0
        rps = under_uvicorn(args.wrk_seconds, root)
        print("(b) wrk -t1 -c16 against uvicorn on 127.0.0.1, requests/s (best of 2)")
        for route in ("plain", "session", "spawn"):
            ratio = rps["guarded", route] / rps["bare", route]
            note = "target >= 0.9" if route != "spawn" else "a session route that starts a process"
            print(
                f"  {route:8}  bare {rps['bare', route]:8.0f}  guarded "
                f"{rps['guarded', route]:8.0f}  ratio {ratio:.3f} ({note})"
            )
        print("  for scale, as ratios to bare on the same routes:")
        for name, label in (
            ("guarded_fixed", "the guard over a constant reading (no reader)"),
            ("floor", "the floor: two preads, a count, a watched send (no guard)"),
        ):
            ratios = "  ".join(
                f"{route} {rps[name, route] / rps['bare', route]:.3f}"
                for route in ("plain", "session", "spawn")
            )
            print(f"    {ratios}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
