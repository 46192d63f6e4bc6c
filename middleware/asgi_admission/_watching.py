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

from asgi_admission._admission.reservations.keeper import ReservationKeeper
from asgi_admission._admission.reservations.settlement import Settlement

#: Close codes that end a WebSocket without an error (RFC 6455 §7.4.1).
_CLEAN_CLOSE: Final = frozenset({1000, 1001})

Stage = Literal["request", "accepted", "open"]


async def run_http(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    keeper: ReservationKeeper,
    entry: Settlement,
    body: list[Message],
    rest_due_in_s: float | None,
) -> None:
    """Run ``app`` for an admitted HTTP session request whose first ``body`` messages
    the guard read already (``rest_due_in_s``: the rest is due within that long)."""
    # Whether the keeper has been told how the request ended (responded or failed).
    told = False
    # What the guard read already goes to the app first, in order.
    replay = body[::-1]
    late = None
    if rest_due_in_s is not None:

        def body_late() -> None:
            nonlocal told
            if not told:
                told = True
                keeper.fail(entry, "body_timeout")

        late = asyncio.get_running_loop().call_later(max(0.0, rest_due_in_s), body_late)

    async def receive_watching() -> Message:
        nonlocal told, late
        if replay:
            return replay.pop()
        message = await receive()
        if late is not None and (
            message["type"] != "http.request" or not message.get("more_body", False)
        ):
            late.cancel()
            late = None
        if message["type"] == "http.disconnect" and not told:
            told = True
            keeper.abandon(entry)
        return message

    async def send_watching(message: Message) -> None:
        nonlocal told
        if not told:
            message_type = message["type"]
            if message_type == "http.response.start":
                if message["status"] >= 400:
                    told = True
                    keeper.fail(entry, "error_status")
            elif (
                message_type == "http.response.body" and not message.get("more_body", False)
            ) or message_type == "http.response.pathsend":
                told = True
                keeper.respond(entry)
        await send(message)

    try:
        await app(scope, receive_watching, send_watching)
    finally:
        if not told:
            keeper.abandon(entry)


async def run_websocket(
    app: ASGIApp,
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    keeper: ReservationKeeper,
    entry: Settlement,
) -> None:
    """Run ``app`` for an admitted WebSocket session."""
    # "request" until the accept, "accepted" until anything else passes, then "open".
    stage: Stage = "request"

    async def receive_watching() -> Message:
        nonlocal stage
        message = await receive()
        if message["type"] == "websocket.disconnect":
            keeper.abandon(entry, session_over=True)
        elif stage == "accepted":
            stage = "open"
        return message

    async def send_watching(message: Message) -> None:
        nonlocal stage
        message_type = message["type"]
        if opened_nothing(stage, message):
            keeper.fail(entry, "error_status")
        if stage == "accepted":
            stage = "open"
        try:
            await send(message)
        finally:
            if message_type == "websocket.close" or message_type.startswith(
                "websocket.http.response"
            ):
                keeper.abandon(entry, session_over=True)
        if message_type == "websocket.accept":
            stage = "accepted"
            keeper.respond(entry)

    try:
        await app(scope, receive_watching, send_watching)
    finally:
        keeper.abandon(entry, session_over=True)


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
