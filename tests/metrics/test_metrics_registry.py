"""Registries: injected, ``None`` for none, no "Duplicated timeseries", errors tolerated."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
from metricskit import SettableReader, guarded_app, request
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from asgi_admission import AdmissionConfig, CapacityDecision, CgroupMemoryReader, MemoryReading
from asgi_admission._admission.decision.observer import Kind
from asgi_admission._metrics.collector import AdmissionCollector
from asgi_admission._metrics.decisions import DecisionMetrics
from asgi_admission._metrics.instrument import expose
from kits.cgroup_trees import write_v2_tree
from kits.suitekit import MIB

#: Internal on purpose: the collector and decision metrics, registered by hand.
INTERNAL = "the collector and decision metrics, registered by hand"


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[Kind, CapacityDecision]] = []
        self.checks: list[CapacityDecision] = []

    def on_decision(self, kind: Kind, decision: CapacityDecision, seconds: float) -> None:
        self.seen.append((kind, decision))

    def on_check(self, decision: CapacityDecision) -> None:
        self.checks.append(decision)


class View:
    """A stand-in guard: what a collector may read."""

    def __init__(self, reader: Any, counts: Any = (1, 2)) -> None:
        from metricskit import controller

        self.config = AdmissionConfig()
        self.controller = controller(reader)
        self.session_limit = 7
        self._counts = counts

    def session_counts(self) -> tuple[int, int]:
        if isinstance(self._counts, Exception):
            raise self._counts
        counts: tuple[int, int] = self._counts
        return counts


def names(registry: CollectorRegistry) -> set[str]:
    return {m.name for m in registry.collect()}


def test_building_twice_on_one_registry_shares_counters(registry: CollectorRegistry) -> None:
    """A second app on the same registry neither raises nor loses counts; gauges follow it."""
    first = guarded_app(SettableReader(used_mb=100), registry)
    assert request(first, "POST", "/sessions").status_code == 201
    second = guarded_app(SettableReader(used_mb=300), registry)
    assert request(second, "POST", "/sessions").status_code == 201
    labels = {"kind": "http", "outcome": "admitted", "reason": "none"}
    assert registry.get_sample_value("asgi_admission_decisions_total", labels) == 2
    assert registry.get_sample_value("asgi_admission_memory_working_set_bytes") == 300 * MIB
    generate_latest(registry)  # one family per name: the exposition is valid


def test_every_live_guard_on_one_registry_is_described(registry: CollectorRegistry) -> None:
    """Two guards on one registry both count: sessions and limits are their sums, the
    state is pressured while either latch is set; a guard that is gone drops out."""
    first, second = View(SettableReader(used_mb=100), counts=(1, 2)), View(SettableReader())
    second._counts = (3, 0)
    expose(first, registry=registry)
    expose(second, registry=registry)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(f"asgi_admission_{name}", labels)

    assert (sample("sessions", state="active"), sample("sessions", state="pending")) == (4, 2)
    assert sample("session_limit") == 14
    assert sample("state", state="normal") == 1
    first.controller.decide(MemoryReading(used_bytes=MIB, limit_bytes=MIB, available=True), 0, 7)
    assert first.controller.pressure_state == "pressured"
    assert sample("state", state="pressured") == 1
    generate_latest(registry)  # still one family per name
    del first
    gc.collect()
    assert (sample("sessions", state="active"), sample("session_limit")) == (3, 7)
    assert sample("state", state="normal") == 1


def test_default_registry_twice() -> None:
    """Without ``registry=`` the global registry is used, and building twice is fine:
    once the first app is gone, the registry describes the second alone."""
    gc.collect()  # other tests' guards may live on (a module-level app): count from here
    before = REGISTRY.get_sample_value("asgi_admission_session_limit") or 0
    apps = [guarded_app(SettableReader(), REGISTRY) for _ in range(2)]
    for app in apps:
        request(app, "POST", "/sessions")
    assert REGISTRY.get_sample_value("asgi_admission_session_limit") == before + 200
    del apps[0]
    gc.collect()
    assert REGISTRY.get_sample_value("asgi_admission_session_limit") == before + 100


def test_registry_none_registers_nothing(registry: CollectorRegistry) -> None:
    """``registry=None`` leaves every registry untouched and an observer still hears decisions."""
    recorder = Recorder()
    app = guarded_app(SettableReader(), None, observer=recorder)
    before = names(REGISTRY)
    assert request(app, "POST", "/sessions").status_code == 201
    assert names(REGISTRY) == before
    assert [kind for kind, _ in recorder.seen] == ["http"]


def test_explicit_observer_is_told_as_well_as_the_metrics(registry: CollectorRegistry) -> None:
    """An ``observer=`` does not switch metrics off: both see each decision."""
    recorder = Recorder()
    app = guarded_app(SettableReader(), registry, observer=recorder)
    request(app, "POST", "/sessions")
    labels = {"kind": "http", "outcome": "admitted", "reason": "none"}
    assert registry.get_sample_value("asgi_admission_decisions_total", labels) == 1
    assert len(recorder.seen) == 1


def test_an_observer_sees_every_decision_with_its_reading(
    registry: CollectorRegistry, tmp_path: Path
) -> None:
    """With an ``observer=`` no admission skips building its decision: each one reaches
    the observer with the reading it was decided on (the bound where that decided)."""
    tree = write_v2_tree(tmp_path / "cgroup", used_mb=100, limit_mb=1000)
    recorder = Recorder()
    app = guarded_app(CgroupMemoryReader(str(tree)), registry, observer=recorder)
    for _ in range(3):
        assert request(app, "POST", "/sessions").status_code == 201
    readings = [decision.memory for _, decision in recorder.seen]
    assert [(m.used_bytes, m.limit_bytes) for m in readings] == [(100 * MIB, 1000 * MIB)] * 3
    assert [m.exact for m in readings] == [True, False, False]
    labels = {"kind": "http", "outcome": "admitted", "reason": "none"}
    assert registry.get_sample_value("asgi_admission_decisions_total", labels) == 3


def test_decision_metrics_unregistered() -> None:
    """``DecisionMetrics(registry=None)`` counts without registering anywhere."""
    metrics = DecisionMetrics(registry=None)
    assert not metrics.live_sessions
    metrics.on_sessions(1, 1)  # no livesum gauge outside multiprocess mode: nothing to do


def test_reader_errors_give_fewer_samples(registry: CollectorRegistry) -> None:
    """A reader that raises leaves the memory gauges out and the state unavailable."""
    reader = SettableReader()
    reader.fail = OSError("cgroup gone")
    registry.register(AdmissionCollector(View(reader)))
    got = names(registry)
    assert "asgi_admission_memory_working_set_bytes" not in got
    assert "asgi_admission_session_limit" in got
    assert registry.get_sample_value("asgi_admission_state", {"state": "unavailable"}) == 1


def test_session_count_errors_give_fewer_samples(registry: CollectorRegistry) -> None:
    """A view whose counts fail still exports the memory gauges."""
    registry.register(AdmissionCollector(View(SettableReader(), counts=RuntimeError("boom"))))
    got = names(registry)
    assert "asgi_admission_sessions" not in got
    assert "asgi_admission_session_limit" not in got
    assert "asgi_admission_memory_usage_ratio" in got


def test_plain_function_reader_is_called(registry: CollectorRegistry) -> None:
    """A reader without ``read()`` is simply called (no PSI)."""
    reading = MemoryReading(used_bytes=10 * MIB, limit_bytes=100 * MIB, available=True)
    registry.register(AdmissionCollector(View(lambda: reading)))
    assert registry.get_sample_value("asgi_admission_memory_usage_ratio") == pytest.approx(0.1)


def test_unbound_collector_exports_build_info_only(registry: CollectorRegistry) -> None:
    """Without a view only ``build_info`` is exported; ``describe`` names every family."""
    collector = AdmissionCollector()
    registry.register(collector)
    assert names(registry) == {"asgi_admission_build_info"}
    described = {m.name for m in collector.describe()}
    assert "asgi_admission_sessions" in described
    assert len(described) == 22
    without = {m.name for m in AdmissionCollector(include_sessions=False).describe()}
    assert described - without == {"asgi_admission_sessions"}


def test_ceiling_clamps_at_zero(registry: CollectorRegistry) -> None:
    """With more reserve pending than the watermark allows, the ceiling reads 0."""
    registry.register(AdmissionCollector(View(SettableReader(), counts=(0, 200))))
    assert registry.get_sample_value("asgi_admission_admission_ceiling_ratio") == 0
