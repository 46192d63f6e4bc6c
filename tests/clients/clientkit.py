"""Real servers for the client tests: ``clients_app`` under uvicorn on 127.0.0.1."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from kits.cgroup_trees import write_v2_tree
from kits.processkit import Server, free_port

HERE = Path(__file__).resolve().parent


def uvicorn_argv(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "clients_app:create",
        "--app-dir",
        str(HERE),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


@contextmanager
def serving(
    specs: Mapping[str, Mapping[str, str]], directory: Path, ports: Mapping[str, int] | None = None
) -> Iterator[dict[str, Server]]:
    """Start one ``clients_app`` per spec (its environment) at once; stop them all after.

    Each guards at most one session (``ADMISSION_MAX_SESSIONS=1``) and tells refused
    clients to wait one second, unless the spec says otherwise.
    """
    cgroup = write_v2_tree(directory / "cgroup")
    servers: dict[str, Server] = {}
    try:
        for name, env in specs.items():
            port = (ports or {}).get(name) or free_port()
            servers[name] = Server(
                uvicorn_argv(port),
                port,
                {
                    "ADMISSION_CGROUP_ROOT": str(cgroup),
                    "ADMISSION_MAX_SESSIONS": "1",
                    "ADMISSION_RETRY_AFTER_SECONDS": "1",
                    **env,
                },
                directory / f"{name}.log",
            )
        for server in servers.values():
            server.wait_ready()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@contextmanager
def holding(server: Server, ttl_s: float = 60) -> Iterator[str]:
    """Hold the server's one session slot (ended on leaving the block); its id."""
    opened = httpx.post(f"{server.base_url}/sessions", params={"ttl_s": ttl_s}, timeout=10)
    assert opened.status_code == 201, opened.text
    session_id: str = opened.json()["id"]
    try:
        yield session_id
    finally:
        httpx.delete(f"{server.base_url}/sessions/{session_id}", timeout=10)


def wait_result(server: Server, run: str, timeout: float = 30) -> Any:
    """What the page of ``run`` reported to ``server``, polling for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = httpx.get(f"{server.base_url}/results/{run}", timeout=10)
        if reply.status_code == 200:
            return reply.json()
        time.sleep(0.1)
    raise AssertionError(f"the page of run {run!r} reported nothing in {timeout}s")
