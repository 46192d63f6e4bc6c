"""Chaos soak: the guarded demo under mixed load while faults are injected on a schedule.

    .venv/bin/python bench/soak.py [--minutes 10] [--workers 4] [--fault-every 7]

Needs root and a writable cgroup v1 memory hierarchy. ``uvicorn --workers N`` serves
the demo app with the shared ledger (``ADMISSION_SHARED_DIR``) inside a fresh memory
group (``memory.limit_in_bytes`` 1536 MiB, no swap), and the client runs, all at once:

- HTTP sessions (``POST /sessions``, held a random 0.2-3 s, then ``DELETE``, on one
  keep-alive connection so the delete reaches the worker that holds the memory),
  some kept pending in the request (``hold_s``), the rest opened at once;
- WebSocket sessions (``/terminal``) echoing for a random while;
- clients that disconnect mid-request, and slow clients that dribble their request;
- ordinary requests (``GET /sessions``) and a ``/health`` probe every 50 ms on a new
  connection, whose latency is the responsiveness figure;
- process sessions (``POST /processes``) grown by 16 MiB every 0.2 s until the
  watchdog halts them (over their own budget, or the container over its critical
  watermark).

Faults, one every ``--fault-every`` seconds, in turn: a worker SIGKILLed, a worker
SIGSTOPped for 2 s and resumed, the ledger directory deleted and restored 1 s later,
the ledger file truncated, the ledger file filled with garbage, the memory limit
lowered for 3 s and raised again, and a process session that grows without bound.

Checked per phase (the time between two faults) and at the end: every HTTP status is
2xx, 404 or 503 (and 409 or 410 from growing a halted or ended process session, as
the demo answers by design) and every WebSocket is accepted or refused (503 or close 1013); a
connection error counts only while a worker is being killed or stopped; no traceback
in the server's log; the ledger never counts more than ``max_sessions + 1`` sessions;
no OOM kill in the group; ``/health`` p99 under 1 s and the worst ``/health`` outside
a stopped or killed worker's window under 3 s; no worker's event loop stalled over 1 s
except while that worker itself was stopped or just restarted, and every live worker's
loop still ticking at the end (each worker runs a probe, ``bench/soak_app.py``). At the end
the load stops and the ledger's counts must come back to zero (readiness probes make
every worker publish its own count). Exit status 1 on any violation; ``--json``
writes the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import websockets

import soak_app
from asgi_admission._admission.ledger.shared_ledger import (
    DEFAULT_CAPACITY,
    FILE_NAME,
    header_problem,
    read_entries,
)
from benchkit import MIB, V1_MEMORY, free_port, joining, memory_group, oom_kills, stop_process_group

LIMIT_MB = 1536
MAX_SESSIONS = 24
SESSION_MB = 32
FAULTS = (
    "kill_worker",
    "stop_worker",
    "delete_ledger_dir",
    "truncate_ledger",
    "garbage_ledger",
    "lower_limit",
    "grow_unbounded",
)
#: After a worker is killed or stopped: how long connection errors are its doing.
FAULT_GRACE_S = 3.0
HEALTH_P99_BUDGET_S = 1.0
HEALTH_WORST_BUDGET_S = 3.0
#: The worst event-loop stall of any worker outside a fault window.
LOOP_STALL_BUDGET_S = 1.0
#: A live worker whose loop has not ticked (its probe's heartbeat) for this long is frozen.
LOOP_SILENCE_BUDGET_S = 5.0
#: Stalls in a worker's first seconds (a worker restarted after a kill) are not counted.
STARTUP_GRACE_S = 5.0
ALLOWED_STATUSES = frozenset({200, 201, 204, 404, 503})
#: What growing a process session may answer: grown, halted (409), or ended (410).
GROWN = frozenset({200, 404, 409, 410})


def traceback_summaries(log: str, limit: int = 3) -> list[str]:
    """The last frame and the exception line of the first ``limit`` tracebacks in ``log``,
    so a failed run (in CI, where the log is gone) still says what raised where."""
    summaries = []
    for block in log.split("Traceback (most recent call last):")[1 : limit + 1]:
        lines = [line.rstrip() for line in block.splitlines() if line.strip()]
        frames = [line.strip() for line in lines if line.lstrip().startswith("File ")]
        ending = next((line for line in lines if not line.startswith((" ", "\t"))), "?")
        summaries.append(f"{frames[-1] if frames else '?'}: {ending}")
    return summaries


def available() -> str | None:
    """Why the soak cannot run here, or ``None``."""
    if not (V1_MEMORY / "memory.limit_in_bytes").is_file():
        return f"no cgroup v1 memory hierarchy at {V1_MEMORY}"
    if os.geteuid() != 0 or not os.access(V1_MEMORY, os.W_OK):
        return f"needs root to create memory groups under {V1_MEMORY}"
    return None


@dataclass
class Phase:
    """What happened between two faults."""

    fault: str
    started: float
    requests: int = 0
    unexpected: list[str] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    max_ledger: int = 0


@dataclass
class SoakResult:
    """The soak's figures; ``violations`` is empty when every check passed."""

    seconds: float
    workers: int
    requests: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    sessions_admitted: int = 0
    sessions_refused: int = 0
    websockets_admitted: int = 0
    websockets_refused: int = 0
    processes_halted: int = 0
    disconnects: int = 0
    fault_errors: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    oom_kills: int = 0
    tracebacks: int = 0
    leaked_pending: int = 0
    leaked_active: int = 0
    max_ledger_sessions: int = 0
    max_client_sessions: int = 0
    health_p99_ms: float = 0.0
    health_worst_ms: float = 0.0
    #: The workers' event loops: the worst stall outside the fault windows, and how many
    #: stalls there (over soak_app.REPORT_S) lasted more than 100 ms.
    loop_stall_worst_ms: float = 0.0
    loop_stalls_over_100ms: int = 0
    #: The worst inside them: a worker SIGSTOPped for 2 s shows it (the probe works).
    loop_stall_in_faults_ms: float = 0.0
    violations: list[str] = field(default_factory=list)


