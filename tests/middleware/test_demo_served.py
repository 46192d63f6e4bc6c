"""The `asgi-admission demo` command under uvicorn: what a proxy in front of it meets."""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import pytest

from kits.cgroupkit import demo

pytestmark = [pytest.mark.real_server]

#: Longer than uvicorn's default keep-alive timeout (5 s).
IDLE_S = 6


def test_an_idle_connection_outlives_uvicorns_default_keep_alive(tmp_path: Path) -> None:
    """A client (a proxy's pooled connection) leaves its connection idle 6 s and sends
    its next request on it: the server kept it open and answers. At uvicorn's default it
    would have closed it after 5 s, and a request sent as it closes is reset."""
    with demo([], tmp_path / "demo.log") as server:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            connection.request("GET", "/health")
            first = connection.getresponse()
            first.read()
            socket = connection.sock
            time.sleep(IDLE_S)
            connection.request("GET", "/health")
            second = connection.getresponse()
            second.read()
            assert (first.status, second.status) == (200, 200)
            assert connection.sock is socket  # the one connection, never reopened
        finally:
            connection.close()
