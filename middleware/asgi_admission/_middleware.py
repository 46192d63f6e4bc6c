"""``AdmissionMiddleware``: match a session request, hand it to its responder.

It holds no decision state: it checks its arguments, has ``build_service`` build the
service, and dispatches (docs/design.md, "One session request", step 1). A request
that opens no session goes straight to the app without a reading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import REGISTRY, CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._admission.decision.observer import DecisionObserver
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy
from asgi_admission._admission.decision.stuck import StuckWatch
from asgi_admission._admission.reservations.pending import Reservations
from asgi_admission._admission.service import AdmissionService
from asgi_admission._arguments import check_arguments, check_callables, check_watchdog
from asgi_admission._config import AdmissionConfig, WebSocketRefusal
from asgi_admission._cors import CORS_INSIDE_WARNING, cors_inside
from asgi_admission._factory import build_service
from asgi_admission._proxy.agent import AgentListener
from asgi_admission._proxy.reports import ProxyReports
from asgi_admission._responses import Refusal, answer_liveness, answer_readiness
from asgi_admission._routes import RouteMatcher, route_path
from asgi_admission._session_requests import (
    Guarded,
    HttpSessionResponder,
    WebSocketSessionResponder,
)
from asgi_admission._watchdog.lifespan import put_in_state
from asgi_admission._watchdog.watchdog import SessionWatchdog

logger = logging.getLogger("asgi_admission")


class AdmissionMiddleware:
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
    ``session_routes`` may map each pattern to its priority class
    (``ADMISSION_PRIORITY_CLASSES``; a plain list: the default class), and
    ``priority(scope)`` pick the class of each request; ``tenant(scope)`` names its
    tenant for ``ADMISSION_TENANT_MAX_SHARE`` (docs/configuration.md).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        session_routes: Iterable[str] | Mapping[str, str] = (),
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
        priority: Callable[[Scope], str] | None = None,
        tenant: Callable[[Scope], str | None] | None = None,
    ) -> None:
        self.app = app
        check_watchdog(watchdog)
        self._watchdog = watchdog
        self._matcher = RouteMatcher(session_routes)
        check_callables(
            routes=bool(self._matcher),
            session_predicate=session_predicate,
            priority=priority,
            tenant=tenant,
        )
        self._predicate = session_predicate
        # __call__ runs on every request: most are a miss on one dict lookup, and only
        # a predicate or a readiness path makes it match beyond the routes.
        self._http_routes = self._matcher.http_routes
        self._ws_routes = self._matcher.websocket_routes
        args = check_arguments(
            config=config,
            controller=controller,
            current_sessions=current_sessions,
            max_sessions=max_sessions,
            retry_after=retry_after,
            readiness_path=readiness_path,
            liveness_path=liveness_path,
            websocket_refusal=websocket_refusal,
            agent_port=agent_port,
        )
        self._readiness_path = readiness_path
        self._liveness_path = args.liveness_path
        paths = (readiness_path, args.liveness_path)
        self._match_beyond_routes = session_predicate is not None or paths != (None, None)
        # Whether the patterns were checked for a root_path prefix (at the first one seen).
        self._prefix_checked = False
        self._service = service = build_service(
            args.config,
            args.controller,
            current_sessions=current_sessions,
            session_limit=args.session_limit,
            retry_after=args.retry_after,
            route_of=self._matcher.pattern_of,
            registry=registry,
            observer=observer,
            # A mapping gives each pattern its priority class; a list: the default one.
            route_classes=dict(session_routes) if isinstance(session_routes, Mapping) else {},
            priority=priority,
            tenant=tenant,
        )
        #: Where this guard shares its counts (``None``: alone).
        self.shared_dir = service.shared_dir
        self._reports = ProxyReports(service)
        self._guarded = Guarded(
            service=service,
            refusal=Refusal(service, expose_details=bool(expose_details)),
            websocket_refusal=args.websocket_refusal,
            load_report=self._reports.load_report,
        )
        if watchdog is not None:
            # Sessions registered with the ticket's route teach the guard their peaks.
            watchdog.learn_peaks_with(service.observe_peak)
        # Starlette builds its stack inside out: what runs inside the guard exists now.
        if cors_inside(app):
            logger.warning(CORS_INSIDE_WARNING)

    # -- what the guard shows -------------------------------------------------------

    @property
    def service(self) -> AdmissionService:
        """The admission service: the decisions, for tests and benchmarks."""
        return self._service

    @property
    def config(self) -> AdmissionConfig:
        return self._service.config

    @property
    def controller(self) -> AdmissionController:
        return self._service.controller

    @property
    def session_limit(self) -> int | None:
        """The configured count cap; ``None``: none while memory is readable."""
        return self._service.session_limit

    @property
    def retry_after(self) -> RetryAfterPolicy:
        return self._service.retry_after

    @property
    def reservations(self) -> Reservations:
        """Settling, tickets and what was learned of the sessions."""
        return self._service.reservations

    @property
    def stuck(self) -> StuckWatch:
        """The watch for stuck pressure (``docs/operations.md``)."""
        return self._service.stuck

    def session_counts(self) -> tuple[int, int]:
        """``(active, pending)`` (``SessionCounts``, ``_admission/service.py``)."""
        return self._service.session_counts()

    # -- ASGI ---------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope_type = scope["type"]
        if scope_type == "http":
            routes = self._http_routes.get(scope["method"])
            if routes is None and not self._match_beyond_routes:
                await self.app(scope, receive, send)
                return
            # Patterns name the route the app routes: the path less a root_path prefix,
            # looked for only where a server or a Mount set one.
            path = self._route_path(scope) if scope.get("root_path") else scope["path"]
            if routes is not None and routes.matches(path):
                await HttpSessionResponder(self.app, self._guarded)(scope, receive, send)
            elif not self._match_beyond_routes:
                await self.app(scope, receive, send)
            elif self._predicate is not None and self._predicate(scope):
                await HttpSessionResponder(self.app, self._guarded)(scope, receive, send)
            elif path == self._readiness_path:
                await answer_readiness(self._service, scope, send)
            elif path == self._liveness_path:
                await answer_liveness(self._service, scope, send)
            else:
                await self.app(scope, receive, send)
        elif scope_type == "websocket":
            routes = self._ws_routes
            path = self._route_path(scope) if scope.get("root_path") else scope["path"]
            if (routes is not None and routes.matches(path)) or (
                self._predicate is not None and self._predicate(scope)
            ):
                await WebSocketSessionResponder(self.app, self._guarded)(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        elif scope_type == "lifespan":
            # The one place startup/shutdown hooks go (the sample, the watchdog, the agent).
            await self._service.serve_lifespan(self._lifespan_app, scope, receive, send)
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

    async def _lifespan_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's lifespan with the watchdog and the agent-check listener, where there
        are: started just before the server hears that startup completed, stopped once
        the app's own shutdown has completed (its hooks may still end sessions), and
        stopped in any case when the lifespan ends."""
        if self._watchdog is not None:
            put_in_state(scope, self._watchdog)
        parts = [part for part in (self._watchdog, self._reports.agent) if part is not None]

        async def send_and_track(message: Message) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete":
                for part in parts:
                    await part.start()
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                await _stop_all(parts)
            await send(message)

        try:
            await self.app(scope, receive, send_and_track)
        finally:
            await _stop_all(parts)


async def _stop_all(parts: list[SessionWatchdog | AgentListener]) -> None:
    """Stops each part in turn, the later ones even where an earlier one's stop raises
    (a watchdog cancelled in a forced shutdown must not leave the agent's port open)."""
    if parts:
        try:
            await parts[0].stop()
        finally:
            await _stop_all(parts[1:])
