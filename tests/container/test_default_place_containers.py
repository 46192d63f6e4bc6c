"""Two containers sharing one /dev/shm (the containers of a pod), each with a cgroup
namespace of its own, so both see their memory group at /sys/fs/cgroup: with nothing
set about sharing, each container's workers share one ledger, and the two never share."""

from __future__ import annotations

import pytest
from containerkit import Container, burst, running

pytestmark = [pytest.mark.container, pytest.mark.usefixtures("podman_ready")]

ENV = {"DEMO_SESSION_MB": "1", "ADMISSION_MAX_SESSIONS": "2"}
WORKERS = ["demo", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
LEDGER = "asgi-admission.ledger"


def ledger_files(container: Container) -> set[str]:
    """The ledger files the container's serving processes have open."""
    script = f"for fd in /proc/[0-9]*/fd/*; do readlink $fd; done 2>/dev/null | grep '/{LEDGER}$'"
    return set(container.exec("sh", "-c", script).stdout.split())


def test_two_containers_in_one_shm_never_share_a_ledger(image: str) -> None:
    """Two containers with private cgroup namespaces and one /dev/shm: /dev/shm holds two
    places, each container's workers have one of them open, and filling one container's
    session limit leaves the other admitting."""
    private = ["--shm-size=16m", "--ipc=shareable"]
    with running("place-one", env=ENV, cgroupns="private", options=private, args=WORKERS) as one:
        shared_ipc = [f"--ipc=container:{one.name}"]
        with running(
            "place-two", env=ENV, cgroupns="private", options=shared_ipc, args=WORKERS
        ) as two:
            listing = {c.name: set(c.exec("ls", "/dev/shm").stdout.split()) for c in (one, two)}
            assert listing[one.name] == listing[two.name]  # one /dev/shm, as in a pod
            places = {name for name in listing[one.name] if name.startswith("asgi-admission-")}
            assert len(places) == 2, listing
            # Both see their group at the mount point: the names' readable part is the same.
            assert len({name.split("-")[3] for name in places}) == 1, places
            files = {c.name: ledger_files(c) for c in (one, two)}
            assert all(len(paths) == 1 for paths in files.values()), files
            assert files[one.name] != files[two.name], files
            filled = burst(one.url, 6, hold_s=2.0, stagger_s=0.02)
            other = burst(two.url, 2)
    # One container's two workers admitted 2 between them, its whole limit.
    assert (filled.admitted, filled.refused) == (2, 4), filled.statuses
    assert other.admitted == 2, other.statuses
