"""Marimo notebooks served with ``marimo.create_asgi_app()``, guarded by asgi-admission.

The guard wraps the whole app the builder returns, so every request passes it first.
A session is a notebook's WebSocket, ``/nb/ws`` (the front end opens
``/nb/ws?session_id=s_xxxxxx``): marimo starts the notebook's kernel, a thread in this
process, once it has accepted the socket. The notebook, ``notebook.py``, is read from
the directory the server starts in.
"""

from __future__ import annotations

import marimo

from asgi_admission import AdmissionMiddleware

notebooks = marimo.create_asgi_app(quiet=True).with_app(path="/nb", root="notebook.py")
app = AdmissionMiddleware(notebooks.build(), session_routes=["WS /nb/ws"])
