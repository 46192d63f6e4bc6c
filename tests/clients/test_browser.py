"""What a real browser (Debian's headless Chromium) sees of the guard's refusals.

Pages are served by one uvicorn (the page origin) and talk to guarded uvicorns on
other ports (other origins); each page posts what its JavaScript saw back to its
own server. Every guarded server holds at most one session, and each test fills
that slot first, so the page's request is refused.
"""

from __future__ import annotations

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
        "auto": api,
        "close": {**api, "ADMISSION_WEBSOCKET_REFUSAL": "close"},
        "deny": {**api, "ADMISSION_WEBSOCKET_REFUSAL": "deny"},
        "cors inside": {**api, "CLIENTS_CORS": "inside"},
    }
    directory = tmp_path_factory.mktemp("browser-servers")
    with serving(specs, directory, ports={"page": page_port}) as started:
        yield started


def visit(chromium: Chromium, page: Server, name: str, **query: Any) -> Any:
    """Open ``/pages/{name}?query`` in a tab and return what its JavaScript reported."""
    run = uuid.uuid4().hex
    params = urlencode({"run": run, **query}, doseq=True)
    target = chromium.open(f"{page.base_url}/pages/{name}?{params}")
    try:
        return wait_result(page, run)
    finally:
        chromium.close(target)


def ws_url(server: Server, path: str = "/terminal/page") -> str:
    return f"ws://127.0.0.1:{server.port}{path}"


@pytest.mark.parametrize(
    ("mode", "protocols"),
    [("auto", []), ("auto", ["tty"]), ("close", [])],
    ids=["auto", "auto with a subprotocol", "close"],
)
def test_browser_websocket_reads_1013_and_the_delay(
    chromium: Chromium, servers: dict[str, Server], mode: str, protocols: list[str]
) -> None:
    """A browser's refused WebSocket opens, then closes cleanly with 1013 and the delay."""
    with holding(servers[mode]):
        seen = visit(
            chromium,
            servers["page"],
            "websocket.html",
            target=ws_url(servers[mode]),
            protocol=protocols,
        )
    assert seen["events"] == ["open", "close"], seen
    assert seen["code"] == 1013
    assert seen["reason"] == "retry_after_s=1; reason=session_limit; Session limit reached"
    assert seen["wasClean"] is True


def test_browser_sees_only_1006_when_denied(chromium: Chromium, servers: dict[str, Server]) -> None:
    """With websocket_refusal="deny" the 503 never reaches JavaScript: error, then close 1006."""
    with holding(servers["deny"]):
        seen = visit(chromium, servers["page"], "websocket.html", target=ws_url(servers["deny"]))
    assert seen["events"] == ["error", "close"], seen
    assert (seen["code"], seen["reason"], seen["wasClean"]) == (1006, "", False)


def test_cross_origin_fetch_reads_the_refusal(
    chromium: Chromium, servers: dict[str, Server]
) -> None:
    """With CORSMiddleware outside the guard, a page on another origin reads 503 and the delay."""
    with holding(servers["auto"]):
        seen = visit(
            chromium, servers["page"], "fetch.html", target=f"{servers['auto'].base_url}/sessions"
        )
    assert seen["status"] == 503, seen
    assert seen["retryAfter"] == "1"
    assert seen["body"]["retry_after_s"] == 1
    assert seen["body"]["reason"] == "session_limit"


def test_cross_origin_fetch_fails_with_cors_inside(
    chromium: Chromium, servers: dict[str, Server]
) -> None:
    """With CORSMiddleware inside the guard the page sees a failed fetch, as the warning says."""
    inside = servers["cors inside"]
    with holding(inside):
        seen = visit(chromium, servers["page"], "fetch.html", target=f"{inside.base_url}/sessions")
    assert seen == {"error": "TypeError: Failed to fetch"}
    assert inside.log_path.read_text().count("CORSMiddleware runs inside AdmissionMiddleware") == 1
    assert "CORSMiddleware runs inside" not in servers["auto"].log_path.read_text()


def test_browser_recipe_waits_and_retries(chromium: Chromium, servers: dict[str, Server]) -> None:
    """examples/clients/admission-retry.js shows why, waits the delay and is admitted, both ways."""
    api = servers["auto"]
    with holding(api, ttl_s=1.5):
        seen = visit(chromium, servers["page"], "recipe.html", api=api.base_url, hold_s=2)
    shown = "Session limit reached; trying again in 1 s."
    for waits in (seen["fetchWaits"], seen["socketWaits"]):
        assert waits, seen
        assert {(w["retryAfterS"], w["reason"], w["shown"]) for w in waits} == {
            (1, "session_limit", shown)
        }
    assert seen["fetchStatus"] == 201
    assert seen["echo"] == "ping"
    assert seen["closeCode"] == 1000
