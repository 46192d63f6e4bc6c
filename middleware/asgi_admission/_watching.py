"""An admitted session request on its way through the app: when does it end, and how.

The middleware has decided and reserved; these run the app with a ``receive``
and ``send`` that tell the :class:`ReservationKeeper` how the request ends
(``docs/reservations.md``):

- HTTP: the response ends (``respond``: settling begins), the app answers with
  a status of 400 or more (``fail``: it opened nothing), the client disconnects
  or the app returns or raises without a complete response (``abandon``). The
  keeper is told before the message is sent, so a client that does not read its
  response cannot hold a reservation by being slow. A body the guard could not
  read whole before deciding gives its reservation back if the rest comes late.
- WebSocket: the accept (``respond``); a close before or at the accept with an
  error, or a denial of 400 or more (``fail``); either side closing or the app
  returning (``abandon``, the session is over).

Telling the keeper is idempotent: every path calls it and the first one counts;
the ``finally`` around the app call also covers ``CancelledError``.
"""

from __future__ import annotations

import asyncio
from typing import Final, Literal

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asgi_admission._admission.reservations.pending import ReservationKeeper
from asgi_admission._admission.reservations.settling import Settlement

#: Close codes that end a WebSocket without an error (RFC 6455 §7.4.1).
_CLEAN_CLOSE: Final = frozenset({1000, 1001})

Stage = Literal["request", "accepted", "open"]


class WatchedHttp:
    """One admitted HTTP session request's run of the app, its state its own (as
    Starlette's ``GZipMiddleware`` keeps a request's in its ``IdentityResponder``): the
    app gets its :meth:`receive` and :meth:`send`, which tell the keeper how it ended.

    ``body``: the first messages the guard read already; ``rest_due_in_s``: the rest is
    due within that long (``None``: it is all there).
    """

    __slots__ = ("_entry", "_keeper", "_late", "_receive", "_replay", "_send", "_told")

    def __init__(
        self,
        receive: Receive,
        send: Send,
        *,
        keeper: ReservationKeeper,
        entry: Settlement,
        body: list[Message],
        rest_due_in_s: float | None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._keeper = keeper
        self._entry = entry
        # Whether the keeper has been told how the request ended (responded or failed).
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
                self._keeper.abandon(self._entry)

    def _body_late(self) -> None:
        if not self._told:
            self._told = True
            self._keeper.fail(self._entry, "body_timeout")

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
            self._keeper.abandon(self._entry)
        return message

    async def send(self, message: Message) -> None:
        if not self._told:
            message_type = message["type"]
            if message_type == "http.response.start":
                if message["status"] >= 400:
                    self._told = True
                    self._keeper.fail(self._entry, "error_status")
            elif (
                message_type == "http.response.body" and not message.get("more_body", False)
            ) or message_type == "http.response.pathsend":
                self._told = True
                self._keeper.respond(self._entry)
        await self._send(message)


class WatchedWebSocket:
    """One admitted WebSocket session's run of the app, its state its own (as
    :class:`WatchedHttp`'s): its :meth:`receive` and :meth:`send` tell the keeper of
    the accept, a denial and the end."""

    __slots__ = ("_entry", "_keeper", "_receive", "_send", "_stage")

    def __init__(
        self, receive: Receive, send: Send, *, keeper: ReservationKeeper, entry: Settlement
    ) -> None:
        self._receive = receive
        self._send = send
        self._keeper = keeper
        self._entry = entry
        # "request" until the accept, "accepted" until anything else passes, then "open".
        self._stage: Stage = "request"

    async def run(self, app: ASGIApp, scope: Scope) -> None:
        """Run ``app`` for the session."""
        try:
            await app(scope, self.receive, self.send)
        finally:
            self._keeper.abandon(self._entry, session_over=True)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "websocket.disconnect":
            self._keeper.abandon(self._entry, session_over=True)
        elif self._stage == "accepted":
            self._stage = "open"
        return message

    async def send(self, message: Message) -> None:
        message_type = message["type"]
        if opened_nothing(self._stage, message):
            self._keeper.fail(self._entry, "error_status")
        if self._stage == "accepted":
            self._stage = "open"
        try:
            await self._send(message)
        finally:
            if message_type == "websocket.close" or message_type.startswith(
                "websocket.http.response"
            ):
                self._keeper.abandon(self._entry, session_over=True)
        if message_type == "websocket.accept":
            self._stage = "accepted"
            self._keeper.respond(self._entry)


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
