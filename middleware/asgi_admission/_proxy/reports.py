"""The guard's reports to the proxy in front of it: the agent check and the load report.

``RoomReports`` is what ``AdmissionMiddleware`` holds of them (``docs/containers.md``):
the room it looks at, the agent-check listener run with the lifespan where a port is
set, and the view session responses are reported from where the header is on.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from asgi_admission._admission.decision.latch import CapacityDecision
from asgi_admission._admission.decision.observer import AdmissionView
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._metrics.collector import admissible_sessions
from asgi_admission._proxy.agent import AgentListener, serve_with_agent
from asgi_admission._proxy.room import RoomView

#: The readiness probe's look: its decision and the counts it was decided with.
Check = Callable[[], tuple[CapacityDecision, tuple[int, int]]]


class RoomReports:
    """The room ``guard`` reports, and where it reports it; ``check`` is its readiness
    probe's look, ``read`` its reader that never raises."""

    def __init__(
        self, *, guard: AdmissionView, check: Check, read: Callable[[], MemoryReading]
    ) -> None:
        self._guard = guard
        self._check = check
        self._read = read
        self.view = RoomView(self.look)
        config = guard.config
        port = config.agent_port
        self.agent = None if port is None else AgentListener(self.view, port=port)
        #: The view session responses report from; ``None``: no header.
        self.load_report = self.view if config.load_metrics_header else None

    def look(self) -> tuple[CapacityDecision, int | None]:
        """The readiness probe's look (the latch and the counts, container-wide where the
        workers share a ledger), and the admissible sessions the metrics report, on an
        exact reading: the fast path's bound would understate the room."""
        decision, counts = self._check()
        memory = decision.memory if decision.memory.exact else self._read()
        guard = self._guard
        fits = admissible_sessions(guard.controller, memory, counts, guard.session_limit)
        return decision, fits

    def lifespan(self, app: ASGIApp) -> ASGIApp:
        """``app``'s lifespan with the agent-check listener, where there is one."""

        async def with_agent(scope: Scope, receive: Receive, send: Send) -> None:
            await serve_with_agent(self.agent, app, scope, receive, send)

        return app if self.agent is None else with_agent
