"""The session requests' way through the guard: decide, wait for a probe, refuse or run.

``SessionRequests`` is the part of ``AdmissionMiddleware`` that speaks ASGI for
one guarded request: the HTTP body is read before the decision (``_body.py``), a
request held for a probe's evidence waits (``_waiting.py``), a refusal is sent
(``_responses.py``), and an admitted one runs the app watched (``_watching.py``).
The decision itself is the middleware's (``_middleware.py``), under the ledger's
lock; nothing here holds that lock across an ``await``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.decision.latch import CapacityDecision
from asgi_admission._admission.decision.observer import Kind
from asgi_admission._admission.decision.stuck_watch import StuckWatch
from asgi_admission._admission.ledger.ledger import LedgerBusy, when_free
from asgi_admission._admission.reservations.holds import Hold
from asgi_admission._admission.reservations.keeper import ReservationKeeper
from asgi_admission._admission.reservations.sampling import sample_while_waiting
from asgi_admission._admission.reservations.tickets import SCOPE_KEY, AdmissionTicket
from asgi_admission._body import Arrival, BodyReader
from asgi_admission._config import AdmissionConfig, WebSocketRefusal
from asgi_admission._proxy.reports import RoomReports
from asgi_admission._proxy.room import reporting
from asgi_admission._responses import (
    Refusal,
    send_http_refusal,
    send_liveness,
    send_readiness,
    send_request_timeout,
    send_websocket_refusal,
    websocket_denial,
)
from asgi_admission._waiting import Listening, wait_then_decide
from asgi_admission._watching import run_http, run_websocket

#: What a refusal needs: the decision, the Retry-After delay, (active, pending).
Refused = tuple[CapacityDecision, int, tuple[int, int]]
#: What a decision comes to: a ticket, a refusal, or a hold for a probe's evidence.
Outcome = AdmissionTicket | Refused | Hold


class SessionRequests:
    """Guarded requests over ASGI; the middleware supplies the decision and its parts."""

    app: ASGIApp
    _config: AdmissionConfig
    _keeper: ReservationKeeper
    _stuck: StuckWatch
    _bodies: BodyReader
    _refusal: Refusal
    _websocket_refusal: WebSocketRefusal
    _admit: Callable[[Kind, Scope | None, Hold | None, bool], Outcome]
    _decide_later: Callable[[Kind, Scope | None, LedgerBusy, Hold | None, bool], Awaitable[Outcome]]
    _check: Callable[[], CapacityDecision]
    _reports: RoomReports
    _note_busy: Callable[[LedgerBusy], None]

    async def _wait(
        self, kind: Kind, scope: Scope, hold: Hold, listening: Listening | None
    ) -> AdmissionTicket | Refused | None:
        """Wait with ``hold`` for the probes' evidence, then decide; ``None``: the client left."""

        async def decide(hold: Hold, expired: bool) -> Outcome:
            try:
                return self._admit(kind, scope, hold, expired)
            except LedgerBusy as exc:
                return await self._decide_later(kind, scope, exc, hold, expired)

        sample_while_waiting(self._keeper)
        return await wait_then_decide(hold, self._keeper.holds, decide, listening)

    async def _guard_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        load_report = self._reports.load_report
        if load_report is not None:
            send = reporting(load_report, send)
        # The body first: a client still sending it holds nothing (_body.py).
        config = self._config
        bodies = self._bodies
        task = bodies.start()
        body: list[Message] = []
        arrival: Arrival = "timed_out"
        try:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                body, arrival = [message], "complete"  # the common case: all there
            else:
                body, arrival = await bodies.rest(receive, message)
        except asyncio.CancelledError:
            bodies.timed_out(task)
        finally:
            time_left = bodies.stop(task)
        if arrival == "disconnected":
            return
        keeper = self._keeper
        if arrival == "timed_out":
            keeper.count_failure("http", "body_timeout")
            await send_request_timeout(send, config.body_timeout_s)
            return
        try:
            outcome: Outcome | None = self._admit("http", scope, None, False)
        except LedgerBusy as exc:
            outcome = await self._decide_later("http", scope, exc, None, False)
        listening = None
        try:
            if isinstance(outcome, Hold):
                # The body is in: the client's next message can only be its disconnect.
                listening = Listening(receive) if arrival == "complete" else None
                outcome = await self._wait("http", scope, outcome, listening)
                if listening is not None:
                    receive = listening.receive
            if outcome is None:
                return  # the client left while it waited: it holds nothing
            if isinstance(outcome, tuple):
                decision, retry_after_s, counts = outcome
                body_text = self._refusal.body(decision, retry_after_s, counts)
                await send_http_refusal(send, retry_after_s, body_text)
                return
            assert isinstance(outcome, AdmissionTicket)
            # The app finds its ticket in the scope: admission_ticket(request).
            scope[SCOPE_KEY] = outcome
            rest_due_in_s = None
            if arrival == "partial":
                rest_due_in_s = time_left
            await run_http(
                self.app,
                scope,
                receive,
                send,
                keeper=keeper,
                entry=outcome._entry,
                body=body,
                rest_due_in_s=rest_due_in_s,
            )
        finally:
            if listening is not None:
                listening.close()

    async def _guard_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        load_report = self._reports.load_report
        if load_report is not None:
            send = reporting(load_report, send)
        try:
            outcome: Outcome | None = self._admit("websocket", scope, None, False)
        except LedgerBusy as exc:
            outcome = await self._decide_later("websocket", scope, exc, None, False)
        listening = None
        try:
            if isinstance(outcome, Hold):
                # Before the accept: the server's connect is kept for the app, and the
                # next message can only be the client's disconnect.
                try:
                    first = await receive()
                except BaseException:
                    self._keeper.holds.leave(outcome)
                    raise
                if first["type"] != "websocket.connect":
                    self._keeper.holds.leave(outcome)
                    return
                listening = Listening(receive, [first])
                receive = listening.receive
                outcome = await self._wait("websocket", scope, outcome, listening)
            if outcome is None:
                return  # the client left while it waited: it holds nothing
            if isinstance(outcome, tuple):
                decision, retry_after_s, counts = outcome
                body = self._refusal.body(decision, retry_after_s, counts)
                await send_websocket_refusal(
                    scope,
                    receive,
                    send,
                    denial=websocket_denial(self._websocket_refusal, scope),
                    retry_after_s=retry_after_s,
                    reason=decision.reason or "session_limit",
                    body=body,
                )
                return
            assert isinstance(outcome, AdmissionTicket)
            # The app finds its ticket in the scope: admission_ticket(request).
            scope[SCOPE_KEY] = outcome
            await run_websocket(
                self.app, scope, receive, send, keeper=self._keeper, entry=outcome._entry
            )
        finally:
            if listening is not None:
                listening.close()

    # -- readiness ----------------------------------------------------------------

    async def _readiness(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            state: str = (await when_free(self._check)).state
        except LedgerBusy as exc:
            self._note_busy(exc)
            state = "ledger_busy"
        await send_readiness(send, state, head=scope["method"] == "HEAD")

    async def _liveness(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Without a lifespan nothing else looks at the latch: the probe's own request does
        # (tried, never waited for: a ledger held by another worker skips the look).
        watch = self._stuck
        if not watch.running:
            watch.step()
        status = watch.status()
        await send_liveness(
            send, status.liveness_failing, status.held_s, head=scope["method"] == "HEAD"
        )
