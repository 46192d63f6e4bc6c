"""Multiprocess mode in one process: mmap-backed counters, a live-sum session gauge."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from metricskit import SettableReader, guarded_app, request, websocket
from prometheus_client import CollectorRegistry, values
from prometheus_client.parser import text_string_to_metric_families

from kits.suitekit import MIB

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def multiproc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``PROMETHEUS_MULTIPROC_DIR`` set, and prometheus_client writing values to mmap files.

    prometheus_client picks its value class when it is imported; a real worker has
    the variable set before that, so the test swaps the class in as that would.
    """
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    value_class = values.MultiProcessValue(lambda: 4242)  # type: ignore[no-untyped-call]
    monkeypatch.setattr(values, "ValueClass", value_class)
    yield tmp_path
    close_all_files = getattr(value_class, "close_all_files", None)  # prometheus-client >= 0.21
    if close_all_files is not None:
        close_all_files()


def scrape(app: Any) -> Samples:
    text = request(app, "GET", "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def decisions(samples: Samples, kind: str) -> float:
    labels = (("kind", kind), ("outcome", "admitted"), ("reason", "none"))
    return samples[("asgi_admission_decisions_total", labels)]


def sessions(samples: Samples, state: str) -> float:
    return samples[("asgi_admission_sessions", (("state", state),))]


def test_counters_and_live_sessions_come_from_the_files(
    multiproc: Path, registry: CollectorRegistry
) -> None:
    """The scrape merges the mmap files and adds one fresh reading; sessions follow releases."""
    app = guarded_app(SettableReader(), registry)

    async def scenario() -> None:
        app.state.proceed, app.state.entered = anyio.Event(), anyio.Event()
        transport = httpx.ASGITransport(app=app)
        async with (
            httpx.AsyncClient(transport=transport, base_url="http://test") as client,
            anyio.create_task_group() as tg,
        ):
            tg.start_soon(client.post, "/sessions")
            with anyio.fail_after(5):
                await app.state.entered.wait()
            during = await client.get("/metrics")
            assert 'asgi_admission_sessions{state="pending"} 1.0' in during.text
            app.state.proceed.set()

    anyio.run(scenario)
    assert (multiproc / "counter_4242.db").exists()
    assert (multiproc / "gauge_livesum_4242.db").exists()
    samples = scrape(app)
    assert decisions(samples, "http") == 1
    assert sessions(samples, "pending") == 0
    assert samples[("asgi_admission_memory_working_set_bytes", ())] == 100 * MIB
    assert [k for k in samples if k[0] == "asgi_admission_build_info"]

    app.state.proceed = None
    assert websocket(app, "/terminal/x")[0]["type"] == "websocket.accept"
    samples = scrape(app)
    assert decisions(samples, "websocket") == 1
    assert sessions(samples, "active") == 0  # closed again: released


def test_late_multiprocess_dir_is_warned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Setting the directory after prometheus_client chose in-memory values logs why it fails."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        guarded_app(SettableReader(), CollectorRegistry()).build_middleware_stack()
    assert "was set after prometheus_client was imported" in caplog.text


def test_multiprocess_scrape_without_a_guard(multiproc: Path, registry: CollectorRegistry) -> None:
    """Before any guard is built the scrape holds the files' metrics only, and filters work."""
    from prometheus_client import Counter

    from asgi_admission import metrics_app

    Counter("worker_jobs", "Jobs.", registry=registry).inc(3)
    app = metrics_app(registry)
    assert "worker_jobs_total 3.0" in request(app, "GET", "/metrics").text
    assert "asgi_admission_build_info" not in request(app, "GET", "/metrics").text
    only = request(app, "GET", "/metrics?name[]=nothing_total").text
    assert "worker_jobs" not in only


def test_readiness_transitions_are_counted_in_multiprocess_mode(
    multiproc: Path, registry: CollectorRegistry
) -> None:
    """A readiness probe that sets the latch is counted in the mmap-backed counters too."""
    reader = SettableReader(used_mb=100, limit_mb=1000)
    app = guarded_app(reader, registry, readiness_path="/ready")
    reader.set_mb(900)
    assert request(app, "GET", "/ready").status_code == 503
    samples = scrape(app)
    assert samples[("asgi_admission_latch_transitions_total", (("to", "pressured"),))] == 1
    assert decisions(samples, "http") == 0
