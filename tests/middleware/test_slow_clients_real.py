"""Real uvicorn: slow-body connections, as many as sessions fit, hold no session slot."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
from mwkit import Server, free_port, write_v2_tree

pytestmark = [pytest.mark.real_server, pytest.mark.slow, pytest.mark.timeout(120)]

SLOTS = 8
HEADERS = b"POST /sessions HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n"


def slow_connection(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(HEADERS + b"x")
    sock.setblocking(False)
    return sock


def answer(sock: socket.socket) -> bytes:
    """What the server sent so far, or ``b""``; ``b"closed"`` once it closed."""
    try:
        data = sock.recv(65536)
    except BlockingIOError:
        return b""
    except OSError:
        return b"closed"
    return data or b"closed"


async def normal_burst(base_url: str, count: int) -> list[int]:
    async with httpx.AsyncClient(base_url=base_url, timeout=20) as client:
        responses = await asyncio.gather(
            *(client.post("/sessions?hold=1", json={"a": 1}) for _ in range(count))
        )
    return [r.status_code for r in responses]


def test_slow_bodies_leave_every_slot_to_normal_clients(tmp_path: Path) -> None:
    """Eight slow bodies against a cap of 8: normal clients are admitted meanwhile, the slow
    ones get a 408 after the default 10 s bound, and nothing is left counted."""
    port = free_port()
    env = {
        "ADMISSION_CGROUP_ROOT": str(write_v2_tree(tmp_path / "cgroup", used_mb=100)),
        "ADMISSION_MAX_SESSIONS": str(SLOTS),
        "ADMISSION_SESSION_RESERVE_MB": "1",
        # An HTTP session's reservation ends with its response here: the slots are what
        # this test is about, not settling.
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9",
    }
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "session_counts_app:create",
        "--app-dir",
        str(Path(__file__).parent),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    server = Server(argv, port, env, tmp_path / "uvicorn.log")
    try:
        server.wait_ready()
        started = time.monotonic()
        slow = [slow_connection(port) for _ in range(SLOTS)]
        time.sleep(0.5)
        # Normal clients, all eight at once (each holds its slot for a second), then one
        # over the cap: the cap is live, and the slow ones hold none of it.
        statuses = asyncio.run(normal_burst(server.base_url, SLOTS + 1))
        assert sorted(statuses) == [201] * SLOTS + [503]
        assert time.monotonic() - started < 5
        assert httpx.get(server.base_url + "/counts").json() == [0, 0]
        answers = [b""] * SLOTS
        while time.monotonic() - started < 30 and not all(answers):
            for index, sock in enumerate(slow):
                if not answers[index]:
                    with_more = answer(sock)
                    if not with_more:
                        try:
                            sock.send(b"x")  # still trickling: one byte at a time
                        except OSError:
                            answers[index] = b"closed"
                    answers[index] = with_more
            time.sleep(0.5)
        took = time.monotonic() - started
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
        assert 9 <= took < 15
        for sock in slow:
            sock.close()
        assert httpx.get(server.base_url + "/counts").json() == [0, 0]
        assert asyncio.run(normal_burst(server.base_url, SLOTS)) == [201] * SLOTS
        assert "Traceback" not in server.log_path.read_text()
    finally:
        server.stop()
