"""Serving the metrics: an ASGI app, a Starlette/FastAPI route, a separate port.

What each serves and how: docs/metrics.md, "Serving them". ``Mount("/metrics", app)``
answers a bare ``/metrics`` with a 307 (Starlette's ``redirect_slashes``), which some
scrapers do not follow; a ``Route`` whose endpoint is an ASGI app matches the exact path.
With ``PROMETHEUS_MULTIPROC_DIR`` set (read when the app is built) each scrape builds a
fresh registry: every worker's counters summed, and this worker's collector, which reads
the container's memory once (summing it per worker would be wrong).
"""

from __future__ import annotations

import errno
import gzip
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final
from urllib.parse import parse_qs

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from asgi_admission._metrics.instrument import bound_collector
from asgi_admission._metrics.instrument import multiprocess_dir as _env_multiprocess_dir

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

logger = logging.getLogger("asgi_admission")

_ALLOW: Final = [(b"allow", b"GET, HEAD")]


class _MultiprocessScrape:
    """A registry-like scrape target that merges the workers' files on each collect."""

    def __init__(self, source: CollectorRegistry, path: str) -> None:
        self._source = source
        self._path = path

    def _registry(self) -> CollectorRegistry:
        scrape = CollectorRegistry()
        MultiProcessCollector(scrape, path=self._path)  # type: ignore[no-untyped-call]
        collector = bound_collector(self._source)
        if collector is not None:
            scrape.register(collector)
        return scrape

    def collect(self) -> Iterable[Metric]:
        return self._registry().collect()

    def restricted_registry(self, names: Iterable[str]) -> Collector:
        return self._registry().restricted_registry(names)


def scrape_target(
    registry: CollectorRegistry = REGISTRY, *, multiprocess_dir: str | None = None
) -> Collector:
    """What a scrape exports: ``registry``, or its multiprocess view (see the notes)."""
    path = multiprocess_dir or _env_multiprocess_dir()
    if path is None:
        return registry
    if not os.path.isdir(path):
        raise ValueError(f"PROMETHEUS_MULTIPROC_DIR={path!r} is not a directory.")
    return _MultiprocessScrape(registry, path)


def _header(scope: Scope, name: bytes) -> str:
    return ",".join(v.decode("latin-1") for k, v in scope["headers"] if k.lower() == name)


def render(
    target: Collector, accept: str, accept_encoding: str, query: Mapping[str, list[str]]
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The exposition body and its headers for one scrape."""
    encoder, content_type = choose_encoder(accept)
    names = query.get("name[]")
    restricted = getattr(target, "restricted_registry", None)
    if names and restricted is not None:
        target = restricted(names)
    body = encoder(target)
    headers = [(b"content-type", content_type.encode("latin-1"))]
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers.append((b"content-encoding", b"gzip"))
    headers.append((b"cache-control", b"no-store"))
    return body, headers


class MetricsApp:
    """An ASGI app that answers GET or HEAD with the metrics of a scrape target.

    A class, not a function: Starlette's ``Route`` and FastAPI's ``add_route``
    treat a plain function as a request/response endpoint and an instance with
    ``__call__`` as an ASGI app.
    """

    __slots__ = ("target",)

    def __init__(self, target: Collector) -> None:
        self.target = target

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1003})
            return
        if scope["method"] not in ("GET", "HEAD"):
            await send({"type": "http.response.start", "status": 405, "headers": _ALLOW})
            await send({"type": "http.response.body", "body": b""})
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        body, headers = render(
            self.target, _header(scope, b"accept"), _header(scope, b"accept-encoding"), query
        )
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )


def metrics_app(
    registry: CollectorRegistry = REGISTRY, *, multiprocess_dir: str | None = None
) -> MetricsApp:
    """An ASGI app that answers GET or HEAD with the metrics of ``registry``.

    Serves any path it is given, so route it at ``/metrics`` with
    :func:`metrics_route` or ``app.add_route`` (not ``mount``, which redirects a
    bare ``/metrics``), or run it on its own. With ``PROMETHEUS_MULTIPROC_DIR``
    set (or ``multiprocess_dir`` given) it exports every worker's counters
    beside one fresh container reading.
    """
    return MetricsApp(scrape_target(registry, multiprocess_dir=multiprocess_dir))


def metrics_route(
    path: str = "/metrics",
    *,
    registry: CollectorRegistry = REGISTRY,
    multiprocess_dir: str | None = None,
    name: str = "metrics",
) -> Route:
    """A Starlette/FastAPI route serving :func:`metrics_app` at exactly ``path``.

    ``Starlette(routes=[metrics_route(), ...])``, or ``app.router.routes.append(
    metrics_route())`` on an existing app. Kept out of the OpenAPI schema.
    """
    return Route(
        path,
        metrics_app(registry, multiprocess_dir=multiprocess_dir),
        methods=["GET", "HEAD"],
        name=name,
        include_in_schema=False,
    )


def start_metrics_server(
    port: int,
    addr: str = "0.0.0.0",
    *,
    registry: CollectorRegistry = REGISTRY,
    multiprocess_dir: str | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve the metrics on their own port from a daemon thread.

    For deployments that must not expose metrics on the public port. Returns
    prometheus_client's server and thread; stop with ``server.shutdown()`` and
    ``server.server_close()``, or use :func:`serving_metrics`.
    """
    target = scrape_target(registry, multiprocess_dir=multiprocess_dir)
    return start_http_server(port, addr, registry=target)


@contextmanager
def serving_metrics(
    port: int,
    addr: str = "0.0.0.0",
    *,
    registry: CollectorRegistry = REGISTRY,
    multiprocess_dir: str | None = None,
) -> Iterator[WSGIServer | None]:
    """:func:`start_metrics_server` for the length of a ``with`` block (an app's lifespan).

    In multiprocess mode any worker can answer for all, so a worker that finds
    the port taken by another logs it and yields ``None`` instead of failing.
    """
    multiprocess = (multiprocess_dir or _env_multiprocess_dir()) is not None
    try:
        server, thread = start_metrics_server(
            port, addr, registry=registry, multiprocess_dir=multiprocess_dir
        )
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or not multiprocess:
            raise
        logger.info("asgi-admission: metrics port %d is served by another worker.", port)
        yield None
        return
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
