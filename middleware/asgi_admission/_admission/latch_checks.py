"""The latch run with no session at stake: readiness, the counts beside it, and liveness.

Notes:

- A check is the latch's own evaluation (``AdmissionController.assess``, the exact
  limit and the counts) in the ledger's critical section, as a session request's
  decision is, but it reserves nothing and settles nothing. The observer is told of it
  as a check (``on_check``), never as a decision.
- The service hands :class:`LatchChecks` its own critical section and decision log: a
  check may set or clear the latch, or find telemetry missing or back, and is logged
  as a decision would be, the log's note of the last blind reading kept under the lock
  for both.
- The readiness probe waits for a shared ledger held by another worker (``when_free``)
  for at most a retry's wait, then answers ``ledger_busy``; :meth:`LatchChecks.look`
  only tries it (``LedgerBusy``), for the stuck-pressure watch and the proxy's reports.
- The liveness probe's status is the stuck-pressure watch's (``decision/stuck_watch.py``,
  docs/operations.md), which this class builds around its own look.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from asgi_admission._admission.decision.decision_log import DecisionLog
from asgi_admission._admission.decision.latch import AdmissionController, CapacityDecision
from asgi_admission._admission.decision.observer import DecisionObserver
from asgi_admission._admission.decision.stuck import StuckStatus
from asgi_admission._admission.decision.stuck_watch import StuckWatch, build_watch
from asgi_admission._admission.inputs import SafeReader
from asgi_admission._admission.ledger.ledger import LedgerBusy, SessionLedger, when_free
from asgi_admission._config import AdmissionConfig


class LatchChecks:
    """The checks of one guard's latch (see the module notes), built by its service:
    ``attempt`` is the service's critical section of ``ledger``, ``log`` its decision
    log, ``own_count`` the keeper's count of this process's sessions, and ``observer``
    is told of every check (``None``: nobody)."""

    __slots__ = (
        "_attempt",
        "_controller",
        "_ledger",
        "_log",
        "_observer",
        "_own_count",
        "_read",
        "_session_limit",
        "stuck",
    )

    def __init__(
        self,
        *,
        config: AdmissionConfig,
        controller: AdmissionController,
        ledger: SessionLedger,
        attempt: AbstractContextManager[object],
        own_count: Callable[[], int | None],
        read: SafeReader,
        session_limit: int | None,
        log: DecisionLog,
        observer: DecisionObserver | None,
        shared_dir: str | None,
    ) -> None:
        self._controller = controller
        self._ledger = ledger
        self._attempt = attempt
        self._own_count = own_count
        self._read = read
        self._session_limit = session_limit
        self._log = log
        self._observer = observer
        #: The watch for stuck pressure (``docs/operations.md``).
        self.stuck: StuckWatch = build_watch(config, controller, self.look, shared_dir)

    def check(self) -> CapacityDecision:
        """The readiness probe's latch evaluation: a decision that reserves nothing."""
        return self.look()[0]

    def look(self) -> tuple[CapacityDecision, tuple[int, int]]:
        """:meth:`check`, with the counts it decided with (for the stuck-pressure watch)."""
        own = self._own_count()
        with self._attempt:
            current, pending = self._ledger.counts(own)
            decision = self._controller.assess(
                current, self._session_limit, pending, read=self._read
            )
            blind_changed = self._log.note_blind(decision)
        if self._observer is not None:
            self._observer.on_check(decision)
        if blind_changed or decision.transition is not None:
            self._log.changed(decision, blind_changed)
        return decision, (current, pending)

    async def readiness(self) -> str:
        """The readiness probe's state: the latch's, or ``ledger_busy`` while another
        worker holds the shared ledger for longer than a retry waits."""
        try:
            return (await when_free(self.check)).state
        except LedgerBusy as exc:
            self._log.busy(exc)
            return "ledger_busy"

    def liveness(self) -> StuckStatus:
        """The stuck-pressure watch's status for the liveness probe. Without a lifespan
        nothing else looks at the latch: the probe's own request does (tried, never waited
        for: a ledger held by another worker skips the look)."""
        watch = self.stuck
        if not watch.running:
            watch.step()
        return watch.status()
