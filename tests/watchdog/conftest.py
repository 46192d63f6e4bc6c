"""Fixtures for the watchdog tests: real children, always killed and reaped afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from watchdogkit import CHILD, Child, FixedReader, Spawn, reading

from asgi_admission import AdmissionConfig


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start children; every one (and its group) is killed and reaped at teardown."""
    started: list[Child] = []

    def start(
        mib: int,
        *,
        new_session: bool = True,
        children: int = 0,
        child_mib: int = 0,
        ignore_term: bool = False,
    ) -> Child:
        argv = [sys.executable, "-c", CHILD, str(mib), str(children), str(child_mib), CHILD]
        if ignore_term:
            argv.append("--ignore-term")
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=new_session,
        )
        child = Child(popen)
        started.append(child)
        assert popen.stdout is not None
        assert popen.stdout.readline().strip() == "ready"
        return child

    yield start
    for child in started:
        if child.popen.poll() is None:
            if os.getpgid(child.pid) == child.pid:
                os.killpg(child.pid, signal.SIGKILL)
            else:
                child.popen.kill()
        child.popen.wait(timeout=10)
        for stream in (child.popen.stdin, child.popen.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def calm() -> FixedReader:
    """A container comfortably under every watermark."""
    return FixedReader(reading(10.0))


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def config() -> AdmissionConfig:
    return AdmissionConfig()
