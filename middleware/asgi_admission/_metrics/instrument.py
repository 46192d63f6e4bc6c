"""How a guard is instrumented on a registry: the observer of its decisions, its view.

A guard is told which observer to tell of its decisions (:func:`instrument`), and
once its service exists the registry's collector describes it (:func:`expose`).

Notes:

- "Duplicated timeseries": metrics belong to a registry, not to a guard. The
  collector and the counters are made once per registry (:func:`registry_binding`)
  and shared by every guard built on it, so building an app twice never raises.
- Multiprocess mode without a shared ledger: session counts are per worker, exported
  by a ``livesum`` gauge (:meth:`DecisionMetrics.on_sessions`), from which a dead
  worker drops out.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, values

from asgi_admission._admission.decision.latch import CapacityDecision
from asgi_admission._admission.decision.observer import AdmissionView, DecisionObserver, Kind
from asgi_admission._admission.ledger.ledger import SessionLedger
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from asgi_admission._metrics.collector import AdmissionCollector
from asgi_admission._metrics.decisions import DecisionMetrics
from asgi_admission._metrics.queue import QueueMetrics

logger = logging.getLogger("asgi_admission")


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (prometheus_client's multiprocess switch)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def _values_are_multiprocess() -> bool:
    cls = values.ValueClass
    return bool(getattr(cls, "_multiprocess", cls.__name__ == "MmapedValue"))


@dataclass(frozen=True, slots=True)
class _Binding:
    """A registry's scrape-time collector, decision counters and wait queue metrics."""

    collector: AdmissionCollector
    metrics: DecisionMetrics
    queue: QueueMetrics


_bindings: weakref.WeakKeyDictionary[CollectorRegistry, _Binding] = weakref.WeakKeyDictionary()
_bindings_lock = threading.Lock()


def registry_binding(registry: CollectorRegistry, *, shared: bool) -> _Binding:
    """The registry's collector and counters, registered there at the first call."""
    with _bindings_lock:
        binding = _bindings.get(registry)
        if binding is not None:
            return binding
        multiprocess = multiprocess_dir() is not None
        if multiprocess and not _values_are_multiprocess():
            logger.warning(
                "asgi-admission: PROMETHEUS_MULTIPROC_DIR was set after prometheus_client "
                "was imported, so this worker's counters stay in memory and a multiprocess "
                "scrape will not see them; set it in the environment the server starts with."
            )
        # A shared ledger's counts are container-wide already: the scraping worker's
        # collector exports them once, where a livesum would add them once per worker.
        live_sessions = multiprocess and not shared
        metrics = DecisionMetrics(registry=registry, live_sessions=live_sessions)
        collector = AdmissionCollector(include_sessions=not live_sessions)
        registry.register(collector)
        queue = QueueMetrics(registry=registry)
        binding = _bindings[registry] = _Binding(collector, metrics, queue)
        return binding


def bound_collector(registry: CollectorRegistry) -> AdmissionCollector | None:
    """The scrape-time collector registered on ``registry``, if any."""
    with _bindings_lock:
        binding = _bindings.get(registry)
    return binding.collector if binding is not None else None


class _Both:
    """Tells two observers of each decision: the metrics first, then the caller's own."""

    __slots__ = ("_first", "_first_check", "_second", "_second_check")

    def __init__(self, first: DecisionObserver, second: DecisionObserver) -> None:
        self._first = first.on_decision
        self._second = second.on_decision
        self._first_check = first.on_check
        self._second_check = second.on_check

    def on_decision(self, kind: Kind, decision: CapacityDecision, seconds: float) -> None:
        self._first(kind, decision, seconds)
        self._second(kind, decision, seconds)

    def on_check(self, decision: CapacityDecision) -> None:
        self._first_check(decision)
        self._second_check(decision)


class _LiveSessions:
    """Multiprocess mode: republishes this worker's session counts whenever they change,
    outside the ledger lock, since ``session_counts`` takes it."""

    __slots__ = ("_counts", "_metrics")

    def __init__(self, metrics: DecisionMetrics, counts: Callable[[], tuple[int, int]]) -> None:
        self._metrics = metrics
        self._counts = counts

    def publish(self) -> None:
        active, pending = self._counts()
        self._metrics.on_sessions(active, pending)

    def on_decision(self, kind: Kind, decision: CapacityDecision, seconds: float) -> None:
        self._metrics.on_decision(kind, decision, seconds)
        self.publish()

    def on_check(self, decision: CapacityDecision) -> None:
        self._metrics.on_check(decision)


def _calls(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        first()
        then()

    return both


def instrument(
    ledger: SessionLedger,
    counts: Callable[[], tuple[int, int]],
    *,
    registry: CollectorRegistry | None = REGISTRY,
    observer: DecisionObserver | None = None,
    on_change: Callable[[], None] | None = None,
) -> DecisionObserver | None:
    """The observer a guard should tell of its decisions to export its metrics on ``registry``.

    An explicit ``observer`` is told of every decision after the metrics. The ledger
    tells of its changes to republish the ``livesum`` session gauge (multiprocess mode),
    then ``on_change`` (the wait queue's wake).
    """
    chosen: DecisionObserver | None = None
    publish: Callable[[], None] | None = None
    if registry is not None:
        metrics = registry_binding(registry, shared=isinstance(ledger, SharedLedger)).metrics
        chosen = metrics
        if metrics.live_sessions:
            live = _LiveSessions(metrics, counts)
            chosen = live
            publish = live.publish
    if publish is not None:
        ledger.tell_changes(publish if on_change is None else _calls(publish, on_change))
    elif on_change is not None:
        ledger.tell_changes(on_change)
    if observer is not None:
        chosen = observer if chosen is None else _Both(chosen, observer)
    return chosen


def queue_metrics(
    ledger: SessionLedger, *, registry: CollectorRegistry | None = REGISTRY
) -> QueueMetrics | None:
    """The wait queue's metrics on ``registry`` (``None``: none)."""
    if registry is None:
        return None
    return registry_binding(registry, shared=isinstance(ledger, SharedLedger)).queue


def expose(view: AdmissionView, *, registry: CollectorRegistry | None = REGISTRY) -> None:
    """Export what ``view`` shows at scrape time on ``registry``, for as long as it lives."""
    if registry is not None:
        registry_binding(registry, shared=False).collector.add(view)
