"""``AdmissionMiddleware``: match, decide, reserve, call, release.

Notes:

- One session request flows one way: scope → route matcher → (ledger lock)
  reader → latch → ledger reserve → app → release. Everything else (lifespan,
  requests that open no session) goes straight to the app without a reading.
- Read, decide and reserve happen inside ``ledger.locked()`` with no ``await``
  in between, so a burst of concurrent requests cannot all pass one reading.
  The latch and the counts are the one deliberate shared state; the lock also
  serialises the controller, whose ``decide`` expects its caller to hold one.
- Most admissions are decided by an upper bound of the working set (raw usage
  and the exact limit, two small reads) while the latch is clear and far from
  the ceiling: the latch's fast path (``AdmissionController.assess``).
- An HTTP session request's body is read before the decision (``_body.py``):
  a client still sending it holds nothing, and one that takes longer than
  ``ADMISSION_BODY_TIMEOUT_SECONDS`` gets a ``408``.
- A reservation outlives its response (HTTP) or accept (WebSocket) until the
  session's memory shows, its learned ramp time or the pending timeout passes,
  or the app's ticket says (``_admission/reservations/keeper.py``, ``docs/reservations.md``).
  A request that opened nothing (an error answer) or failed before that point
  gives it back at once (``_watching.py``).
- A route whose footprint is not learned yet is probed: its first sessions are
  decided on an exact reading and admitted a few at a time, and the others are
  held, reserving nothing, until the probes' evidence is in (``_waiting.py``,
  ``_admission/reservations/probing.py``). Learned routes cost one dict lookup more.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Iterable
from typing import TypeVar, get_args

from prometheus_client import REGISTRY, CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from asgi_admission._admission.decision.decision_log import log_change
from asgi_admission._admission.decision.latch import AdmissionController, CapacityDecision, is_blind
from asgi_admission._admission.decision.observer import DecisionObserver, Kind
from asgi_admission._admission.decision.reserve import never_admits
from asgi_admission._admission.decision.stuck_watch import StuckWatch, build_watch, liveness_path_of
from asgi_admission._admission.ledger.ledger import (
    LedgerBusy,
    SessionLedger,
    when_free,
)
from asgi_admission._admission.reservations.holds import Hold
from asgi_admission._admission.reservations.keeper import ReservationKeeper
from asgi_admission._admission.reservations.probing import Gate
from asgi_admission._admission.reservations.sampling import serve_with_keeper
from asgi_admission._admission.reservations.settlement import apply
from asgi_admission._admission.reservations.tickets import AdmissionTicket
from asgi_admission._body import BodyReader
from asgi_admission._config import AdmissionConfig, WebSocketRefusal
from asgi_admission._cors import CORS_INSIDE_WARNING, cors_inside
from asgi_admission._factory import build_controller, build_sharing
from asgi_admission._memory.reading import UNAVAILABLE, MemoryReading
from asgi_admission._metrics.collector import instrument
from asgi_admission._proxy.reports import RoomReports
from asgi_admission._responses import (
    Refusal,
    RetryAfterPolicy,
    coerce_policy,
    learned_details,
)
from asgi_admission._routes import RouteMatcher, route_path
from asgi_admission._session_requests import Outcome, SessionRequests
from asgi_admission._watchdog.lifespan import serve_lifespan
from asgi_admission._watchdog.watchdog import SessionWatchdog

logger = logging.getLogger("asgi_admission")


_MIB = 1024 * 1024
_T = TypeVar("_T")


class AdmissionMiddleware(SessionRequests):
    """Refuses new sessions with 503 + ``Retry-After`` before memory runs out.

    ``session_routes`` are patterns such as ``"POST /sessions"`` or
    ``"WS /terminal/*"``; ``session_predicate(scope)`` may pick further requests.
    ``current_sessions()`` reports sessions the app tracks itself (it is called
    before each decision, on the event loop, outside the ledger's lock: keep it
    cheap); without it the middleware counts the WebSockets it admitted and that
    are still open. A ``watchdog``
    (``SessionWatchdog``) is started and stopped with the app's lifespan;
    handlers reach it with ``session_watchdog(request)``.
    ``websocket_refusal`` (default: the config's, ``"auto"``) says how a refused
    WebSocket is told: closed with 1013 and the delay in the reason where a
    browser asks (``Origin``), the 503 denial response otherwise.
    ``liveness_path`` (default: the config's) answers 503 once the memory pressure is
    stuck, held by the server's own memory (``docs/operations.md``), and 200 otherwise.
    ``agent_port`` (default: the config's) serves HAProxy's agent check with the lifespan.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        session_routes: Iterable[str] = (),
        session_predicate: Callable[[Scope], bool] | None = None,
        config: AdmissionConfig | None = None,
        controller: AdmissionController | None = None,
        current_sessions: Callable[[], int] | None = None,
        max_sessions: int | None = None,
        expose_details: bool = False,
        retry_after: RetryAfterPolicy | int | None = None,
        readiness_path: str | None = None,
        liveness_path: str | None = None,
        websocket_refusal: WebSocketRefusal | None = None,
        observer: DecisionObserver | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        watchdog: SessionWatchdog | None = None,
        agent_port: int | None = None,
    ) -> None:
        self.app = app
        if watchdog is not None and not isinstance(watchdog, SessionWatchdog):
            raise ValueError(f"watchdog must be a SessionWatchdog or None; got {watchdog!r}.")
        self._watchdog = watchdog
        self._matcher = RouteMatcher(session_routes)
        if session_predicate is not None and not callable(session_predicate):
            raise ValueError(
                f"session_predicate must be a callable taking the ASGI scope; "
                f"got {session_predicate!r}."
            )
        if not self._matcher and session_predicate is None:
            raise ValueError(
                "AdmissionMiddleware needs session_routes (e.g. ['POST /sessions']) or a "
                "session_predicate; without either it would guard nothing."
            )
        self._predicate = session_predicate
        # __call__ runs on every request: most are a miss on one dict lookup, and only
        # a predicate or a readiness path makes it look further.
        self._http_routes = self._matcher.http_routes()
        self._ws_routes = self._matcher.websocket_routes()
        if current_sessions is not None and not callable(current_sessions):
            raise ValueError(
                f"current_sessions must be a callable returning an int; got {current_sessions!r}."
            )
        self._current_sessions = current_sessions
        # Whether current_sessions() failed last time, to log failure and recovery once.
        self._count_failed = False
        # Whether a ledger_busy refusal was logged (once: the ledger logs its outages).
        self._busy_logged = False
        if readiness_path is not None and not (
            isinstance(readiness_path, str) and readiness_path.startswith("/")
        ):
            raise ValueError(f"readiness_path must start with '/'; got {readiness_path!r}.")
        self._readiness_path = readiness_path
        # Whether the patterns were checked for a root_path prefix (at the first one seen).
        self._prefix_checked = False

        if config is not None and controller is not None:
            raise ValueError(
                "Pass config or controller, not both: the controller carries its own "
                "thresholds, reserve and reader, and config would describe different ones."
            )
        self._config = config if config is not None else AdmissionConfig.from_env()
        if agent_port is not None:
            self._config = dataclasses.replace(self._config, agent_port=agent_port)
        liveness_path = liveness_path_of(self._config, liveness_path, readiness_path)
        self._liveness_path = liveness_path
        self._look_further = (
            session_predicate is not None or readiness_path is not None or liveness_path is not None
        )
        self._controller = controller if controller is not None else build_controller(self._config)
        # None: no count cap while memory is readable, the fallback one while blind.
        limit = self._config.max_sessions if max_sessions is None else max_sessions
        if limit is not None and (type(limit) is not int or limit < 0):  # bool is not int here
            raise ValueError(f"max_sessions must be a whole number, 0 or more; got {limit!r}.")
        self._session_limit = limit
        if limit == 0:
            logger.warning(
                "asgi-admission: max_sessions is 0, so every session request is refused "
                "(reason session_limit) while other requests pass."
            )
        self._retry_after = coerce_policy(retry_after, self._config.retry_after_s)
        if websocket_refusal is None:
            websocket_refusal = self._config.websocket_refusal
        elif websocket_refusal not in get_args(WebSocketRefusal):
            raise ValueError(
                f"websocket_refusal must be 'auto', 'close' or 'deny'; got {websocket_refusal!r}."
            )
        self._websocket_refusal: WebSocketRefusal = websocket_refusal
        self._refusal = Refusal(
            expose_details=bool(expose_details),
            high=self._controller.high_watermark_percent,
            resume=self._controller.resume_threshold_percent,
            reserve_for=self._controller.reserve_for,
            session_limit=limit,
        )
        sharing = build_sharing(self._config, self._controller.memory_reader)
        self._ledger: SessionLedger = sharing.ledger
        #: Where this guard shares its counts (``None``: alone), and the look for other
        #: workers where it counts alone by default (started with the lifespan).
        self.shared_dir = sharing.directory
        self._alone = sharing.alone
        self._bodies = BodyReader(
            timeout_s=self._config.body_timeout_s, buffer_bytes=self._config.body_buffer_bytes
        )
        # Shared, lock-protected: whether the last decision was blind, for logging
        # telemetry loss and recovery once each.
        self._blind = False
        # Whether the ERROR for a configuration that can never admit has been logged.
        self._never_admits_logged = False
        # Metrics on ``registry`` (None: none); an explicit ``observer`` is told as well.
        self._observer: DecisionObserver | None
        self._observer = instrument(self, self._ledger, registry=registry, observer=observer)
        # Asked once for the decision path: the ledger's critical section (the same
        # reusable context manager every time) and the never-raising reader. Without
        # an observer (no metrics, no observer=) the clock is not read either.
        self._locked = self._ledger.locked()
        self._attempt = self._ledger.attempt()
        self._safe_read = self._read
        config = self._config
        self._keeper = ReservationKeeper(
            controller=self._controller,
            locked=self._attempt,
            read=self._safe_read,
            active_count=lambda own: self._ledger.counts(own)[0],
            own_count=self._own_count,
            route_of=self._matcher.pattern_of,
            learning=config.reserve_learning,
            min_reserve_bytes=config.reserve_min_bytes,
            timeout_s=config.pending_timeout_s,
            # A body larger than the buffer may take the body timeout to arrive, and
            # keeps its reservation for that long if it does.
            request_timeout_s=max(config.pending_timeout_s, config.body_timeout_s),
            shared_dir=sharing.directory,
            ledger_is_current=getattr(self._ledger, "is_current", None),
            on_reserve=self._on_reserve,
            probe_sessions=config.probe_sessions,
        )
        self._stuck = build_watch(config, self._controller, self._look, sharing.directory)
        self._reports = RoomReports(guard=self, check=self._look, read=self._safe_read)
        self._refusal.learned = lambda: learned_details(self._keeper.estimates())
        self._refusal.probing = self._probing_details
        if watchdog is not None:
            # Sessions registered with the ticket's route teach the guard their peaks.
            watchdog.on_peak = self._keeper.observe_peak

        # Starlette builds its stack inside out: what runs inside the guard exists now.
        if cors_inside(app):
            logger.warning(CORS_INSIDE_WARNING)

    def _on_reserve(self, learned_bytes: int, configured_bytes: int | None) -> None:
        # Debug only: it changes with observations (the metrics show it); the latch's
        # transitions and telemetry are what the log says at INFO and above.
        logger.debug(
            "asgi-admission: one session was learned to need %.1f MiB; with learning %s "
            "that %s the reserve (%s).",
            learned_bytes / _MIB,
            self._config.reserve_learning,
            "replaces" if self._config.reserve_learning == "adapt" else "sets a floor for",
            "derived from the limit"
            if configured_bytes is None
            else f"configured {configured_bytes / _MIB:.1f} MiB",
        )

    def _probing_details(self) -> list[dict[str, object]]:
        return [dataclasses.asdict(status) for status in self._keeper.probe_status()]

    # -- AdmissionView ------------------------------------------------------------

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def controller(self) -> AdmissionController:
        return self._controller

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
        """The watch for stuck pressure (``docs/operations.md``)."""
        return self._stuck

    def session_counts(self) -> tuple[int, int]:
        """``(active, pending)``; active comes from ``current_sessions`` when given.

        With a shared ledger held by another worker this waits at most
        ``LOCK_WAIT_S`` and then raises ``LedgerBusy`` (a scrape reports no counts).
        """
        own = self._own_count()
        with self._locked:
            return self._ledger.counts(own)

    def _own_count(self) -> int | None:
        """The app's count less its sessions still pending past their response.

        A session whose response has ended is in the app's own count already and
        still pending until it settles: it is counted once, as pending.
        """
        return self._less_waiting(self._app_count())

    def _less_waiting(self, count: int | None) -> int | None:
        """The app's ``count`` less its sessions still pending past their response."""
        if count is None:
            return None
        return max(0, count - self._keeper.settler.past_response)

    def _app_count(self) -> int | None:
        """``current_sessions()``, or ``None`` (the ledger's own count) when it fails.

        A broken counter must not turn every session request into a 500: the memory
        latch still guards, and the count falls back to the sessions this
        middleware admitted itself until the app's counter answers again.
        """
        current_sessions = self._current_sessions
        if current_sessions is None:
            return None
        try:
            count = operator.index(current_sessions())
        except Exception:
            if not self._count_failed:
                self._count_failed = True
                logger.exception(
                    "asgi-admission: current_sessions() failed or returned no whole number; "
                    "counting the sessions this middleware admitted until it answers again."
                )
            return None
        if self._count_failed:
            self._count_failed = False
            logger.info("asgi-admission: current_sessions() answers again.")
        return count

    # -- ASGI ---------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope["type"]
        if scope_type == "http":
            routes = self._http_routes.get(scope["method"])
            if routes is None and not self._look_further:
                await self.app(scope, receive, send)
                return
            # Patterns name the route the app routes: the path less a root_path prefix,
            # looked for only where a server or a Mount set one.
            path = self._route_path(scope) if scope.get("root_path") else scope["path"]
            if routes is not None and routes.matches(path):
                await self._guard_http(scope, receive, send)
            elif not self._look_further:
                await self.app(scope, receive, send)
            elif self._predicate is not None and self._predicate(scope):
                await self._guard_http(scope, receive, send)
            elif path == self._readiness_path:
                await self._readiness(scope, receive, send)
            elif path == self._liveness_path:
                await self._liveness(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        elif scope_type == "websocket":
            routes = self._ws_routes
            path = self._route_path(scope) if scope.get("root_path") else scope["path"]
            if (routes is not None and routes.matches(path)) or (
                self._predicate is not None and self._predicate(scope)
            ):
                await self._guard_websocket(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        elif scope_type == "lifespan":
            await self._lifespan(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    def _route_path(self, scope: Scope) -> str:
        """The route of a scope with a ``root_path``; at the first one, a warning for
        patterns written with that prefix in them (they would match nothing)."""
        if not self._prefix_checked:
            self._prefix_checked = True
            problem = self._matcher.prefixed(scope["root_path"])
            if problem is not None:
                logger.warning("asgi-admission: %s", problem)
        return route_path(scope)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The one place startup/shutdown hooks go (the sample, the watchdog, the agent).
        if self._alone is not None:
            self._alone.start()
        app = self._reports.lifespan(self._lifespan_app)
        await serve_with_keeper(self._keeper, app, scope, receive, send, also=self._stuck.run)

    async def _lifespan_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._watchdog is None:
            await self.app(scope, receive, send)
        else:
            await serve_lifespan(self._watchdog, self.app, scope, receive, send)

    # -- the decision -------------------------------------------------------------

    def _read(self) -> MemoryReading:
        try:
            return self._controller.memory_reader()
        except Exception:
            # A custom reader must not take the service down: decide blind,
            # which falls back to the fixed session cap.
            return UNAVAILABLE

    async def _decide_later(
        self,
        kind: Kind,
        scope: Scope | None,
        tried: LedgerBusy,
        hold: Hold | None = None,
        expired: bool = False,
    ) -> Outcome:
        """:meth:`_admit` retried without blocking the loop after the caller's first try
        raised ``tried`` (a free ledger costs no coroutine); else a ``ledger_busy`` refusal."""
        try:
            return await when_free(lambda: self._admit(kind, scope, hold, expired), tried=tried)
        except LedgerBusy as exc:
            self._note_busy(exc)
            decision = CapacityDecision(
                allowed=False,
                state=self._controller.pressure_state,
                memory=UNAVAILABLE,
                reason="ledger_busy",
            )
            if self._observer is not None:
                self._observer.on_decision(kind, decision, 0.0)
            return decision, self._retry_after.next_delay(), (0, 0)

    def _note_busy(self, exc: LedgerBusy) -> None:
        if not self._busy_logged:
            self._busy_logged = True
            logger.warning(
                "asgi-admission: refusing sessions with ledger_busy: %s. Logged once.", exc
            )

    def _admit(
        self,
        kind: Kind,
        scope: Scope | None = None,
        hold: Hold | None = None,
        expired: bool = False,
    ) -> Outcome:
        """Read, decide and (when admitted) reserve, atomically; no awaits here.

        The admitted session's ticket, what a refusal needs (the decision, the
        Retry-After delay and the counts it was decided with), or a :class:`Hold`
        while its route is probed (``hold``: the one it waited with, ``expired``: at
        its deadline, which refuses it with ``probing`` if it would wait again).
        ``scope`` names the session's route. ``LedgerBusy`` when the shared ledger
        is held by another worker right now (the caller retries).
        """
        observer = self._observer
        start = time.perf_counter() if observer is not None else 0.0
        ledger = self._ledger
        keeper = self._keeper
        limit = self._session_limit
        # The app's own count (current_sessions) replaces the ledger's count of
        # accepted WebSockets; a shared ledger adds the other workers' counts. App
        # code, so it is asked once, before the critical section, never inside it.
        count = None if self._current_sessions is None else self._app_count()
        if count is not None and keeper.settler.waiting and count < keeper.settler.past_response:
            # The app counts fewer sessions than are waiting to settle: some ended.
            with self._attempt:
                ended = keeper.settler.counted(count)
            apply(ended)
        if keeper.deferred:
            # Session events kept while another worker held the ledger count first.
            with self._attempt:
                caught_up = keeper.catch_up()
            apply(caught_up)
        own = None if count is None else self._less_waiting(count)  # after the events above
        route = keeper.route(scope)
        probing = keeper.probing and route not in keeper.known()
        with self._attempt:
            current, pending = ledger.counts(own)
            gate: Gate = "known"
            if probing:
                decision, gate = self._probe_decision(route, current, pending, expired)
            else:
                decision = self._controller.assess(
                    current, limit, pending, read=self._safe_read, route=route
                )
            memory = decision.memory
            entry = held = None
            retry_after_s = 0
            if gate == "hold":
                # Waits for its probes' evidence (a hold that waited keeps its deadline).
                deadline = time.monotonic() + self._config.probe_wait_s
                held = keeper.holds.hold(route, deadline, hold)
            elif decision.allowed:
                entry = keeper.admitted(
                    ledger.reserve(),
                    kind,
                    scope,
                    memory.used_bytes,
                    memory.limit_bytes,
                    route=route,
                    probe=gate == "probe",
                )
            else:
                retry_after_s = self._retry_delay(decision, route)
            # A fast-path decision reads a bound (usage with its cache), never
            # used for settling: a look at the exact working set is due instead.
            settled = keeper.settle_with(memory) if memory.exact else keeper.due()
            blind_changed = self._note_blind(decision)
        if settled:
            apply(settled)
        if observer is not None:
            if held is None:
                observer.on_decision(kind, decision, time.perf_counter() - start)
            else:  # not decided yet: only what the latch did counts
                observer.on_check(decision)
        if blind_changed or decision.transition is not None:
            if decision.transition == "pressured":
                self._log_never_admits(decision.memory)
            log_change(decision, blind_changed, self._controller, self._session_limit)
        if held is not None:
            return held
        if entry is not None:
            return AdmissionTicket(keeper, entry)
        return decision, retry_after_s, (current, pending)

    def _probe_decision(
        self, route: str, current: int, pending: int, expired: bool
    ) -> tuple[CapacityDecision, Gate]:
        """A route not learned yet: the latch on an exact reading (a probe's growth counts
        from it), then whether the session is a probe, waits, or is decided as it is."""
        memory = self._safe_read()
        blind = not memory.exact or is_blind(memory)
        # The gate first: this reading may conclude the probes, and raise the reserve.
        gate: Gate = "known" if blind else self._keeper.gate(route, memory.used_bytes)
        decision = self._controller.decide(
            memory, current, self._session_limit, pending, route=route
        )
        if not decision.allowed or blind:
            return decision, "known"  # refused anyway, or blind: nothing to probe with
        if gate == "hold" and expired:
            refused = CapacityDecision(
                False, decision.state, memory, "probing", decision.transition
            )
            return refused, "known"
        return decision, gate

    def _retry_delay(self, decision: CapacityDecision, route: str) -> int:
        """Retry-After for a refusal: from the rate of session ends when memory is short,
        about the probes' ramp so far while probing."""
        if decision.reason == "memory_pressure":
            wait = self._keeper.ends.expected_wait_s(time.monotonic())
            if wait is not None:
                return self._retry_after.delay_for(wait)
        elif decision.reason == "probing":
            ramp = self._keeper.board.retry_after_s(route, time.monotonic())
            return self._retry_after.delay_for(ramp)
        return self._retry_after.next_delay()

    def _check(self) -> CapacityDecision:
        """The readiness probe's latch evaluation: a decision that reserves nothing."""
        return self._look()[0]

    def _look(self) -> tuple[CapacityDecision, tuple[int, int]]:
        """:meth:`_check`, with the counts it decided with (for the stuck-pressure watch)."""
        own = self._own_count()
        with self._attempt:
            current, pending = self._ledger.counts(own)
            decision = self._controller.assess(
                current, self._session_limit, pending, read=self._safe_read
            )
            blind_changed = self._note_blind(decision)
        if self._observer is not None:
            self._observer.on_check(decision)
        if blind_changed or decision.transition is not None:
            if decision.transition == "pressured":
                self._log_never_admits(decision.memory)
            log_change(decision, blind_changed, self._controller, self._session_limit)
        return decision, (current, pending)

    def _note_blind(self, decision: CapacityDecision) -> bool:
        """Record whether ``decision`` was blind; whether that changed. Under the lock."""
        blind = decision.state == "unavailable"
        changed = blind != self._blind
        self._blind = blind
        return changed

    def _log_never_admits(self, memory: MemoryReading) -> None:
        # A latch that sets at the first reading of a limit may be set for good: a
        # reserve the limit cannot hold. Said once, at ERROR, naming the setting.
        if self._never_admits_logged:
            return
        controller = self._controller
        problem = never_admits(
            limit_bytes=memory.limit_bytes,
            high_watermark_percent=controller.high_watermark_percent,
            reserve_bytes=controller.reserve_for(memory.limit_bytes),
            reserve_configured=controller.reserve_bytes is not None,
        )
        if problem is not None:
            self._never_admits_logged = True
            logger.error("asgi-admission: %s", problem)
