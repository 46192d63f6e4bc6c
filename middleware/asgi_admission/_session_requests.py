"""One session request: its body, its decision, then the refusal or the app, and its end.

A responder of its own per request (HTTP or WebSocket) reads an HTTP body before the
decision, asks the admission service, waits with its client heard while it is a waiter,
sends the refusal or runs the app, and tells its reservation how the request ended.
"""

from __future__ import annotations

import asyncio
import sys
from asyncio import current_task
from collections.abc import Coroutine
from time import monotonic
from typing import Any, Final, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.ledger.ledger import LedgerBusy
from asgi_admission._admission.reservations.pending import Reservations
from asgi_admission._admission.reservations.probing import ProbeWaiter
from asgi_admission._admission.reservations.settling import Reservation
from asgi_admission._admission.reservations.tickets import (
    SCOPE_KEY,
    AdmissionTicket,
    reservation_of,
)
from asgi_admission._admission.scheduling.queue import Queued, Refused
from asgi_admission._admission.service import AdmissionService, Outcome
from asgi_admission._config import WebSocketRefusal
from asgi_admission._proxy.capacity import CapacityView, reporting
from asgi_admission._responses import (
    Refusal,
    send_http_refusal,
    send_request_timeout,
    send_websocket_refusal,
    websocket_denial,
)

# --------------------------------------------------------------------------------------
# A session request's body, read before the decision so that a slow client holds nothing
# (docs/reservations.md, "Slow clients"): a reservation made before the body has arrived
# could be held by a client that sends its headers and then nothing, and ASGI servers set
# no body timeout of their own.
#
# The bound is one timer for all the requests still reading (``BodyReader``), which
# cancels a late request's own task while it waits on ``receive``; only a cancellation
# the timer made is taken as the timeout, any other one goes on. Buffering is bounded so
# that the guard itself never holds more than ``buffer_bytes`` per request.

Arrival = Literal["complete", "partial", "disconnected", "timed_out"]

_UNCANCEL: Final = sys.version_info >= (3, 11)


class BodyReader:
    """Reads session requests' bodies before their decision, each within ``timeout_s``.

    One timer serves every request whose body is still arriving (armed for the
    earliest deadline, never per request): a body that is already there, the
    common case, costs a dictionary entry and no timer.
    """

    __slots__ = ("_expired", "_reading", "_timer", "buffer_bytes", "timeout_s")

    def __init__(self, *, timeout_s: float, buffer_bytes: int) -> None:
        self.timeout_s = timeout_s
        self.buffer_bytes = buffer_bytes
        #: The tasks reading a body now, with their deadlines (``time.monotonic``).
        self._reading: dict[asyncio.Task[Any], float] = {}
        #: Those the timer cancelled.
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> asyncio.Task[Any]:
        """The current request begins reading its body: its deadline starts now."""
        task = current_task()
        if task is None:  # pragma: no cover - an ASGI app always runs in a task
            raise RuntimeError("asgi-admission must run inside an asyncio task.")
        self._reading[task] = monotonic() + self.timeout_s
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.timeout_s, self._expire)
        return task

    def stop(self, task: asyncio.Task[Any]) -> float:
        """The request has its body (or left, or timed out): its deadline
        (``time.monotonic``)."""
        return self._reading.pop(task)

    def timed_out(self, task: asyncio.Task[Any]) -> None:
        """Inside ``except CancelledError`` around the read: returns where the timer
        cancelled it (the read timed out), re-raises any other cancellation."""
        if task not in self._expired:
            raise  # the cancellation being handled: not the timer's
        self._expired.discard(task)
        if _UNCANCEL:
            task.uncancel()  # type: ignore[attr-defined,unused-ignore]

    async def rest(self, receive: Receive, message: Message) -> tuple[list[Message], Arrival]:
        """After a first ``message`` that is not the whole body: the messages up to the
        whole body, at most ``buffer_bytes`` of it, or the client leaving."""
        messages = [message]
        size = 0
        while True:
            if message["type"] != "http.request":
                return messages, "disconnected"
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return messages, "complete"
            if size >= self.buffer_bytes:
                return messages, "partial"
            message = await receive()
            messages.append(message)

    def _expire(self) -> None:
        # Cancel the reads past their deadline; re-arm for the earliest one left.
        self._timer = None
        now = monotonic()
        earliest = None
        for task, deadline in self._reading.items():
            if task in self._expired:
                continue
            if deadline <= now:
                self._expired.add(task)
                task.cancel()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._timer = asyncio.get_running_loop().call_later(earliest - now, self._expire)


