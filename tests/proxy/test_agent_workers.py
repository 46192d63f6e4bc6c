"""Two uvicorn workers in one real memory group, sharing their ledger: both listen on the
agent port, and whichever takes a connection says the same container-wide capacity."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import httpx
import pytest
from agentkit import ask

from kits.cgroupkit import joining, memory_group
from kits.processkit import Server, free_port

pytestmark = [pytest.mark.real_cgroup, pytest.mark.real_server, pytest.mark.slow]


def listeners(port: int) -> int:
    """How many IPv4 sockets listen on ``port`` (one per worker's agent)."""
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            count += 1
    return count


def admissible(port: int) -> int:
    match = re.fullmatch(rb"ready (\d+)%\n", ask(port))
    assert match is not None
    return int(match.group(1))


def test_every_worker_answers_the_same_container_wide_capacity(tmp_path: Path) -> None:
    """Sessions opened through either worker lower the capacity both workers' agents say,
    by the same amount: thirty agent checks, spread by the kernel over the two, agree."""
    agent_port, port = free_port(), free_port()
    with memory_group(512, "agent_workers") as group:
        env = {
            "ADMISSION_CGROUP_ROOT": str(group),
            "ADMISSION_SHARED_DIR": str(tmp_path / "shared"),
            "ADMISSION_AGENT_PORT": str(agent_port),
            "ADMISSION_SESSION_RESERVE_MB": "20",
            "ADMISSION_SESSION_RESERVE_LEARNING": "off",
            "ADMISSION_PROBE_SESSIONS": "0",
            "DEMO_SESSION_MB": "16",
        }
        argv = [
            *joining(group),
            sys.executable,
            "-m",
            "uvicorn",
            "asgi_admission.demo:create_app",
            "--factory",
            "--workers",
            "2",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        server = Server(argv, port, env, tmp_path / "server.log")
        try:
            server.wait_ready()
            deadline = time.monotonic() + 20
            while listeners(agent_port) < 2:  # each worker's listener, started with it
                assert time.monotonic() < deadline, "the second worker never listened"
                time.sleep(0.05)
            empty = {admissible(agent_port) for _ in range(30)}
            assert len(empty) == 1, empty
            with httpx.Client(timeout=10) as client:
                for _ in range(4):
                    # A connection each: the workers share the listening socket.
                    response = client.post(
                        f"{server.base_url}/sessions", headers={"connection": "close"}
                    )
                    assert response.status_code == 201
            time.sleep(1.0)  # the sessions' memory shows, and their reservations settle
            answers = [admissible(agent_port) for _ in range(30)]
        finally:
            server.stop()
    assert len(set(answers)) == 1, answers
    (before,) = empty
    # Four sessions of 16 MiB against 20 MiB reserves: four fewer, perhaps three.
    assert before - 4 <= answers[0] <= before - 3, (before, answers)
