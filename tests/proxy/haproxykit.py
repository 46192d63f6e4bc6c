"""Debian's HAProxy in front of three real uvicorn replicas, each in its own memory group.

Used by tests/proxy/test_haproxy.py and bench/haproxy.py. Each replica serves the
demo (WebSocket sessions of ``SESSION_MB`` each) with its agent-check listener on;
HAProxy weighs them by what their agents say (``balance leastconn``, ``weight 100``,
``agent-check``) or spreads them round robin, retrying a refused session elsewhere
in both cases (``retry-on 503``, ``option redispatch``), as docs/containers.md
configures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from kits.cgroupkit import joining, memory_group, oom_kills
from kits.processkit import Server, free_port, stop_process_group
from kits.requirekit import require

SESSION_MB = 32
#: Just under what one such WebSocket session adds to the working set (about 35 MiB):
#: a session settles once its memory shows (docs/reservations.md), and the capacity the
#: agents say is then at most one session too many.
RESERVE_MB = 34
#: Three sizes, so that "in proportion to capacity" means something: about 3, 5 and 7
#: sessions fit.
LIMITS_MB = (224, 320, 416)
#: How often HAProxy asks each agent, in milliseconds.
AGENT_INTER_MS = 100

Balance = Literal["agent", "roundrobin"]
BALANCES: tuple[Balance, ...] = ("agent", "roundrobin")


def haproxy_binary() -> str:
    """Debian's haproxy; the test is skipped without it, and fails under ``CI=true``."""
    path = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    require(path is not None, "haproxy is not installed; scripts/setup installs Debian's")
    assert path is not None
    return path


@dataclass
class Replica:
    """One uvicorn replica of the demo in its own memory group."""

    name: str
    group: Path
    server: Server
    agent_port: int

    @property
    def url(self) -> str:
        return self.server.base_url

    def sessions(self) -> int:
        ids: list[str] = httpx.get(f"{self.url}/sessions", timeout=10).json()["sessions"]
        return len(ids)

    def refused(self) -> int:
        """The WebSocket sessions this replica has refused so far (its own counter)."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith("asgi_admission_decisions_total{") and (
                'kind="websocket"' in line and 'outcome="rejected"' in line
            ):
                total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def agent(self) -> str:
        """What this replica's agent check says now."""
        with socket.create_connection(("127.0.0.1", self.agent_port), timeout=5) as sock:
            answer = b""
            while chunk := sock.recv(64):
                answer += chunk
        return answer.decode()

    def admissible(self) -> int:
        """The admissible sessions its agent says (``ready N%``), 0 for ``drain``."""
        match = re.fullmatch(r"ready (\d+)%\n", self.agent())
        return int(match.group(1)) if match else 0

    def oom_kills(self) -> int:
        return oom_kills(self.group)


@contextlib.contextmanager
def replicas(workdir: Path) -> Iterator[list[Replica]]:
    """Three replicas with their agents on, one per memory group of ``LIMITS_MB``."""
    with contextlib.ExitStack() as stack:
        started = []
        for index, limit in enumerate(LIMITS_MB):
            group = stack.enter_context(memory_group(limit, f"haproxy{index}"))
            port, agent_port = free_port(), free_port()
            env = {
                "ADMISSION_CGROUP_ROOT": str(group),
                "ADMISSION_AGENT_PORT": str(agent_port),
                "ADMISSION_SESSION_RESERVE_MB": str(RESERVE_MB),
                # Sessions of one known size: what was learned or probed would move the
                # figures the test compares from one run to the next.
                "ADMISSION_SESSION_RESERVE_LEARNING": "off",
                "ADMISSION_PROBE_SESSIONS": "0",
                "ADMISSION_RETRY_AFTER_SECONDS": "1",
                "DEMO_SESSION_MB": str(SESSION_MB),
            }
            argv = [
                *joining(group),
                sys.executable,
                "-m",
                "uvicorn",
                "asgi_admission.demo:create_app",
                "--factory",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ]
            server = Server(argv, port, env, workdir / f"r{index}.log")
            stack.callback(server.stop)
            started.append(Replica(f"r{index}", group, server, agent_port))
        for replica in started:
            replica.server.wait_ready()
        # One session each first: the server loads its WebSocket code at the first one,
        # and a capacity said before then would not count that code.
        asyncio.run(_warm_up(started))
        yield started