# --------------------------------------------------------------------------------------
# The client of a waiter, heard while it waits (for a probe's evidence or for capacity).
#
# The service waits (``AdmissionService.wait`` for a probe, ``wait_for_capacity`` in the wait
# queue); this is what it listens to meanwhile, so that a client that leaves ends the wait.
#
# Notes:
#
# - HTTP: the body has been read before the decision, so the next message is the
# client's disconnect, which ends the wait with nothing sent. A body larger than
# the guard's buffer is still arriving: it is not read ahead (it belongs to the
# app), and a client that leaves is found once the app reads it.
# - WebSocket: the wait is before the accept. The server's ``websocket.connect`` is
# taken first and kept for the app (or the refusal); the next message can only be
# the client's disconnect.
# - Whatever is read while waiting is handed to the app in order (``receive``); a
# read still pending when the request ends is cancelled (``close``).

_DISCONNECTS = frozenset({"http.disconnect", "websocket.disconnect"})


class Listening:
    """The client's messages while its request waits: a disconnect is noticed, anything
    else kept for the app."""

    __slots__ = ("_kept", "_quiet", "_receive", "_task")

    def __init__(self, receive: Receive, kept: list[Message] | None = None) -> None:
        self._receive = receive
        self._kept = list(kept or ())
        self._task: asyncio.Task[Message] | None = None
        #: Once anything but a disconnect arrived, nothing more is read ahead.
        self._quiet = False

    def next_message(self) -> asyncio.Task[Message] | None:
        """The client's next message, read in the background (``None``: not listening)."""
        if self._quiet:
            return None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._read())
        return self._task

    async def _read(self) -> Message:
        return await self._receive()

    def heard(self) -> bool:
        """After :meth:`next_message` completed: whether the client left (else the message
        is kept for the app, and nothing more is read ahead)."""
        task, self._task = self._task, None
        assert task is not None
        assert task.done()
        try:
            message = task.result()
        except Exception:
            return True  # the server can no longer give this request anything
        if message["type"] in _DISCONNECTS:
            return True
        self._kept.append(message)
        self._quiet = True
        return False

    async def receive(self) -> Message:
        """The app's ``receive``: what was kept, then what was being read, then the server's."""
        if self._kept:
            return self._kept.pop(0)
        task = self._task
        if task is not None:
            self._task = None
            return await task
        return await self._receive()

    def close(self) -> None:
        """The request is over: a read still pending is cancelled."""
        task, self._task = self._task, None
        if task is not None:
            if task.done():
                if not task.cancelled():
                    task.exception()  # retrieved, so that asyncio does not log it
            else:
                task.cancel()


# --------------------------------------------------------------------------------------
# An admitted session request on its way through the app: when does it end, and how.
#
# These run the app with a ``receive`` and ``send`` that tell the :class:`Reservations`
# how the request ends (docs/reservations.md, "Requests that open nothing"): ``respond``
# (the response ends or the WebSocket is accepted: settling begins), ``fail`` (it opened
# nothing) or ``abandon``. The reservations are told before the message is sent, so a
# client that does not read its response cannot hold a reservation by being slow.
#
# Telling the reservations is idempotent: every path calls it and the first one counts;
# the ``finally`` around the app call also covers ``CancelledError``.

#: Close codes that end a WebSocket without an error (RFC 6455 §7.4.1).
_CLEAN_CLOSE: Final = frozenset({1000, 1001})

Stage = Literal["request", "accepted", "open"]


