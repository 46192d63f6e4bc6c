"""The Python client recipes in examples/clients against a real uvicorn on 127.0.0.1."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from types import ModuleType

import httpx
import pytest
from clientkit import holding, serving

from kits.processkit import Server
from kits.suitekit import ROOT

pytestmark = [pytest.mark.real_server, pytest.mark.timeout(90)]

RECIPES = ROOT / "examples" / "clients"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving({"api": {"CLIENTS_CORS": "none"}}, tmp_path_factory.mktemp("recipes")) as servers:
        yield servers["api"]


def hold(server: Server, ttl_s: float) -> None:
    """Take the server's one session slot for ``ttl_s`` seconds."""
    opened = httpx.post(f"{server.base_url}/sessions", params={"ttl_s": ttl_s}, timeout=10)
    assert opened.status_code == 201


def close(server: Server, session_id: str) -> None:
    """End a session the recipe opened, freeing the slot for the next test."""
    assert httpx.delete(f"{server.base_url}/sessions/{session_id}", timeout=10).status_code == 204


def test_requests_recipe_waits_out_the_refusal(server: Server) -> None:
    """urllib3's Retry is refused, waits Retry-After and is admitted once the held session ends."""
    recipe = load("requests_retry")
    hold(server, ttl_s=1.5)
    started = time.monotonic()
    with recipe.session_with_retry() as http:
        response = http.post(f"{server.base_url}/sessions", timeout=30)
    assert response.status_code == 201
    close(server, response.json()["id"])
    refusals = [entry.status for entry in response.raw.retries.history]
    assert refusals
    assert set(refusals) == {503}
    assert time.monotonic() - started >= 1.0


def test_requests_recipe_hands_back_the_last_refusal(server: Server) -> None:
    """When every attempt is refused, the recipe returns the final 503 instead of raising."""
    recipe = load("requests_retry")
    with holding(server), recipe.session_with_retry(attempts=2) as http:
        response = http.post(f"{server.base_url}/sessions", timeout=30)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert [entry.status for entry in response.raw.retries.history] == [503]


def test_httpx_recipe_waits_out_the_refusal(server: Server) -> None:
    """The httpx loop is refused, sleeps Retry-After and is admitted once the held session ends."""
    recipe = load("httpx_retry")
    hold(server, ttl_s=1.5)
    seen: list[int] = []

    def record(response: httpx.Response) -> None:
        seen.append(response.status_code)

    started = time.monotonic()
    with httpx.Client(timeout=30, event_hooks={"response": [record]}) as client:
        response = recipe.post_with_retry(client, f"{server.base_url}/sessions")
    assert response.status_code == 201
    close(server, response.json()["id"])
    assert seen[0] == 503
    assert seen[-1] == 201
    assert time.monotonic() - started >= 1.0


def test_httpx_recipe_reads_retry_after() -> None:
    """The delay is Retry-After when it is whole seconds and the default otherwise."""
    recipe = load("httpx_retry")
    assert recipe.retry_after_s(httpx.Response(503, headers={"Retry-After": "7"})) == 7.0
    assert recipe.retry_after_s(httpx.Response(503)) == 5.0
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert recipe.retry_after_s(httpx.Response(503, headers={"Retry-After": date}), 3) == 3.0
