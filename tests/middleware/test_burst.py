"""A burst of concurrent session requests cannot all pass the same reading."""

from __future__ import annotations

import asyncio

import httpx
from mwkit import SettableReader, guard
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


def test_burst_admits_exactly_what_the_reserve_allows() -> None:
    """60 concurrent openings against a held-open handler: 14 admitted, 46 refused with 503."""
    # 100 MiB used of 1000 MiB, high watermark 80%, 50 MiB per session:
    # 100 + n * 50 <= 800 admits n = 14 sessions while all are still pending.
    release = asyncio.Event()

    async def open_session(request: Request) -> Response:
        await release.wait()
        return PlainTextResponse("opened")

    app = Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])
    reader = SettableReader(used_mb=100, limit_mb=1000)
    mw = guard(app, reader, reserve_mb=50, registry=None)

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            tasks = [asyncio.create_task(client.post("/sessions")) for _ in range(60)]
            for _ in range(400):  # the refusals answer at once; give them up to 2 s
                if sum(task.done() for task in tasks) >= 46:
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.05)
            assert sum(task.done() for task in tasks) == 46
            assert mw.session_counts() == (0, 14)
            release.set()
            return await asyncio.gather(*tasks)

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) == 14
    assert statuses.count(503) == 46
    assert all(r.headers["retry-after"].isdigit() for r in responses if r.status_code == 503)
    assert mw.session_counts() == (0, 0)
    assert reader.calls == 60
