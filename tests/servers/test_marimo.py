"""Marimo, guarded the way its users serve notebooks: ``marimo.create_asgi_app()``.

``marimo_app/guarded_marimo.py`` builds the app with ``create_asgi_app`` for one
notebook at ``/nb`` and wraps it in ``AdmissionMiddleware`` with
``session_routes=["WS /nb/ws"]`` and nothing else: the guard's defaults. The server is
uvicorn inside a real memory group. A session is the notebook's WebSocket, opened the
way marimo's front end opens it (``/nb/ws?session_id=s_xxxxxx`` with the page's
``Origin``); marimo accepts it, then runs the notebook in a kernel thread of the
server, so all of a session's memory arrives after the accept.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
import serverkit
import websockets
from websockets.typing import Origin

from kits.cgroupkit import oom_kills, working_set_bytes
from kits.suitekit import MIB

pytestmark = [
    pytest.mark.real_cgroup,
    pytest.mark.real_server,
    pytest.mark.slow,
    pytest.mark.timeout(180),
]

APP_DIR = Path(__file__).resolve().parent / "marimo_app"
READY = "/nb/health"
# Room for a handful of sessions under the high watermark, and for no more than one
# session over it before the limit.
LIMIT_MB = 640
SESSIONS = 24
# What a session computes: about 85 MiB of data, built over 1.7 s as a notebook that
# loads something would.
NOTEBOOK = """import marimo

app = marimo.App()


@app.cell
def _():
    import time

    blocks = []
    for _ in range(17):
        blocks.append(b"\\x01" * (5 * 1024 * 1024))
        time.sleep(0.1)
    return (blocks,)


if __name__ == "__main__":
    app.run()
