"""How a guard's admission is instrumented: the observer of its decisions, its view.

A guard is told which observer to tell of its decisions (:func:`instrument`), and
once its service exists the registry's collector describes it (:func:`expose`).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry

from asgi_admission._admission.decision.latch import CapacityDecision
from asgi_admission._admission.decision.observer import AdmissionView, DecisionObserver, Kind
from asgi_admission._admission.ledger.ledger import SessionLedger
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from asgi_admission._metrics.collector import registry_binding
from asgi_admission._metrics.decisions import DecisionMetrics
from asgi_admission._metrics.queue import QueueMetrics


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