PENDING_TIMEOUT_S = 5


class Soak:
    """One soak run: the server, the load, the faults and the checks."""

    def __init__(self, *, seconds: float, workers: int, fault_every: float, work: Path) -> None:
        self.seconds = seconds
        self.workers = workers
        self.fault_every = fault_every
        self.work = work
        self.ledger_dir = work / "shm" / "ledger"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.result = SoakResult(seconds=seconds, workers=workers)
        self.phases: list[Phase] = [Phase("start", time.monotonic())]
        self.statuses: Counter[str] = Counter()
        self.fault_windows: list[tuple[float, float]] = []
        #: The workers stopped: (pid, from, to); only their own stalls then are excused.
        self.stops: list[tuple[int, float, float]] = []
        self.client_sessions = 0
        self.stopping = False
        self.rng = random.Random(12)
        self.group = Path()
        self.stall_dir = work / "stalls"
        self.proc: subprocess.Popen[bytes] | None = None

    # -- the server ------------------------------------------------------------------

    def start_server(self, group: Path) -> None:
        self.group = group
        env = {
            **os.environ,
            "ADMISSION_CGROUP_ROOT": str(group),
            "ADMISSION_SHARED_DIR": str(self.ledger_dir),
            "ADMISSION_SESSION_RESERVE_MB": "64",
            # Sessions that never show their memory (abandoned, halted, refused work)
            # are released by the pending timeout: short enough for the quiesce check.
            "ADMISSION_PENDING_TIMEOUT_SECONDS": str(PENDING_TIMEOUT_S),
            "ADMISSION_MAX_SESSIONS": str(MAX_SESSIONS),
            "DEMO_SESSION_MB": str(SESSION_MB),
        }
        self.stall_dir.mkdir(exist_ok=True)
        env[soak_app.SETTING] = str(self.stall_dir)
        argv = [
            sys.executable,
            "-m",
            "uvicorn",
            "soak_app:create_app",
            "--factory",
            "--app-dir",
            str(Path(__file__).resolve().parent),
            "--workers",
            str(self.workers),
            "--port",
            str(self.port),
            "--log-level",
            "warning",
        ]
        # Join the group before exec, so every worker (and restarted one) is charged to it.
        argv = [*joining(group), *argv]
        self.log_path = self.work / "server.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            if len(self.worker_pids()) >= self.workers:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                        return
            time.sleep(0.2)
        raise RuntimeError(f"server not ready:\n{self.log_path.read_text()}")

    def stop_server(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc, timeout=15)
            self._log.close()

    async def settled_worker(self, workers: list[int]) -> int:
        """One of ``workers`` whose loop probe has run past its start-up grace, waiting a
        few seconds for one: a worker restarted after a kill may not have started its
        probe yet (imports are slow on a busy machine), and a stop then goes unrecorded.
        Any of them if none settles in time."""
        deadline = time.monotonic() + 10.0
        while True:
            probes = soak_app.read_probes(self.stall_dir)
            now = time.monotonic()
            settled = [
                pid
                for pid in workers
                if pid in probes and 0 < probes[pid].started < now - STARTUP_GRACE_S
            ]
            if settled or now >= deadline:
                return self.rng.choice(settled or workers)
            await asyncio.sleep(0.1)

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        try:
            children = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        pids = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if "spawn_main" in " ".join(child.cmdline()):
                    pids.append(child.pid)
        return pids

    def ledger_totals(self) -> tuple[int, int]:
        """(pending, active) over the live workers' slots; (0, 0) while there is no file
        or while it holds a fault's garbage (the workers rebuild it)."""
        try:
            with (self.ledger_dir / FILE_NAME).open("rb") as file:
                if header_problem(file.read(16), DEFAULT_CAPACITY) is not None:
                    return 0, 0
            entries = read_entries(self.ledger_dir)
        except OSError:
            return 0, 0
        live = [e for e in entries if e.alive]
        return sum(max(0, e.pending) for e in live), sum(max(0, e.active) for e in live)

    # -- bookkeeping -------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.phases[-1]

    def in_fault_window(self, at: float) -> bool:
        return any(start <= at <= end + FAULT_GRACE_S for start, end in self.fault_windows)

    def record(self, what: str, *, ok: bool, at: float | None = None) -> None:
        self.statuses[what] += 1
        self.phase.requests += 1
        if not ok:
            self.phase.unexpected.append(what)

    def record_error(self, kind: str, exc: BaseException, started: float) -> None:
        name = f"{kind}:{type(exc).__name__}"
        if self.in_fault_window(started) or self.in_fault_window(time.monotonic()):
            self.result.fault_errors += 1
            self.statuses[name + "(fault)"] += 1
            self.phase.requests += 1
        else:
            self.record(name, ok=False)

    def record_status(self, kind: str, status: int) -> None:
        self.record(f"{kind}:{status}", ok=status in ALLOWED_STATUSES)

    # -- the load --------------------------------------------------------------------

    async def http_sessions(self) -> None:
        while not self.stopping:
            hold = self.rng.choice([0.0, 0.0, 0.3, 0.8])
            lifetime = self.rng.uniform(0.2, 3.0)
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            started = time.monotonic()
            async with httpx.AsyncClient(base_url=self.base, limits=limits, timeout=30) as client:
                try:
                    response = await client.post("/sessions", params={"hold_s": hold})
                except httpx.HTTPError as exc:
                    self.record_error("session", exc, started)
                    await asyncio.sleep(0.1)
                    continue
                self.record_status("session", response.status_code)
                if response.status_code != 201:
                    self.result.sessions_refused += response.status_code == 503
                    await asyncio.sleep(self.rng.uniform(0.05, 0.3))
                    continue
                self.result.sessions_admitted += 1
                self.client_sessions += 1
                self.result.max_client_sessions = max(
                    self.result.max_client_sessions, self.client_sessions
                )
                try:
                    await asyncio.sleep(lifetime)
                    started = time.monotonic()
                    try:
                        deleted = await client.delete(f"/sessions/{response.json()['id']}")
                    except httpx.HTTPError as exc:
                        self.record_error("delete", exc, started)
                    else:
                        self.record_status("delete", deleted.status_code)
                finally:
                    self.client_sessions -= 1

    async def websocket_sessions(self) -> None:
        url = f"ws://127.0.0.1:{self.port}/terminal/soak"
        while not self.stopping:
            started = time.monotonic()
            try:
                async with websockets.connect(url, open_timeout=10, close_timeout=5) as socket:
                    greeting = await asyncio.wait_for(socket.recv(), 10)
                    self.result.websockets_admitted += 1
                    self.client_sessions += 1
                    try:
                        for _ in range(self.rng.randint(1, 20)):
                            await socket.send("ping")
                            await asyncio.wait_for(socket.recv(), 10)
                            await asyncio.sleep(0.1)
                    finally:
                        self.client_sessions -= 1
                    self.record("websocket:ok", ok=bool(greeting))
            except websockets.InvalidStatus as exc:
                status = exc.response.status_code
                self.result.websockets_refused += status == 503
                self.record_status("websocket", status)
            except websockets.ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code == 1013:
                    self.result.websockets_refused += 1
                    self.record("websocket:1013", ok=True)
                else:
                    self.record_error("websocket", exc, started)
            except (OSError, TimeoutError, websockets.WebSocketException) as exc:
                self.record_error("websocket", exc, started)
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))

    async def disconnects(self) -> None:
        """Session requests abandoned while the app still holds them (client timeout)."""
        while not self.stopping:
            started = time.monotonic()
            async with httpx.AsyncClient(base_url=self.base, timeout=0.2) as client:
                try:
                    response = await client.post("/sessions", params={"hold_s": 2})
                except httpx.TimeoutException:
                    self.result.disconnects += 1
                    self.record("session:disconnected", ok=True)
                except httpx.HTTPError as exc:
                    self.record_error("disconnect", exc, started)
                else:  # refused at once: a 503 is quick
                    self.record_status("session", response.status_code)
            await asyncio.sleep(self.rng.uniform(0.2, 0.6))

    async def slow_clients(self) -> None:
        """A request sent a few bytes at a time over about a second."""
        request = (
            f"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n"
        ).encode()
        while not self.stopping:
            started = time.monotonic()
            writer = None
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                for index in range(0, len(request), 8):
                    writer.write(request[index : index + 8])
                    await writer.drain()
                    await asyncio.sleep(0.05)
                line = await asyncio.wait_for(reader.readline(), 30)
                status = int(line.split()[1])
                self.record_status("slow", status)
                # Its session (if admitted) is dropped with the connection: the demo
                # keeps it until the worker restarts, so it is deleted here if possible.
                if status == 201:
                    body = await asyncio.wait_for(reader.read(), 10)
                    session_id = json.loads(body.split(b"\r\n\r\n", 1)[-1])["id"]
                    await self.delete_anywhere(session_id)
            except (OSError, TimeoutError, ValueError, IndexError) as exc:
                self.record_error("slow", exc, started)
            finally:
                if writer is not None:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))

    async def delete_anywhere(self, session_id: str) -> None:
        # Ids are per worker: try a few connections, each may land on another worker.
        async with httpx.AsyncClient(base_url=self.base, timeout=10) as client:
            for _ in range(12):
                with contextlib.suppress(httpx.HTTPError):
                    response = await client.delete(
                        f"/sessions/{session_id}", headers={"connection": "close"}
                    )
                    self.record_status("delete", response.status_code)
                    if response.status_code == 204:
                        return

    async def ordinary(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as client:
            while not self.stopping:
                started = time.monotonic()
                try:
                    response = await client.get("/sessions")
                    self.record_status("ordinary", response.status_code)
                except httpx.HTTPError as exc:
                    self.record_error("ordinary", exc, started)
                await asyncio.sleep(0.05)

    async def health(self) -> None:
        while not self.stopping:
            started = time.monotonic()
            try:
                async with httpx.AsyncClient(base_url=self.base, timeout=30) as client:
                    response = await client.get("/health", headers={"connection": "close"})
                took = time.monotonic() - started
                self.record_status("health", response.status_code)
                if not self.in_fault_window(started):
                    self.phase.health_s.append(took)
            except httpx.HTTPError as exc:
                self.record_error("health", exc, started)
            await asyncio.sleep(0.05)

    async def processes(self, *, budget_mb: int = 96, until_halted: bool = False) -> None:
        """Process sessions grown 16 MiB at a time until the watchdog halts them."""
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        began = time.monotonic()
        while not self.stopping:
            started = time.monotonic()
            async with httpx.AsyncClient(base_url=self.base, limits=limits, timeout=30) as client:
                try:
                    response = await client.post(
                        "/processes", params={"hold_mb": 8, "budget_mb": budget_mb}
                    )
                    self.record_status("process", response.status_code)
                    if response.status_code != 201:
                        await asyncio.sleep(0.5)
                        if until_halted and time.monotonic() - began > 5:
                            return  # refused throughout: the fault found no room
                        continue
                    session_id = response.json()["id"]
                    halted = False
                    for _ in range(LIMIT_MB // 16):
                        grown = await client.post(
                            f"/processes/{session_id}/grow", params={"mb": 16}
                        )
                        # The demo answers 409 once the watchdog halted the session, 410
                        # if its process ended otherwise: both by design.
                        self.record(f"grow:{grown.status_code}", ok=grown.status_code in GROWN)
                        if grown.status_code != 200 or grown.json()["halt"] is not None:
                            halted = grown.status_code in (200, 409)
                            break
                        await asyncio.sleep(0.2)
                    self.result.processes_halted += halted
                    deleted = await client.delete(f"/processes/{session_id}")
                    self.record_status("process-delete", deleted.status_code)
                except httpx.HTTPError as exc:
                    self.record_error("process", exc, started)
            if until_halted:
                return
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))

    async def ledger_watch(self) -> None:
        while not self.stopping:
            pending, active = await asyncio.to_thread(self.ledger_totals)
            self.phase.max_ledger = max(self.phase.max_ledger, pending + active)
            await asyncio.sleep(0.1)

    # -- the faults ------------------------------------------------------------------

    async def fault(self, name: str) -> None:
        self.result.faults[name] = self.result.faults.get(name, 0) + 1
        workers = self.worker_pids()
        if name == "kill_worker" and workers:
            now = time.monotonic()
            self.fault_windows.append((now, now + 5.0))  # a restarted worker imports first
            os.kill(self.rng.choice(workers), signal.SIGKILL)
        elif name == "stop_worker" and workers:
            victim = await self.settled_worker(workers)
            now = time.monotonic()
            self.fault_windows.append((now, now + 2.0))
            self.stops.append((victim, now, now + 2.0))
            os.kill(victim, signal.SIGSTOP)
            try:
                await asyncio.sleep(2.0)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGCONT)
        elif name == "delete_ledger_dir":
            shutil.rmtree(self.ledger_dir, ignore_errors=True)
            await asyncio.sleep(1.0)
            with contextlib.suppress(FileExistsError):
                self.ledger_dir.mkdir(mode=0o700)
        elif name == "truncate_ledger":
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.ledger_dir / FILE_NAME, 7)
        elif name == "garbage_ledger":
            path = self.ledger_dir / FILE_NAME
            with contextlib.suppress(FileNotFoundError):
                size = path.stat().st_size
                fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
                try:
                    os.pwrite(fd, self.rng.randbytes(size), 0)
                finally:
                    os.close(fd)
        elif name == "lower_limit":
            limit_file = self.group / "memory.limit_in_bytes"
            usage = int((self.group / "memory.usage_in_bytes").read_text())
            lowered = min(LIMIT_MB * MIB, max(usage + 384 * MIB, 768 * MIB))
            with contextlib.suppress(OSError):  # EBUSY: cannot reclaim that far now
                limit_file.write_text(str(lowered))
            await asyncio.sleep(3.0)
            limit_file.write_text(str(LIMIT_MB * MIB))
        elif name == "grow_unbounded":
            await self.processes(budget_mb=65536, until_halted=True)

    async def faults(self) -> None:
        """One fault every ``fault_every`` seconds on a fixed schedule (a fault's own
        duration does not push the next one back), none in the last second."""
        index = 0
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + self.seconds
        while True:
            next_at = start + (index + 1) * self.fault_every
            await asyncio.sleep(max(0.0, min(next_at, end) - loop.time()))
            if loop.time() >= end - 1:
                return
            name = FAULTS[index % len(FAULTS)]
            index += 1
            previous = self.phase
            print(
                f"soak: {previous.fault}: {previous.requests} requests, "
                f"{len(previous.unexpected)} unexpected; next fault: {name}",
                file=sys.stderr,
                flush=True,
            )
            self.phases.append(Phase(name, time.monotonic()))
            await self.fault(name)

    # -- the run ---------------------------------------------------------------------

    async def load(self) -> None:
        tasks = [
            *(asyncio.ensure_future(self.http_sessions()) for _ in range(8)),
            *(asyncio.ensure_future(self.websocket_sessions()) for _ in range(3)),
            asyncio.ensure_future(self.disconnects()),
            asyncio.ensure_future(self.slow_clients()),
            asyncio.ensure_future(self.ordinary()),
            asyncio.ensure_future(self.health()),
            asyncio.ensure_future(self.processes()),
            asyncio.ensure_future(self.ledger_watch()),
        ]
        try:
            await self.faults()
        finally:
            self.stopping = True
            self.phases.append(Phase("quiesce", time.monotonic()))
            done, pending = await asyncio.wait(tasks, timeout=60)
            for task in pending:
                task.cancel()
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]

    async def end_app_sessions(self) -> None:
        """Delete the sessions the app still holds: those of abandoned requests (the demo
        opens them anyway) and of deletes that never reached their worker."""
        for _ in range(8 * self.workers):
            limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
            async with httpx.AsyncClient(base_url=self.base, limits=limits, timeout=10) as client:
                with contextlib.suppress(httpx.HTTPError):
                    listed = await client.get("/sessions")
                    for session_id in listed.json()["sessions"]:
                        response = await client.delete(f"/sessions/{session_id}")
                        self.record_status("cleanup", response.status_code)

    async def quiesce(self) -> tuple[int, int]:
        """Readiness probes until every worker has published its count; the totals."""
        pending = active = 0
        deadline = time.monotonic() + 20
        async with httpx.AsyncClient(base_url=self.base, timeout=10) as client:
            while time.monotonic() < deadline:
                await self.end_app_sessions()
                for _ in range(4 * self.workers):
                    with contextlib.suppress(httpx.HTTPError):
                        await client.get("/admission/ready", headers={"connection": "close"})
                pending, active = self.ledger_totals()
                if pending == active == 0:
                    break
                await asyncio.sleep(0.5)
        return pending, active

    def check(self, oom_before: int) -> None:
        result = self.result
        violations = result.violations
        result.statuses = dict(sorted(self.statuses.items()))
        result.requests = sum(self.statuses.values())
        health = [s for phase in self.phases for s in phase.health_s]
        if len(health) >= 2:
            result.health_p99_ms = statistics.quantiles(health, n=100)[98] * 1e3
            result.health_worst_ms = max(health) * 1e3
        result.max_ledger_sessions = max(phase.max_ledger for phase in self.phases)
        result.oom_kills = oom_kills(self.group) - oom_before
        stalls: list[float] = []
        stopped: list[float] = []
        probes = soak_app.read_probes(self.stall_dir)
        for pid, probe in probes.items():
            for ended, lag in probe.stalls:
                if ended - lag < probe.started + STARTUP_GRACE_S:
                    continue  # a worker restarted after a kill imports and warms up
                excused = any(
                    victim == pid and start <= ended <= end + FAULT_GRACE_S
                    for victim, start, end in self.stops
                )
                (stopped if excused else stalls).append(lag)
        result.loop_stall_worst_ms = round(max(stalls, default=0.0) * 1e3, 1)
        result.loop_stalls_over_100ms = sum(lag > 0.1 for lag in stalls)
        result.loop_stall_in_faults_ms = round(max(stopped, default=0.0) * 1e3, 1)
        now = time.monotonic()
        for pid in self.worker_pids():
            beating = probes.get(pid)
            silent = now - beating.last_beat if beating is not None else float("inf")
            if silent > LOOP_SILENCE_BUDGET_S:
                violations.append(
                    f"worker pid {pid}'s event loop has not ticked for {silent:.1f} s"
                )
        log = self.log_path.read_text(errors="replace")
        result.tracebacks = log.count("Traceback (most recent call last)")
        for number, phase in enumerate(self.phases):
            where = f"phase {number} ({phase.fault})"
            if phase.unexpected:
                violations.append(f"{where}: unexpected outcomes {Counter(phase.unexpected)}")
            if phase.max_ledger > MAX_SESSIONS + 1:
                violations.append(
                    f"{where}: the ledger counted {phase.max_ledger} sessions, over "
                    f"max_sessions + 1 = {MAX_SESSIONS + 1}"
                )
            if phase.health_s and max(phase.health_s) > HEALTH_WORST_BUDGET_S:
                violations.append(
                    f"{where}: /health took {max(phase.health_s):.2f} s outside a fault window"
                )
        if result.loop_stall_worst_ms > LOOP_STALL_BUDGET_S * 1e3:
            violations.append(
                f"a worker's event loop stalled {result.loop_stall_worst_ms:.0f} ms outside "
                f"a fault window (budget {LOOP_STALL_BUDGET_S * 1e3:.0f} ms)"
            )
        if result.health_p99_ms > HEALTH_P99_BUDGET_S * 1e3:
            violations.append(f"/health p99 {result.health_p99_ms:.0f} ms over 1 s")
        if result.tracebacks:
            violations.append(
                f"{result.tracebacks} tracebacks in the server log {self.log_path}: "
                + " | ".join(traceback_summaries(log))
            )
        if result.oom_kills:
            violations.append(f"{result.oom_kills} OOM kills in the memory group")
        if result.leaked_pending or result.leaked_active:
            violations.append(
                f"counts not back to zero at quiesce: {result.leaked_pending} pending, "
                f"{result.leaked_active} active"
            )
        if result.sessions_admitted == 0 or result.sessions_refused == 0:
            violations.append("the load never both admitted and refused a session")

    def run(self) -> SoakResult:
        with memory_group(LIMIT_MB, "soak") as group:
            oom_before = oom_kills(group)
            self.start_server(group)
            try:
                asyncio.run(self.load())
                pending, active = asyncio.run(self.quiesce())
                self.result.leaked_pending, self.result.leaked_active = pending, active
                self.check(oom_before)
            finally:
                self.stop_server()
        return self.result


def run_soak(*, seconds: float, workers: int = 4, fault_every: float = 7.0) -> SoakResult:
    """One soak of ``seconds``; the figures and any violations."""
    work = Path(tempfile.mkdtemp(prefix="asgi-admission-soak-"))
    try:
        result = Soak(seconds=seconds, workers=workers, fault_every=fault_every, work=work).run()
    except BaseException:
        print(f"soak: the server's log is kept in {work}", file=sys.stderr)
        raise
    if result.violations:
        print(f"soak: the server's log is kept in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--fault-every", type=float, default=7.0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    problem = available()
    if problem is not None:
        print(f"soak: {problem}", file=sys.stderr)
        return 2
    result = run_soak(seconds=args.minutes * 60, workers=args.workers, fault_every=args.fault_every)
    figures: dict[str, Any] = asdict(result)
    print(json.dumps(figures, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
