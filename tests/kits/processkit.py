"""Helpers for tests that run servers as subprocesses on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

from kits.requirekit import require_marker


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


class Server:
    """A server subprocess on 127.0.0.1, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], port: int, env: dict[str, str], log: Path) -> None:
        require_marker("real_server", "starts a server process")
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


def open_files(pid: int, name: str) -> set[str]:
    """The paths of the files named ``name`` that process ``pid`` has open."""
    paths = set()
    fd_dir = Path("/proc", str(pid), "fd")
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(fd_dir / fd)
            if os.path.basename(target) == name:
                paths.add(target)
    return paths
