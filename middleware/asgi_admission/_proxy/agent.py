"""The agent-check listener: the replica's capacity in one line per connection, for HAProxy.

Started and stopped with the app's lifespan, on every interface with ``SO_REUSEPORT``,
so every worker of a container listens on the same port and answers alike; its bounds
on what a client may send or hold: docs/containers.md, "Bounded".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, cast

from asgi_admission._proxy.capacity import CapacityView, agent_line

logger = logging.getLogger("asgi_admission")

#: The longest a connection stays open, answered or not.
ANSWER_TIMEOUT_S: Final = 2.0
#: What a client may send (HAProxy sends nothing, or its short ``agent-send`` string).
MAX_RECEIVED_BYTES: Final = 1024
#: Connections open at once; more are closed unanswered.
MAX_CONNECTIONS: Final = 256


class _Answer(asyncio.Protocol):
    """One agent-check connection."""

    __slots__ = ("_agent", "_received", "_timer", "_transport")

    def __init__(self, agent: AgentListener) -> None:
        self._agent = agent
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no asyncio.Transport subclasses, but have its methods.
        transport = cast(asyncio.Transport, transport)
        self._transport = transport
        agent = self._agent
        if len(agent.open) >= MAX_CONNECTIONS:
            transport.abort()
            return
        agent.open.add(self)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(ANSWER_TIMEOUT_S, transport.abort)
        capacity = agent.view.fresh()
        if capacity is not None:
            self.answer(agent_line(capacity))
        else:
            agent.waiting.append(self)
            agent.check_soon()

    def answer(self, line: bytes | None) -> None:
        """Say ``line`` (``None``: nothing, the check failed) and close once it is sent."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if line is not None:
            transport.write(line)
        transport.close()

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        if self._received > MAX_RECEIVED_BYTES and self._transport is not None:
            self._transport.abort()

    def eof_received(self) -> bool:
        return True  # half-closed by the client: the answer can still go out

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._agent.open.discard(self)
        self._transport = None

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class AgentListener:
    """The agent-check listener on ``port``, answering from ``view``."""

    def __init__(self, view: CapacityView, *, port: int) -> None:
        self.view = view
        self.port = port
        self._server: asyncio.Server | None = None
        self.open: set[_Answer] = set()
        self.waiting: list[_Answer] = []
        self._checking: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Listen; a port that cannot be had is logged at ERROR and the service runs on."""
        if self._server is not None:
            return
        try:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: _Answer(self), None, self.port, reuse_port=True, backlog=128
            )
        except OSError as exc:
            logger.error(
                "asgi-admission: the agent-check listener cannot listen on port %d "
                "(ADMISSION_AGENT_PORT): %s. The service runs without it.",
                self.port,
                exc,
            )

    async def stop(self) -> None:
        """Stop listening and cut off the connections still open."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for answer in list(self.open):
            answer.abort()
        self.waiting.clear()
        checking, self._checking = self._checking, None
        if checking is not None and not checking.done():
            checking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await checking
        if server is not None:
            await server.wait_closed()

    def check_soon(self) -> None:
        """Answer the waiting connections once the capacity is checked (one check for all)."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._answer_waiting())

    async def _answer_waiting(self) -> None:
        try:
            line: bytes | None = agent_line(await self.view.now())
        except Exception:
            line = None  # logged by the view; HAProxy keeps the last weight
        waiting, self.waiting = self.waiting, []
        for answer in waiting:
            answer.answer(line)
