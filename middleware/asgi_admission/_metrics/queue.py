"""The scheduler's metrics: how many wait, per class, how long each wait took, and the
decisions of each class.

``asgi_admission_class_decisions_total`` is a family of its own: a new label on
``asgi_admission_decisions_total`` would change every series a dashboard of a guard
without classes already matches. The ``class`` label takes the configured names only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from asgi_admission._admission.decision.latch import CapacityDecision
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS
from asgi_admission._admission.scheduling.queue import WaitOutcome, WaitRecord
from asgi_admission._metrics.decisions import OUTCOMES, PREFIX

#: Bucket upper bounds of ``asgi_admission_queue_wait_seconds``: 5 ms (a wake on the
#: loop) to a minute (the longest wait worth configuring behind a proxy).
WAIT_BUCKETS: Final = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAIT_OUTCOMES: Final[tuple[WaitOutcome, ...]] = get_args(WaitOutcome)


class QueueMetrics:
    """The wait queue's gauge and histogram on ``registry``, for ``classes``, and the
    decisions per class (:meth:`counting_decisions`)."""

    __slots__ = ("_decided", "_seconds", "_waiting")

    def __init__(
        self, *, registry: CollectorRegistry | None, classes: Iterable[str] = (DEFAULT_CLASS,)
    ) -> None:
        self._waiting = Gauge(
            PREFIX + "queue_waiting",
            "Session requests waiting for capacity, by priority class.",
            ("class",),
            registry=registry,
            multiprocess_mode="livesum",
        )
        self._seconds = Histogram(
            PREFIX + "queue_wait_seconds",
            "How long session requests waited for capacity, by class and how the wait ended.",
            ("class", "outcome"),
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self._decided = Counter(
            PREFIX + "class_decisions",
            "Session admission decisions of each priority class, by outcome and refusal reason.",
            ("class", "outcome", "reason"),
            registry=registry,
        )
        self.declare(classes)

    def declare(self, classes: Iterable[str]) -> None:
        """Start every combination of ``classes`` at 0 (a guard's configured classes)."""
        for name in classes:
            self._waiting.labels(name)
            for outcome in WAIT_OUTCOMES:
                self._seconds.labels(name, outcome)

    def counting_decisions(self, classes: Iterable[str]) -> Callable[[str, CapacityDecision], None]:
        """What a guard with ``classes`` tells of each decision and its request's class."""
        incs: dict[tuple[str, bool, str | None], Callable[[], None]] = {}
        for name in classes:
            for allowed, reason, outcome, label in OUTCOMES:
                incs[name, allowed, reason] = self._decided.labels(name, outcome, label).inc

        def decided(class_name: str, decision: CapacityDecision) -> None:
            inc = incs.get((class_name, decision.allowed, decision.reason))
            if inc is not None:
                inc()

        return decided

    def joined(self, class_name: str) -> None:
        """A request of ``class_name`` waits."""
        self._waiting.labels(class_name).inc()

    def left(self, class_name: str) -> None:
        """A request of ``class_name`` waits no longer (or never waited: the queue was full)."""
        self._waiting.labels(class_name).dec()

    def on_wait_end(self, record: WaitRecord) -> None:
        """One wait ended (the queue's ``on_wait_end``)."""
        self._seconds.labels(record.class_name, record.outcome).observe(record.seconds)