async def _warm_up(replicas: list[Replica]) -> None:
    for replica in replicas:
        url = replica.url.replace("http://", "ws://")
        async with connect(f"{url}/terminal/warm-up", open_timeout=10) as sock:
            await sock.recv()
    deadline = time.monotonic() + 10
    while any(replica.sessions() for replica in replicas):
        assert time.monotonic() < deadline, "the warm-up sessions never ended"
        await asyncio.sleep(0.02)


class Relay:
    """A TCP relay in front of one agent: HAProxy asks it, it asks the agent; once
    ``kill``-ed, nothing listens on its port any more (the agent is gone for HAProxy)."""

    def __init__(self, target: int) -> None:
        self._target = target
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            with (
                client,
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self._target), timeout=2) as up,
            ):
                while chunk := up.recv(64):
                    client.sendall(chunk)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)


def haproxy_conf(
    *, port: int, admin: int, replicas: list[Replica], balance: Balance, agents: list[int]
) -> str:
    if balance == "agent":
        servers = "".join(
            f"    server {r.name} 127.0.0.1:{r.server.port} weight 100 check inter 1s"
            f" agent-check agent-port {agent} agent-inter {AGENT_INTER_MS}ms\n"
            for r, agent in zip(replicas, agents, strict=True)
        )
        algorithm = "leastconn"
    else:
        servers = "".join(
            f"    server {r.name} 127.0.0.1:{r.server.port} weight 100 check inter 1s\n"
            for r in replicas
        )
        algorithm = "roundrobin"
    return f"""\
global
    stats socket ipv4@127.0.0.1:{admin} level admin
    maxconn 2000
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    timeout tunnel 60s
    retries 3
    option redispatch 1
    retry-on 503 conn-failure empty-response
    # What HAProxy answers itself when every server drains: a Retry-After too.
    http-error status 503 content-type application/json string "{{}}" hdr retry-after 1
frontend sessions
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance {algorithm}
    option httpchk GET /health
{servers}"""


