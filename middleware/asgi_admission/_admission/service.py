"""``AdmissionService``: read, decide and reserve; what the ASGI side asks of admission.

See docs/design.md, "One session request", for the path through it. Notes:

- Read, decide and reserve happen inside the ledger's critical section with no
  ``await`` in between, so a burst of concurrent requests cannot all pass one
  reading. The lock also serialises the controller, whose ``decide`` expects its
  caller to hold one.
- The critical section is only tried: where another worker holds the shared
  ledger, :meth:`~AdmissionService.admit` raises ``LedgerBusy`` and
  :meth:`~AdmissionService.admit_later` retries without blocking the loop, then
  refuses with ``ledger_busy``.
- The decisions of a waiting request that do not admit are checks, not refusals,
  for the metrics (docs/configuration.md, "Waiting and priority").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    ClassCeilings,
    DecisionLog,
    is_blind,
)
from asgi_admission._admission.decision.observer import DecisionObserver, Kind
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy
from asgi_admission._admission.decision.stuck import StuckStatus, StuckWatch, build_watch
from asgi_admission._admission.ledger.ledger import (
    CountedSession,
    LedgerBusy,
    SessionLedger,
    when_free,
)
from asgi_admission._admission.ledger.shared_place import AloneCheck
from asgi_admission._admission.reservations.pending import (
    AppCount,
    Reservations,
    sample_while_waiting,
    serve_with_reservations,
)
from asgi_admission._admission.reservations.probing import (
    Listener,
    ProbeAnswer,
    ProbeWaiter,
    ProbeWaiters,
    wait_then_decide,
)
from asgi_admission._admission.reservations.settling import Reservation, apply
from asgi_admission._admission.reservations.tickets import AdmissionTicket, reservation_of
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS
from asgi_admission._admission.scheduling.queue import (
    WAITABLE,
    FreedWatch,
    Queued,
    Refused,
    WaitQueue,
    WaitWatcher,
    behind_others,
    ran_out,
    wait_in_line,
)
from asgi_admission._admission.scheduling.shared_order import SharedOrder
from asgi_admission._admission.scheduling.tenants import TenantShares, TenantSlot
from asgi_admission._config import AdmissionConfig
from asgi_admission._memory.reading import UNAVAILABLE, MemoryReading, SafeReader

logger = logging.getLogger("asgi_admission")


# --------------------------------------------------------------------------------------
# How one session request is decided: the latch on an upper bound or an exact reading,
# by its priority class's ceiling, while its route is probed, and a refusal's delay. The
# service asks these inside the ledger's critical section; nothing here takes a lock or
# awaits.


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDecisions:
    """The decisions of one guard's session requests: the latch's (``controller``) with
    what the pending sessions and one more hold (``reservations.held_bytes``), a class's
    ceiling (``ceilings``; ``None``: one class, the controller's), what the probes answer
    for a probed route and a refusal's delay (``retry_after``)."""

    controller: AdmissionController
    reservations: Reservations
    read: SafeReader
    session_limit: int | None
    retry_after: RetryAfterPolicy
    ceilings: ClassCeilings | None

    def decide(self, current: int, pending: int, route: str | None) -> CapacityDecision:
        """The latch's decision for one more session of ``route``: on an upper bound of
        the working set where it admits (two small reads, while the latch is clear), else
        on an exact reading."""
        admitted = self.admitted_on_bound(current, pending, route)
        if admitted is not None:
            return admitted
        return self.decide_exactly(current, pending, route)

    def admitted_on_bound(
        self, current: int, pending: int, route: str | None
    ) -> CapacityDecision | None:
        """The decision on an upper bound of the working set where that admits; ``None``
        where an exact reading must decide."""
        controller = self.controller
        if controller.bound_may_admit(current, self.session_limit, pending):
            bound = controller.read_bound()
            if bound is not None:
                used, limit = bound.used_bytes, bound.limit_bytes
                assert used is not None  # read_bound() returns usable bounds only
                assert limit is not None
                held = self.reservations.held_bytes(route, pending, limit)
                if controller.bound_admits(used, limit, held):
                    return controller.admitted_on(bound)
        return None

    def decide_exactly(self, current: int, pending: int, route: str | None) -> CapacityDecision:
        """:meth:`decide` on an exact reading, where the upper bound did not admit."""
        memory = self.read()
        limit = memory.limit_bytes
        held = self.reservations.held_bytes(route, pending, limit) if limit else None
        return self.controller.decide(memory, current, self.session_limit, pending, held_bytes=held)

    def counting(
        self, ledger: SessionLedger, own: int | None, route: str | None
    ) -> tuple[CapacityDecision, int, int]:
        """:meth:`decide` with the counts it takes from ``ledger`` (given the app's count
        ``own``), and those counts.

        While the bound is in use (``bound_in_use``), the fast path is tried first on the
        ledger's high counts, which leave out the check of whether the other workers live: a
        dead worker's sessions can only make the latch refuse, so where the bound admits
        with them in, it admits without them too. Where it does not, and while no bound is
        in use (none offered, or the latch set), the exact counts (which recover a dead
        worker's sessions) decide, as :meth:`decide` does.
        """
        if not self.controller.bound_in_use():
            current, pending = ledger.counts(own)
            return self.decide(current, pending, route), current, pending
        current, pending = ledger.counts(own, high=True)
        admitted = self.admitted_on_bound(current, pending, route)
        if admitted is not None:
            return admitted, current, pending
        exact = ledger.counts(own)
        if exact == (current, pending):  # nothing recovered: the fast path answered already
            return self.decide_exactly(current, pending, route), current, pending
        current, pending = exact
        return self.decide(current, pending, route), current, pending

    def by_class(
        self, klass: str, memory: MemoryReading, route: str, current: int, pending: int
    ) -> CapacityDecision:
        """The decision for a request of priority class ``klass``: its class's ceiling
        and latch on ``memory``, the reserves as the controller counts them."""
        ceilings = self.ceilings
        assert ceilings is not None
        limit = memory.limit_bytes
        return ceilings.decide(
            klass,
            memory,
            current_sessions=current,
            session_limit=self.session_limit,
            pending_sessions=pending,
            held_bytes=self.reservations.held_bytes(route, pending, limit) if limit else 0,
        )

    def probed(
        self, route: str, current: int, pending: int, expired: bool, klass: str
    ) -> tuple[CapacityDecision, ProbeAnswer]:
        """A route not learned yet: the latch on an exact reading (a probe's growth counts
        from it), then whether the session is a probe, waits, or is decided as it is."""
        memory = self.read()
        blind = not memory.exact or is_blind(memory)
        # The probes first: this reading may conclude them, and raise the reserve.
        answer: ProbeAnswer = (
            "known" if blind else self.reservations.probe_answer(route, memory.used_bytes)
        )
        if self.ceilings is None:
            held = self.reservations.held_bytes(route, pending, memory.limit_bytes or 0)
            decision = self.controller.decide(
                memory, current, self.session_limit, pending, held_bytes=held
            )
        else:
            decision = self.by_class(klass, memory, route, current, pending)
        if not decision.allowed or blind:
            return decision, "known"  # refused anyway, or blind: nothing to probe with
        if answer == "wait" and expired:
            refused = CapacityDecision(
                False, decision.state, memory, "probing", decision.transition
            )
            return refused, "known"
        return decision, answer

    def retry_delay(self, decision: CapacityDecision, route: str) -> int:
        """Retry-After for a refusal: from the rate of session ends when memory is short,
        about the probes' ramp so far while probing."""
        if decision.reason in ("memory_pressure", "queue_timeout", "queue_full"):
            wait = self.reservations.expected_wait_s(time.monotonic())
            if wait is not None:
                return self.retry_after.delay_for(wait)
        elif decision.reason == "probing":
            ramp = self.reservations.expected_wait_s(time.monotonic(), probed=route)
            assert ramp is not None  # a probed route's ramp is always known
            return self.retry_after.delay_for(ramp)
        return self.retry_after.next_delay()


# --------------------------------------------------------------------------------------
# ``SessionCounts``: the sessions a guard counts, for the metrics and the scrape.


class SessionCounts:
    """``(active, pending)`` sessions, waiting for the ledger's lock; active comes from
    the app's own count when it gives one (less those still pending past their response).

    With a shared ledger held by another worker this waits at most ``LOCK_WAIT_S``
    and then raises ``LedgerBusy`` (a scrape reports no counts).
    """

    __slots__ = ("_ledger", "_locked", "_reservations")

    def __init__(self, ledger: SessionLedger, reservations: Reservations) -> None:
        self._ledger = ledger
        self._reservations = reservations
        self._locked = ledger.locked()

    def __call__(self) -> tuple[int, int]:
        own = self._reservations.own_count()
        with self._locked:
            return self._ledger.counts(own)


# --------------------------------------------------------------------------------------
# Which priority class a session request is of and which tenant: docs/configuration.md,
# "Waiting and priority". Class names come from the configuration only, so the metrics'
# ``class`` label is a bounded set however requests are classified.


def default_class(names: tuple[str, ...]) -> str:
    """The class of a request nobody classified: ``default`` where configured, else the last."""
    return DEFAULT_CLASS if DEFAULT_CLASS in names else names[-1]


def check_route_classes(route_classes: Mapping[str, str], names: tuple[str, ...]) -> None:
    """A ``ValueError`` naming the first route mapped to a class that is not configured."""
    for pattern, name in route_classes.items():
        if name not in names:
            raise ValueError(
                f"session_routes maps {pattern!r} to the priority class {name!r}, which is "
                f"not one of the classes in force {list(names)!r} "
                "(ADMISSION_PRIORITY_CLASSES, or priority_classes in AdmissionConfig)."
            )


class Priorities:
    """The class of each session request, from ``priority`` and the route's class."""

    __slots__ = ("_default", "_logged", "_names", "_priority", "_routes")

    def __init__(
        self,
        *,
        names: tuple[str, ...],
        route_classes: Mapping[str, str],
        priority: Callable[[Scope], str] | None,
    ) -> None:
        check_route_classes(route_classes, names)
        self._names = frozenset(names)
        self._default = default_class(names)
        self._routes = dict(route_classes)
        self._priority = priority
        self._logged = False

    def of(self, scope: Scope | None, route: str) -> str:
        """The class of the request of ``scope`` that came by the pattern ``route``."""
        by_route = self._routes.get(route, self._default)
        priority = self._priority
        if priority is None or scope is None:
            return by_route
        try:
            name = priority(scope)
        except Exception:
            if not self._logged:
                self._logged = True
                logger.exception(
                    "asgi-admission: the priority callable failed; such requests are of "
                    "their route's class (%r here). Logged once.",
                    by_route,
                )
            return by_route
        if name in self._names:
            return name
        if not self._logged:
            self._logged = True
            logger.warning(
                "asgi-admission: the priority callable named the class %r, which is not one "
                "of %s; such requests are of their route's class (%r here). Logged once.",
                name,
                sorted(self._names),
                by_route,
            )
        return by_route


class Tenants:
    """Each session request's tenant (``tenant(scope)``) and the sessions each holds
    (``TenantShares``): a tenant that raises is none, logged once."""

    __slots__ = ("_logged", "_refusing_until", "_tenant", "shares")

    def __init__(self, *, tenant: Callable[[Scope], str | None], shares: TenantShares) -> None:
        self._tenant = tenant
        self.shares = shares
        self._logged = False
        # Until then requests are being refused (monotonic seconds).
        self._refusing_until = 0.0

    def refusing(self, for_s: float) -> None:
        """A request was refused: requests are being refused for ``for_s`` (the delay a
        refused client is told to come back after)."""
        self._refusing_until = time.monotonic() + for_s

    def beyond(
        self, tenant: str, counted: int, queue: WaitQueue[Any] | None, waiting: bool
    ) -> bool:
        """Whether one more session of ``tenant`` is beyond its share of the ``counted``
        sessions while others wait in ``queue`` (besides a ``waiting`` request itself) or
        requests are being refused; otherwise the share does not bind."""
        contended = (queue is not None and queue.total() > int(waiting)) or (
            time.monotonic() < self._refusing_until
        )
        return contended and self.shares.over_share(tenant, counted)

    def of(self, scope: Scope | None) -> str | None:
        """The tenant of the request of ``scope`` (``None``: none, never over a share)."""
        if scope is None:
            return None
        try:
            name = self._tenant(scope)
        except Exception:
            if not self._logged:
                self._logged = True
                logger.exception(
                    "asgi-admission: the tenant callable failed; such requests have no "
                    "tenant (no share applies to them). Logged once."
                )
            return None
        return name if isinstance(name, str) else None

    def hold(self, reservation: CountedSession, tenant: str) -> CountedSession:
        """``reservation`` counted for ``tenant`` until it is released."""
        return TenantCountedSession(reservation, self.shares, self.shares.admitted(tenant))


class TenantCountedSession:
    """A reservation that counts its tenant's session until it is released (once)."""

    __slots__ = ("_inner", "_released", "_shares", "_slot")

    def __init__(self, inner: CountedSession, shares: TenantShares, slot: TenantSlot) -> None:
        self._inner = inner
        self._shares = shares
        self._slot = slot
        self._released = False

    def activate(self) -> None:
        self._inner.activate()

    def release(self) -> None:
        # Counted out before the ledger's release wakes the waiters, so they see it.
        if not self._released:
            self._released = True
            self._shares.released(self._slot)
        self._inner.release()


# --------------------------------------------------------------------------------------
# The latch run with no session at stake: readiness, the counts beside it, and liveness.
#
# A check is a session request's decision in the ledger's critical section that
# reserves and settles nothing; the observer is told of it as a check (``on_check``).
# It shares the service's critical section and decision log: a check may move the latch
# or find telemetry missing or back, and is logged as a decision would be.


class LatchChecks:
    """The checks of one guard's latch, built by its service: ``decisions`` are its
    decisions, ``attempt`` its critical section of ``ledger``, ``log`` its decision log,
    and ``observer`` is told of every check (``None``: nobody)."""

    __slots__ = ("_attempt", "_decisions", "_ledger", "_log", "_observer", "stuck")

    def __init__(
        self,
        *,
        config: AdmissionConfig,
        decisions: RequestDecisions,
        ledger: SessionLedger,
        attempt: AbstractContextManager[object],
        log: DecisionLog,
        observer: DecisionObserver | None,
        shared_dir: str | None,
    ) -> None:
        self._decisions = decisions
        self._ledger = ledger
        self._attempt = attempt
        self._log = log
        self._observer = observer
        #: The watch for stuck pressure (``docs/operations.md``).
        self.stuck: StuckWatch = build_watch(
            config, decisions.controller, self.check_with_counts, shared_dir
        )

    def check(self) -> CapacityDecision:
        """The readiness probe's latch evaluation: a decision that reserves nothing."""
        return self.check_with_counts()[0]

    def check_with_counts(self) -> tuple[CapacityDecision, tuple[int, int]]:
        """:meth:`check`, with the counts it decided with (for the stuck-pressure watch)."""
        own = self._decisions.reservations.own_count()
        with self._attempt:
            current, pending = self._ledger.counts(own)
            decision = self._decisions.decide(current, pending, None)
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
        nothing else checks the latch: the probe's own request does (tried, never waited
        for: a ledger held by another worker skips the check)."""
        watch = self.stuck
        if not watch.running:
            watch.step()
        return watch.status()


#: What a decision comes to: a ticket, a refusal, a waiter for a probe's evidence, or a
#: place in the wait queue.
Outcome = AdmissionTicket | Refused | ProbeWaiter | Queued


class AdmissionService:
    """The admission of one guard: every collaborator is built and handed in by
    ``build_service`` (``_factory.py``), and nothing here speaks ASGI but the lifespan.

    ``session_limit`` is the configured count cap (``None``: none while memory is
    readable); ``app_count`` the app's own count of its sessions; ``read`` the
    controller's reader, never raising; ``probe_waiters`` the requests waiting for a probe
    (the reservations' too); ``observer`` is told of every decision (``None``: nobody).
    """

    def __init__(
        self,
        *,
        config: AdmissionConfig,
        controller: AdmissionController,
        ledger: SessionLedger,
        reservations: Reservations,
        probe_waiters: ProbeWaiters,
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
        self.config = config
        self.controller = controller
        #: Where the sessions are counted: this process's, or the workers' shared one.
        self.ledger = ledger
        #: Settling, tickets and what was learned of the sessions.
        self.reservations = reservations
        self._probe_waiters = probe_waiters
        self._app_count = app_count
        self._counts_app = app_count.current_sessions is not None
        self.read = read
        #: ``(active, pending)``, waiting for the lock (the metrics' and the scrape's).
        self.session_counts = counts
        #: The configured count cap; ``None``: none while memory is readable.
        self.session_limit = session_limit
        self.retry_after = retry_after
        self._observer = observer
        #: Where this guard shares its counts (``None``: alone), and the search for
        #: other workers where it counts alone by default (started with the lifespan).
        self.shared_dir = shared_dir
        self.alone = alone
        # Asked once for the decision path: the ledger's critical section (the same
        # reusable context manager every time), only tried.
        self._attempt = ledger.attempt()
        self._log = DecisionLog(controller, session_limit)
        self._decide = RequestDecisions(
            controller=controller,
            reservations=reservations,
            read=read,
            session_limit=session_limit,
            retry_after=retry_after,
            ceilings=ceilings,
        )
        #: The latch run with no session at stake: readiness, liveness, the proxy's check.
        self.checks = LatchChecks(
            config=config,
            decisions=self._decide,
            ledger=ledger,
            attempt=self._attempt,
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

    # -- what the guard shows -------------------------------------------------------

    @property
    def stuck(self) -> StuckWatch:
        """The watch for stuck pressure (``docs/operations.md``), which the metrics read."""
        return self.checks.stuck

    def observe_peak(self, route: str, peak_bytes: int, *, exact: bool = False) -> None:
        """A session of ``route`` peaked at ``peak_bytes``, as a session watchdog measured
        it (its RSS at most, or ``exact``: its own memory group's peak): learned from."""
        self.reservations.observe_peak(route, peak_bytes, exact=exact)

    # -- the decision ---------------------------------------------------------------

    def admit(
        self,
        kind: Kind,
        scope: Scope | None = None,
        waited: ProbeWaiter | None = None,
        expired: bool = False,
        waiting: bool = False,
        klass: str | None = None,
        tenant: str | None = None,
    ) -> Outcome:
        """Read, decide and (when admitted) reserve, atomically; no awaits here.

        The admitted session's ticket, what a refusal needs (the decision, the
        Retry-After delay and the counts it was decided with), or a :class:`ProbeWaiter`
        while its route is probed (``waited``: the one it waited as, ``expired``: at
        its deadline, which refuses it with ``probing`` if it would wait again).
        With the wait queue on, :class:`Queued` where it could wait instead of being
        refused, or others of its class or a higher one wait already (``waiting``: an
        attempt of a request in the queue, answered its refusal, told to the observer as
        a check). ``klass``: the request's priority class and ``tenant`` its tenant (``klass``
        ``None``: both its own, found here).
        ``scope`` names the session's route. ``LedgerBusy`` when the shared ledger
        is held by another worker right now (:meth:`admit_later` retries).
        """
        start = time.perf_counter() if self._observer is not None else 0.0
        reservations = self.reservations
        # The app's own count (current_sessions) replaces the ledger's count of
        # accepted WebSockets; a shared ledger adds the other workers' counts. App
        # code, so it is asked once, before the critical section, never inside it.
        own = reservations.reconcile(self._app_count() if self._counts_app else None)
        route = reservations.route(scope)
        if klass is None:  # its own class and tenant, found here
            priorities, tenants = self._priorities, self.tenants
            klass = DEFAULT_CLASS if priorities is None else priorities.of(scope, route)
            tenant = None if tenants is None else tenants.of(scope)
        queue = self.wait_queue
        # Others wait for capacity (here, or in another worker: the order's): deciding
        # this one now would let it jump the line.
        if queue is not None and not waiting and queue.ahead(klass):
            return Queued(behind_others(self.controller.pressure_state), klass, tenant)
        probing = reservations.probing and route not in reservations.view.known()
        with self._attempt:
            answer: ProbeAnswer = "known"
            if tenant is None and not probing and self.ceilings is None:
                # The common case (no tenant, no probe, one class), with no call more (it is
                # the session path): the latch alone, on a bound where one admits.
                decision, current, pending = self._decide.counting(self.ledger, own, route)
            else:
                decision, answer, current, pending = self._decision(
                    own, route, klass, tenant, probing, expired, waiting
                )
            # What the decision comes to: an admitted session's reservation, a probe
            # waiter, a refusal's Retry-After delay, or None: it may wait in the queue.
            held: Reservation | ProbeWaiter | int | None
            if answer != "wait" and decision.allowed:
                held = self._reserve(decision.memory, kind, scope, route, tenant, answer == "probe")
            else:
                held = self._not_admitted(decision, answer, route, waited)
            # A fast-path decision reads a bound (usage with its cache), never
            # used for settling: an exact reading of the working set is due instead.
            memory = decision.memory
            settled = reservations.settle_with(memory) if memory.exact else reservations.due()
            blind_changed = self._log.note_blind(decision)
        if settled:
            apply(settled)
        # Told: the observer, the class's count and the decision log. A probe waiter's or a
        # queued request's decision is not decided yet: only what the latch did counts.
        decided = held is not None and not isinstance(held, ProbeWaiter)
        observer = self._observer
        if observer is not None:
            if decided:
                observer.on_decision(kind, decision, time.perf_counter() - start)
            else:
                observer.on_check(decision)
        if decided and self._class_decided is not None:
            self._class_decided(klass, decision)
        if blind_changed or decision.transition is not None:
            self._log.changed(decision, blind_changed)
        if isinstance(held, Reservation):
            return AdmissionTicket(reservations, held)
        return self._not_admitted_outcome(held, decision, current, pending, klass, tenant, waiting)

    # The steps of :meth:`admit`, in its order.

    def _decision(
        self,
        own: int | None,
        route: str,
        klass: str,
        tenant: str | None,
        probing: bool,
        expired: bool,
        waiting: bool,
    ) -> tuple[CapacityDecision, ProbeAnswer, int, int]:
        """The decision inside the critical section for a request with a tenant, of a
        probed route or under priority classes; with the probes' answer and the counts
        (current, pending) it was decided on."""
        current, pending = self.ledger.counts(own)
        tenants, decide = self.tenants, self._decide
        if (
            tenant is not None
            and tenants is not None
            and tenants.beyond(tenant, current + pending, self.wait_queue, waiting)
        ):
            state = self.controller.pressure_state
            decision = CapacityDecision(False, state, UNAVAILABLE, "tenant_share")
            return decision, "known", current, pending
        if probing:
            decision, answer = decide.probed(route, current, pending, expired, klass)
            return decision, answer, current, pending
        if self.ceilings is None:
            return decide.decide(current, pending, route), "known", current, pending
        decision = decide.by_class(klass, self.read(), route, current, pending)
        return decision, "known", current, pending

    def _not_admitted(
        self,
        decision: CapacityDecision,
        answer: ProbeAnswer,
        route: str,
        waited: ProbeWaiter | None,
    ) -> ProbeWaiter | int | None:
        """What a decision that admits nobody yet comes to inside the critical section: a
        probe waiter, a refusal's Retry-After delay, or ``None``: it may wait in the queue."""
        if answer == "wait":
            # Waits for its probes' evidence (a waiter that waited keeps its deadline).
            deadline = time.monotonic() + self.config.probe_wait_s
            return self._probe_waiters.add(route, deadline, waited)
        if self.wait_queue is not None and decision.reason in WAITABLE:
            return None
        # Refused, not waiting: for the fair share, requests are being refused.
        tenants = self.tenants
        if tenants is not None and decision.reason != "tenant_share":
            tenants.refusing(self.retry_after.base_s)
        return self._decide.retry_delay(decision, route)

    def _reserve(
        self,
        memory: MemoryReading,
        kind: Kind,
        scope: Scope | None,
        route: str,
        tenant: str | None,
        probe: bool,
    ) -> Reservation:
        """Reserves an admitted session in the ledger (and its tenant's share), and records
        it with the reading it was admitted on."""
        reservation = self.ledger.reserve()
        tenants = self.tenants
        if tenant is not None and tenants is not None:
            reservation = tenants.hold(reservation, tenant)
        return self.reservations.admitted(
            reservation,
            kind,
            scope,
            memory.used_bytes,
            memory.limit_bytes,
            route=route,
            probe=probe,
        )

    def _not_admitted_outcome(
        self,
        held: ProbeWaiter | int | None,
        decision: CapacityDecision,
        current: int,
        pending: int,
        klass: str,
        tenant: str | None,
        waiting: bool,
    ) -> Outcome:
        """What :meth:`admit` answers for a request it did not admit: the probe waiter, a
        place in the queue (a request in it already: its refusal), or a refusal."""
        if isinstance(held, ProbeWaiter):
            return held
        if held is None:
            refused = Refused(decision, 0, (current, pending))
            return refused if waiting else Queued(refused, klass, tenant)
        return Refused(decision, held, (current, pending))

    async def admit_later(
        self,
        kind: Kind,
        scope: Scope | None,
        tried: LedgerBusy,
        waited: ProbeWaiter | None = None,
        expired: bool = False,
    ) -> Outcome:
        """:meth:`admit` retried without blocking the loop after the caller's first try
        raised ``tried`` (a free ledger costs no coroutine); else a ``ledger_busy`` refusal."""
        try:
            return await when_free(lambda: self.admit(kind, scope, waited, expired), tried=tried)
        except LedgerBusy as exc:
            self._log.busy(exc)
            decision = CapacityDecision(
                allowed=False,
                state=self.controller.pressure_state,
                memory=UNAVAILABLE,
                reason="ledger_busy",
            )
            if self._observer is not None:
                self._observer.on_decision(kind, decision, 0.0)
            if self._class_decided is not None:
                klass = DEFAULT_CLASS
                if self._priorities is not None and scope is not None:
                    klass = self._priorities.of(scope, self.reservations.route(scope))
                self._class_decided(klass, decision)
            return Refused(decision, self.retry_after.next_delay(), (0, 0))

    async def wait(
        self, kind: Kind, scope: Scope, waiter: ProbeWaiter, listening: Listener | None
    ) -> AdmissionTicket | Refused | Queued | None:
        """Wait with ``waiter`` for the probes' evidence, then decide (:class:`Queued`: it
        waits on in the wait queue); ``None``: the client left (``listening`` hears it;
        ``None``: it cannot be heard)."""

        async def decide(waiter: ProbeWaiter, expired: bool) -> Outcome:
            try:
                return self.admit(kind, scope, waiter, expired)
            except LedgerBusy as exc:
                return await self.admit_later(kind, scope, exc, waiter, expired)

        sample_while_waiting(self.reservations)
        return await wait_then_decide(waiter, self._probe_waiters, decide, listening)

    async def wait_for_capacity(
        self, kind: Kind, scope: Scope, queued: Queued, listening: Listener | None
    ) -> AdmissionTicket | Refused | None:
        """Wait in the queue for capacity, holding nothing (``queue.py``), then the
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
            give_back=lambda ticket: self.reservations.abandon(reservation_of(ticket)),
            queued=queued,
            listening=listening,
            watcher=self._queue_watcher,
            freed=self._freed,
        )
        if waited.outcome in ("admitted", "cancelled"):
            return waited.admission  # ``None``: the client left, and it holds nothing
        refused, counts = ran_out(waited.outcome, last)
        if self.tenants is not None and refused.reason != "tenant_share":
            self.tenants.refusing(self.retry_after.base_s)
        if self._observer is not None:
            self._observer.on_decision(kind, refused, waited.waited_s)
        if self._class_decided is not None:
            self._class_decided(queued.class_name, refused)
        return Refused(refused, self._decide.retry_delay(refused, ""), counts)

    def leave(self, waiter: ProbeWaiter) -> None:
        """A probe waiter goes before it waited (its client left, or sent no connect)."""
        self._probe_waiters.leave(waiter)

    # -- the lifespan ---------------------------------------------------------------

    async def serve_lifespan(
        self, app: ASGIApp, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """``app``'s lifespan with what admission runs alongside: the reservations' periodic
        sample, the stuck-pressure watch and the search for other workers."""
        if self.alone is not None:
            self.alone.start()
        try:
            await serve_with_reservations(
                self.reservations, app, scope, receive, send, also=self.stuck.run
            )
        finally:
            if self._order is not None:
                self._order.leave()  # its slot and wake socket, for the next worker
