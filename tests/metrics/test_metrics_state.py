"""Every exported metric follows the guard through normal → pressured → normal."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from metricskit import SettableReader, guarded_app, request, websocket
from prometheus_client import CollectorRegistry

from asgi_admission import CgroupMemoryReader, MemoryReading, __version__
from kits.cgroup_trees import write_v2_tree
from kits.suitekit import MIB

P = "asgi_admission_"


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(P + name, labels)


def decisions(registry: CollectorRegistry, kind: str, outcome: str, reason: str) -> float | None:
    return value(registry, "decisions_total", kind=kind, outcome=outcome, reason=reason)


def state(registry: CollectorRegistry) -> dict[str, float | None]:
    return {s: value(registry, "state", state=s) for s in ("normal", "pressured", "unavailable")}


def test_metric_types_and_labels(registry: CollectorRegistry) -> None:
    """Each family of the table is exported with its type and its bounded label names."""
    reader = SettableReader()
    reader.psi = 1.5
    _guard = guarded_app(reader, registry).build_middleware_stack()  # kept alive while read
    families = {m.name: m for m in registry.collect()}
    expected = {
        "memory_working_set_bytes": ("gauge", set()),
        "memory_limit_bytes": ("gauge", set()),
        "memory_reclaimable_bytes": ("gauge", set()),
        "memory_usage_ratio": ("gauge", set()),
        "memory_pressure_stall_ratio": ("gauge", set()),
        "admission_ceiling_ratio": ("gauge", set()),
        "high_watermark_ratio": ("gauge", set()),
        "resume_threshold_ratio": ("gauge", set()),
        "session_reserve_bytes": ("gauge", set()),
        "state": ("gauge", {"state"}),
        "sessions": ("gauge", {"state"}),
        "session_limit": ("gauge", set()),
        "decisions": ("counter", {"kind", "outcome", "reason"}),
        "latch_transitions": ("counter", {"to"}),
        "telemetry_failures": ("counter", set()),
        "decision_duration_seconds": ("histogram", set()),
        "queue_waiting": ("gauge", {"class"}),
        "queue_wait_seconds": ("histogram", {"class", "outcome"}),
        # Per class where classes are configured: none here, so no sample.
        "class_decisions": ("counter", set()),
        "build_info": ("gauge", {"version"}),
        # Learned per route: no sample (so no label) before the first session is observed.
        "session_footprint_bytes": ("gauge", set()),
        "session_ramp_seconds": ("gauge", set()),
        "admissible_sessions": ("gauge", set()),
        "pending_expired": ("counter", set()),
        "session_requests_failed": ("counter", {"kind", "cause"}),
        "probing_routes": ("gauge", set()),
        "probe_waiting_requests": ("gauge", set()),
        "pressure_stuck": ("gauge", set()),
        "unattributed_bytes": ("gauge", set()),
    }
    assert set(families) == {P + name for name in expected}
    for name, (kind, labels) in expected.items():
        family = families[P + name]
        assert family.type == kind, name
        sample_labels = {k for s in family.samples for k in s.labels} - {"le"}
        assert sample_labels == labels, name
    buckets = [
        s.labels["le"]
        for s in families[P + "decision_duration_seconds"].samples
        if "le" in s.labels
    ]
    assert buckets[0] == "1e-06"
    assert buckets[-2:] == ["0.01", "+Inf"]
    assert value(registry, "build_info", version=__version__) == 1


def test_counters_start_at_zero_for_every_reachable_combination(
    registry: CollectorRegistry,
) -> None:
    """Before any decision every kind × outcome × reason a decision can carry reads 0."""
    _guard = guarded_app(
        SettableReader(), registry
    ).build_middleware_stack()  # kept alive while read
    for kind in ("http", "websocket"):
        assert decisions(registry, kind, "admitted", "none") == 0
        for reason in ("memory_pressure", "session_limit", "telemetry_unavailable", "ledger_busy"):
            assert decisions(registry, kind, "rejected", reason) == 0
    assert value(registry, "latch_transitions_total", to="pressured") == 0
    assert value(registry, "latch_transitions_total", to="normal") == 0
    assert value(registry, "telemetry_failures_total") == 0
    assert value(registry, "decision_duration_seconds_count") == 0


def test_normal_pressured_normal(registry: CollectorRegistry) -> None:
    """Gauges and counters follow the latch as memory climbs past high and falls below resume."""
    reader = SettableReader(used_mb=100, limit_mb=1000)
    reader.psi = 2.5
    app = guarded_app(reader, registry)
    # normal
    assert request(app, "POST", "/sessions").status_code == 201
    assert state(registry) == {"normal": 1, "pressured": 0, "unavailable": 0}
    assert value(registry, "memory_working_set_bytes") == 100 * MIB
    assert value(registry, "memory_limit_bytes") == 1000 * MIB
    assert value(registry, "memory_reclaimable_bytes") == 5 * MIB
    assert value(registry, "memory_usage_ratio") == pytest.approx(0.1)
    assert value(registry, "memory_pressure_stall_ratio") == pytest.approx(0.025)
    assert value(registry, "high_watermark_ratio") == pytest.approx(0.8)
    assert value(registry, "resume_threshold_ratio") == pytest.approx(0.7)
    assert value(registry, "session_reserve_bytes") == 10 * MIB
    assert value(registry, "admission_ceiling_ratio") == pytest.approx(0.79)
    assert value(registry, "session_limit") == 100
    assert value(registry, "sessions", state="active") == 0
    assert value(registry, "sessions", state="pending") == 0
    assert decisions(registry, "http", "admitted", "none") == 1

    # pressured: past the high watermark
    reader.set_mb(850)
    assert value(registry, "state", state="normal") == 1  # a scrape never moves the latch
    assert request(app, "POST", "/sessions").status_code == 503
    assert state(registry) == {"normal": 0, "pressured": 1, "unavailable": 0}
    assert value(registry, "memory_usage_ratio") == pytest.approx(0.85)
    assert value(registry, "latch_transitions_total", to="pressured") == 1
    assert decisions(registry, "http", "rejected", "memory_pressure") == 1

    # still pressured between resume and high: no new transition
    reader.set_mb(750)
    assert request(app, "POST", "/sessions").status_code == 503
    assert value(registry, "latch_transitions_total", to="pressured") == 1
    assert decisions(registry, "http", "rejected", "memory_pressure") == 2
    assert state(registry)["pressured"] == 1

    # normal again below resume
    reader.set_mb(600)
    assert websocket(app, "/terminal/x")[0]["type"] == "websocket.accept"
    assert state(registry) == {"normal": 1, "pressured": 0, "unavailable": 0}
    assert value(registry, "latch_transitions_total", to="normal") == 1
    assert decisions(registry, "websocket", "admitted", "none") == 1
    assert value(registry, "telemetry_failures_total") == 0
    assert value(registry, "decision_duration_seconds_count") == 4
    assert 0 < (value(registry, "decision_duration_seconds_sum") or 0) < 1


def test_telemetry_loss_and_session_limit(registry: CollectorRegistry) -> None:
    """Blind decisions count as telemetry failures; the state reads unavailable; caps refuse."""
    reader = SettableReader()
    app = guarded_app(reader, registry, max_sessions=0)
    assert request(app, "POST", "/sessions").status_code == 503
    assert decisions(registry, "http", "rejected", "session_limit") == 1
    reader.lose()
    assert request(app, "POST", "/sessions").status_code == 503
    closed = websocket(app, "/terminal/x")[-1]  # refused: accepted, then closed with 1013
    assert (closed["type"], closed["code"]) == ("websocket.close", 1013)
    assert decisions(registry, "http", "rejected", "telemetry_unavailable") == 1
    assert decisions(registry, "websocket", "rejected", "telemetry_unavailable") == 1
    assert value(registry, "telemetry_failures_total") == 2
    assert state(registry) == {"normal": 0, "pressured": 0, "unavailable": 1}
    for absent in ("memory_working_set_bytes", "memory_limit_bytes", "memory_usage_ratio"):
        assert value(registry, absent) is None
    assert value(registry, "session_reserve_bytes") == 10 * MIB


def test_unlimited_memory_has_no_limit_or_ratio(registry: CollectorRegistry) -> None:
    """While unlimited the limit, ratio and ceiling are absent and the state is unavailable."""
    _guard = guarded_app(
        SettableReader(limit_mb=None), registry
    ).build_middleware_stack()  # kept alive while read
    assert value(registry, "memory_working_set_bytes") == 100 * MIB
    for absent in ("memory_limit_bytes", "memory_usage_ratio", "admission_ceiling_ratio"):
        assert value(registry, absent) is None
    assert value(registry, "memory_pressure_stall_ratio") is None
    assert state(registry)["unavailable"] == 1


def test_no_memory_limit_is_not_a_telemetry_failure(registry: CollectorRegistry) -> None:
    """Unlimited memory: refusals at the cap say no_memory_limit and no failure is counted."""
    reader = SettableReader(limit_mb=None)
    app = guarded_app(reader, registry, max_sessions=0, readiness_path="/ready")
    for _ in range(3):
        assert request(app, "POST", "/sessions").status_code == 503
    assert request(app, "GET", "/ready").status_code == 200
    closed = websocket(app, "/terminal/x")[-1]
    assert (closed["type"], closed["code"]) == ("websocket.close", 1013)
    assert decisions(registry, "http", "rejected", "no_memory_limit") == 3
    assert decisions(registry, "websocket", "rejected", "no_memory_limit") == 1
    assert decisions(registry, "http", "rejected", "telemetry_unavailable") == 0
    assert value(registry, "telemetry_failures_total") == 0
    assert state(registry)["unavailable"] == 1
    assert value(registry, "session_reserve_bytes") == 10 * MIB


def test_current_sessions_and_pending_follow_the_guard(registry: CollectorRegistry) -> None:
    """``sessions`` reports the app's active count and the requests admitted but in flight."""

    async def scenario() -> None:
        app = guarded_app(SettableReader(), registry, current_sessions=lambda: 3)
        app.state.proceed, app.state.entered = anyio.Event(), anyio.Event()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.post, "/sessions")
                with anyio.fail_after(5):
                    await app.state.entered.wait()
                assert value(registry, "sessions", state="pending") == 1
                assert value(registry, "sessions", state="active") == 3
                assert value(registry, "admission_ceiling_ratio") == pytest.approx(0.78)
                app.state.proceed.set()
            assert value(registry, "sessions", state="pending") == 0

    anyio.run(scenario)


