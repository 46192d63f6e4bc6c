"""The real-cgroup burst with 4 workers and the shared ledger: no OOM kill."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ledgerkit import Workers, burst, memory_group, oom_kills

from kits.suitekit import MIB

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
]

LIMIT_MB = 1024
SESSION_MB = 64
# Long enough that each wave is one concurrent burst: per-worker counting gets
# OOM-killed by this load (15 of 32 admitted on the development machine).
WAVES = 3
PER_WAVE = 32
HOLD_S = 1.5


def test_four_workers_with_a_shared_ledger_are_never_oom_killed(tmp_path: Path) -> None:
    """Bursts of 64 MiB sessions spread over 4 workers in a 1 GiB cgroup end in 503s, not OOM."""
    with memory_group(LIMIT_MB) as group:
        env = {
            "ADMISSION_CGROUP_ROOT": str(group),
            "ADMISSION_SHARED_DIR": str(tmp_path / "shm"),
            "ADMISSION_SESSION_RESERVE_MB": "96",
            "ADMISSION_MAX_SESSIONS": "1000",
            "DEMO_SESSION_MB": str(SESSION_MB),
        }
        server = Workers(4, env, tmp_path / "server.log", cgroup=group)
        try:
            server.wait_ready()
            workers = server.worker_pids()
            assert len(workers) == 4
            statuses: list[int | str] = []
            for _ in range(WAVES):
                statuses += asyncio.run(burst(server.base_url, PER_WAVE, HOLD_S))
            assert server.worker_pids() == workers
            assert server.proc.poll() is None
        finally:
            server.stop()
        assert oom_kills(group) == 0
        peak = int((group / "memory.max_usage_in_bytes").read_text())
    admitted, refused = statuses.count(201), statuses.count(503)
    assert admitted + refused == WAVES * PER_WAVE, statuses
    # The guard was exercised both ways: sessions were admitted until memory ran short.
    assert admitted >= 3
    assert refused >= PER_WAVE
    assert peak < LIMIT_MB * MIB
