"""``promtool check metrics`` accepts the exposition, in the text and OpenMetrics formats.

promtool (2.42, Debian's) lints only the text format: fed OpenMetrics it reports
every counter as lacking help, because OpenMetrics puts ``# HELP`` on the family
name (``x``) and not on the sample (``x_total``); see prometheus/prometheus#8932.
So the OpenMetrics exposition is parsed with prometheus_client's strict
OpenMetrics parser, and the families it yields are linted by promtool.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from metricskit import SettableReader, guarded_app, promtool_check, request
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from starlette.applications import Starlette

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


@pytest.fixture
def app(registry: CollectorRegistry) -> Starlette:
    """A guard after one admitted and one refused decision, with PSI."""
    reader = SettableReader()
    reader.psi = 3.0
    app = guarded_app(reader, registry)
    request(app, "POST", "/sessions")
    reader.set_mb(900)
    request(app, "POST", "/sessions")
    return app


class Parsed(Collector):
    def __init__(self, text: str) -> None:
        # prometheus_client's OpenMetrics parser has no annotations (its text parser has).
        self.families: list[Metric] = list(text_string_to_metric_families(text))  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        return self.families


def test_text_format(app: Starlette, promtool: str) -> None:
    """The text exposition passes promtool's linter without a single remark."""
    exposition = request(app, "GET", "/metrics", headers={"accept": "text/plain"}).content
    assert b"asgi_admission_decisions_total" in exposition
    result = promtool_check(promtool, exposition)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_openmetrics_format(app: Starlette, promtool: str) -> None:
    """The OpenMetrics exposition is strictly valid and its families pass promtool."""
    response = request(app, "GET", "/metrics", headers={"accept": OPENMETRICS})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    parsed = Parsed(response.text)
    names = {family.name for family in parsed.families}
    assert {"asgi_admission_decisions", "asgi_admission_memory_usage_ratio"} <= names
    result = promtool_check(promtool, generate_latest(parsed))
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
