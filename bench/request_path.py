"""What one session request runs through: the package's modules it enters, counted.

    sudo .venv/bin/python bench/request_path.py [--settle-s 3] [--idle-s 1] [--limit-mb 512]
        [--json] [--edges N]
    .venv/bin/python bench/request_path.py --in-process [--settle-s 3] [--idle-s 1] [--json]
        [--edges N]

A Starlette app with the guard at its defaults (``AdmissionMiddleware`` with
``session_routes=["POST /sessions"]`` and nothing else) gets one ``POST /sessions``,
``--idle-s`` after it started: the handler builds 16 MiB inside the request, keeps
it, and answers ``201``. A profile hook (``sys.setprofile``, and
``threading.setprofile`` for the threads the guard starts) records every call into
the package ``asgi_admission`` (a frame whose code's file lies under the package's
directory; code a dataclass generated from a string counts as the module it was
generated for) from the moment the request reaches the app until ``--settle-s``
after its answer. It reports:

- the package's modules entered, and how often each (an *entry*: a call whose
  caller is not in that module);
- *crossings*: calls whose caller is in one of the package's modules and callee in
  another; calls into the package from outside it (the server, Starlette, asyncio's
  event loop running a callback or a task) are counted apart;
- each of those up to the answer (the moment the response's last body message
  leaves the guard for the server) and through the settling after it;
- with ``--edges N``, the N ``(caller, callee)`` pairs of modules most crossed
  between.

Within the figures it also counts the calls into methods a dataclass generated, and
the coroutines and generators resumed: a profile hook sees a resumed frame as a call
(its caller the frame that resumes it), so an ``await`` that suspends counts again.

Two ways to serve the app:

- the default: real uvicorn (its defaults), in a fresh cgroup v1 memory group of
  ``--limit-mb`` (needs root and a writable /sys/fs/cgroup/memory); the server runs
  this file (``--serve PORT``), which installs the hook before uvicorn starts, and
  the counts come back from a path the wrapper answers outside the guard;
- ``--in-process``: no root, the same app driven by ``httpx.ASGITransport`` with its
  lifespan running, reading a copy of the captured v1 tree
  tests/fixtures/cgroup/local-firecracker-v1-hybrid (a 512 MiB limit, 71 MiB used,
  figures that never move).

:func:`measure_in_process` is the in-process run as a function, for a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dis
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import httpx
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import asgi_admission
from asgi_admission import AdmissionConfig, AdmissionMiddleware
from benchkit import (
    FIXTURES,
    MIB,
    free_port,
    joining,
    memory_group,
    stop_process_group,
    wait_healthy,
)
from kits.cgroup_trees import copy_files
from kits.cgroupkit import default_places

#: The package whose modules are counted.
PACKAGE_DIR = os.path.realpath(os.path.dirname(asgi_admission.__file__))
#: What the session request's handler builds and keeps.
SESSION_BYTES = 16 * MIB
SETTLE_S = 3.0
#: How long the server runs before the request: within it the shared ledger's first
#: heartbeat claims the worker's slot, which the request's decision does otherwise.
IDLE_S = 1.0
#: Answered by the wrapper, outside the guard: the counts so far, as JSON.
COUNTS_PATH = "/_request_path/counts"
#: The captured tree the in-process run reads (cgroup v1, a 512 MiB limit).
FIXTURE_TREE = FIXTURES / "local-firecracker-v1-hybrid"

# CPython's flags of a generator, coroutine and async generator's code.
_RESUMABLE = 0x20 | 0x100 | 0x200
#: The instruction a frame starts (its argument 0) and resumes at, from CPython 3.11.
_RESUME = dis.opmap.get("RESUME", -1)


@dataclass(frozen=True)
class ModuleCalls:
    """The calls into one module's functions: all of them, and its entries (those
    whose caller is outside the module, in another of the package's or not in it)."""

    calls: int
    entries: int


@dataclass(frozen=True)
class Tally:
    """Calls of one kind, and how many of them were a coroutine or generator resumed,
    or went into a method a dataclass generated for one of the package's classes."""

    calls: int
    resumed: int
    generated: int

    def as_json(self) -> dict[str, int]:
        return {"calls": self.calls, "resumed": self.resumed, "generated": self.generated}

    @classmethod
    def from_json(cls, data: Any) -> Tally:
        return cls(int(data["calls"]), int(data["resumed"]), int(data["generated"]))


