"""A jupyverse plugin that guards the server's session route with asgi-admission.

Jupyverse builds its FastAPI app from fps modules found by the ``jupyverse.modules``
entry point; this module is one more of them. It adds ``AdmissionMiddleware`` to the
app while the modules prepare, before the server serves it, so every request to the
app passes the guard first. ``POST /api/sessions`` is the route that starts a kernel.

Each kernel's process is registered with a session watchdog, which runs while the
server does, under the admission ticket of the request that started the kernel: the
kernel's own memory, measured, settles that session's reservation. When the process
ends (``DELETE /api/sessions/{id}``, ``DELETE /api/kernels/{id}``, or the kernel
dying), the watchdog ends its session and a reservation still pending is given back.
"""

from __future__ import annotations

import contextlib

import psutil
from fastapi import FastAPI, Request
from fps import Module
from fps_kernels.kernel_server.server import kernels as running
from jupyverse_auth import User
from jupyverse_kernels import Kernels
from jupyverse_kernels.models import Session

from asgi_admission import (
    AdmissionMiddleware,
    AdmissionTicket,
    SessionPeak,
    SessionWatchdog,
    admission_ticket,
    metrics_route,
)


def kernel_pid(connection_file: str) -> int | None:
    """The server's child process started with ``connection_file``: the kernel (jupyverse
    does not publish its process, but its command names the connection file)."""
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if connection_file in child.cmdline():
                return child.pid
    return None


class AdmissionModule(Module):
    """Adds the guard and ``/metrics`` to jupyverse's app and measures its kernels with a
    watchdog of its own; the settings come from the environment."""

    async def prepare(self) -> None:
        app = await self.get(FastAPI)
        kernels = await self.get(Kernels)  # type: ignore[type-abstract]
        # Not handed to the middleware, which would learn what a kernel costs from its
        # highest RSS: that counts the libraries all kernels share (docs/servers.md).
        self.watchdog = watchdog = SessionWatchdog.from_env()
        app.add_middleware(AdmissionMiddleware, session_routes=["POST /api/sessions"])
        app.router.routes.append(metrics_route())
        tickets: dict[str, AdmissionTicket] = {}  # by jupyverse's session id
        create_session = kernels.create_session

        async def create_measured_session(request: Request, user: User) -> Session:
            session = await create_session(request, user)
            ticket = admission_ticket(request)
            if session is not None and ticket is not None:
                kernel = running[session.kernel.id]["server"].kernel
                pid = kernel_pid(kernel.connection_file)
                if pid is not None:
                    tickets[session.id] = ticket
                    watchdog.register(pid, session_id=session.id, ticket=ticket)
            return session

        def ended(peak: SessionPeak) -> None:
            # The kernel's process is gone (or halted): a reservation still pending ends.
            ticket = tickets.pop(peak.session_id, None)
            if ticket is not None and ticket.state == "pending":
                ticket.release()

        kernels.create_session = create_measured_session  # type: ignore[method-assign]
        watchdog.on_session_peak = ended

    async def start(self) -> None:
        await self.watchdog.start()

    async def stop(self) -> None:
        await self.watchdog.stop()
