"""An in-place resize on a real cgroup v2 kernel: ``memory.max`` of a running container
raised and lowered under the demo, as Kubernetes does to a pod's container (stable
since 1.35), in a cgroup namespace whose root is the container's group.

Runs in the VM of scripts/cgroup-v2 (the ``cgroup_v2`` marker).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kits.cgroupkit import (
    Demo,
    container,
    demo,
    key_of,
    metric,
    oom_kills,
    v2_group,
    working_set_bytes,
)
from kits.pollkit import wait_for
from kits.suitekit import MIB

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.real_server, pytest.mark.timeout(600)]

SESSION_MB = 24
#: In-request sessions (the demo holds their memory itself), a reserve their size, and
#: nothing learned that could move it: the arithmetic below is the latch's alone.
SETTINGS = {
    "DEMO_SESSION_MB": str(SESSION_MB),
    "ADMISSION_SESSION_RESERVE_MB": str(SESSION_MB + 4),
    "ADMISSION_PROBE_SESSIONS": "0",
}
LIMIT = "asgi_admission_memory_limit_bytes"
ACTIVE = 'asgi_admission_sessions{state="active"}'
PENDING = 'asgi_admission_sessions{state="pending"}'


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, Demo, httpx.Client]]:
    """The demo in a container's view of a fresh 256 MiB group, and a client to it."""
    with (
        v2_group(256, "resize") as group,
        demo(container(group), tmp_path / "demo.log", env=SETTINGS) as server,
        server.client(timeout=300) as client,
    ):
        yield group, server, client


def open_until_refused(client: httpx.Client, most: int = 30) -> tuple[int, httpx.Response]:
    """Sessions opened one by one until one is refused: (how many were admitted, the
    refusal)."""
    for admitted in range(most):
        response = client.post("/sessions")
        if response.status_code != 201:
            return admitted, response
    raise AssertionError(f"{most} sessions admitted: nothing was refused")


def test_a_raised_limit_admits_more(served: tuple[Path, Demo, httpx.Client]) -> None:
    """Sessions until refused at 256 MiB; memory.max raised to 512 MiB under the running
    server: the limit metric follows, and more sessions are admitted at once."""
    group, _, client = served
    first, refusal = open_until_refused(client)
    assert refusal.status_code == 503
    assert refusal.json()["reason"] == "memory_pressure"
    assert first >= 2
    (group / "memory.max").write_text(str(512 * MIB))
    more, refusal = open_until_refused(client)
    assert refusal.json()["reason"] == "memory_pressure"
    # 256 MiB more, 80 % of it under the ceiling: about seven more sessions of 28 MiB.
    assert more >= 5, (first, more)
    assert metric(client, LIMIT) == 512 * MIB
    assert oom_kills(group) == 0


def test_a_limit_lowered_below_what_pending_sessions_need_refuses_the_next_at_once(
    served: tuple[Path, Demo, httpx.Client],
) -> None:
    """Two sessions pending (their requests still open, their memory not there yet);
    memory.max lowered so that the ceiling no longer holds the working set and their
    two reserves: the next session is refused at once, without waiting for them, and
    when their memory arrives it still fits (no OOM kill)."""
    group, _, client = served
    pending: list[int] = []

    def hold() -> None:
        with httpx.Client(base_url=client.base_url, timeout=300) as own:
            pending.append(own.post("/sessions", params={"hold_s": 20}).status_code)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for holder in holders:
        holder.start()
    try:
        wait_for(lambda: metric(client, PENDING) == 2, timeout=60, step=0.2)
        working_set = working_set_bytes(group)
        reserve = (SESSION_MB + 4) * MIB
        # The ceiling (80 %) just under the working set and the two reserves pending.
        lowered = int((working_set + 2 * reserve) / 0.8) - 4 * MIB
        (group / "memory.max").write_text(str(lowered))
        started = time.monotonic()
        refused = client.post("/sessions")
        took = time.monotonic() - started
        assert refused.status_code == 503, refused.text
        assert refused.json()["reason"] == "memory_pressure"
        assert took < 10, took  # not after the pending requests' 20 s
        assert metric(client, LIMIT) == lowered // 4096 * 4096
    finally:
        for holder in holders:
            holder.join(timeout=120)
    assert pending == [201, 201]
    assert oom_kills(group) == 0


def test_a_limit_lowered_to_just_above_the_working_set_admits_nothing_and_kills_nothing(
    served: tuple[Path, Demo, httpx.Client],
) -> None:
    """Three sessions open; memory.max lowered to 16 MiB above the working set: the
    kernel reclaims the file cache, the guard still counts three sessions open (the
    fall in usage is not sessions ending), admits none, and nothing is OOM-killed."""
    group, _, client = served
    for _ in range(3):
        assert client.post("/sessions").status_code == 201
    wait_for(
        lambda: metric(client, ACTIVE) == 3 and metric(client, PENDING) == 0, timeout=60, step=0.2
    )
    cache_before = key_of(group / "memory.stat", "file")
    usage_before = int((group / "memory.current").read_text())
    lowered = working_set_bytes(group) + 16 * MIB
    (group / "memory.max").write_text(str(lowered))
    usage_after = int((group / "memory.current").read_text())
    assert usage_after <= lowered
    refusals = [client.post("/sessions") for _ in range(3)]
    assert [r.status_code for r in refusals] == [503, 503, 503]
    assert {r.json()["reason"] for r in refusals} == {"memory_pressure"}
    time.sleep(2)  # a few of the guard's samples of the reclaimed figures
    assert metric(client, ACTIVE) == 3
    assert metric(client, PENDING) == 0
    assert client.post("/sessions").status_code == 503
    assert oom_kills(group) == 0
    assert client.get("/health").status_code == 200
    print({"cache_before": cache_before, "usage": (usage_before, usage_after)})