@dataclass(frozen=True)
class PathCounts:
    """What the hook saw between two moments."""

    #: By module (its path under the package), the calls into it, most entries first.
    modules: dict[str, ModuleCalls]
    #: Calls from one of the package's modules into another.
    crossings: Tally
    #: Calls into the package from code outside it.
    from_outside: Tally
    #: Each ``(caller, callee)`` pair of the package's modules a crossing went between.
    edges: frozenset[tuple[str, str]] = frozenset()
    #: By ``(caller, callee)`` pair, how many crossings went between them, most first.
    edge_calls: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def module_count(self) -> int:
        return len(self.modules)

    @property
    def calls(self) -> int:
        return sum(m.calls for m in self.modules.values())

    def as_json(self) -> dict[str, object]:
        return {
            "module_count": self.module_count,
            "crossings": self.crossings.as_json(),
            "from_outside": self.from_outside.as_json(),
            "edges": sorted(self.edges),
            "edge_calls": [[a, b, n] for (a, b), n in self.edge_calls.items()],
            "calls": self.calls,
            "modules": {
                name: {"calls": m.calls, "entries": m.entries} for name, m in self.modules.items()
            },
        }

    @classmethod
    def from_json(cls, data: Any) -> PathCounts:
        """The counts :meth:`as_json` gave (read back from the server)."""
        return cls(
            modules={
                str(name): ModuleCalls(calls=int(m["calls"]), entries=int(m["entries"]))
                for name, m in data["modules"].items()
            },
            crossings=Tally.from_json(data["crossings"]),
            from_outside=Tally.from_json(data["from_outside"]),
            edges=frozenset((str(a), str(b)) for a, b in data["edges"]),
            edge_calls={(str(a), str(b)): int(n) for a, b, n in data.get("edge_calls", [])},
        )


@dataclass(frozen=True)
class PathReport:
    """One session request's counts: to its answer, and through the settling after it."""

    status: int
    to_answer: PathCounts
    settled: PathCounts
    settle_s: float

    def as_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "settle_s": self.settle_s,
            "to_answer": self.to_answer.as_json(),
            "settled": self.settled.as_json(),
        }


class PathCounter:
    """A profile hook that counts calls into the package while it records.

    :meth:`install` sets the hook for this thread and the threads started after it;
    it counts only between :meth:`start` and :meth:`stop`, and :meth:`answered` keeps
    the counts so far as those to the answer.
    """

    def __init__(self, package_dir: str = PACKAGE_DIR) -> None:
        self._prefix = package_dir + os.sep
        self._modules: dict[CodeType, str | None] = {}
        self._lock = threading.Lock()
        self._recording = False
        self.started = False
        self.done = False
        self._calls: dict[str, list[int]] = {}
        self._crossings = [0, 0, 0]  # calls, resumed, generated
        self._outside = [0, 0, 0]
        self._edges: dict[tuple[str, str], int] = {}
        self._to_answer: PathCounts | None = None

    def install(self) -> None:
        sys.setprofile(self._hook)
        threading.setprofile(self._hook)

    def uninstall(self) -> None:
        """No hook for this thread or new threads; threads hooked already stop counting."""
        self._recording = False
        sys.setprofile(None)
        threading.setprofile(None)

    def start(self) -> None:
        self.started = True
        self._recording = True

    def answered(self) -> None:
        self._to_answer = self.counts()

    def stop(self) -> None:
        self._recording = False
        self.done = True

    def counts(self) -> PathCounts:
        """The counts so far."""
        with self._lock:
            return PathCounts(
                modules={
                    name: ModuleCalls(calls=c[0], entries=c[1])
                    for name, c in sorted(self._calls.items(), key=lambda item: -item[1][1])
                },
                crossings=Tally(*self._crossings),
                from_outside=Tally(*self._outside),
                edges=frozenset(self._edges),
                edge_calls=dict(sorted(self._edges.items(), key=lambda item: -item[1])),
            )

    def report(self, status: int, settle_s: float) -> PathReport:
        settled = self.counts()
        return PathReport(
            status=status,
            to_answer=self._to_answer if self._to_answer is not None else settled,
            settled=settled,
            settle_s=settle_s,
        )

    def _module_of(self, frame: FrameType) -> str | None:
        """The module (its path under the package) whose code ``frame`` runs, or ``None``
        outside the package; code compiled from a string (what a dataclass generates)
        belongs to the module whose globals it runs with."""
        code = frame.f_code
        try:
            return self._modules[code]
        except KeyError:
            filename = code.co_filename
            if filename.startswith("<"):
                module = sys.modules.get(str(frame.f_globals.get("__name__")))
                filename = getattr(module, "__file__", None) or filename
            path = os.path.realpath(filename)
            name = path[len(self._prefix) :] if path.startswith(self._prefix) else None
            self._modules[code] = name
            return name

    def _hook(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not self._recording:
            return
        module = self._module_of(frame)
        if module is None:
            return
        back = frame.f_back
        caller = None if back is None else self._module_of(back)
        code = frame.f_code
        resumed = int(bool(code.co_flags & _RESUMABLE) and _resumed(frame))
        generated = int(code.co_filename.startswith("<"))
        with self._lock:
            counted = self._calls.get(module)
            if counted is None:
                counted = self._calls[module] = [0, 0]
            counted[0] += 1
            if caller != module:
                counted[1] += 1
                tally = self._outside if caller is None else self._crossings
                if caller is not None:
                    edge = (caller, module)
                    self._edges[edge] = self._edges.get(edge, 0) + 1
                tally[0] += 1
                tally[1] += resumed
                tally[2] += generated


def _resumed(frame: FrameType) -> bool:
    """Whether a generator's or coroutine's frame is resumed rather than started: from
    CPython 3.11 a frame starts at ``RESUME 0`` and resumes at ``RESUME`` 1 to 3; 3.10
    starts at ``f_lasti == -1``."""
    lasti = frame.f_lasti
    if lasti < 0:
        return False
    code = frame.f_code.co_code
    return not (code[lasti] == _RESUME and code[lasti + 1] == 0)


# -- the app -----------------------------------------------------------------------


async def open_session(request: Request) -> JSONResponse:
    """Build the session's memory (every page written) and keep it; answer ``201``."""
    sessions: list[bytes] = request.app.state.sessions
    sessions.append(b"\x01" * SESSION_BYTES)
    return JSONResponse({"session": len(sessions)}, status_code=201)


async def health(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def create_app(
    *, config: AdmissionConfig | None = None, registry: CollectorRegistry | None = REGISTRY
) -> AdmissionMiddleware:
    """The guarded app: the guard's defaults (``config``: from the environment) and
    one session route."""
    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            Route("/health", health),
        ]
    )
    app.state.sessions = []
    return AdmissionMiddleware(
        app, session_routes=["POST /sessions"], config=config, registry=registry
    )


