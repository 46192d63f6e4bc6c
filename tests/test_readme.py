"""The README stays short, its Python examples run, and its links reach the documentation."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import cast

import httpx
import pytest
from fastapi import FastAPI
from starlette.applications import Starlette

from kits.suitekit import ROOT


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_python_examples() -> None:
    """The README shows the quick start for FastAPI and for Starlette."""
    assert len(BLOCKS) == 2
    assert "from fastapi import FastAPI" in BLOCKS[0]
    assert "from starlette.applications import Starlette" in BLOCKS[1]


def test_readme_is_short_and_links_every_documentation_page() -> None:
    """At most about 200 lines, with a working link to each page of the documentation site."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    pages = sorted(p.name for p in (README.parent / "docs").glob("*.md"))
    for page in pages:
        assert f"(docs/{page}" in text, page
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (README.parent / target).exists(), target


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_blocks_compile(index: int) -> None:
    """Every Python block in the README is valid Python."""
    compile(BLOCKS[index], f"README.md python block {index}", "exec")


@pytest.mark.anyio
async def test_starlette_quick_start_guards_sessions_and_serves_metrics(
    fixture_copy: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Starlette quick start admits a session, answers readiness and serves /metrics."""
    tree = fixture_copy("telegraf/v2")
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tree))
    monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "1")
    namespace: dict[str, object] = {}
    exec(BLOCKS[1], namespace)
    # The README block binds ``app``; exec's namespace is untyped, so name what it holds.
    transport = httpx.ASGITransport(app=cast(Starlette, namespace["app"]))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.post("/sessions")).status_code == 201
        assert (await client.get("/admission/ready")).json()["state"] == "normal"
        assert "asgi_admission_memory_usage_ratio" in (await client.get("/metrics")).text


@pytest.mark.anyio
async def test_quick_start_guards_sessions_and_serves_metrics(
    fixture_copy: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick start admits a session under the limit, answers readiness and /metrics."""
    tree = fixture_copy("telegraf/v2")  # 4.5 GB working set of a 96 GiB limit
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tree))
    namespace: dict[str, object] = {}
    exec(BLOCKS[0], namespace)
    app = cast(FastAPI, namespace["app"])

    @app.post("/sessions")
    async def open_session() -> dict[str, str]:
        return {"id": "1"}

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.post("/sessions")).status_code == 200
        ready = await client.get("/admission/ready")
        assert ready.status_code == 200
        assert ready.json()["state"] == "normal"
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200
        assert 'asgi_admission_decisions_total{kind="http",outcome="admitted",reason="none"}' in (
            metrics.text
        )
        assert "asgi_admission_memory_usage_ratio" in metrics.text
