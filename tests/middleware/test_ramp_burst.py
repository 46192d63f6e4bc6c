"""Sessions whose memory arrives after their 201, in a real memory group under uvicorn.

Each session is a child process whose memory (about 96 MiB) arrives over 2 s after
the response. A burst of 40 must be cut at the group's true capacity with no OOM
kill whether the guard settles on its own, learns a reserve set 12x too small, or
the app holds the ticket; the bare app, in the same module, is OOM-killed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import ramp_burst

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(240),
]

HOLD_MB = 92


@pytest.fixture(scope="module")
def footprint() -> int:
    """One session's measured footprint (interpreter plus its held memory)."""
    if not ramp_burst.available():
        message = "needs root and a writable cgroup v1 memory hierarchy at /sys/fs/cgroup/memory"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return ramp_burst.session_footprint(HOLD_MB)


def assert_cut_at_capacity(result: ramp_burst.RampResult) -> None:
    assert result.oom_kills == 0, result.summary()
    assert result.server_alive, result.summary()
    assert result.capacity - 1 <= result.admitted <= result.capacity + 1, result.summary()
    assert result.admitted + result.refused == len(result.statuses), result.statuses
    assert result.retry_after_ok
    assert result.readmitted is True, result.summary()


def test_bare_app_is_oom_killed_by_the_ramping_burst(footprint: int) -> None:
    """The contrast: without the guard the burst is admitted far past capacity and OOM-killed."""
    result = ramp_burst.run_ramp_burst("bare", hold_mb=HOLD_MB, footprint=footprint)
    assert result.admitted > result.capacity + 1, result.summary()
    assert result.oom_kills > 0, result.summary()


@pytest.mark.parametrize("mode", ["settle", "learn", "ticket"])
def test_ramping_burst_is_cut_at_capacity(footprint: int, mode: ramp_burst.Mode) -> None:
    """Settling alone, a learned reserve, or a held ticket admit capacity +-1, no OOM kill."""
    result = ramp_burst.run_ramp_burst(mode, hold_mb=HOLD_MB, footprint=footprint)
    assert_cut_at_capacity(result)
    if mode == "learn":
        assert result.learned_within_15pct_s is not None, result.summary()


@pytest.mark.parametrize("workers", [1, 4])
def test_a_burst_after_an_overlapping_warm_up_is_cut_at_capacity(
    footprint: int, workers: int
) -> None:
    """Four warm-up sessions, each opened 0.6 s after the one before had ramped, all
    closed together, and a burst of 40 a second later, the reserve 12x too small (one
    worker, or four sharing a ledger in a 1 GiB group): the footprint is learned from the
    working set before any session ends (there is never a quiet episode), within 15 %,
    and the burst is cut at capacity +-1."""
    result = ramp_burst.run_ramp_burst(
        "learn",
        hold_mb=HOLD_MB,
        footprint=footprint,
        warm_up="overlapping",
        workers=workers,
        limit_mb=768 if workers == 1 else 1024,
    )
    assert_cut_at_capacity(result)
    learned = result.learned_before_ends_mb
    assert learned is not None, result.summary()
    assert abs(learned - result.footprint_mb) <= 0.15 * result.footprint_mb, result.summary()


@pytest.mark.parametrize("mode", ["settle", "learn", "ticket"])
def test_ramping_burst_over_four_workers_is_cut_at_capacity(
    footprint: int, mode: ramp_burst.Mode
) -> None:
    """The same with 4 uvicorn workers and the shared ledger, in a 1 GiB group."""
    result = ramp_burst.run_ramp_burst(
        mode, hold_mb=HOLD_MB, footprint=footprint, workers=4, limit_mb=1024
    )
    assert result.workers == 4
    assert_cut_at_capacity(result)


def test_ramping_burst_over_four_workers_sharing_by_default_is_cut_at_capacity(
    footprint: int,
) -> None:
    """4 uvicorn workers with no setting of where to share or which cgroup to read find
    their memory group and one private ledger in it by themselves: the burst is cut at
    capacity with no OOM kill (each worker guarding alone admitted twice what fit)."""
    result = ramp_burst.run_ramp_burst(
        "settle", hold_mb=HOLD_MB, footprint=footprint, workers=4, default_sharing=True
    )
    assert result.workers == 4
    assert len(result.ledgers) == 4, result.ledgers
    files = {path for paths in result.ledgers.values() for path in paths}
    assert len(files) == 1, result.ledgers
    assert all(len(paths) == 1 for paths in result.ledgers.values()), result.ledgers
    place = os.path.dirname(files.pop())
    assert os.path.basename(place).startswith(f"asgi-admission-{os.geteuid()}-asgi_admission_ramp")
    assert_cut_at_capacity(result)
