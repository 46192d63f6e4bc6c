"""The README's Python examples compile, and its quick start serves what it promises."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_readme_has_python_examples() -> None:
    """The README shows at least the quick start and the watchdog in Python."""
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_blocks_compile(index: int) -> None:
    """Every Python block in the README is valid Python."""
    compile(BLOCKS[index], f"README.md python block {index}", "exec")


@pytest.mark.anyio
async def test_quick_start_guards_sessions_and_serves_metrics(
    fixture_copy: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick start admits a session under the limit, answers readiness and /metrics."""
    tree = fixture_copy("telegraf/v2")  # 4.5 GB working set of a 96 GiB limit
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tree))
    namespace: dict[str, object] = {}
    exec(BLOCKS[0], namespace)
    app = namespace["app"]

    @app.post("/sessions")  # type: ignore[attr-defined,misc]
    async def open_session() -> dict[str, str]:
        return {"id": "1"}

    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
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
