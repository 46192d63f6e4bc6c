"""The guard behind a path prefix on real servers: the cap and the latch hold as without.

Each server runs ``prefixed_app`` (``POST /sessions`` holds its session for a second)
with ``max_sessions=2`` and a cgroup v2 fixture tree whose usage the test rewrites:
uvicorn without a prefix (the baseline), uvicorn ``--root-path /api`` (requests come
without the prefix, as from a proxy that strips it, and uvicorn puts it back in the
path), the guarded app under Starlette's ``Mount("/api", ...)``, hypercorn
``--root-path /api`` and granian ``--url-path-prefix /api`` (requests come with the
prefix, which these two leave in the path).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from mwkit import Server, free_port, write_v2_tree

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(60)]

HERE = Path(__file__).parent
LIMIT_MB = 4096


@dataclass(frozen=True, slots=True)
class Served:
    """A running server, the prefix its clients put in front of every path, its tree."""

    server: Server
    prefix: str
    cgroup: Path

    def url(self, path: str) -> str:
        return f"{self.server.base_url}{self.prefix}{path}"

    def set_used_mb(self, used_mb: int) -> None:
        write_v2_tree(self.cgroup, used_mb=used_mb, limit_mb=LIMIT_MB)


def argv(name: str, port: int) -> tuple[list[str], str]:
    """The command line for ``name`` and the prefix its clients send."""
    uvicorn = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port)]
    uvicorn += ["--log-level", "warning", "--factory"]
    if name == "uvicorn":
        return [*uvicorn, "prefixed_app:create"], ""
    if name == "uvicorn --root-path":
        return [*uvicorn, "--root-path", "/api", "prefixed_app:create"], ""
    if name == "uvicorn, Mount":
        return [*uvicorn, "prefixed_app:mounted"], "/api"
    if name == "hypercorn --root-path":
        hypercorn = [sys.executable, "-m", "hypercorn", "--bind", f"127.0.0.1:{port}"]
        return [*hypercorn, "--root-path", "/api", "prefixed_app:create()"], "/api"
    assert name == "granian --url-path-prefix"
    granian = [sys.executable, "-m", "granian", "--interface", "asgi", "--factory"]
    granian += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    return [*granian, "--url-path-prefix", "/api", "prefixed_app:create"], "/api"


SERVERS = [
    "uvicorn",
    "uvicorn --root-path",
    "uvicorn, Mount",
    "hypercorn --root-path",
    "granian --url-path-prefix",
]


@pytest.fixture(params=SERVERS)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    name: str = request.param
    port = free_port()
    cgroup = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=LIMIT_MB)
    env = {
        "PYTHONPATH": str(HERE),
        "ADMISSION_CGROUP_ROOT": str(cgroup),
        "ADMISSION_MAX_SESSIONS": "2",
        "ADMISSION_SESSION_RESERVE_MB": "1",
        # Overlapping requests, not a probe followed by its waiters: the cap is the point.
        "ADMISSION_PROBE_SESSIONS": "0",
    }
    command, prefix = argv(name, port)
    server = Server(command, port, env, tmp_path / "server.log")
    try:
        server.wait_ready(prefix + "/health")
        yield Served(server, prefix, cgroup)
    finally:
        server.stop()


async def burst(served: Served, n: int) -> list[tuple[int, str | None]]:
    """``n`` concurrent ``POST /sessions``: each one's status and refusal reason."""
    async with httpx.AsyncClient(timeout=10) as client:
        responses = await asyncio.gather(*(client.post(served.url("/sessions")) for _ in range(n)))
    return sorted((r.status_code, r.json().get("reason")) for r in responses)


def test_the_latch_holds_behind_a_prefix(served: Served) -> None:
    """Behind each server's prefix as without one: past the high watermark every session
    request is refused (memory_pressure) and the readiness path says so, until memory is
    back below the resume threshold."""
    served.set_used_mb(LIMIT_MB * 95 // 100)
    assert asyncio.run(burst(served, 2)) == [(503, "memory_pressure")] * 2
    ready = httpx.get(served.url("/admission/ready"), timeout=10)
    assert (ready.status_code, ready.json()) == (503, {"ready": False, "state": "pressured"})
    served.set_used_mb(100)
    ready = httpx.get(served.url("/admission/ready"), timeout=10)
    assert (ready.status_code, ready.json()) == (200, {"ready": True, "state": "normal"})


def test_the_cap_holds_behind_a_prefix(served: Served) -> None:
    """Behind each server's prefix as without one: four overlapping session requests
    admit exactly max_sessions=2 and refuse two (session_limit)."""
    assert asyncio.run(burst(served, 4)) == [(201, None)] * 2 + [(503, "session_limit")] * 2
