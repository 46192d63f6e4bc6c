"""What a real browser (Debian's headless Chromium) sees of a WebSocket that waits for capacity.

As in ``test_browser.py``: the page is served by one uvicorn, the guarded uvicorns hold
one session each (``ADMISSION_MAX_SESSIONS=1``, the app's own count), and each test fills
that slot first. Here the guards let a session request wait: its handshake simply takes
longer, then opens, or ends with the 1013 close once its wait runs out.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from browser import Chromium
from clientkit import holding, serving, wait_result

from kits.processkit import Server, free_port

pytestmark = [pytest.mark.real_server, pytest.mark.browser, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    browser = Chromium(tmp_path_factory.mktemp("chromium") / "profile")
    try:
        yield browser
    finally:
        browser.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    page_port = free_port()
    api = {"CLIENTS_ALLOW_ORIGIN": f"http://127.0.0.1:{page_port}"}
    specs = {
        "page": {"CLIENTS_CORS": "none"},
        "long wait": {**api, "ADMISSION_QUEUE_TIMEOUT_SECONDS": "10"},
        "short wait": {**api, "ADMISSION_QUEUE_TIMEOUT_SECONDS": "1"},
    }
    directory = tmp_path_factory.mktemp("browser-waiting-servers")
    with serving(specs, directory, ports={"page": page_port}) as started:
        yield started


def visit(chromium: Chromium, page: Server, target: Server, **query: Any) -> Any:
    """Open the waiting page against ``target``'s terminal; what its JavaScript reported."""
    run = uuid.uuid4().hex
    url = f"ws://127.0.0.1:{target.port}/terminal/page"
    params = urlencode({"run": run, "target": url, **query})
    tab = chromium.open(f"{page.base_url}/pages/websocket-wait.html?{params}")
    try:
        return wait_result(page, run)
    finally:
        chromium.close(tab)


def test_a_browsers_websocket_waits_then_opens(
    chromium: Chromium, servers: dict[str, Server]
) -> None:
    """The slot is held by a session that ends after 1.5 s: the page's socket opens once it
    has, within a second of it (the guard sees the app's count fall), and closes cleanly.

    Timed on the wall clock from the hold, not from the page's start: the browser takes a
    while of its own to load the page, during which the hold's time runs already."""
    asked = time.time()  # the session's 1.5 s start after this
    with holding(servers["long wait"], ttl_s=1.5):
        held = time.time()  # and before this
        seen = visit(chromium, servers["page"], servers["long wait"], close="1")
    assert seen["events"] == ["open", "close"], seen
    opened = seen["openedAtMs"] / 1000
    assert opened - asked >= 1.4, seen  # not before the session ended (the clocks' grain)
    assert opened - held < 2.5, seen
    assert (seen["code"], seen["wasClean"]) == (1000, True)


def test_a_browsers_websocket_whose_wait_runs_out_reads_1013(
    chromium: Chromium, servers: dict[str, Server]
) -> None:
    """The slot stays held: after its 1 s wait the page's socket opens and closes cleanly
    with 1013, the delay and reason ``queue_timeout``."""
    with holding(servers["short wait"]):
        seen = visit(chromium, servers["page"], servers["short wait"])
    assert seen["events"] == ["open", "close"], seen
    assert seen["code"] == 1013
    assert seen["wasClean"] is True
    assert seen["reason"].startswith("retry_after_s="), seen
    assert "; reason=queue_timeout; " in seen["reason"], seen
    assert seen["closedAfterMs"] >= 1000, seen
