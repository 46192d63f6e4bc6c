"""Debian's headless Chromium, opening tabs over the DevTools protocol.

Notes:

- The pages report what their JavaScript saw to their own server; the browser is
  only told which URL to open (``Target.createTarget``), so the CDP client here is
  a single request over the ``websockets`` sync client.
- ``--remote-debugging-port=0`` lets Chromium pick a free port; it writes the port
  and the browser's endpoint to ``DevToolsActivePort`` in the profile directory.
- The flags are those that work as root in a container: no sandbox, no GPU, no
  QUIC, and nothing that reaches the network on its own (loopback only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

from kits.processkit import stop_process_group

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-port=0",
)


def unavailable(reason: str) -> None:
    """Skip a browser test here, but fail it under ``CI=true``, where Chromium must run."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the real-browser tests must run)")
    pytest.skip(reason)


class Chromium:
    """A headless Chromium with a fresh profile under ``profile``; ``stop()`` ends it."""

    def __init__(self, profile: Path, *, timeout: float = 30.0) -> None:
        binary = shutil.which("chromium")
        if binary is None:
            unavailable("chromium is not installed (scripts/setup installs Debian's chromium)")
            raise AssertionError  # pragma: no cover - unavailable() raises
        profile.mkdir(parents=True, exist_ok=True)
        self._log_path = profile.with_suffix(".log")
        self._log = self._log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not active.exists() or len(active.read_text().split()) < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                unavailable(f"chromium did not start:\n{self._log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        port, path = active.read_text().split()[:2]
        self._endpoint = f"ws://127.0.0.1:{port}{path}"

    def _command(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        with connect(self._endpoint, open_timeout=10, max_size=None) as cdp:
            cdp.send(json.dumps({"id": 1, "method": method, "params": params}))
            while True:
                reply = json.loads(cdp.recv(timeout=10))
                if reply.get("id") == 1:
                    if "error" in reply:
                        raise RuntimeError(f"{method} failed: {reply['error']}")
                    result: dict[str, Any] = reply["result"]
                    return result

    def open(self, url: str) -> str:
        """Open ``url`` in a new tab; its target id."""
        target: str = self._command("Target.createTarget", {"url": url})["targetId"]
        return target

    def close(self, target: str) -> None:
        self._command("Target.closeTarget", {"targetId": target})

    def stop(self) -> None:
        stop_process_group(self.proc, timeout=5)
        self._log.close()