class WatchedHttp:
    """One admitted HTTP session request's run of the app, its state its own (as
    Starlette's ``GZipMiddleware`` keeps a request's in its ``IdentityResponder``): the
    app gets its :meth:`receive` and :meth:`send`, which tell the reservations how it ended.

    ``body``: the first messages the guard read already; ``rest_due_in_s``: the rest is
    due within that long (``None``: it is all there).
    """

    __slots__ = ("_entry", "_late", "_receive", "_replay", "_reservations", "_send", "_told")

    def __init__(
        self,
        receive: Receive,
        send: Send,
        *,
        reservations: Reservations,
        entry: Reservation,
        body: list[Message],
        rest_due_in_s: float | None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._reservations = reservations
        self._entry = entry
        # Whether the reservations have been told how the request ended (responded or failed).
        self._told = False
        # What the guard read already goes to the app first, in order.
        self._replay = body[::-1]
        self._late: asyncio.TimerHandle | None = None
        if rest_due_in_s is not None:
            self._late = asyncio.get_running_loop().call_later(
                max(0.0, rest_due_in_s), self._body_late
            )

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        """Run ``app`` for the request."""
        try:
            await app(scope, self.receive, self.send)
        finally:
            if not self._told:
                self._reservations.abandon(self._entry)

    def _body_late(self) -> None:
        if not self._told:
            self._told = True
            self._reservations.fail(self._entry, "body_timeout")

    async def receive(self) -> Message:
        if self._replay:
            return self._replay.pop()
        message = await self._receive()
        if self._late is not None and (
            message["type"] != "http.request" or not message.get("more_body", False)
        ):
            self._late.cancel()
            self._late = None
        if message["type"] == "http.disconnect" and not self._told:
            self._told = True
            self._reservations.abandon(self._entry)
        return message

    async def send(self, message: Message) -> None:
        if not self._told:
            message_type = message["type"]
            if message_type == "http.response.start":
                if message["status"] >= 400:
                    self._told = True
                    self._reservations.fail(self._entry, "error_status")
            elif (
                message_type == "http.response.body" and not message.get("more_body", False)
            ) or message_type == "http.response.pathsend":
                self._told = True
                self._reservations.respond(self._entry)
        await self._send(message)


class WatchedWebSocket:
    """One admitted WebSocket session's run of the app, its state its own (as
    :class:`WatchedHttp`'s): its :meth:`receive` and :meth:`send` tell the reservations of
    the accept, a denial and the end."""

    __slots__ = ("_entry", "_receive", "_reservations", "_send", "_stage")

    def __init__(
        self, receive: Receive, send: Send, *, reservations: Reservations, entry: Reservation
    ) -> None:
        self._receive = receive
        self._send = send
        self._reservations = reservations
        self._entry = entry
        # "request" until the accept, "accepted" until anything else passes, then "open".
        self._stage: Stage = "request"

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        """Run ``app`` for the session."""
        try:
            await app(scope, self.receive, self.send)
        finally:
            self._reservations.abandon(self._entry, session_over=True)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self._reservations.abandon(self._entry, session_over=True)
        elif self._stage == "accepted":
            self._stage = "open"
        return message

    async def send(self, message: Message) -> None:
        message_type = message["type"]
        if opened_nothing(self._stage, message):
            self._reservations.fail(self._entry, "error_status")
        if self._stage == "accepted":
            self._stage = "open"
        try:
            await self._send(message)
        finally:
            if message_type == "websocket.close" or message_type.startswith(
                "websocket.http.response"
            ):
                self._reservations.abandon(self._entry, session_over=True)
        if message_type == "websocket.accept":
            self._stage = "accepted"
            self._reservations.respond(self._entry)


def opened_nothing(stage: Stage, message: Message) -> bool:
    """Whether ``message`` from the app ends a WebSocket that opened no session: a close
    before the accept (a denial), a denial response of 400 or more, or a close with an
    error code as the first thing after the accept."""
    message_type = message["type"]
    if message_type == "websocket.close":
        return stage == "request" or (
            stage == "accepted" and message.get("code", 1000) not in _CLEAN_CLOSE
        )
    return (
        message_type == "websocket.http.response.start"
        and stage == "request"
        and message["status"] >= 400
    )


# --------------------------------------------------------------------------------------
# One guarded session request over ASGI: its responder asks the service, then answers
# (docs/design.md, "One session request", step 2). Like Starlette's ``GZipMiddleware``
# with its ``IdentityResponder``, each request gets a responder of its own, which holds
# that request's state. Nothing here holds the ledger's lock across an ``await``.


class Guarded:
    """What every session request of one guard is answered with, built once."""

    __slots__ = ("bodies", "load_report", "refusal", "reservations", "service", "websocket_refusal")

    def __init__(
        self,
        *,
        service: AdmissionService,
        refusal: Refusal,
        websocket_refusal: WebSocketRefusal,
        load_report: CapacityView | None,
    ) -> None:
        self.service = service
        self.reservations = service.reservations
        self.refusal = refusal
        config = service.config
        self.bodies = BodyReader(
            timeout_s=config.body_timeout_s, buffer_bytes=config.body_buffer_bytes
        )
        self.websocket_refusal = websocket_refusal
        #: Where session responses report the capacity from; ``None``: no header.
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
        # The body first: a client still sending it holds nothing.
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
            deadline = bodies.stop(task)
        if arrival == "disconnected":
            return
        service = guarded.service
        if arrival == "timed_out":
            guarded.reservations.count_failure("http", "body_timeout")
            await send_request_timeout(send, service.config.body_timeout_s)
            return
        try:
            outcome: Outcome | None = service.admit("http", scope)
        except LedgerBusy as exc:
            outcome = await service.admit_later("http", scope, exc)
        rest_due_in_s = deadline - monotonic() if arrival == "partial" else None
        if type(outcome) is AdmissionTicket:
            # The common case, admitted at once: it waited for nothing, listens to nothing.
            await self._run(scope, receive, send, outcome, body, rest_due_in_s)
            return
        try:
            if isinstance(outcome, (ProbeWaiter, Queued)) and arrival == "complete":
                # The body is in: the client's next message can only be its disconnect.
                self._listening = Listening(receive)
                receive = self._listening.receive
            if isinstance(outcome, ProbeWaiter):
                outcome = await service.wait("http", scope, outcome, self._listening)
            if isinstance(outcome, Queued):
                outcome = await service.wait_for_capacity("http", scope, outcome, self._listening)
            if outcome is None:
                return  # the client left while it waited: it holds nothing
            if isinstance(outcome, Refused):
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
        """The admitted request's run of the app: the coroutine of ``WatchedHttp.run``."""
        # The app finds its ticket in the scope: admission_ticket(request).
        scope[SCOPE_KEY] = ticket
        watched = WatchedHttp(
            receive,
            send,
            reservations=self._guarded.reservations,
            entry=reservation_of(ticket),
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
            if isinstance(outcome, (ProbeWaiter, Queued)):
                # Before the accept: the server's connect is kept for the app, and the
                # next message can only be the client's disconnect.
                try:
                    first = await receive()
                except BaseException:
                    if isinstance(outcome, ProbeWaiter):
                        service.leave(outcome)
                    raise
                if first["type"] != "websocket.connect":
                    if isinstance(outcome, ProbeWaiter):
                        service.leave(outcome)
                    return
                self._listening = Listening(receive, [first])
                receive = self._listening.receive
            if isinstance(outcome, ProbeWaiter):
                outcome = await service.wait("websocket", scope, outcome, self._listening)
            if isinstance(outcome, Queued):
                outcome = await service.wait_for_capacity(
                    "websocket", scope, outcome, self._listening
                )
            if outcome is None:
                return  # the client left while it waited: it holds nothing
            if isinstance(outcome, Refused):
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
                receive, send, reservations=guarded.reservations, entry=reservation_of(outcome)
            )
            await watched.run(self._app, scope)
        finally:
            if self._listening is not None:
                self._listening.close()
