"""Shared helpers for the middleware tests: a settable reader and guard builders."""

from __future__ import annotations

import os
import subprocess
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from asgi_admission import (
    AdmissionController,
    AdmissionMiddleware,
    MemoryReading,
)
from cgroup_trees import write_v2_tree as write_v2_tree
from processkit import free_port as free_port
from processkit import stop_process_group

with warnings.catch_warnings():
    # Starlette 1.x prefers the httpx2 fork for its TestClient and warns when it
    # falls back to httpx; the fallback works, and httpx is what the project pins.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

__all__ = ["MIB", "Server", "SettableReader", "TestClient", "controller", "free_port", "guard"]

MIB = 1024 * 1024


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
    app: Any,
    reader: Callable[[], MemoryReading],
    *,
    routes: Iterable[str] = ("POST /sessions", "WS /terminal/*"),
    reserve_mb: float = 10,
    max_sessions: int = 100,
    **options: Any,
) -> AdmissionMiddleware:
    return AdmissionMiddleware(
        app,
        session_routes=list(routes),
        controller=controller(reader, reserve_mb=reserve_mb),
        max_sessions=max_sessions,
        **{"retry_after": 5, **options},
    )


class Server:
    """A server subprocess on 127.0.0.1, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], port: int, env: dict[str, str], log: Path) -> None:
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.log_path = log

    def wait_ready(self, path: str = "/health", timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.base_url + path, timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        stop_process_group(self.proc, timeout=10)
        self._log.close()
