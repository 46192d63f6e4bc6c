"""The project's image under podman with a 768 MiB limit, sessions whose memory ramps in.

Each ``POST /processes?hold_mb=96&ramp_s=2`` answers 201 at once and its child's
memory arrives over the next seconds. A burst of 32 must still be cut at the
container's true capacity (what fits under the high watermark once every admitted
session's memory has arrived, as tests/middleware/test_ramp_burst.py counts it),
refuse the rest with 503 + Retry-After, never be OOM-killed, and admit again once
the sessions are closed.
"""

from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest
from containerkit import Container, inspect, running

from kits.cgroupkit import working_set_bytes
from kits.suitekit import MIB, V1_MEMORY

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

LIMIT_MB = 768
HOLD_MB = 96
RAMP_S = 2.0
SESSIONS = 32
HIGH_WATERMARK = 80.0
PARAMS = {"hold_mb": HOLD_MB, "ramp_s": RAMP_S}


def env(reserve_mb: int) -> dict[str, str]:
    return {
        "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": str(HIGH_WATERMARK),
        "ADMISSION_SESSION_RESERVE_MB": str(reserve_mb),
        "ADMISSION_SESSION_RESERVE_LEARNING": "off",
        "ADMISSION_MAX_SESSIONS": "1000",
        "ADMISSION_RETRY_AFTER_SECONDS": "1",
    }


def working_set(container: Container) -> int:
    """The container group's working set: usage less file cache, as the guard counts it."""
    return working_set_bytes(V1_MEMORY / inspect(container.name)["State"]["CgroupPath"].lstrip("/"))


def session_footprint() -> int:
    """What one session adds to the container's working set once its memory has arrived."""
    with running("ramp-footprint", env=env(HOLD_MB)) as container:
        time.sleep(0.5)
        before = working_set(container)
        opened = httpx.post(f"{container.url}/processes", params={"hold_mb": HOLD_MB}, timeout=30)
        assert opened.status_code == 201, opened.text
        time.sleep(0.3)
        return working_set(container) - before


def fire(url: str) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=SESSIONS)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *(client.post(f"{url}/processes", params=PARAMS) for _ in range(SESSIONS))
            )

    return asyncio.run(run())


@pytest.mark.timeout(300)
def test_a_ramping_burst_is_cut_at_capacity_without_oom(image: str) -> None:
    """32 ramping sessions at once: capacity +-1 admitted, the rest 503, no OOM, then reopened."""
    footprint = session_footprint()
    reserve_mb = math.ceil(footprint / MIB)
    with running("ramp-burst", env=env(reserve_mb), memory=f"{LIMIT_MB}m") as container:
        time.sleep(0.5)
        baseline = working_set(container)
        ceiling = LIMIT_MB * MIB * HIGH_WATERMARK / 100
        capacity = max(0, math.floor((ceiling - baseline) / footprint))

        responses = fire(container.url)
        time.sleep(RAMP_S + 2.5)  # every admitted session's memory has arrived
        statuses = [r.status_code for r in responses]
        admitted = [r.json() for r in responses if r.status_code == 201]
        refusals = [r for r in responses if r.status_code == 503]
        memory = container.memory()
        figures = {
            "footprint_mb": round(footprint / MIB, 1),
            "baseline_mb": round(baseline / MIB, 1),
            "capacity": capacity,
            "admitted": len(admitted),
            "refused": len(refusals),
            "oom_kills": memory.oom_kills,
            "peak_mb": round(memory.max_usage_bytes / MIB, 1),
        }
        print(figures)

        assert len(admitted) + len(refusals) == SESSIONS, statuses
        assert capacity - 1 <= len(admitted) <= capacity + 1, figures
        assert all(
            r.headers.get("retry-after", "").isdigit() and int(r.headers["retry-after"]) >= 1
            for r in refusals
        ), [r.headers.get("retry-after") for r in refusals]
        assert memory.limit_bytes == LIMIT_MB * MIB
        assert memory.oom_kills == 0, figures
        assert not memory.under_oom
        assert container.running()
        assert not container.oom_killed()

        with httpx.Client(base_url=container.url, timeout=30) as client:
            for session in admitted:
                closed = client.delete(f"/processes/{session['id']}")
                assert closed.status_code == 204, closed.text
            for _ in range(20):
                reopened = client.post("/processes", params=PARAMS)
                if reopened.status_code == 201:
                    break
                time.sleep(0.5)
            assert reopened.status_code == 201, reopened.text
            client.delete(f"/processes/{reopened.json()['id']}")
        assert container.memory().oom_kills == 0
