"""Helpers for tests that run servers as subprocesses on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process_group(proc: subprocess.Popen[bytes], *, timeout: float = 10) -> None:
    """SIGTERM ``proc``'s process group, then SIGKILL it if it has not ended in ``timeout``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