def test_readiness_checks_count_latch_transitions(registry: CollectorRegistry) -> None:
    """A readiness probe that sets or clears the latch is counted, but not as a decision."""
    reader = SettableReader(used_mb=100, limit_mb=1000)
    app = guarded_app(reader, registry, readiness_path="/ready")
    reader.set_mb(850)
    assert request(app, "GET", "/ready").status_code == 503
    assert value(registry, "latch_transitions_total", to="pressured") == 1
    reader.set_mb(100)
    assert request(app, "GET", "/ready").status_code == 200
    assert value(registry, "latch_transitions_total", to="normal") == 1
    reader.lose()
    assert request(app, "GET", "/ready").status_code == 200
    assert value(registry, "telemetry_failures_total") == 1
    assert value(registry, "decision_duration_seconds_count") == 0
    assert decisions(registry, "http", "admitted", "none") == 0


class CountingReader:
    """A real reader over a cgroup tree, counting full readings and bounds."""

    def __init__(self, inner: CgroupMemoryReader) -> None:
        self.inner = inner
        self.full = self.bounds = 0

    def __call__(self) -> MemoryReading:
        self.full += 1
        return self.inner()

    def read(self, *, pressure: bool = False) -> MemoryReading:
        return self.inner.read(pressure=pressure)

    def read_bound(self) -> MemoryReading | None:
        self.bounds += 1
        return self.inner.read_bound()


