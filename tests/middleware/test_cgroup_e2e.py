"""End to end in a real memory group: a burst that would OOM-kill the bare app does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import oom_burst

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.timeout(120),
]


def test_guarded_burst_in_a_768_mib_group_has_no_oom_kill() -> None:
    """40 concurrent 48 MiB sessions in 768 MiB: no OOM kill, capacity ±1 admitted, rest 503."""
    result = oom_burst.run_burst(guarded=True, sessions=40, session_mb=48, limit_mb=768)
    assert result.oom_kills == 0
    assert result.server_alive
    assert abs(result.admitted - result.capacity) <= 1, (result.admitted, result.capacity)
    assert result.admitted >= 1
    assert result.admitted + result.refused == 40, result.statuses
    assert result.retry_after_ok
    assert result.readmitted_after_close is True
