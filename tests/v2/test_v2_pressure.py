"""PSI and stuck pressure on a real cgroup v2 kernel (booted with ``psi=1``): a server
that leaks, with no session open, in a container's view of its 256 MiB group.

Runs in the VM of scripts/cgroup-v2 (the ``cgroup_v2`` marker).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kits.cgroupkit import container, demo, metric, oom_kills, v2_group
from kits.pollkit import wait_for

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.real_server, pytest.mark.timeout(600)]

#: The ceiling is 80 % of 256 MiB less a derived reserve of 32 MiB: about 173 MiB. The
#: server's own memory and this leak pass it; the server alone is far below 70 %.
LEAK_MB = 160
#: ADMISSION_STUCK_AFTER_SECONDS, short; the VM's emulated clock runs as the host's.
AFTER_S = 4.0
ALIVE = "/admission/alive"
LEAK_APP = [
    sys.executable,
    "-m",
    "uvicorn",
    "--factory",
    "leak_app:create",
    "--app-dir",
    str(Path(__file__).resolve().parents[1] / "middleware"),
    "--host",
    "127.0.0.1",
    "--log-level",
    "warning",
]


def test_psi_is_exported_and_a_leak_is_stuck_then_clears(tmp_path: Path) -> None:
    """The server leaks 160 MiB with no session open: the latch sets, the pressure is
    called stuck after ``AFTER_S`` (WARNING once, the gauge, liveness 503), PSI's
    stall ratio is exported throughout, and freeing the leak clears it all."""
    settings = {"ADMISSION_STUCK_AFTER_SECONDS": str(AFTER_S), "ADMISSION_LIVENESS_PATH": ALIVE}
    with (
        v2_group(256, "stuck") as group,
        demo(container(group), tmp_path / "leak.log", command=LEAK_APP, env=settings) as server,
        server.client(timeout=60) as client,
    ):
        stall = metric(client, "asgi_admission_memory_pressure_stall_ratio")
        assert stall is not None
        assert 0 <= stall <= 1
        assert client.get(ALIVE).status_code == 200
        assert client.post(f"/leak?mb={LEAK_MB}").status_code == 200
        # The readiness probe's check sets the latch: no session request at all.
        assert client.get("/admission/ready").status_code == 503
        wait_for(lambda: client.get(ALIVE).status_code == 503, timeout=60, step=0.2)
        assert metric(client, "asgi_admission_pressure_stuck") == 1
        unattributed = metric(client, "asgi_admission_unattributed_bytes")
        assert unattributed is not None
        assert unattributed >= LEAK_MB * 2**20
        assert metric(client, "asgi_admission_memory_pressure_stall_ratio") is not None
        assert client.delete("/leak").status_code == 200
        wait_for(lambda: client.get(ALIVE).status_code == 200, timeout=60, step=0.2)
        assert metric(client, "asgi_admission_pressure_stuck") == 0
        assert client.get("/admission/ready").status_code == 200
        assert client.post("/sessions").status_code == 201
        kills = oom_kills(group)
    log = server.log()
    stuck = [line for line in log.splitlines() if "memory pressure is stuck" in line]
    assert len(stuck) == 1, log
    assert stuck[0].startswith("WARNING")
    assert len([line for line in log.splitlines() if "no longer stuck" in line]) == 1, log
    assert "Traceback" not in log
    assert kills == 0
