"""One guarded session request over ASGI: its responder asks the service, then answers.

``AdmissionMiddleware`` hands each session request to a responder of its own (as
Starlette's ``GZipMiddleware`` does to its ``IdentityResponder``), which holds
that request's state: the HTTP body is read before the decision (``_body.py``: a client still
sending it holds nothing, and one slower than ``ADMISSION_BODY_TIMEOUT_SECONDS``
gets a ``408``),
the decision is the service's (``_admission/service.py``), a request held for a
probe's evidence or for capacity waits with its client heard (``_waiting.py``), a
refusal is sent
(``_responses.py``), and an admitted one runs the app watched (``_watching.py``).
Nothing here holds the ledger's lock across an ``await``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.reservations.probing import Hold
from asgi_admission._admission.reservations.tickets import (
    SCOPE_KEY,
    AdmissionTicket,
    settlement_of,
)
from asgi_admission._admission.scheduling.queue import Queued
from asgi_admission._admission.service import AdmissionService, Outcome
from asgi_admission._body import Arrival, BodyReader
from asgi_admission._config import WebSocketRefusal
from asgi_admission._proxy.room import RoomView, reporting
from asgi_admission._responses import (
    Refusal,
    send_http_refusal,
    send_request_timeout,
    send_websocket_refusal,
    websocket_denial,
)
from asgi_admission._waiting import Listening
from asgi_admission._watching import WatchedHttp, WatchedWebSocket


class Guarded:
    """What every session request of one guard is answered with, built once."""

    __slots__ = ("bodies", "keeper", "load_report", "refusal", "service", "websocket_refusal")

    def __init__(
        self,
        *,
        service: AdmissionService,
        refusal: Refusal,
        websocket_refusal: WebSocketRefusal,
        load_report: RoomView | None,
    ) -> None:
        self.service = service
        self.keeper = service.keeper
        self.refusal = refusal
        config = service.config
        self.bodies = BodyReader(
            timeout_s=config.body_timeout_s, buffer_bytes=config.body_buffer_bytes
        )
        self.websocket_refusal = websocket_refusal
        #: Where session responses report the room from; ``None``: no header.
        self.load_report = load_report


class HttpSessionResponder:
    """One HTTP session request: its body first, then the decision and the answer."""

    __slots__ = ("_app", "_guarded", "_listening")

    def __init__(self, app: ASGIApp, guarded: Guarded) -> None:
        self._app = app
        self._guarded = guarded
        self._listening: Listening | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = self._guarded
        if guarded.load_report is not None:
            send = reporting(guarded.load_report, send)
        # The body first: a client still sending it holds nothing (_body.py).
        bodies = guarded.bodies
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
        service = guarded.service
        if arrival == "timed_out":
            guarded.keeper.count_failure("http", "body_timeout")
            await send_request_timeout(send, service.config.body_timeout_s)
            return
        try:
            outcome: Outcome | None = service.admit("http", scope)
        except LedgerBusy as exc:
            outcome = await service.admit_later("http", scope, exc)
        rest_due_in_s = time_left if arrival == "partial" else None
        if type(outcome) is AdmissionTicket:
            # The common case, admitted at once: it waited for nothing, listens to nothing.
            await self._run(scope, receive, send, outcome, body, rest_due_in_s)
            return
        try:
            if isinstance(outcome, (Hold, Queued)) and arrival == "complete":
                # The body is in: the client's next message can only be its disconnect.
                self._listening = Listening(receive)
                receive = self._listening.receive
            if isinstance(outcome, Hold):
                outcome = await service.wait("http", scope, outcome, self._listening)
            if isinstance(outcome, Queued):
                outcome = await service.wait_for_room("http", scope, outcome, self._listening)
            if outcome is None:
                return  # the client left while it waited: it holds nothing
            if isinstance(outcome, tuple):
                decision, retry_after_s, counts = outcome
                body_text = guarded.refusal.body(decision, retry_after_s, counts)
                await send_http_refusal(send, retry_after_s, body_text)
                return
            assert isinstance(outcome, AdmissionTicket)
            await self._run(scope, receive, send, outcome, body, rest_due_in_s)
        finally:
            if self._listening is not None:
                self._listening.close()

    def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ticket: AdmissionTicket,
        body: list[Message],
        rest_due_in_s: float | None,
    ) -> Coroutine[None, None, None]:
        """The admitted request's run of the app (a coroutine of ``WatchedHttp.run``
        itself: no layer of its own)."""
        # The app finds its ticket in the scope: admission_ticket(request).
        scope[SCOPE_KEY] = ticket
        watched = WatchedHttp(
            receive,
            send,
            keeper=self._guarded.keeper,
            entry=settlement_of(ticket),
            body=body,
            rest_due_in_s=rest_due_in_s,
        )
        return watched.run(self._app, scope)


class WebSocketSessionResponder:
    """One WebSocket session request: the decision before the accept, then the answer."""

    __slots__ = ("_app", "_guarded", "_listening")

    def __init__(self, app: ASGIApp, guarded: Guarded) -> None:
        self._app = app
        self._guarded = guarded
        self._listening: Listening | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = self._guarded
        if guarded.load_report is not None:
            send = reporting(guarded.load_report, send)
        service = guarded.service
        try:
            outcome: Outcome | None = service.admit("websocket", scope)
        except LedgerBusy as exc:
            outcome = await service.admit_later("websocket", scope, exc)
        try:
            if isinstance(outcome, (Hold, Queued)):
                # Before the accept: the server's connect is kept for the app, and the
                # next message can only be the client's disconnect.
                try:
                    first = await receive()
                except BaseException:
                    if isinstance(outcome, Hold):
                        service.leave(outcome)
                    raise
                if first["type"] != "websocket.connect":
                    if isinstance(outcome, Hold):
                        service.leave(outcome)
                    return
                self._listening = Listening(receive, [first])
                receive = self._listening.receive
            if isinstance(outcome, Hold):
                outcome = await service.wait("websocket", scope, outcome, self._listening)
            if isinstance(outcome, Queued):
                outcome = await service.wait_for_room("websocket", scope, outcome, self._listening)
            if outcome is None:
                return  # the client left while it waited: it holds nothing
            if isinstance(outcome, tuple):
                decision, retry_after_s, counts = outcome
                await send_websocket_refusal(
                    scope,
                    receive,
                    send,
                    denial=websocket_denial(guarded.websocket_refusal, scope),
                    retry_after_s=retry_after_s,
                    reason=decision.reason or "session_limit",
                    body=guarded.refusal.body(decision, retry_after_s, counts),
                )
                return
            assert isinstance(outcome, AdmissionTicket)
            # The app finds its ticket in the scope: admission_ticket(request).
            scope[SCOPE_KEY] = outcome
            watched = WatchedWebSocket(
                receive, send, keeper=guarded.keeper, entry=settlement_of(outcome)
            )
            await watched.run(self._app, scope)
        finally:
            if self._listening is not None:
                self._listening.close()
