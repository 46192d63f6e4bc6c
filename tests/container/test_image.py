"""The project's image under podman with a 512 MiB limit, in both cgroup namespace modes.

A burst of session openings admits what fits and refuses the rest with 503 +
Retry-After, and the kernel never OOM-kills anything in the container's group.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from typing import Literal

import httpx
import pytest
from containerkit import LIMIT, burst, podman, running, sample

from kits.suitekit import MIB, PACKAGE, ROOT

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

SESSION_MB = 64
# Sessions of 64 MiB with a 64 MiB reserve each under a 512 MiB limit: a handful fit
# below the 80% high watermark, so a burst of 16 must be partly refused.
ENV = {
    "DEMO_SESSION_MB": str(SESSION_MB),
    "ADMISSION_SESSION_RESERVE_MB": str(SESSION_MB),
    "ADMISSION_MAX_SESSIONS": "64",
    "ADMISSION_RETRY_AFTER_SECONDS": "2",
}
HIGH_WATERMARK = 0.80
# Prints "path digest" for each module of the package installed in the image.
INSTALLED_DIGESTS = """
import hashlib, pathlib, asgi_admission
root = pathlib.Path(asgi_admission.__file__).parent
for path in sorted(root.rglob("*.py")):
    print(path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
"""


def test_the_image_runs_this_checkouts_code(image: str) -> None:
    """Every module installed in the image is the checkout's own, byte for byte, and the
    image carries the digest of its build context: a source change rebuilds the install
    (its bind mount is not in the layer cache's key), so no test runs a stale image."""
    config = json.loads(podman("image", "inspect", image).stdout)[0]
    digest = subprocess.run(
        ["bash", str(ROOT / "scripts" / "source-digest")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert config["Config"]["Labels"]["io.asgi-admission.source-digest"] == digest
    installed = podman(
        "run", "--rm", "--network=none", "--entrypoint=python3", image, "-c", INSTALLED_DIGESTS
    ).stdout.splitlines()
    checkout = [
        f"{path.relative_to(PACKAGE).as_posix()} {hashlib.sha256(path.read_bytes()).hexdigest()}"
        for path in sorted(PACKAGE.rglob("*.py"))
    ]
    assert installed == checkout


def test_image_runs_as_a_numeric_non_root_user_with_a_healthcheck(image: str) -> None:
    """The image's user is 10001:10001 and its HEALTHCHECK passes on a running container."""
    config = json.loads(podman("image", "inspect", image).stdout)[0]
    assert config["Config"]["User"] == "10001:10001"
    assert "/health" in " ".join(config["Healthcheck"]["Test"])
    with running("health", env=ENV) as container:
        assert container.exec("id", "-u").stdout.strip() == "10001"
        check = podman("healthcheck", "run", container.name, check=False)
        assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("cgroupns", ["host", "private"])
def test_a_burst_admits_what_fits_and_refuses_the_rest_without_oom(
    image: str, cgroupns: Literal["host", "private"]
) -> None:
    """16 sessions at once: some 201, the rest 503 + Retry-After, 0 OOM kills, peak < limit."""
    with running(f"burst-{cgroupns}", env=ENV, cgroupns=cgroupns) as container:
        result = burst(container.url, 16, hold_s=0.5)
        assert set(result.statuses) == {201, 503}, result.statuses
        assert all(
            after is not None and int(after) >= 1
            for status, after in zip(result.statuses, result.retry_after, strict=True)
            if status == 503
        ), result.retry_after
        # What was admitted fits under the high watermark, sessions alone counted.
        assert result.admitted * SESSION_MB * MIB <= HIGH_WATERMARK * LIMIT
        listed = httpx.get(f"{container.url}/sessions", timeout=10).json()["sessions"]
        assert len(listed) == result.admitted
        memory = container.memory()
        assert memory.limit_bytes == LIMIT
        assert memory.oom_kills == 0
        assert not memory.under_oom
        assert memory.max_usage_bytes < LIMIT
        assert container.running()
        assert not container.oom_killed()


@pytest.mark.parametrize("cgroupns", ["host", "private"])
def test_probe_and_metrics_inside_report_the_512_mib_limit(
    image: str, cgroupns: Literal["host", "private"]
) -> None:
    """`asgi-admission probe --json` in the container and its /metrics both see 512 MiB."""
    with running(f"probe-{cgroupns}", env=ENV, cgroupns=cgroupns) as container:
        probe = container.exec("asgi-admission", "probe", "--json")
        report = json.loads(probe.stdout)
        assert report["memory"]["limit_bytes"] == LIMIT, probe.stdout
        assert report["source"] == "cgroup-v1"
        assert report["decision"]["allowed"] is True
        metrics = httpx.get(f"{container.url}/metrics", timeout=10).text
        assert sample(metrics, "asgi_admission_memory_limit_bytes") == LIMIT