class CountedApp:
    """Counts the first ``POST /sessions``: from its arrival to ``settle_s`` after its
    answer. Answers :data:`COUNTS_PATH` itself, without entering the guard."""

    def __init__(self, app: ASGIApp, counter: PathCounter, *, settle_s: float) -> None:
        self.app = app
        self.counter = counter
        self.settle_s = settle_s
        self.status = 0
        #: Set once the counting is over.
        self.finished = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif scope["path"] == COUNTS_PATH:
            body: dict[str, object] = {"done": self.counter.done}
            if self.counter.done:
                body["report"] = self.counter.report(self.status, self.settle_s).as_json()
            await JSONResponse(body)(scope, receive, send)
        elif (scope["method"], scope["path"]) == ("POST", "/sessions") and not self.counter.started:
            await self._counted(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _counted(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        counter = self.counter

        async def send_counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                counter.answered()
                loop.call_later(self.settle_s, self._stop)
            await send(message)

        counter.start()
        await self.app(scope, receive, send_counted)

    def _stop(self) -> None:
        self.counter.stop()
        self.finished.set()


# -- in process --------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running_lifespan(app: ASGIApp) -> AsyncIterator[None]:
    """The app's lifespan started, and shut down on exit (as a server would)."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    outbox: asyncio.Queue[Message] = asyncio.Queue()
    scope: Scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.ensure_future(app(scope, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"the app's lifespan did not start: {started}")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task


async def measure_in_process(
    cgroup_root: Path, *, settle_s: float = SETTLE_S, idle_s: float = IDLE_S
) -> PathReport:
    """One session request, counted, against the cgroup tree at ``cgroup_root`` (a
    directory with a limit), its app driven in this process by ``httpx.ASGITransport``.

    Run it on the thread of its event loop (``asyncio.run``): the hook is set for this
    thread and the threads started after it, and removed on return, as is the place
    the guard's default shared ledger made for the tree.
    """
    counter = PathCounter()
    counter.install()
    try:
        guarded = create_app(
            config=AdmissionConfig(cgroup_root=str(cgroup_root)), registry=CollectorRegistry()
        )
        app = CountedApp(guarded, counter, settle_s=settle_s)
        async with running_lifespan(app):
            await asyncio.sleep(idle_s)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://guarded") as client:
                response = await client.post("/sessions")
            await asyncio.wait_for(app.finished.wait(), settle_s + 30)
    finally:
        counter.uninstall()
        for place in default_places(cgroup_root):
            shutil.rmtree(place, ignore_errors=True)
    return counter.report(response.status_code, settle_s)


def run_in_process(settle_s: float, idle_s: float = IDLE_S) -> PathReport:
    """:func:`measure_in_process` against a copy of :data:`FIXTURE_TREE`."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = copy_files(FIXTURE_TREE, Path(tmp) / "group")
        return asyncio.run(measure_in_process(tree, settle_s=settle_s, idle_s=idle_s))


# -- under uvicorn -----------------------------------------------------------------


def serve(port: int, settle_s: float) -> None:
    """The server's side: the hook, then the app under uvicorn (its defaults)."""
    import uvicorn

    counter = PathCounter()
    counter.install()
    app = CountedApp(create_app(), counter, settle_s=settle_s)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def run_under_uvicorn(limit_mb: int, settle_s: float, idle_s: float = IDLE_S) -> PathReport:
    """Serve the app in a fresh memory group of ``limit_mb``, send one session
    request ``idle_s`` after it is ready, and fetch the counts once its settling is over."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    # The guard at its defaults: no setting of ours or the machine's reaches it.
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("ADMISSION_", "CODA_"))
    }
    with memory_group(limit_mb, "request_path") as group, tempfile.TemporaryFile() as log:
        argv = [
            *joining(group),
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            str(port),
            "--settle-s",
            str(settle_s),
        ]
        proc = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            wait_healthy(base_url, proc, 60)
            time.sleep(idle_s)
            status = httpx.post(base_url + "/sessions", timeout=30).status_code
            time.sleep(settle_s)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                body = httpx.get(base_url + COUNTS_PATH, timeout=10).json()
                if body["done"]:
                    report = body["report"]
                    assert report["status"] == status
                    return PathReport(
                        status=status,
                        to_answer=PathCounts.from_json(report["to_answer"]),
                        settled=PathCounts.from_json(report["settled"]),
                        settle_s=settle_s,
                    )
                time.sleep(0.1)
            raise RuntimeError("the server did not finish counting")
        except BaseException:
            log.seek(0)
            sys.stderr.write(log.read().decode(errors="replace"))
            raise
        finally:
            stop_process_group(proc)


# -- the report --------------------------------------------------------------------


def print_report(report: PathReport, where: str, edges: int = 0) -> None:
    answer, settled = report.to_answer, report.settled
    print(f"one POST /sessions ({where}): {report.status}")
    print(f"{'':36}{'to the answer':>15}{f'+{report.settle_s:g} s settling':>20}")
    rows = [("modules entered", answer.module_count, settled.module_count)]
    for label, first, second in (
        ("crossings (module -> module)", answer.crossings, settled.crossings),
        ("calls into it from outside", answer.from_outside, settled.from_outside),
    ):
        rows += [
            (label, first.calls, second.calls),
            ("  into methods a dataclass made", first.generated, second.generated),
            ("  coroutines resumed", first.resumed, second.resumed),
        ]
    rows.append(("calls in all", answer.calls, settled.calls))
    for label, first_n, then_n in rows:
        print(f"{label:36}{first_n:>15}{then_n:>20}")
    print()
    print("modules by entries through the settling (entries to the answer; calls in all):")
    for name, counted in settled.modules.items():
        early = answer.modules.get(name, ModuleCalls(0, 0))
        print(f"  {counted.entries:6} ({early.entries:4}; {counted.calls:6})  {name}")
    if edges:
        print()
        print(f"the {edges} busiest crossings through the settling (to the answer):")
        for (caller, callee), n in list(settled.edge_calls.items())[:edges]:
            early_n = answer.edge_calls.get((caller, callee), 0)
            print(f"  {n:6} ({early_n:4})  {caller} -> {callee}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    # The server's side, started by the bench itself: serve on this port.
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--in-process", action="store_true", help="no root: httpx, a fixture")
    parser.add_argument("--settle-s", type=float, default=SETTLE_S)
    parser.add_argument(
        "--idle-s", type=float, default=IDLE_S, help="how long the server runs before the request"
    )
    parser.add_argument("--limit-mb", type=int, default=512)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--edges", type=int, default=0, metavar="N", help="also print the N busiest crossings"
    )
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.settle_s)
        return
    if args.in_process:
        report = run_in_process(args.settle_s, args.idle_s)
        where = f"in process, httpx.ASGITransport, the tree {FIXTURE_TREE.name}"
    else:
        report = run_under_uvicorn(args.limit_mb, args.settle_s, args.idle_s)
        where = f"uvicorn in a cgroup v1 memory group of {args.limit_mb} MiB"
    if args.json:
        print(json.dumps({"where": where, **report.as_json()}, indent=2))
    else:
        print_report(report, where, args.edges)


if __name__ == "__main__":
    main()