"""
# A refusal is a close with 1013 (the guard's answer to a handshake with an Origin, as
# every browser sends) and a reason that starts with the delay.
REFUSAL = re.compile(r"retry_after_s=(\d+); reason=(\w+); ")
STARTED = "started"


def serve(
    tmp: Path, name: str, limit_mb: int, settings: dict[str, str] | None = None
) -> AbstractContextManager[serverkit.Served]:
    (tmp / "notebook.py").write_text(NOTEBOOK)
    argv = [
        str(Path(sys.executable).with_name("uvicorn")),
        *("--app-dir", str(APP_DIR), "guarded_marimo:app", "--port", "{port}"),
    ]
    return serverkit.serve_in_group(
        argv, limit_mb=limit_mb, name=name, ready_path=READY, env=settings or {}, cwd=tmp
    )


async def session(
    base_url: str, session_id: str, decided: Callable[[str], None], hold: Awaitable[None]
) -> None:
    """One notebook session as marimo's front end opens it: ``decided`` gets
    :data:`STARTED` once its notebook has run, or how it ended; it stays open until
    ``hold`` is done."""
    url = base_url.replace("http://", "ws://") + f"/nb/ws?session_id={session_id}"
    try:
        async with websockets.connect(url, origin=Origin(base_url), open_timeout=60) as socket:
            while json.loads(await socket.recv()).get("op") != "completed-run":
                pass
            decided(STARTED)
            await hold
    except websockets.ConnectionClosed as closed:
        code, reason = (closed.rcvd.code, closed.rcvd.reason) if closed.rcvd else (None, "")
        decided(f"closed {code} {reason}")
    except (OSError, TimeoutError, websockets.InvalidHandshake) as exc:
        decided(type(exc).__name__)


async def _burst(base_url: str, prefix: str, n: int, held: Callable[[list[str]], None]) -> None:
    """``n`` sessions opened at once, with ids shaped as marimo's page makes them
    (``s_`` and six of ``[0-9a-z]``: ``prefix`` is three); ``held`` gets how each was
    decided while the started ones are still open, and they close when it returns."""
    loop = asyncio.get_running_loop()
    outcomes = [loop.create_future() for _ in range(n)]
    hold = loop.create_future()
    tasks = [
        asyncio.create_task(session(base_url, f"s_{prefix}{i:03d}", outcomes[i].set_result, hold))
        for i in range(n)
    ]
    decided = await asyncio.gather(*outcomes)
    await asyncio.to_thread(held, list(decided))
    hold.set_result(None)
    await asyncio.gather(*tasks)


def burst(served: serverkit.Served, prefix: str, n: int) -> tuple[list[str], int]:
    """A burst of ``n`` sessions: how each was decided and the group's settled working
    set while the started ones were still open."""
    seen: list[tuple[list[str], int]] = []
    asyncio.run(
        _burst(
            served.base_url,
            prefix,
            n,
            lambda decided: seen.append((decided, serverkit.settled_peak(served.group))),
        )
    )
    return seen[0]


@pytest.fixture(scope="module")
def footprint(tmp_path_factory: pytest.TempPathFactory) -> int:
    """One session's footprint: the group's settled working set before and after one."""
    serverkit.require_server("marimo")
    with serve(tmp_path_factory.mktemp("mo_one"), "marimo_one", 2048) as served:
        time.sleep(1)
        before = serverkit.settled_peak(served.group, quiet_s=1.0)
        decided, after = burst(served, "one", 1)
        assert decided == [STARTED], decided
        return after - before


def result_of(
    decided: list[str], settled: int, *, footprint: int, baseline: int, served: serverkit.Served
) -> serverkit.BurstResult:
    refusals = [m for m in (REFUSAL.search(d) for d in decided) if m]
    return serverkit.BurstResult(
        footprint_mb=round(footprint / MIB, 1),
        baseline_mb=round(baseline / MIB, 1),
        capacity=serverkit.capacity(LIMIT_MB, baseline, footprint),
        sessions=len(decided),
        admitted=decided.count(STARTED),
        alive_kernels=decided.count(STARTED),
        refused=len(refusals),
        retry_after_ok=all(d.startswith("closed 1013 ") for d in decided if d != STARTED),
        other=[d for d in decided if d != STARTED and not REFUSAL.search(d)],
        oom_kills=oom_kills(served.group),
        server_alive=served.alive(READY),
        settled_mb=round(settled / MIB, 1),
        reasons=dict(Counter(m.group(2) for m in refusals)),
    )


@pytest.mark.parametrize(
    "settings",
    [{}, {"ADMISSION_SESSION_RESERVE_MB": "8"}],
    ids=["defaults", "reserve_10x_too_small"],
)
def test_first_burst_of_notebook_sessions_is_cut_at_capacity(
    footprint: int, tmp_path: Path, settings: dict[str, str]
) -> None:
    """A first burst of 24 notebook WebSockets on a fresh guarded marimo, in a group with
    capacity for a handful, with the guard's defaults or a reserve set ten times too small,
    starts capacity give or take one kernels, refuses the rest with a 1013 close carrying
    Retry-After, and the kernel's OOM killer kills nothing; closing them all frees
    nothing (marimo keeps their kernels), and a second burst then is not admitted into
    memory that is still held."""
    with serve(tmp_path, "marimo_burst", LIMIT_MB, settings) as served:
        time.sleep(1)
        baseline = working_set_bytes(served.group)
        first = result_of(
            *burst(served, "fst", SESSIONS), footprint=footprint, baseline=baseline, served=served
        )
        print(first.summary())
        assert first.capacity >= 3, first.summary()
        assert first.oom_kills == 0, first.summary()
        assert first.server_alive, first.summary()
        assert first.capacity - 1 <= first.admitted <= first.capacity + 1, first.summary()
        assert first.admitted + first.refused == SESSIONS, first.summary()
        assert first.retry_after_ok, first.summary()

        # The first burst's sockets are closed; their kernels live on for marimo's
        # session TTL (120 s), and so does their memory.
        time.sleep(1)
        held = working_set_bytes(served.group)
        capacity = serverkit.capacity(LIMIT_MB, held, footprint)
        second = result_of(
            *burst(served, "snd", 2 * first.capacity),
            footprint=footprint,
            baseline=held,
            served=served,
        )
        print({"held_mb": round(held / MIB, 1), "capacity": capacity, **second.summary()})
        assert held > baseline + (first.admitted - 0.5) * footprint, (held, first.summary())
        assert second.oom_kills == 0, second.summary()
        assert second.server_alive, second.summary()
        assert second.admitted <= capacity + 1, (capacity, second.summary())
        assert second.retry_after_ok, second.summary()
