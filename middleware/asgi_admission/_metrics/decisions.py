"""Decision metrics: the decision path's counters and histogram (a ``DecisionObserver``).

Every labelled child is bound once, in a dict keyed by ``(kind, allowed, reason)``, so
a decision costs a dict lookup and three increments, never a label lookup. All
reachable label combinations start at 0, so ``rate()`` works from the first scrape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, get_args

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from asgi_admission._admission.decision.latch import CapacityDecision, Reason, has_no_limit
from asgi_admission._admission.decision.observer import Kind

PREFIX: Final = "asgi_admission_"

#: Bucket upper bounds of ``asgi_admission_decision_duration_seconds``: 1 µs to 10 ms.
DURATION_BUCKETS: Final = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
)

KINDS: Final[tuple[Kind, ...]] = ("http", "websocket")
#: ``(allowed, reason)`` pairs a decision can carry, with their label values.
OUTCOMES: Final[tuple[tuple[bool, Reason | None, str, str], ...]] = (
    (True, None, "admitted", "none"),
    *((False, reason, "rejected", reason) for reason in get_args(Reason)),
)


class DecisionMetrics:
    """The counters and histogram of the decision path: a ``DecisionObserver``.

    ``live_sessions=True`` adds the ``livesum`` session gauge of multiprocess mode.
    """

    __slots__ = ("_incs", "_observe", "_sessions", "_telemetry", "_transition")

    def __init__(
        self, *, registry: CollectorRegistry | None = REGISTRY, live_sessions: bool = False
    ) -> None:
        decisions = Counter(
            PREFIX + "decisions",
            "Session admission decisions, by request kind, outcome and refusal reason.",
            ("kind", "outcome", "reason"),
            registry=registry,
        )
        transitions = Counter(
            PREFIX + "latch_transitions",
            "Times the memory latch set (to=pressured) or cleared (to=normal).",
            ("to",),
            registry=registry,
        )
        telemetry_failures = Counter(
            PREFIX + "telemetry_failures",
            "Session decisions taken because memory could not be read (not for no limit).",
            registry=registry,
        )
        duration = Histogram(
            PREFIX + "decision_duration_seconds",
            "Time to read memory, run the latch and reserve, per session decision.",
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        incs: dict[tuple[str, bool, str | None], Callable[[], None]] = {}
        for kind in KINDS:
            for allowed, reason, outcome, label in OUTCOMES:
                incs[kind, allowed, reason] = decisions.labels(kind, outcome, label).inc
        self._incs = incs
        self._transition = {to: transitions.labels(to).inc for to in ("pressured", "normal")}
        self._telemetry = telemetry_failures.inc
        self._observe = duration.observe
        self._sessions: tuple[Callable[[float], None], Callable[[float], None]] | None = None
        if live_sessions:
            sessions = Gauge(
                PREFIX + "sessions",
                "Sessions admitted, by state.",
                ("state",),
                registry=registry,
                multiprocess_mode="livesum",
            )
            self._sessions = (sessions.labels("active").set, sessions.labels("pending").set)

    def on_decision(self, kind: Kind, decision: CapacityDecision, seconds: float) -> None:
        """Count one decision and time it; called on the decision path."""
        self._incs[kind, decision.allowed, decision.reason]()
        self._observe(seconds)
        if decision.transition is not None:
            self._transition[decision.transition]()
        if decision.state == "unavailable" and not has_no_limit(decision.memory):
            self._telemetry()

    def on_check(self, decision: CapacityDecision) -> None:
        """Count what a readiness check did to the latch; it is not a decision."""
        if decision.transition is not None:
            self._transition[decision.transition]()
        if decision.state == "unavailable" and not has_no_limit(decision.memory):
            self._telemetry()

    @property
    def live_sessions(self) -> bool:
        """Whether this exports session counts itself (the multiprocess ``livesum`` gauge)."""
        return self._sessions is not None

    def on_sessions(self, active: int, pending: int) -> None:
        """Publish this worker's session counts (only with ``live_sessions``)."""
        if self._sessions is not None:
            self._sessions[0](active)
            self._sessions[1](pending)
