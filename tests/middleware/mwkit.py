"""Shared helpers for the middleware tests: a settable reader and guard builders."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from starlette.types import ASGIApp

from asgi_admission import (
    AdmissionController,
    AdmissionMiddleware,
    MemoryReading,
)
from kits.cgroup_trees import write_v2_tree as write_v2_tree
from kits.processkit import Server as Server
from kits.processkit import free_port as free_port
from kits.suitekit import MIB

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork for its TestClient and warns when it
    # falls back to httpx; the fallback works, and httpx is what the project pins.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

__all__ = [
    "NOT_PROBING",
    "Server",
    "SettableReader",
    "TestClient",
    "controller",
    "free_port",
    "guard",
]

#: A pending timeout so short that a reservation ends with its response or accept, as
#: an in-request session's does once its memory shows: these tests are about the
#: request's lifecycle (tests/middleware/test_settling*.py are about settling).
AT_RESPONSE = {"ADMISSION_PENDING_TIMEOUT_SECONDS": "1e-9"}
#: No probing of routes not learned yet: a fixed reading never grows, so a probe would
#: teach such tests' sessions a footprint of 0 after a quiet spell and change what they
#: are about (tests/middleware/test_probing.py is about probing, with it on).
NOT_PROBING = {"ADMISSION_PROBE_SESSIONS": "0"}


@contextlib.contextmanager
def environment(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in ``os.environ`` while a guard is built (with ``controller=``, the
    middleware reads its other settings from the environment), restored after."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class SettableReader:
    """A memory reader whose figures the test sets; counts its calls."""

    def __init__(self, used_mb: float = 100, limit_mb: float = 1000) -> None:
        self.used = int(used_mb * MIB)
        self.limit: int | None = int(limit_mb * MIB)
        self.available = True
        self.calls = 0

    def set_mb(self, used_mb: float) -> None:
        self.used = int(used_mb * MIB)

    def __call__(self) -> MemoryReading:
        self.calls += 1
        return MemoryReading(
            used_bytes=self.used if self.available else None,
            limit_bytes=self.limit if self.available else None,
            available=self.available,
            path="/fake/cgroup",
        )


def controller(
    reader: Callable[[], MemoryReading],
    *,
    reserve_mb: float = 10,
    high: float = 80,
    resume: float = 70,
) -> AdmissionController:
    return AdmissionController(
        high_watermark_percent=high,
        resume_threshold_percent=resume,
        reserve_bytes=int(reserve_mb * MIB),
        memory_reader=reader,
    )


def guard(
    app: ASGIApp,
    reader: Callable[[], MemoryReading],
    *,
    routes: Iterable[str] = ("POST /sessions", "WS /terminal/*"),
    reserve_mb: float = 10,
    max_sessions: int = 100,
    **options: Any,
) -> AdmissionMiddleware:
    with environment({**AT_RESPONSE, **NOT_PROBING}):
        return AdmissionMiddleware(
            app,
            session_routes=list(routes),
            controller=controller(reader, reserve_mb=reserve_mb),
            max_sessions=max_sessions,
            **{"retry_after": 5, **options},
        )