@dataclass
class HAProxy:
    """A running HAProxy: its URL and its admin socket."""

    url: str
    admin_port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def command(self, line: str) -> str:
        with socket.create_connection(("127.0.0.1", self.admin_port), timeout=5) as sock:
            sock.sendall(line.encode() + b"\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        return answer.decode()

    def servers(self) -> dict[str, dict[str, str]]:
        """``show stat`` of the backend's servers, by name."""
        text = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(text))
        return {
            row["svname"]: row
            for row in rows
            if row["pxname"] == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_for(self, name: str, status: str, *, timeout: float = 5) -> float:
        """Waits until server ``name``'s status starts with ``status`` (``DRAIN``, ``UP``);
        the seconds it took."""
        start = time.monotonic()
        seen = ""
        while time.monotonic() - start < timeout:
            seen = self.servers()[name]["status"]
            if seen.startswith(status):
                return time.monotonic() - start
            time.sleep(0.02)
        raise TimeoutError(f"{name} stayed {seen}, never {status}")


@contextlib.contextmanager
def haproxy(
    workdir: Path, replicas: list[Replica], *, balance: Balance, agents: list[int] | None = None
) -> Iterator[HAProxy]:
    """Debian's HAProxy on 127.0.0.1 in front of ``replicas``; ``agents`` are the ports
    its agent checks go to (default: each replica's agent)."""
    binary = haproxy_binary()
    prefix = workdir / f"haproxy-{balance}-{time.monotonic_ns()}"
    prefix.mkdir()
    port, admin = free_port(), free_port()
    conf = prefix / "haproxy.cfg"
    ports = agents if agents is not None else [r.agent_port for r in replicas]
    conf.write_text(
        haproxy_conf(port=port, admin=admin, replicas=replicas, balance=balance, agents=ports)
    )
    log = prefix / "haproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "-db", "-f", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proxy = HAProxy(f"ws://127.0.0.1:{port}", admin, proc, log)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"haproxy exited early:\n{log.read_text()}")
            with contextlib.suppress(OSError, KeyError):
                # Up, and (with agents) each agent asked once since it started.
                rows = proxy.servers().values()
                if all(row["status"] == "UP" for row in rows) and (
                    balance != "agent" or all(row["agent_status"] == "CHECKED" for row in rows)
                ):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy never saw the replicas up:\n{log.read_text()}")
            time.sleep(0.05)
        yield proxy
    finally:
        stop_process_group(proc)


@dataclass
class Burst:
    """Sessions opened through a proxy: the open WebSockets, and for each refusal a
    client saw, what every replica's agent said right then."""

    replicas: list[Replica]
    sockets: list[ClientConnection] = field(default_factory=list)
    refusals: list[list[str]] = field(default_factory=list)
    #: The ``Retry-After`` of each refusal a client saw (``None``: none).
    retry_afters: list[str | None] = field(default_factory=list)

    async def open(self, url: str, count: int, *, pace_s: float) -> None:
        """``count`` WebSocket sessions, one every ``pace_s``; each stays open."""
        for index in range(count):
            try:
                self.sockets.append(await connect(f"{url}/terminal/b{index}", open_timeout=10))
                await self.sockets[-1].recv()  # the session's greeting
            except InvalidStatus as exc:
                if exc.response.status_code != 503:
                    raise
                self.refusals.append([replica.agent() for replica in self.replicas])
                self.retry_afters.append(exc.response.headers.get("retry-after"))
            await asyncio.sleep(pace_s)

    async def fill(self, replica: Replica) -> int:
        """Opens sessions on ``replica`` itself until it refuses one; how many it took."""
        url = replica.url.replace("http://", "ws://")
        for index in range(32):
            try:
                sock = await connect(f"{url}/terminal/f{index}", open_timeout=10)
            except InvalidStatus as exc:
                if exc.response.status_code != 503:
                    raise
                return index
            self.sockets.append(sock)
            await sock.recv()
        raise AssertionError(f"{replica.name} took 32 sessions of {SESSION_MB} MiB")

    async def echo(self) -> bool:
        """Whether every open session still echoes."""
        for index, sock in enumerate(self.sockets):
            await sock.send(f"ping {index}")
            if await sock.recv() != f"ping {index}":
                return False
        return True

    async def close(self) -> None:
        for sock in self.sockets:
            await sock.close()
        self.sockets.clear()


def settle(replicas: list[Replica], capacities: list[int], *, timeout: float = 10) -> None:
    """Waits until every replica has no session and its agent says ``capacities`` again, or
    one session less where the server kept a few MiB of what its sessions freed (an
    allocator's arenas, on a busy machine): ``capacities`` becomes what they say then, for
    the tests after."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [r.admissible() for r in replicas]
        if seen == capacities and not any(r.sessions() for r in replicas):
            return
        close = all(
            capacity - 1 <= now <= capacity for now, capacity in zip(seen, capacities, strict=True)
        )
        if (
            close
            and not any(r.sessions() for r in replicas)
            and time.monotonic() > deadline - timeout / 2
        ):
            capacities[:] = seen
            return
        if time.monotonic() > deadline:
            agents = [r.agent().strip() for r in replicas]
            raise TimeoutError(f"the replicas never came back to {capacities}: {agents}")
        time.sleep(0.05)


__all__ = [
    "AGENT_INTER_MS",
    "BALANCES",
    "Balance",
    "Burst",
    "HAProxy",
    "Relay",
    "Replica",
    "haproxy",
    "memory_group",
    "replicas",
    "settle",
]
