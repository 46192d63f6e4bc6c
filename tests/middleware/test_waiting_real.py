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

from kits.cgroupkit import joining, memory_group, oom_kills
from kits.processkit import Server, free_port

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
def served(group: Path, tmp_path: Path, wait_s: float, **more: str) -> Iterator[Server]:
    """``waiting_app`` under uvicorn inside ``group``, waiting ``wait_s`` (0: none), with
    ``more`` settings."""
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
        **more,
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


FLOOD_S = 20.0


async def flood(base_url: str, clients: int) -> tuple[list[tuple[int, float]], list[int]]:
    """``clients`` batch openers, each opening again as soon as it is answered (after a
    refusal's 0.1 s), for ``FLOOD_S``, and a critical opening (held 1 s) every second:
    each critical one's (status, seconds less its hold), and the batch statuses."""
    critical: list[tuple[int, float]] = []
    batch: list[int] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        end = time.monotonic() + FLOOD_S

        async def opener(first: int) -> None:
            seq = first
            while time.monotonic() < end:
                response = await client.post("/sessions", params={"seq": seq, "hold": HOLD_S})
                batch.append(response.status_code)
                seq += clients
                if response.status_code != 201:
                    await asyncio.sleep(0.1)

        async def admin(seq: int) -> None:
            start = time.monotonic()
            response = await client.post("/admin", params={"seq": 10**6 + seq, "hold": 1.0})
            critical.append((response.status_code, time.monotonic() - start - 1.0))

        openers = [asyncio.create_task(opener(i)) for i in range(clients)]
        await asyncio.sleep(2.0)  # the flood fills the batch class first
        admins = []
        for seq in range(int(FLOOD_S) - 3):
            admins.append(asyncio.create_task(admin(seq)))
            await asyncio.sleep(1.0)
        await asyncio.gather(*openers, *admins)
    return critical, batch


def test_critical_openings_are_admitted_through_a_flood_of_batch_ones(tmp_path: Path) -> None:
    """Classes critical=90 and batch=65, a 3 s wait: five times the batch capacity opening
    continuously for 20 s while a critical opening arrives every second. Every critical
    one is admitted within 1 s, batch ones wait or are refused, and no OOM kill."""
    with memory_group(LIMIT_MB, "flood") as group:
        with served(
            group,
            tmp_path,
            3.0,
            ADMISSION_PRIORITY_CLASSES="critical=90,batch=65",
            WAITING_APP_CLASSES="1",
        ) as server:
            critical, batch = asyncio.run(flood(server.base_url, 5 * 3))
            time.sleep(1)
            counts = httpx.get(server.base_url + "/counts").json()
        assert [status for status, _ in critical] == [201] * len(critical), critical
        assert max(waited for _, waited in critical) < 1.0, critical
        assert batch.count(201) > 0, batch
        assert batch.count(503) > 0, batch
        assert counts == [0, 0]
        assert oom_kills(group) == 0


async def tenants_in_a_loop(base_url: str, seconds: float) -> dict[str, list[int]]:
    """Tenant a opens sessions (held 1 s) from six loops, b and c from one each, each
    opening again as soon as it is answered, for ``seconds``: the statuses per tenant."""
    statuses: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        end = time.monotonic() + seconds

        async def loop(tenant: str, first: int) -> None:
            seq = first
            while time.monotonic() < end:
                response = await client.post(
                    "/sessions", params={"seq": seq, "hold": 1.0, "tenant": tenant}
                )
                statuses[tenant].append(response.status_code)
                seq += 100

        loops = [loop("a", i) for i in range(6)] + [loop("b", 6), loop("c", 7)]
        await asyncio.gather(*loops)
    return statuses


def test_a_tenant_in_a_loop_never_holds_more_than_its_share_while_others_wait(
    tmp_path: Path,
) -> None:
    """Share 0.5, a count cap of 6, a 10 s wait: tenant a opens sessions from six loops
    beside b and c from one each, for 8 s. Every session of a admitted while others waited
    (a waiter admitted beside at least one more) left a holding at most half of the
    counted sessions; b and c were served too, every request admitted, no OOM kill."""
    with memory_group(LIMIT_MB, "tenants") as group:
        with served(
            group,
            tmp_path,
            WAIT_S,
            ADMISSION_TENANT_MAX_SHARE="0.5",
            ADMISSION_MAX_SESSIONS="6",
            WAITING_APP_TENANTS="1",
            ADMISSION_TEST_SESSION_MB="8",
        ) as server:
            statuses = asyncio.run(tenants_in_a_loop(server.base_url, 8.0))
            seen = httpx.get(server.base_url + "/shares").json()
        contended = [
            (held, counted)
            for tenant, held, counted, waiting in seen
            if tenant == "a" and waiting >= 2
        ]
        assert contended, seen
        assert all(held["a"] <= max(1, 0.5 * counted) for held, counted in contended), contended
        assert all(set(codes) == {201} for codes in statuses.values()), statuses
        assert len(statuses["b"]) >= 4, statuses
        assert len(statuses["c"]) >= 4, statuses
        assert oom_kills(group) == 0