def test_admissions_the_bound_decides_are_counted_and_timed(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    """Admissions decided on the bound alone (the latch's fast path) are counted and
    timed like any other; near the ceiling and while latched the reading is full."""
    tree = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=1000)
    reader = CountingReader(CgroupMemoryReader(str(tree)))
    app = guarded_app(reader, registry)

    def set_mb(used_mb: int) -> None:
        (tree / "memory.current").write_text(f"{used_mb * MIB}\n")

    for _ in range(5):
        assert request(app, "POST", "/sessions").status_code == 201
    assert (reader.full, reader.bounds) == (1, 4)
    assert decisions(registry, "http", "admitted", "none") == 5
    assert value(registry, "decision_duration_seconds_count") == 5

    set_mb(795)  # the bound with one reserve (805 MiB) passes the 800 MiB ceiling
    assert request(app, "POST", "/sessions").status_code == 503
    assert (reader.full, reader.bounds) == (2, 5)
    assert value(registry, "latch_transitions_total", to="pressured") == 1

    set_mb(100)
    assert request(app, "POST", "/sessions").status_code == 201  # latched: read in full
    assert request(app, "POST", "/sessions").status_code == 201  # clear: the bound again
    assert (reader.full, reader.bounds) == (3, 6)
    assert value(registry, "latch_transitions_total", to="normal") == 1
    assert decisions(registry, "http", "admitted", "none") == 7
    assert decisions(registry, "http", "rejected", "memory_pressure") == 1
    assert value(registry, "decision_duration_seconds_count") == 8
