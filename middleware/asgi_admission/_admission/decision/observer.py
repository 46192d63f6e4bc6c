"""The observer: the seam between admission and what watches it (metrics, tests).

The admission service reports every decision to one ``DecisionObserver`` and is
an ``AdmissionView`` for collectors that read its state at scrape time (so is the
middleware). Nothing here imports the service or Prometheus, so either side can be
tested alone.
"""

from __future__ import annotations

from typing import Literal, Protocol

from asgi_admission._admission.decision.latch import AdmissionController, CapacityDecision
from asgi_admission._config import AdmissionConfig

Kind = Literal["http", "websocket"]


class AdmissionView(Protocol):
    """What a scrape-time collector may read from a running guard."""

    @property
    def config(self) -> AdmissionConfig: ...

    @property
    def controller(self) -> AdmissionController: ...

    @property
    def session_limit(self) -> int | None:
        """The configured count cap; ``None``: none while memory is readable."""
        ...

    def session_counts(self) -> tuple[int, int]:
        """``(active, pending)`` sessions; container-wide when the ledger is shared."""
        ...


class DecisionObserver(Protocol):
    """Told of every session decision, on the decision path: keep it cheap."""

    def on_decision(self, kind: Kind, decision: CapacityDecision, seconds: float) -> None: ...

    def on_check(self, decision: CapacityDecision) -> None:
        """The latch ran without a session at stake (the readiness path).

        It may still have set or cleared the latch, or found telemetry missing.
        """
        ...
