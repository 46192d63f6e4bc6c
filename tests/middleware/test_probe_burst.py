"""A first burst of sessions of unknown cost, in a real memory group under uvicorn.

Nothing is learned yet, learning is at its default, and each of the 24 sessions is a
child process whose memory arrives over 2 s after its ``201``: the guard probes the
route with one session and decides the others once that one's memory has stopped
growing. Whether the reserve is the default one (half of what a session costs) or a
configured one 12x too small, the burst is cut at the group's true capacity in one
go, with no OOM kill and no client trying again (bench/probe_burst.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import probe_burst
import ramp_burst

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

RAMP_S = 2.0
#: About one ramp plus a second (the probe's quiet spell), with room for a busy machine.
MOST_WAIT_S = RAMP_S + 2.5


@pytest.fixture(scope="module", autouse=True)
def machine() -> None:
    if not ramp_burst.available():
        message = "needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.mark.parametrize(
    ("case", "workers"), [*((case, 1) for case in probe_burst.CASES), ("small", 4)]
)
def test_a_first_burst_is_cut_at_capacity_by_probing(case: probe_burst.Case, workers: int) -> None:
    """No reserve set for sessions twice the default one, or a reserve 12x too small (also
    over 4 workers sharing a ledger): the first burst of 24 admits capacity +-1 at once,
    no OOM kill, every refusal a 503 with Retry-After, and no admitted request waits much
    more than one ramp."""
    result = probe_burst.run_probe_burst(case, sessions=24, ramp_s=RAMP_S, workers=workers)
    summary = result.summary()
    print(summary)  # the figures, for the record (pytest -s)
    if case == "default":
        assert result.reserve_mb * 1.8 <= result.footprint_mb, summary
    else:
        assert result.reserve_mb * 10 <= result.footprint_mb, summary
    assert result.oom_kills == 0, summary
    assert result.server_alive, summary
    assert result.capacity - 1 <= result.admitted <= result.capacity + 1, summary
    assert result.admitted >= 2, summary  # the probe and at least one decided on its evidence
    assert result.admitted + result.refused == len(result.statuses), summary
    assert result.retry_after_ok, summary
    # Every waiter was decided on the probe's evidence, none ran out of time.
    assert "probing" not in result.reasons, summary
    assert max(result.waits_s) <= MOST_WAIT_S, summary
    assert result.learned_footprint_mb is not None, summary
    assert abs(result.learned_footprint_mb - result.footprint_mb) <= 0.15 * result.footprint_mb
