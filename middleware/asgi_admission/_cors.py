"""Noticing Starlette's ``CORSMiddleware`` inside the guard, where it cannot help refusals
(docs/clients.md, "CORS: put ``CORSMiddleware`` outside the guard").

Starlette (and FastAPI, which uses Starlette's stack) builds its middleware from the
inside out, so when the guard is constructed everything inside it already exists: the
chain of ``.app`` attributes leads down to the router. Middleware listed before the
guard in ``middleware=[...]`` (or added after it with FastAPI's ``add_middleware``) is
outside and never on that chain. A guard wrapping a whole Starlette application sees
its ``user_middleware``.
"""

from __future__ import annotations

from typing import Final

from starlette.middleware.cors import CORSMiddleware

#: How far down the ``.app`` chain to look; real stacks are a handful deep.
_MAX_DEPTH: Final = 64

CORS_INSIDE_WARNING: Final = (
    "asgi-admission: CORSMiddleware runs inside AdmissionMiddleware, so the guard's "
    "refusals (503 + Retry-After) carry no CORS headers and a page on another origin "
    "sees only a failed fetch. Put CORSMiddleware outside the guard: list it before "
    "AdmissionMiddleware in Starlette's middleware=[...], or in FastAPI call "
    "app.add_middleware(CORSMiddleware, ...) after app.add_middleware(AdmissionMiddleware, "
    "...); and give it expose_headers=['Retry-After'] (see docs/clients.md)."
)


def cors_inside(app: object) -> bool:
    """Whether Starlette's ``CORSMiddleware`` runs somewhere inside ``app``."""
    node: object = app
    for _ in range(_MAX_DEPTH):
        if isinstance(node, CORSMiddleware):
            return True
        entries = getattr(node, "user_middleware", None)
        for entry in entries if isinstance(entries, list) else ():
            cls = getattr(entry, "cls", None)
            if isinstance(cls, type) and issubclass(cls, CORSMiddleware):
                return True
        node = getattr(node, "app", None)
        if node is None:
            return False
    return False
