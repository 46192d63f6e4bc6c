"""Real cgroup v2 memory groups for the tests marked ``cgroup_v2`` (run in the VM of
scripts/cgroup-v2): make one, read the kernel's own figures, run a command in it or in
a container's view of it, and always remove it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from kits.cgroupkit import joining, remove_group_tree
from kits.processkit import free_port, stop_process_group
from kits.requirekit import require_marker
from kits.suitekit import MIB, V2_ROOT

#: Seconds a server started in the VM has to answer ``/health``: under emulation (no
#: KVM) Python runs about 20 times slower, and importing the demo takes 20 to 30 s.
SERVER_START_S = 240.0


@contextlib.contextmanager
def v2_group(limit_mb: int | None, name: str, *, parent: Path = V2_ROOT) -> Iterator[Path]:
    """A fresh group ``asgi_admission_<name>_<pid>_<ns>`` under ``parent`` with
    ``memory.max`` at ``limit_mb`` (``None``: no limit) and no swap; on exit its tasks
    and those of the groups below it are killed and all of them removed."""
    require_marker("cgroup_v2", "makes a real cgroup v2 memory group")
    group = parent / f"asgi_admission_{name}_{os.getpid()}_{time.monotonic_ns()}"
    group.mkdir()
    try:
        if limit_mb is not None:
            (group / "memory.max").write_text(str(limit_mb * MIB))
        swap = group / "memory.swap.max"
        if swap.exists():
            swap.write_text("0")
        yield group
    finally:
        remove_group_tree(group)


def give_memory(group: Path) -> None:
    """Give the memory controller to ``group``'s children (it must have no process)."""
    (group / "cgroup.subtree_control").write_text("+memory")


def stats(group: Path) -> dict[str, int]:
    """``memory.stat`` as numbers."""
    lines = (group / "memory.stat").read_text().splitlines()
    return {key: int(value) for key, value in (line.split() for line in lines)}


def working_set_bytes(group: Path) -> int:
    """``memory.current`` less both file LRUs, as the guard computes it."""
    found = stats(group)
    usage = int((group / "memory.current").read_text())
    return max(0, usage - found["inactive_file"] - found["active_file"])


def events(group: Path, *, local: bool = False) -> dict[str, int]:
    """``memory.events`` (counting the groups below too) or ``memory.events.local``."""
    name = "memory.events.local" if local else "memory.events"
    lines = (group / name).read_text().splitlines()
    return {key: int(value) for key, value in (line.split() for line in lines)}


def oom_kills(group: Path, *, local: bool = False) -> int:
    """How many processes the kernel's OOM killer has killed in ``group`` (and below it,
    unless ``local``), from ``memory.events``."""
    return events(group, local=local)["oom_kill"]


def procs(group: Path) -> list[int]:
    """The processes in ``group`` now."""
    return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]


def container(group: Path) -> list[str]:
    """The argv prefix of a command run as in a container whose cgroup is ``group``: it
    joins the group, then unshares a cgroup namespace (whose root is the group) and a
    mount namespace in which cgroup2 is mounted again at /sys/fs/cgroup, so that it sees
    the group as the top of the hierarchy, as a pod's container does."""
    remount = 'umount -l /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$@"'
    return [
        *joining(group),
        "unshare",
        "--cgroup",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        remount,
        "container",
    ]


def wait_for(check: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    """Poll ``check`` until it returns something true (returned), or fail at ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"not reached in {timeout} s"
        time.sleep(step)


def metric(client: httpx.Client, name: str) -> float | None:
    """The value of the sample ``name`` (with its labels, as exposed) at ``/metrics``."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


#: The command :class:`Demo` serves unless told otherwise.
DEMO = [sys.executable, "-m", "asgi_admission.cli", "demo"]


class Demo:
    """``asgi-admission demo`` (or ``command``, which takes ``--port``) started with
    ``prefix`` (a group to join, a container's view) and only the ``ADMISSION_*``
    settings given, as in a pod."""

    def __init__(
        self,
        prefix: list[str],
        log: Path,
        *,
        command: list[str] = DEMO,
        env: Mapping[str, str] | None = None,
        **settings: str,
    ) -> None:
        require_marker("real_server", "starts a server process")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "CODA_"))}
        given = {"DEMO_SESSION_MB": "0", "ADMISSION_SHARED_DIR": "off", **(env or {}), **settings}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [*prefix, *command, "--port", str(self.port)],
                env={**clean, **given},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.proc.poll() is None, f"the demo exited:\n{self.log()}"
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(self.base_url + "/health", timeout=5).status_code == 200
            return False

        wait_for(ready, SERVER_START_S, step=0.5)

    def log(self) -> str:
        return self.log_path.read_text()

    def kill(self) -> None:
        """SIGKILL the server alone (its children and groups stay, as after a crash)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        stop_process_group(self.proc, timeout=30)


@contextlib.contextmanager
def demo(
    prefix: list[str],
    log: Path,
    *,
    command: list[str] = DEMO,
    env: Mapping[str, str] | None = None,
    **settings: str,
) -> Iterator[Demo]:
    """A :class:`Demo`, ready, stopped at the end (even after a failure)."""
    server = Demo(prefix, log, command=command, env=env, **settings)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
