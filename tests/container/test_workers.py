"""Four uvicorn workers in one container share one session count through the ledger.

The ledger lives on a memory-backed directory mounted as the chart mounts it (a tmpfs,
like a ``medium: Memory`` emptyDir): whichever worker a request reaches, a burst of
overlapping openings is admitted up to ``ADMISSION_MAX_SESSIONS`` container-wide, and
the sessions those requests opened still count once the requests have ended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from containerkit import Container, burst, running

from kits.suitekit import LEDGER_HEADER, LEDGER_SLOT

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

SHARED = "/run/asgi-admission/shared"
# A subdirectory, as the chart sets it: the tmpfs itself is writable by everyone (1777),
# which the guard refuses for its ledger's own directory.
LEDGER_DIR = f"{SHARED}/ledger"
MAX_SESSIONS = 5
ENV = {
    "DEMO_SESSION_MB": "8",
    "ADMISSION_SESSION_RESERVE_MB": "8",
    "ADMISSION_MAX_SESSIONS": str(MAX_SESSIONS),
    "ADMISSION_SHARED_DIR": LEDGER_DIR,
}


def deciding_workers(raw: bytes) -> set[int]:
    """The pids of the workers with a slot in the ledger file ``raw``."""
    magic, _capacity, used = LEDGER_HEADER.unpack_from(raw)
    assert magic == b"ASGIADM1"
    slots = LEDGER_SLOT.iter_unpack(
        raw[LEDGER_HEADER.size : LEDGER_HEADER.size + used * LEDGER_SLOT.size]
    )
    return {pid for pid, _start, _pending, _active in slots if pid}


@contextlib.contextmanager
def four_workers() -> Iterator[Container]:
    with running(
        "workers",
        env=ENV,
        options=[f"--mount=type=tmpfs,destination={SHARED},tmpfs-size=16m"],
        args=["demo", "--host", "0.0.0.0", "--port", "8000", "--workers", "4"],
    ) as container:
        yield container


def test_four_workers_admit_exactly_the_cap_container_wide_during_a_burst(image: str) -> None:
    """24 overlapping openings over 4 workers: exactly the cap is admitted, no OOM kill."""
    with four_workers() as container:
        result = burst(container.url, 24, hold_s=1.0, stagger_s=0.02)
        assert result.admitted == MAX_SESSIONS, result.statuses
        assert result.refused == 24 - MAX_SESSIONS
        ledger = container.exec(
            "python3",
            "-c",
            f"import sys; sys.stdout.write(open('{LEDGER_DIR}/asgi-admission.ledger', 'rb')"
            ".read().hex())",
        )
        # More than one worker decided, so the cap held across processes, not within one.
        assert len(deciding_workers(bytes.fromhex(ledger.stdout))) >= 2
        mounts = container.exec("cat", "/proc/mounts").stdout
        assert any(
            line.split()[1] == SHARED and line.split()[2] == "tmpfs" for line in mounts.splitlines()
        )
        assert container.memory().oom_kills == 0


def test_sessions_opened_earlier_still_count_against_the_cap_in_other_workers(
    image: str,
) -> None:
    """Once the cap is reached and the requests have ended, a second burst admits nothing."""
    with four_workers() as container:
        first = burst(container.url, 24, hold_s=1.0, stagger_s=0.02)
        assert first.admitted == MAX_SESSIONS, first.statuses
        second = burst(container.url, 8)
        assert second.refused == 8, second.statuses
