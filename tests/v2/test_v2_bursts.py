"""Ramping bursts in a container's view on a real cgroup v2 kernel: the demo in a cgroup
namespace whose root is its 512 MiB group, process sessions whose memory arrives after
their ``201``, a burst of ten at once. With the defaults, and with a reserve 12 times too
small, the guard admits what fits (within one) and the kernel kills nothing
(``memory.events``).

Runs in the VM of scripts/cgroup-v2 (the ``cgroup_v2`` marker); sized for a machine
that emulates it (Python about 20 times slower than on the host).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kits.cgroupkit import container, demo, metric, oom_kills, v2_group
from kits.cgroupkit import working_set_bytes as working_set
from kits.pollkit import wait_for
from kits.suitekit import MIB

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.real_server, pytest.mark.timeout(900)]

LIMIT_MB = 512
#: The high watermark at its default, 80 %.
CEILING = LIMIT_MB * MIB * 80 // 100
HOLD_MB = 48
RAMP_S = 2
SESSIONS = 10
#: The most sessions the warm-up opens before the guard must have learned their route.
WARM_UPS = 4
FOOTPRINT = 'asgi_admission_session_footprint_bytes{route="POST /processes"}'
PARAMS = {"hold_mb": HOLD_MB, "ramp_s": RAMP_S}


def learned_within(client: httpx.Client, footprint: int) -> bool:
    """Whether the footprint the guard learned of the route is within 15 % of this one."""
    learned = metric(client, FOOTPRINT)
    return learned is not None and abs(learned - footprint) <= 0.15 * footprint


def one_session(client: httpx.Client, group: Path) -> tuple[int, bool]:
    """One session opened, left to ramp and closed: (what it added to the working set,
    whether the guard had learned it within 15 % by then)."""
    before = working_set(group)
    opened = client.post("/processes", params=PARAMS)
    assert opened.status_code == 201, opened.text
    path = f"/processes/{opened.json()['id']}"
    wait_for(lambda: (client.get(path).json()["rss_bytes"] or 0) >= HOLD_MB * MIB, 180, step=1)
    time.sleep(1)  # the child's last pages are charged
    footprint = working_set(group) - before
    with contextlib.suppress(AssertionError):  # not yet: the next session teaches more
        wait_for(lambda: learned_within(client, footprint), timeout=60, step=1)
    assert client.delete(path).status_code == 204
    wait_for(lambda: working_set(group) < before + footprint // 2, timeout=60, step=0.2)
    return footprint, learned_within(client, footprint)


def warm_up(client: httpx.Client, group: Path) -> tuple[int, int]:
    """Sessions one at a time until what the guard learned of their route is within 15 %
    of what one adds to the working set (as it would learn from the first sessions of a
    day; at most WARM_UPS of them): (that footprint, the working set after them)."""
    footprint = 0
    for _ in range(WARM_UPS):
        footprint, learned = one_session(client, group)
        if learned:
            return footprint, working_set(group)
    raise AssertionError(
        f"after {WARM_UPS} sessions of {footprint / MIB:.1f} MiB the guard had learned "
        f"{metric(client, FOOTPRINT)} bytes"
    )


async def burst(base_url: str) -> list[httpx.Response]:
    """``SESSIONS`` session requests at once."""
    limits = httpx.Limits(max_connections=SESSIONS, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=300, limits=limits) as client:
        requests = (client.post("/processes", params=PARAMS) for _ in range(SESSIONS))
        return await asyncio.gather(*requests)


@dataclass
class Burst:
    """What a burst showed."""

    footprint_mb: float
    baseline_mb: float
    capacity: int
    statuses: list[int]
    reasons: set[str]
    retry_after: bool
    oom_kills: int
    alive: bool

    @property
    def admitted(self) -> int:
        return self.statuses.count(201)


def run(group: Path, tmp_path: Path, **settings: str) -> Burst:
    """The burst after a warm-up, in a container's view of ``group``: its figures."""
    with (
        demo(container(group), tmp_path / "demo.log", env=settings) as server,
        server.client(timeout=300) as client,
    ):
        footprint, baseline = warm_up(client, group)
        capacity = math.floor((CEILING - baseline) / footprint)
        responses = asyncio.run(burst(server.base_url))
        statuses = [r.status_code for r in responses]
        refusals = [r for r in responses if r.status_code == 503]
        # Every admitted session's memory arrives (the child starts, then ramps).
        opened = [r.json()["id"] for r in responses if r.status_code == 201]
        wait_for(
            lambda: all(
                (client.get(f"/processes/{i}").json()["rss_bytes"] or 0) >= HOLD_MB * MIB
                for i in opened
            ),
            timeout=300,
            step=1,
        )
        return Burst(
            footprint_mb=round(footprint / MIB, 1),
            baseline_mb=round(baseline / MIB, 1),
            capacity=capacity,
            statuses=statuses,
            reasons={r.json()["reason"] for r in refusals},
            retry_after=all(r.headers.get("retry-after", "").isdigit() for r in refusals),
            oom_kills=oom_kills(group),
            alive=server.proc.poll() is None and client.get("/health").status_code == 200,
        )


def assert_cut_at_capacity(result: Burst) -> None:
    assert result.capacity >= 3, result  # a burst that tells something
    assert result.capacity - 1 <= result.admitted <= result.capacity + 1, result
    assert result.statuses.count(503) == SESSIONS - result.admitted, result
    assert result.reasons == {"memory_pressure"}, result
    assert result.retry_after, result
    assert result.oom_kills == 0, result
    assert result.alive, result


def test_a_ramping_burst_with_the_defaults_is_cut_at_capacity(tmp_path: Path) -> None:
    """No setting at all (the reserve derived from memory.max, learning on): after a
    few sessions have taught the guard their route, a burst of ten is admitted to capacity
    within one, the rest refused with Retry-After, and no OOM kill."""
    with v2_group(LIMIT_MB, "burst_defaults") as group:
        result = run(group, tmp_path)
    print(result)
    assert_cut_at_capacity(result)


def test_a_ramping_burst_with_a_reserve_twelve_times_too_small_is_cut_at_capacity(
    tmp_path: Path,
) -> None:
    """ADMISSION_SESSION_RESERVE_MB a twelfth of a session's footprint: what the guard
    learned of the route raises it, and the burst is cut at capacity all the same."""
    with v2_group(LIMIT_MB, "burst_small") as group:
        result = run(group, tmp_path, ADMISSION_SESSION_RESERVE_MB=str(round(HOLD_MB / 12)))
    print(result)
    assert_cut_at_capacity(result)
