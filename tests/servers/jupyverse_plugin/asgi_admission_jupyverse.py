"""A jupyverse plugin that guards the server's session route with asgi-admission.

Jupyverse builds its FastAPI app from fps modules found by the ``jupyverse.modules``
entry point; this module is one more of them. It adds ``AdmissionMiddleware`` to the
app while the modules prepare, before the server serves it, so every request to the
app passes the guard first. ``POST /api/sessions`` is the route that starts a kernel.
"""

from __future__ import annotations

from fastapi import FastAPI
from fps import Module

from asgi_admission import AdmissionMiddleware


class AdmissionModule(Module):
    """Adds the guard to jupyverse's app; the guard's settings come from the environment."""

    async def prepare(self) -> None:
        app = await self.get(FastAPI)
        app.add_middleware(AdmissionMiddleware, session_routes=["POST /api/sessions"])
