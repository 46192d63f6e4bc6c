"""The bounded wait for capacity in a real 512 MiB memory group under uvicorn.

Each session holds 48 MiB inside its request for 2 s (a 64 MiB reserve each, no
learning, no probing), so a few fit at once. A burst of three times that many, sent
20 ms apart, must be served whole with a 10 s wait, in arrival order, with no OOM
kill; with no wait, the same burst is cut with 503s.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cgroupkit import joining, memory_group, oom_kills
from processkit import Server, free_port

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

LIMIT_MB = 512
HOLD_S = 2.0
WAIT_S = 10.0


@contextlib.contextmanager
def served(group: Path, tmp_path: Path, wait_s: float) -> Iterator[Server]:
    """``waiting_app`` under uvicorn inside ``group``, waiting ``wait_s`` (0: none)."""
    port = free_port()
    env = {
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": str(wait_s),
        "ADMISSION_SESSION_RESERVE_MB": "64",
        "ADMISSION_SESSION_RESERVE_LEARNING": "off",
        "ADMISSION_PROBE_SESSIONS": "0",
        # The session is over at its response: its reservation lasts no longer.
        "ADMISSION_PENDING_TIMEOUT_SECONDS": "0.5",
        "ADMISSION_RETRY_AFTER_SECONDS": "5",
        "ADMISSION_TEST_SESSION_MB": "48",
    }
    argv = [
        *joining(group),
        sys.executable,
        "-m",
        "uvicorn",
        "--factory",
        "waiting_app:create",
        "--app-dir",
        str(Path(__file__).parent),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    server = Server(argv, port, env, tmp_path / f"waiting-{wait_s}.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


async def burst(base_url: str, count: int) -> list[tuple[int, int, float, str]]:
    """``count`` openings sent 20 ms apart: (seq, status, seconds, reason) each."""
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:

        async def one(seq: int) -> tuple[int, int, float, str]:
            await asyncio.sleep(seq * 0.02)
            start = time.monotonic()
            response = await client.post("/sessions", params={"seq": seq, "hold": HOLD_S})
            reason = response.json().get("reason", "") if response.status_code == 503 else ""
            return seq, response.status_code, time.monotonic() - start, reason

        return await asyncio.gather(*(one(seq) for seq in range(count)))


def test_a_burst_of_three_times_the_capacity_is_served_whole_in_arrival_order(
    tmp_path: Path,
) -> None:
    """With no wait the burst is cut with 503s at what fits at once; with a 10 s wait a
    burst of three times that is admitted whole, in arrival order, each wait shorter than
    the timeout, and no OOM kill either way."""
    with memory_group(LIMIT_MB, "waiting") as group:
        with served(group, tmp_path, 0) as server:
            cut = asyncio.run(burst(server.base_url, 18))
            time.sleep(1)
            assert httpx.get(server.base_url + "/counts").json() == [0, 0]
        capacity = sum(status == 201 for _, status, _, _ in cut)
        refused = [reason for _, status, _, reason in cut if status == 503]
        assert 2 <= capacity < 18, cut
        assert set(refused) == {"memory_pressure"}, cut
        assert oom_kills(group) == 0

        count = 3 * capacity
        with served(group, tmp_path, WAIT_S) as server:
            waited = asyncio.run(burst(server.base_url, count))
            order = httpx.get(server.base_url + "/order").json()
            time.sleep(1)
            counts = httpx.get(server.base_url + "/counts").json()
        assert [status for _, status, _, _ in waited] == [201] * count, waited
        assert order == list(range(count)), order
        assert max(seconds for _, _, seconds, _ in waited) < WAIT_S + HOLD_S, waited
        assert counts == [0, 0]
        assert oom_kills(group) == 0
