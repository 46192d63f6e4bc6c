"""The demo in a real 512 MiB memory group with no ADMISSION_* settings: right out of the box.

Needs root and a writable cgroup v1 memory hierarchy (this project's machines and CI,
where a missing one fails the test rather than skipping it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kits.cgroupkit import default_places, joining, oom_kills, remove_group_tree
from kits.processkit import free_port, stop_process_group
from kits.suitekit import MIB, V1_MEMORY

LIMIT_MB = 512

pytestmark = [pytest.mark.real_cgroup, pytest.mark.real_server, pytest.mark.timeout(120)]


@pytest.fixture
def group() -> Iterator[Path]:
    """A fresh 512 MiB v1 memory group named after this process; removed even on failure."""
    if not (
        os.geteuid() == 0
        and (V1_MEMORY / "memory.limit_in_bytes").is_file()
        and os.access(V1_MEMORY, os.W_OK)
    ):
        reason = f"needs root and a writable cgroup v1 memory hierarchy at {V1_MEMORY}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    path = V1_MEMORY / f"asgi-admission-small-{os.getpid()}-{time.monotonic_ns()}"
    path.mkdir()
    try:
        (path / "memory.limit_in_bytes").write_text(str(LIMIT_MB * MIB))
        yield path
    finally:
        places = default_places(path)  # where the demo, with no settings, shared its ledger
        remove_group_tree(path, attempts=50)  # with the session groups the demo made in it
        for place in places:
            shutil.rmtree(place, ignore_errors=True)


@contextlib.contextmanager
def demo_in(group: Path, tmp_path: Path, **settings: str) -> Iterator[tuple[str, Path]]:
    """``asgi-admission demo`` started inside ``group`` with only ``settings`` in its env.

    No ``ADMISSION_*`` variable reaches it but those given, and no cgroup root: it
    finds its own memory group, as it would in a container.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "CODA_"))}
    env.update(settings)
    log = tmp_path / f"demo-{port}.log"
    argv = [
        *joining(group),
        sys.executable,
        "-m",
        "asgi_admission.cli",
        "demo",
        "--port",
        str(port),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    base_url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"the demo did not serve /health:\n{log.read_text()}")
        yield base_url, log
    finally:
        stop_process_group(proc)


def test_defaults_admit_64_mib_sessions_until_memory_is_short(group: Path, tmp_path: Path) -> None:
    """512 MiB, no settings: 64 MiB sessions are admitted up to the ceiling, 0 OOM kills."""
    with demo_in(group, tmp_path, DEMO_SESSION_MB="64") as (base_url, log):
        statuses: list[int] = []
        with httpx.Client(base_url=base_url, timeout=30) as client:
            for _ in range(10):
                response = client.post("/sessions")
                statuses.append(response.status_code)
                if response.status_code == 503:
                    assert response.json()["reason"] == "memory_pressure"
                    break
            assert client.get("/health").status_code == 200
            ready = client.get("/admission/ready")
    admitted = statuses.count(201)
    # The ceiling is 80% of 512 MiB minus one 64 MiB reserve; the demo's own ~40 MiB and
    # five sessions (about 360 MiB) fit under it, a sixth would not.
    assert 4 <= admitted <= 6, statuses
    assert statuses[-1] == 503, statuses
    assert ready.status_code == 503
    assert oom_kills(group) == 0
    text = log.read_text()
    assert "ERROR" not in text, text


def test_a_reserve_that_cannot_fit_is_an_error_naming_the_variable(
    group: Path, tmp_path: Path
) -> None:
    """With ADMISSION_SESSION_RESERVE_MB=768 in 512 MiB the log says so at ERROR, once."""
    with demo_in(group, tmp_path, ADMISSION_SESSION_RESERVE_MB="768") as (base_url, log):
        with httpx.Client(base_url=base_url, timeout=30) as client:
            for _ in range(3):
                assert client.post("/sessions").status_code == 503
        time.sleep(0.2)
    errors = [line for line in log.read_text().splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, log.read_text()
    assert "ADMISSION_SESSION_RESERVE_MB (reserve_bytes) is 768 MiB" in errors[0]
    assert "no session can ever be admitted" in errors[0]


def test_the_watchdog_halts_a_growing_process_before_the_kernel_does(
    group: Path, tmp_path: Path
) -> None:
    """At its defaults the watchdog halts a child grown in 100 MiB requests: 409, 0 OOM kills."""
    with (
        demo_in(group, tmp_path, DEMO_SESSION_MB="0") as (base_url, _),
        httpx.Client(base_url=base_url, timeout=60) as client,
    ):
        opened = client.post("/processes", params={"hold_mb": 16})
        assert opened.status_code == 201, opened.text
        path = f"/processes/{opened.json()['id']}"
        answers: list[int] = []
        for _ in range(8):
            grown = client.post(f"{path}/grow", params={"mb": 100})
            answers.append(grown.status_code)
            if grown.status_code != 200:
                break
            time.sleep(1)
        assert answers[-1] == 409, (answers, grown.text)
        assert "halted by the watchdog (container_headroom)" in grown.json()["detail"]
        assert client.get("/health").status_code == 200
    assert oom_kills(group) == 0
