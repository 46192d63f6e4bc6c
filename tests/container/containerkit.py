"""Running the project's image with podman, for the container tests and bench/replicas.py.

Podman reads the project's ``deploy/podman/containers.conf`` (``CONTAINERS_CONF``);
``scripts/containers`` installs it and ``scripts/image`` builds the image. Every
container and pod is named after this process's pid, so parallel runs never collide,
and removed again even when a test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kits.suitekit import MIB, ROOT, V1_MEMORY

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kits.processkit import free_port

CONF = ROOT / "deploy" / "podman" / "containers.conf"
# One tag per checkout (scripts/image builds :dev by default): the gates of several
# clones on one machine each run the image of their own source.
TAG = "dev-" + hashlib.sha256(str(ROOT).encode()).hexdigest()[:10]
IMAGE = f"localhost/asgi-admission-demo:{TAG}"
HELM_TEST_IMAGE = "localhost/asgi-admission-helm-test:dev"
LIMIT = 512 * MIB
PREFIX = f"asgi-admission-test-{os.getpid()}"

__all__ = [
    "HELM_TEST_IMAGE",
    "IMAGE",
    "LIMIT",
    "PREFIX",
    "ROOT",
    "TAG",
    "Burst",
    "Container",
    "build_image",
    "burst",
    "container_memory",
    "free_port",
    "podman",
    "remove_pod",
    "running",
    "sample",
    "unavailable_reason",
    "wait_http",
]


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs ``podman ARGS`` with the project's configuration; fails loudly on an error."""
    proc = subprocess.run(
        ["podman", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env=podman_env(),
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} exited with {proc.returncode}:\n{proc.stderr}")
    return proc


def unavailable_reason() -> str | None:
    """Why podman cannot run the image here, or None when it can."""
    if shutil.which("podman") is None:
        return "podman is not installed: run scripts/setup as root (it calls scripts/containers)"
    if os.geteuid() != 0:
        return "the container tests run podman as root (cgroup limits, published ports)"
    if not (V1_MEMORY / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory hierarchy at {V1_MEMORY} to check OOM kills in"
    probe = podman("info", "--format", "{{.Host.OCIRuntime.Name}}", check=False)
    if probe.returncode != 0:
        return f"podman info fails with {CONF}: {probe.stderr.strip()}"
    return None


def build_image() -> str:
    """Runs scripts/image (base, wheels, image, helm test image); returns the image name."""
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "image")],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env={**os.environ, "IMAGE": IMAGE},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/image failed:\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


def wait_http(url: str, *, timeout: float = 60, alive: Callable[[], bool] | None = None) -> None:
    """Waits until ``url`` answers at all (any status); ``alive()`` False ends the wait."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the server behind {url} stopped before answering")
        with contextlib.suppress(httpx.TransportError):
            httpx.get(url, timeout=2)
            return
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@dataclass(frozen=True, slots=True)
class ContainerMemory:
    """What the kernel's memory group of a container says: limit, peak and OOM kills."""

    limit_bytes: int
    max_usage_bytes: int
    oom_kills: int
    under_oom: bool


def container_memory(container: str) -> ContainerMemory:
    """Reads the container's own v1 memory group (podman's cgroupfs manager made it)."""
    cgroup_path = inspect(container)["State"]["CgroupPath"]
    group = V1_MEMORY / cgroup_path.lstrip("/")
    control = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
    return ContainerMemory(
        limit_bytes=int((group / "memory.limit_in_bytes").read_text()),
        max_usage_bytes=int((group / "memory.max_usage_in_bytes").read_text()),
        oom_kills=int(control["oom_kill"]),
        under_oom=control["under_oom"] == "1",
    )


def inspect(container: str) -> dict[str, Any]:
    data: list[dict[str, Any]] = json.loads(podman("inspect", container).stdout)
    return data[0]


@dataclass(frozen=True, slots=True)
class Container:
    """A running container, published on 127.0.0.1:``port``."""

    name: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def exec(self, *args: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *args, check=False)

    def oom_killed(self) -> bool:
        killed: bool = inspect(self.name)["State"]["OOMKilled"]
        return killed

    def running(self) -> bool:
        state: bool = inspect(self.name)["State"]["Running"]
        return state

    def memory(self) -> ContainerMemory:
        return container_memory(self.name)

    def logs(self) -> str:
        proc = podman("logs", self.name, check=False)
        return proc.stdout + proc.stderr


@contextlib.contextmanager
def running(
    suffix: str,
    *,
    env: dict[str, str],
    cgroupns: str = "host",
    memory: str = "512m",
    options: Sequence[str] = (),
    args: Sequence[str] = (),
    image: str = IMAGE,
) -> Iterator[Container]:
    """Runs the image detached with a memory limit and port 8000 on 127.0.0.1; removes it."""
    name = f"{PREFIX}-{suffix}"
    port = free_port()
    env_args = [f"--env={key}={value}" for key, value in env.items()]
    podman(
        "run",
        "--detach",
        f"--name={name}",
        f"--memory={memory}",
        f"--cgroupns={cgroupns}",
        f"--publish=127.0.0.1:{port}:8000",
        *env_args,
        *options,
        image,
        *args,
    )
    container = Container(name=name, port=port)
    try:
        wait_http(f"{container.url}/health", alive=container.running)
        yield container
    except Exception:
        print(container.logs(), file=sys.stderr)
        raise
    finally:
        podman("rm", "--force", "--time=0", name, check=False)


def remove_pod(name: str) -> None:
    podman("pod", "rm", "--force", "--time=0", name, check=False)


@dataclass(frozen=True, slots=True)
class Burst:
    """The answers to a burst of session openings: status codes and Retry-After values."""

    statuses: tuple[int, ...]
    retry_after: tuple[str | None, ...]
    session_ids: tuple[str, ...]

    @property
    def admitted(self) -> int:
        return self.statuses.count(201)

    @property
    def refused(self) -> int:
        return self.statuses.count(503)


def burst(
    url: str, count: int, *, hold_s: float = 0.0, stagger_s: float = 0.0, timeout: float = 60
) -> Burst:
    """Opens ``count`` sessions at once with ``POST url/sessions?hold_s=``.

    ``stagger_s`` starts request ``i`` after ``i * stagger_s`` seconds: connections that
    arrive together are all accepted by whichever uvicorn worker wakes first, staggered
    ones are spread over the workers (and still overlap while each is held).
    """

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        await asyncio.sleep(i * stagger_s)
        return await client.post(f"{url}/sessions", params={"hold_s": hold_s})

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=count)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            return await asyncio.gather(*(one(client, i) for i in range(count)))

    responses = asyncio.run(run())
    return Burst(
        statuses=tuple(r.status_code for r in responses),
        retry_after=tuple(r.headers.get("retry-after") for r in responses),
        session_ids=tuple(r.json()["id"] for r in responses if r.status_code == 201),
    )


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample ``name{labels}`` in a /metrics page."""
    values = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    if len(values) != 1:
        raise LookupError(f"{len(values)} samples named {name} with {labels} in /metrics")
    return values[0]
