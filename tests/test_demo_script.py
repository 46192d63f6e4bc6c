"""``bash scripts/demo`` on a fresh copy of the repository: no Go, no apt-get, /health soon."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kits.processkit import free_port, stop_process_group
from kits.suitekit import ROOT

#: "About a minute" on a fresh machine; generous, since the test machines are shared.
SERVE_WITHIN_S = 240


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a clone would have them (tracked and new, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if not source.is_file():
            continue  # deleted in the work tree
        target = dest / os.fsdecode(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        target.chmod(source.stat().st_mode)
    return dest


def failing_tools(shims: Path, called: Path) -> Path:
    """A directory of ``apt-get``, ``go`` and ``helm`` that record the call and fail."""
    shims.mkdir()
    for tool in ("apt-get", "go", "helm", "sudo"):
        script = shims / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{called}"\nexit 1\n')
        script.chmod(0o755)
    return shims


@pytest.mark.slow
@pytest.mark.real_server
def test_demo_serves_health_without_go_or_apt_get(tmp_path: Path) -> None:
    """A fresh copy with no Go and a failing apt-get serves /health, calling neither."""
    repo = fresh_copy(tmp_path / "clone")
    called = tmp_path / "called.txt"
    shims = failing_tools(tmp_path / "shims", called)
    python = os.path.realpath(sys.executable)  # the interpreter behind the test's venv
    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": f"{shims}:/usr/bin:/bin",
        "PYTHON": python,
        "LANG": "C.UTF-8",
    }
    port = free_port()
    log = (tmp_path / "demo.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "scripts/demo", "--port", str(port)],
        cwd=repo,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        healthy = False
        while time.monotonic() - started < SERVE_WITHIN_S and proc.poll() is None:
            try:
                healthy = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy:
                break
            time.sleep(0.5)
        elapsed = time.monotonic() - started
        output = (tmp_path / "demo.log").read_text(errors="replace")
        assert healthy, f"no /health after {elapsed:.0f} s; exit {proc.poll()}:\n{output}"
        assert not called.exists(), called.read_text()
        assert not (repo / ".tools").exists()
        assert (repo / ".venv-demo" / "bin" / "asgi-admission").exists()
        print(f"scripts/demo served /health {elapsed:.1f} s after it started")
    finally:
        stop_process_group(proc)
        log.close()
