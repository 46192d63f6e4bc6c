"""``AdmissionService``: read, decide and reserve; what the ASGI side asks of admission.

Notes:

- One session request flows one way: (ledger lock) reader → latch → ledger
  reserve → a ticket, a refusal, or a hold for a probe's evidence. The middleware
  asks :meth:`AdmissionService.admit` and answers the client; it holds no
  decision state of its own.
- Read, decide and reserve happen inside the ledger's critical section with no
  ``await`` in between, so a burst of concurrent requests cannot all pass one
  reading. The latch and the counts are the one deliberate shared state; the lock
  also serialises the controller, whose ``decide`` expects its caller to hold one.
- Most admissions are decided by an upper bound of the working set (raw usage
  and the exact limit, two small reads) while the latch is clear and far from
  the ceiling: the latch's fast path (``AdmissionController.assess``).
- The critical section is only tried: where another worker holds the shared
  ledger, :meth:`~AdmissionService.admit` raises ``LedgerBusy`` and
  :meth:`~AdmissionService.admit_later` retries without blocking the loop, then
  refuses with ``ledger_busy``.
- A route whose footprint is not learned yet is probed: its first sessions are
  decided on an exact reading and admitted a few at a time, and the others are
  held, reserving nothing, until the probes' evidence is in (:meth:`wait`,
  ``probe_wait.py``, ``reservations/probing.py``). Learned routes cost one dict
  lookup more.
- With ``ADMISSION_QUEUE_TIMEOUT_SECONDS`` above 0, a request that does not fit is
  answered :class:`Queued` and waits for capacity, holding nothing
  (``capacity_wait.py``); while others of its class or a higher one wait (in any
  worker, where the waiting order is shared: ``scheduling/shared_order.py``), a new
  one goes behind them. The decisions of a waiting request that do not admit are
  checks, not refusals, for the metrics. With priority classes each request is decided
  against its class's ceiling and latch (``decision/classes.py``; one class at the
  high watermark: the controller).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from asgi_admission._admission.capacity_wait import (
    WAITABLE,
    FreedWatch,
    Queued,
    Refused,
    WaitWatcher,
    behind_others,
    ran_out,
    wait_in_line,
)
from asgi_admission._admission.counts import SessionCounts
from asgi_admission._admission.decision.classes import ClassCeilings
from asgi_admission._admission.decision.decision_log import DecisionLog
from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
)
from asgi_admission._admission.decision.observer import DecisionObserver, Kind
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy
from asgi_admission._admission.decision.stuck_watch import StuckWatch
from asgi_admission._admission.inputs import AppCount, SafeReader
from asgi_admission._admission.latch_checks import LatchChecks
from asgi_admission._admission.ledger.ledger import LedgerBusy, SessionLedger, when_free
from asgi_admission._admission.ledger.shared_place import AloneCheck
from asgi_admission._admission.priorities import Priorities, Tenants
from asgi_admission._admission.probe_wait import Listener, wait_then_decide
from asgi_admission._admission.request_decisions import RequestDecisions
from asgi_admission._admission.reservations.holds import Hold, HoldRegistry
from asgi_admission._admission.reservations.keeper import ReservationKeeper
from asgi_admission._admission.reservations.probing import Gate
from asgi_admission._admission.reservations.sampling import sample_while_waiting, serve_with_keeper
from asgi_admission._admission.reservations.settlement import apply
from asgi_admission._admission.reservations.tickets import AdmissionTicket, settlement_of
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS
from asgi_admission._admission.scheduling.queue import WaitQueue
from asgi_admission._admission.scheduling.shared_order import SharedOrder
from asgi_admission._config import AdmissionConfig
from asgi_admission._memory.reading import UNAVAILABLE

logger = logging.getLogger("asgi_admission")

#: What a decision comes to: a ticket, a refusal, a hold for a probe's evidence, or a
#: place in the wait queue.
Outcome = AdmissionTicket | Refused | Hold | Queued


class AdmissionService:
    """The admission of one guard: every collaborator is built and handed in by
    ``build_service`` (``_factory.py``), and nothing here speaks ASGI but the lifespan.

    ``session_limit`` is the configured count cap (``None``: none while memory is
    readable); ``app_count`` the app's own count of its sessions; ``read`` the
    controller's reader, never raising; ``holds`` the requests waiting for a probe
    (the keeper's too); ``observer`` is told of every decision (``None``: nobody).
    """

    def __init__(
        self,
        *,
        config: AdmissionConfig,
        controller: AdmissionController,
        ledger: SessionLedger,
        keeper: ReservationKeeper,
        holds: HoldRegistry,
        app_count: AppCount,
        read: SafeReader,
        counts: SessionCounts,
        session_limit: int | None,
        retry_after: RetryAfterPolicy,
        observer: DecisionObserver | None,
        shared_dir: str | None,
        alone: AloneCheck | None,
        queue: WaitQueue[AdmissionTicket] | None = None,
        queue_watcher: WaitWatcher | None = None,
        freed: FreedWatch | None = None,
        ceilings: ClassCeilings | None = None,
        priorities: Priorities | None = None,
        tenants: Tenants | None = None,
        order: SharedOrder | None = None,
        on_class_decision: Callable[[str, CapacityDecision], None] | None = None,
    ) -> None:
        self._config = config
        self._controller = controller
        self._ledger = ledger
        self._keeper = keeper
        self._holds = holds
        self._app_count = app_count
        self._counts_app = app_count.current_sessions is not None
        self.read = read
        #: ``(active, pending)``, waiting for the lock (the metrics' and the scrape's).
        self.session_counts = counts
        self._session_limit = session_limit
        self._retry_after = retry_after
        self._observer = observer
        #: Where this guard shares its counts (``None``: alone), and the look for other
        #: workers where it counts alone by default (started with the lifespan).
        self.shared_dir = shared_dir
        self.alone = alone
        # Asked once for the decision path: the ledger's critical section (the same
        # reusable context manager every time), only tried.
        self._attempt = ledger.attempt()
        self._log = DecisionLog(controller, session_limit)
        #: The latch run with no session at stake: readiness, liveness, the proxy's look.
        self.checks = LatchChecks(
            config=config,
            controller=controller,
            ledger=ledger,
            attempt=self._attempt,
            own_count=keeper.own_count,
            read=read,
            session_limit=session_limit,
            log=self._log,
            observer=observer,
            shared_dir=shared_dir,
        )
        #: The session requests waiting for capacity (``None``: none wait, refused at once).
        self.wait_queue = queue
        #: Each priority class's ceiling and latch; ``None``: one class at the high
        #: watermark, decided by the controller (which gives the same answers).
        self.ceilings = ceilings
        self._priorities = priorities
        #: Who holds how many sessions, for the fair share (``None``: no share applies).
        self.tenants = tenants
        self._queue_watcher = queue_watcher
        self._freed = freed
        self._order = order  # the workers' waiting order, closed with the lifespan
        self._class_decided = on_class_decision  # each decision, with its request's class
        self._decide = RequestDecisions(
            controller=controller,
            keeper=keeper,
            read=read,
            session_limit=session_limit,
            retry_after=retry_after,
            ceilings=ceilings,
        )

    # -- what the guard shows -------------------------------------------------------

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def controller(self) -> AdmissionController:
        return self._controller

    @property
    def ledger(self) -> SessionLedger:
        """Where the sessions are counted: this process's, or the workers' shared one."""
        return self._ledger

    @property
    def session_limit(self) -> int | None:
        """The configured count cap; ``None``: none while memory is readable."""
        return self._session_limit

    @property
    def retry_after(self) -> RetryAfterPolicy:
        return self._retry_after

    @property
    def keeper(self) -> ReservationKeeper:
        """Settling, tickets and what was learned of the sessions."""
        return self._keeper

    @property
    def stuck(self) -> StuckWatch:
        """The watch for stuck pressure (``docs/operations.md``), which the metrics read."""
        return self.checks.stuck

    def observe_peak(self, route: str, peak_bytes: int, *, exact: bool = False) -> None:
        """A session of ``route`` peaked at ``peak_bytes``, as a session watchdog measured
        it (its RSS at most, or ``exact``: its own memory group's peak): learned from."""
        self._keeper.observe_peak(route, peak_bytes, exact=exact)

    # -- the decision ---------------------------------------------------------------

    def admit(
        self,
        kind: Kind,
        scope: Scope | None = None,
        hold: Hold | None = None,
        expired: bool = False,
        waiting: bool = False,
        klass: str | None = None,
        tenant: str | None = None,
    ) -> Outcome:
        """Read, decide and (when admitted) reserve, atomically; no awaits here.

        The admitted session's ticket, what a refusal needs (the decision, the
        Retry-After delay and the counts it was decided with), or a :class:`Hold`
        while its route is probed (``hold``: the one it waited with, ``expired``: at
        its deadline, which refuses it with ``probing`` if it would wait again).
        With the wait queue on, :class:`Queued` where it could wait instead of being
        refused, or others of its class or a higher one wait already (``waiting``: an
        attempt of a request in the queue, answered its refusal, told to the observer as
        a check). ``klass``: the request's priority class and ``tenant`` its tenant (``klass``
        ``None``: both its own, found here).
        ``scope`` names the session's route. ``LedgerBusy`` when the shared ledger
        is held by another worker right now (:meth:`admit_later` retries).
        """
        queue = self.wait_queue
        observer = self._observer
        start = time.perf_counter() if observer is not None else 0.0
        ledger = self._ledger
        keeper = self._keeper
        # The app's own count (current_sessions) replaces the ledger's count of
        # accepted WebSockets; a shared ledger adds the other workers' counts. App
        # code, so it is asked once, before the critical section, never inside it.
        count = self._app_count() if self._counts_app else None
        own = keeper.reconcile(count)
        route = keeper.route(scope)
        tenants = self.tenants
        if klass is None:
            klass = DEFAULT_CLASS if self._priorities is None else self._priorities.of(scope, route)
            tenant = None if tenants is None else tenants.of(scope)
        # Others wait for capacity (here, or in another worker: the order's): deciding
        # this one now would let it jump the line.
        if queue is not None and not waiting and queue.ahead(klass):
            return Queued(behind_others(self._controller.pressure_state), klass, tenant)
        probing = keeper.probing and route not in keeper.known()
        ceilings = self.ceilings
        with self._attempt:
            current, pending = ledger.counts(own)
            gate: Gate = "known"
            if (
                tenant is not None
                and tenants is not None
                and tenants.beyond(tenant, current + pending, queue, waiting)
            ):
                decision = CapacityDecision(
                    False, self._controller.pressure_state, UNAVAILABLE, "tenant_share"
                )
            elif probing:
                decision, gate = self._decide.probed(route, current, pending, expired, klass)
            elif ceilings is None:
                decision = self._controller.assess(
                    current, self._session_limit, pending, read=self.read, route=route
                )
            else:
                decision = self._decide.by_class(klass, self.read(), route, current, pending)
            memory = decision.memory
            entry = held = None
            retry_after_s = 0
            if gate == "hold":
                # Waits for its probes' evidence (a hold that waited keeps its deadline).
                deadline = time.monotonic() + self._config.probe_wait_s
                held = self._holds.hold(route, deadline, hold)
            elif decision.allowed:
                reservation = ledger.reserve()
                if tenant is not None and tenants is not None:
                    reservation = tenants.hold(reservation, tenant)
                entry = keeper.admitted(
                    reservation,
                    kind,
                    scope,
                    memory.used_bytes,
                    memory.limit_bytes,
                    route=route,
                    probe=gate == "probe",
                )
            elif queue is None or decision.reason not in WAITABLE:
                # Refused, not waiting: for the fair share, requests are being refused.
                if tenants is not None and decision.reason != "tenant_share":
                    tenants.refusing(self._retry_after.base_s)
                retry_after_s = self._decide.retry_delay(decision, route)
            # A fast-path decision reads a bound (usage with its cache), never
            # used for settling: a look at the exact working set is due instead.
            settled = keeper.settle_with(memory) if memory.exact else keeper.due()
            blind_changed = self._log.note_blind(decision)
        if settled:
            apply(settled)
        queued = (
            entry is None and held is None and queue is not None and decision.reason in WAITABLE
        )
        if observer is not None:
            if held is None and not queued:
                observer.on_decision(kind, decision, time.perf_counter() - start)
            else:  # not decided yet: only what the latch did counts
                observer.on_check(decision)
        if self._class_decided is not None and held is None and not queued:
            self._class_decided(klass, decision)
        if blind_changed or decision.transition is not None:
            self._log.changed(decision, blind_changed)
        if held is not None:
            return held
        if entry is not None:
            return AdmissionTicket(keeper, entry)
        if queued and not waiting:
            return Queued((decision, retry_after_s, (current, pending)), klass, tenant)
        return decision, retry_after_s, (current, pending)

    async def admit_later(
        self,
        kind: Kind,
        scope: Scope | None,
        tried: LedgerBusy,
        hold: Hold | None = None,
        expired: bool = False,
    ) -> Outcome:
        """:meth:`admit` retried without blocking the loop after the caller's first try
        raised ``tried`` (a free ledger costs no coroutine); else a ``ledger_busy`` refusal."""
        try:
            return await when_free(lambda: self.admit(kind, scope, hold, expired), tried=tried)
        except LedgerBusy as exc:
            self._log.busy(exc)
            decision = CapacityDecision(
                allowed=False,
                state=self._controller.pressure_state,
                memory=UNAVAILABLE,
                reason="ledger_busy",
            )
            if self._observer is not None:
                self._observer.on_decision(kind, decision, 0.0)
            if self._class_decided is not None:
                klass = DEFAULT_CLASS
                if self._priorities is not None and scope is not None:
                    klass = self._priorities.of(scope, self._keeper.route(scope))
                self._class_decided(klass, decision)
            return decision, self._retry_after.next_delay(), (0, 0)

    async def wait(
        self, kind: Kind, scope: Scope, hold: Hold, listening: Listener | None
    ) -> AdmissionTicket | Refused | Queued | None:
        """Wait with ``hold`` for the probes' evidence, then decide (:class:`Queued`: it
        waits on in the wait queue); ``None``: the client left (``listening`` hears it;
        ``None``: it cannot be heard)."""

        async def decide(hold: Hold, expired: bool) -> Outcome:
            try:
                return self.admit(kind, scope, hold, expired)
            except LedgerBusy as exc:
                return await self.admit_later(kind, scope, exc, hold, expired)

        sample_while_waiting(self._keeper)
        return await wait_then_decide(hold, self._holds, decide, listening)

    async def wait_for_room(
        self, kind: Kind, scope: Scope, queued: Queued, listening: Listener | None
    ) -> AdmissionTicket | Refused | None:
        """Wait in the queue for capacity, holding nothing (``capacity_wait.py``), then the
        ticket, a refusal (``queue_timeout``, ``queue_full``), or ``None``: the client left
        (``listening`` hears it; ``None``: it cannot be heard)."""
        queue = self.wait_queue
        assert queue is not None

        def decide() -> Outcome:
            # A probe's wait is over for a request in the queue: it waits here instead.
            klass, tenant = queued.class_name, queued.tenant
            return self.admit(kind, scope, expired=True, waiting=True, klass=klass, tenant=tenant)

        waited, last = await wait_in_line(
            queue,
            decide=decide,
            # A waiter left in the instant it was admitted: its session never opens.
            give_back=lambda ticket: self._keeper.abandon(settlement_of(ticket)),
            queued=queued,
            listening=listening,
            watcher=self._queue_watcher,
            freed=self._freed,
        )
        if waited.outcome in ("admitted", "cancelled"):
            return waited.admission  # ``None``: the client left, and it holds nothing
        refused, counts = ran_out(waited.outcome, last)
        if self.tenants is not None and refused.reason != "tenant_share":
            self.tenants.refusing(self._retry_after.base_s)
        if self._observer is not None:
            self._observer.on_decision(kind, refused, waited.waited_s)
        if self._class_decided is not None:
            self._class_decided(queued.class_name, refused)
        return refused, self._decide.retry_delay(refused, ""), counts

    def leave(self, hold: Hold) -> None:
        """A held request goes before it waited (its client left, or sent no connect)."""
        self._holds.leave(hold)

    # -- the lifespan ---------------------------------------------------------------

    async def serve_lifespan(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """``app``'s lifespan with what admission runs alongside: the keeper's periodic
        sample, the stuck-pressure watch and the look for other workers."""
        if self.alone is not None:
            self.alone.start()
        try:
            await serve_with_keeper(self._keeper, app, scope, receive, send, also=self.stuck.run)
        finally:
            if self._order is not None:
                self._order.leave()  # its slot and wake socket, for the next worker
