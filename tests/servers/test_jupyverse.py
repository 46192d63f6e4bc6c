"""Jupyverse, guarded the way its users add things to it: a jupyverse plugin.

``jupyverse_plugin/`` is a plugin (an fps module found by the ``jupyverse.modules``
entry point) that adds ``AdmissionMiddleware`` to jupyverse's FastAPI app with
``session_routes=["POST /api/sessions"]`` and nothing else: the guard's defaults.
The server is started with the ``jupyverse`` command inside a real memory group; each
session is an ipykernel process whose memory mostly arrives after the ``201``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import Counter
from contextlib import AbstractContextManager
from pathlib import Path

import httpx
import pytest
import serverkit

from kits.cgroupkit import oom_kills, working_set_bytes
from kits.suitekit import MIB

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

PLUGIN = Path(__file__).resolve().parent / "jupyverse_plugin"
READY = "/api/kernelspecs"
LIMIT_MB = 768
# The lab plugin needs the JupyterLab front end, which the API never uses.
ARGV = [
    str(Path(sys.executable).with_name("jupyverse")),
    *("--port", "{port}", "--disable", "lab"),
]
SESSION = {"kernel": {"name": "python3"}, "type": "notebook"}


def serve(tmp: Path, name: str, limit_mb: int) -> AbstractContextManager[serverkit.Served]:
    env = {"PYTHONPATH": os.pathsep.join([str(PLUGIN), os.environ.get("PYTHONPATH", "")])}
    return serverkit.serve_in_group(
        ARGV, limit_mb=limit_mb, name=name, ready_path=READY, env=env, cwd=tmp
    )


def kernels_in(group: Path) -> int:
    """How many ipykernel processes run in ``group``."""
    count = 0
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        count += b"ipykernel_launcher" in cmdline
    return count


def open_session(client: httpx.Client, i: int) -> httpx.Response:
    return client.post(
        "/api/sessions", json={**SESSION, "name": f"n{i}.ipynb", "path": f"n{i}.ipynb"}
    )


@pytest.fixture(scope="module")
def footprint(tmp_path_factory: pytest.TempPathFactory) -> int:
    """One kernel's footprint: the group's settled working set before and after one session."""
    serverkit.require_server("jupyverse_api")
    with serve(tmp_path_factory.mktemp("jv_one"), "jupyverse_one", 2048) as served:
        time.sleep(1)
        before = serverkit.settled_peak(served.group, quiet_s=1.0)
        with httpx.Client(base_url=served.base_url, timeout=30) as client:
            assert open_session(client, 0).status_code == 201
        after = serverkit.settled_peak(served.group)
        assert kernels_in(served.group) == 1
        return after - before


async def _burst(base_url: str, n: int) -> list[httpx.Response | str]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:

        async def one(i: int) -> httpx.Response | str:
            try:
                return await client.post(
                    "/api/sessions", json={**SESSION, "name": f"b{i}.ipynb", "path": f"b{i}.ipynb"}
                )
            except httpx.HTTPError as exc:
                return type(exc).__name__

        return await asyncio.gather(*(one(i) for i in range(n)))


def reason(response: httpx.Response) -> str:
    """The guard's reason for a refusal, from its problem body."""
    try:
        return str(response.json().get("reason"))
    except ValueError:
        return "no problem body"


def test_first_burst_of_kernels_is_cut_at_capacity(footprint: int, tmp_path: Path) -> None:
    """A first burst of 3x capacity kernel sessions on a fresh guarded jupyverse admits
    capacity give or take one (each kernel alive), refuses the rest with 503 and
    Retry-After, and the kernel's OOM killer kills nothing: the guard's probe of the
    route, not its guessed reserve, decides the burst."""
    with serve(tmp_path, "jupyverse_burst", LIMIT_MB) as served:
        time.sleep(1)
        baseline = working_set_bytes(served.group)
        cap = serverkit.capacity(LIMIT_MB, baseline, footprint)
        assert cap >= 2, (footprint / MIB, baseline / MIB)
        sessions = 3 * cap + 2
        responses = asyncio.run(_burst(served.base_url, sessions))
        settled = serverkit.settled_peak(served.group)
        codes = [r if isinstance(r, str) else r.status_code for r in responses]
        refusals = [r for r in responses if not isinstance(r, str) and r.status_code == 503]
        result = serverkit.BurstResult(
            footprint_mb=round(footprint / MIB, 1),
            baseline_mb=round(baseline / MIB, 1),
            capacity=cap,
            sessions=sessions,
            admitted=codes.count(201),
            alive_kernels=kernels_in(served.group),
            refused=len(refusals),
            retry_after_ok=all(r.headers.get("retry-after", "").isdigit() for r in refusals),
            other=[str(c) for c in codes if c not in (201, 503)],
            oom_kills=oom_kills(served.group),
            server_alive=served.alive(READY),
            settled_mb=round(settled / MIB, 1),
            reasons=dict(Counter(reason(r) for r in refusals)),
        )
        print(result.summary())
        assert result.oom_kills == 0, result.summary()
        assert result.server_alive, result.summary()
        assert cap - 1 <= result.admitted <= cap + 1, result.summary()
        assert result.alive_kernels == result.admitted, result.summary()
        assert result.admitted + result.refused == sessions, result.summary()
        assert result.retry_after_ok, result.summary()
