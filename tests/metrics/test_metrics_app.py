"""The ``/metrics`` app and route: exact path, negotiation, methods, a separate port."""

from __future__ import annotations

import gzip
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from metricskit import SettableReader, free_port, guarded_app, promtool_check, request
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.types import Message

from asgi_admission import metrics_app, metrics_route, serving_metrics
from asgi_admission._metrics.serving import start_metrics_server
from asgi_admission.demo import metrics_port_from_env

#: Internal on purpose: the metrics renderer and the separate-port server below serving_metrics.
INTERNAL = "the metrics renderer and the separate-port server below serving_metrics"

OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@pytest.fixture
def app(registry: CollectorRegistry) -> Starlette:
    return guarded_app(SettableReader(), registry)


def test_bare_metrics_path_answers_without_redirect(app: Starlette) -> None:
    """``GET /metrics`` is a 200 with the text format, not a 307 to ``/metrics/``."""
    response = request(app, "GET", "/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert response.headers["cache-control"] == "no-store"
    assert "asgi_admission_memory_usage_ratio 0.1" in response.text


def test_openmetrics_is_negotiated(app: Starlette) -> None:
    """A scraper asking for OpenMetrics gets it, terminated by ``# EOF``."""
    accept = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
    response = request(app, "GET", "/metrics", headers={"accept": accept})
    assert response.headers["content-type"].startswith(OPENMETRICS)
    assert response.text.endswith("# EOF\n")


def test_gzip_head_and_other_methods(registry: CollectorRegistry) -> None:
    """gzip when accepted, HEAD has no body, other methods get 405 with ``Allow``."""
    app = metrics_app(registry)
    Counter("probe_total", "A probe.", registry=registry).inc()
    raw = request(app, "GET", "/", headers={"accept-encoding": "gzip"})
    assert b"probe_total 1.0" in raw.content  # httpx decoded the gzip body
    assert raw.headers["content-encoding"] == "gzip"
    head = request(app, "HEAD", "/metrics")
    assert (head.status_code, head.content) == (200, b"")
    post = request(app, "POST", "/metrics")
    assert (post.status_code, post.headers["allow"]) == (405, "GET, HEAD")


def test_name_filter(registry: CollectorRegistry) -> None:
    """``?name[]=`` restricts the exposition, as prometheus_client's own apps do."""
    Counter("kept_total", "Kept.", registry=registry)
    Counter("dropped_total", "Dropped.", registry=registry)
    body = request(metrics_app(registry), "GET", "/metrics?name[]=kept_total").text
    assert "kept_total" in body
    assert "dropped_total" not in body


def test_fastapi_add_route(registry: CollectorRegistry) -> None:
    """FastAPI serves the app at ``/metrics`` through ``add_route``, and the route helper too."""
    api = FastAPI()
    # Starlette types add_route's endpoint as a request handler, though its Route serves
    # any ASGI app (a class instance) as such: the call is right, its annotation too narrow.
    api.add_route("/metrics", metrics_app(registry), include_in_schema=False)  # type: ignore[arg-type]
    api.router.routes.append(metrics_route("/other", registry=registry))
    assert request(api, "GET", "/metrics").status_code == 200
    assert request(api, "GET", "/other").status_code == 200
    assert "/metrics" not in api.openapi()["paths"]


def test_lifespan_and_websocket_when_served_alone(registry: CollectorRegistry) -> None:
    """Run on its own, the app completes the lifespan and closes stray WebSockets."""
    app = metrics_app(registry)
    sent: list[Message] = []
    incoming: list[Message] = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    anyio.run(app, {"type": "lifespan"}, receive, send)
    anyio.run(app, {"type": "websocket"}, receive, send)
    assert [m["type"] for m in sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
        "websocket.close",
    ]


def test_separate_port(registry: CollectorRegistry, promtool: str) -> None:
    """``serving_metrics`` serves the registry on its own port for the length of the block."""
    stack = guarded_app(SettableReader(), registry).build_middleware_stack()
    port = free_port()
    with serving_metrics(port, "127.0.0.1", registry=registry) as server:
        assert server is not None
        response = httpx.get(f"http://127.0.0.1:{port}/metrics")
        assert response.status_code == 200
        assert "asgi_admission_state" in response.text
        assert promtool_check(promtool, response.content).returncode == 0
    with pytest.raises(httpx.ConnectError):  # stopped when the block ends
        httpx.get(f"http://127.0.0.1:{port}/metrics")
    del stack  # the guard lived as long as its app: the metrics described it


def test_separate_port_taken(registry: CollectorRegistry, tmp_path: Any) -> None:
    """A taken port fails, unless in multiprocess mode, where another worker serves it."""
    port = free_port()
    server, thread = start_metrics_server(port, "127.0.0.1", registry=registry)
    try:
        with (
            pytest.raises(OSError, match="in use"),
            serving_metrics(port, "127.0.0.1", registry=registry),
        ):
            pass
        with serving_metrics(
            port, "127.0.0.1", registry=registry, multiprocess_dir=str(tmp_path)
        ) as other:
            assert other is None
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, None),
        ({"ADMISSION_METRICS_PORT": " "}, None),
        ({"ADMISSION_METRICS_PORT": "9100"}, 9100),
    ],
)
def test_metrics_port_from_env(environ: dict[str, str], expected: int | None) -> None:
    """``ADMISSION_METRICS_PORT`` is a port number or unset."""
    assert metrics_port_from_env(environ) == expected


@pytest.mark.parametrize("raw", ["http", "0", "65536", "-1"])
def test_metrics_port_from_env_rejects_junk(raw: str) -> None:
    """A malformed port fails loudly instead of quietly exposing metrics publicly."""
    with pytest.raises(ValueError, match="ADMISSION_METRICS_PORT"):
        metrics_port_from_env({"ADMISSION_METRICS_PORT": raw})


def test_multiprocess_dir_must_exist(registry: CollectorRegistry, tmp_path: Any) -> None:
    """A multiprocess directory that is not a directory is a configuration error."""
    with pytest.raises(ValueError, match="not a directory"):
        metrics_app(registry, multiprocess_dir=str(tmp_path / "missing"))


def test_gzip_body_is_really_gzip(registry: CollectorRegistry) -> None:
    """The compressed body decompresses to the plain exposition."""
    from asgi_admission._metrics.serving import render

    body, headers = render(registry, "", "gzip", {})
    assert (b"content-encoding", b"gzip") in headers
    assert gzip.decompress(body) == b""
    plain, headers = render(registry, "", "identity", {})
    assert plain == b""
    assert b"content-encoding" not in dict(headers)


def test_demo_serves_metrics(registry: CollectorRegistry) -> None:
    """The demo answers ``/metrics`` on its public port by default."""
    from asgi_admission.demo import create_app

    demo = create_app(session_mb=0, registry=registry)
    assert request(demo, "POST", "/sessions").status_code == 201
    body = request(demo, "GET", "/metrics").text
    assert (
        'asgi_admission_decisions_total{kind="http",outcome="admitted",reason="none"} 1.0' in body
    )


def test_demo_metrics_port(registry: CollectorRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``ADMISSION_METRICS_PORT`` the demo serves metrics there, and not publicly."""
    from asgi_admission.demo import create_app

    port = free_port()
    monkeypatch.setenv("ADMISSION_METRICS_PORT", str(port))
    demo = create_app(session_mb=0, registry=registry)
    assert request(demo, "GET", "/metrics").status_code == 404

    async def scenario() -> str:
        async with demo.router.lifespan_context(demo), httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{port}/metrics")).text

    assert "asgi_admission_build_info" in anyio.run(scenario)
