"""The documentation's reference pages agree with the code and with a real exposition."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import re
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from asgi_admission import (
    AdmissionConfig,
    AdmissionMiddleware,
    CgroupMemoryReader,
    SessionWatchdog,
    metrics_route,
)
from asgi_admission import _config_env as env
from asgi_admission._watchdog.watchdog import ENV_CRITICAL_WATERMARK, ENV_INTERVAL
from asgi_admission.demo import ENV_METRICS_PORT
from kits.suitekit import MIB, PACKAGE, ROOT

#: Internal on purpose: the variable names each setting is read from, checked against
#: the docs.
INTERNAL = "the variable names each setting is read from, checked against the docs"

#: Each field of AdmissionConfig and the variables it is read from, as ``_config_env``
#: names them: the docs must pair them the same way (two variables swapped in the
#: docs still each name a variable ``from_env`` reads).
ENVIRONMENT: dict[str, tuple[str, str | None]] = {
    "high_watermark_percent": env.ENV_HIGH,
    "resume_threshold_percent": env.ENV_RESUME,
    "reserve_bytes": env.ENV_RESERVE_MB,
    "max_sessions": env.ENV_MAX_SESSIONS,
    "retry_after_s": env.ENV_RETRY_AFTER,
    "cgroup_root": env.ENV_CGROUP_ROOT,
    "memory_source": env.ENV_MEMORY_SOURCE,
    "reclaimable": env.ENV_RECLAIMABLE,
    "shared_dir": env.ENV_SHARED_DIR,
    "websocket_refusal": env.ENV_WEBSOCKET_REFUSAL,
    "reserve_learning": env.ENV_LEARNING,
    "reserve_min_bytes": env.ENV_RESERVE_MIN_MB,
    "pending_timeout_s": env.ENV_PENDING_TIMEOUT,
    "body_timeout_s": env.ENV_BODY_TIMEOUT,
    "body_buffer_bytes": env.ENV_BODY_BUFFER_KB,
    "probe_sessions": env.ENV_PROBE_SESSIONS,
    "probe_wait_s": env.ENV_PROBE_WAIT,
    "session_groups": env.ENV_SESSION_GROUPS,
    "stuck_after_s": env.ENV_STUCK_AFTER,
    "liveness_path": env.ENV_LIVENESS_PATH,
    "agent_port": env.ENV_AGENT_PORT,
    "load_metrics_header": env.ENV_LOAD_METRICS,
    "queue_timeout_s": env.ENV_QUEUE_TIMEOUT,
    "queue_limit": env.ENV_QUEUE_LIMIT,
    "priority_classes": env.ENV_PRIORITY_CLASSES,
    "tenant_max_share": env.ENV_TENANT_MAX_SHARE,
}

DOCS = ROOT / "docs"
CODE = re.compile(r"`([^`]+)`")


def tables(page: str) -> dict[str, list[dict[str, str]]]:
    """Each table of ``page`` under the heading above it, as rows of {column: cell}."""
    found: dict[str, list[dict[str, str]]] = {}
    heading, header = "", None
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading, header = line.lstrip("#").strip(), None
        elif line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= set("|-: "):
                found.setdefault(heading, []).append(dict(zip(header, cells, strict=True)))
        else:
            header = None
    return found


def first_code(cell: str) -> str:
    match = CODE.search(cell)
    assert match is not None, f"no `code` in {cell!r}"
    return match.group(1)


def literal(cell: str) -> object:
    return ast.literal_eval(first_code(cell))


def legacy(cell: str) -> str | None:
    return None if cell == "—" else first_code(cell)


CONFIGURATION = tables("configuration.md")


def test_every_config_field_is_documented_with_its_variables_and_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The AdmissionConfig table lists each field once, with its default and the variables
    it is read from (``ENVIRONMENT``), which from_env reads: a value it cannot use is
    warned of by the variable's name (a free-text setting takes it as it is), and the
    legacy name is read with a warning naming both."""
    rows = {first_code(row["argument"]): row for row in CONFIGURATION["`AdmissionConfig`"]}
    fields = {field.name: field for field in dataclasses.fields(AdmissionConfig)}
    assert list(rows) == list(fields)
    assert set(ENVIRONMENT) == set(fields)
    caplog.set_level(logging.WARNING, logger="asgi_admission")
    for name, row in rows.items():
        assert literal(row["default"]) == fields[name].default, name
        assert row["meaning"].endswith("."), name
        current, old = ENVIRONMENT[name]
        assert first_code(row["environment"]) == current, name
        assert legacy(row["legacy name"]) == old, name
        caplog.clear()
        taken = getattr(AdmissionConfig.from_env({current: "!!"}), name) == "!!"
        warned = any(message.startswith(f"{current}=") for message in caplog.messages)
        assert taken or warned, name
        if old is not None:
            caplog.clear()
            AdmissionConfig.from_env({old: "!!"})
            assert f"{old} is a legacy name; set {current} instead." in caplog.messages, name


def test_every_middleware_argument_is_documented_with_its_default() -> None:
    """The AdmissionMiddleware table lists each keyword argument with its default."""
    rows = {first_code(row["argument"]): row for row in CONFIGURATION["`AdmissionMiddleware`"]}
    parameters = inspect.signature(AdmissionMiddleware.__init__).parameters
    keywords = {n: p for n, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert list(rows) == list(keywords)
    for name, row in rows.items():
        default = keywords[name].default
        if name == "registry":
            assert first_code(row["default"]) == "REGISTRY"
        else:
            assert literal(row["default"]) == default, name


def test_watchdog_settings_are_documented_with_their_defaults() -> None:
    """The watchdog table gives each from_env variable and the constructor's default."""
    rows = {first_code(row["argument"]): row for row in CONFIGURATION["`SessionWatchdog.from_env`"]}
    parameters = inspect.signature(SessionWatchdog.__init__).parameters
    expected = {"critical_watermark_percent": ENV_CRITICAL_WATERMARK, "interval_s": ENV_INTERVAL}
    assert set(rows) == set(expected)
    for name, (current, old) in expected.items():
        assert first_code(rows[name]["environment"]) == current
        assert legacy(rows[name]["legacy name"]) == old
        assert literal(rows[name]["default"]) == parameters[name].default


def test_every_variable_the_package_reads_is_documented() -> None:
    """Each ADMISSION_* name in the package's source appears in a configuration table."""
    documented = {
        first_code(row["environment"])
        for rows in CONFIGURATION.values()
        for row in rows
        if "environment" in row
    }
    used = {
        name
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r"\bADMISSION_[A-Z_]*[A-Z]\b", path.read_text(encoding="utf-8"))
    }
    assert ENV_METRICS_PORT in documented
    assert used <= documented, used - documented


def exposition(fixture_copy: Callable[..., Path]) -> str:
    """A real /metrics: a guard over a captured v2 cgroup (with PSI) and a watchdog, scraped."""
    registry = CollectorRegistry()
    tree = fixture_copy("telegraf/v2")
    # A count cap, so that asgi_admission_session_limit is exported: without one it is
    # absent while memory is readable.
    config = AdmissionConfig(cgroup_root=str(tree), max_sessions=16)

    async def open_session(request: Request) -> JSONResponse:
        return JSONResponse({"id": "1"}, status_code=201)

    app = Starlette(
        routes=[
            Route("/sessions", open_session, methods=["POST"]),
            metrics_route(registry=registry),
        ]
    )
    watchdog = SessionWatchdog(config=config, memory_reader=CgroupMemoryReader(str(tree)),
                               registry=registry)  # fmt: skip
    guarded = AdmissionMiddleware(
        app,
        # Mapped to its class: the per-class decisions are exported too.
        session_routes={"POST /sessions": "default"},
        config=config,
        registry=registry,
        watchdog=watchdog,
        readiness_path="/ready",
    )
    # A watched session of the route ended at a 64 MiB peak: something learned to show.
    assert watchdog.on_peak is not None
    watchdog.on_peak("POST /sessions", 64 * MIB)

    async def scrape() -> str:
        transport = httpx.ASGITransport(app=guarded)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.post("/sessions")).status_code == 201
            assert (await client.get("/ready")).status_code == 200
            return (await client.get("/metrics")).text

    return anyio.run(scrape)


def test_metrics_reference_matches_a_real_exposition(fixture_copy: Callable[..., Path]) -> None:
    """Every documented metric is exported with its type and labels, and nothing undocumented."""
    rows = {first_code(row["metric"]): row for row in tables("metrics.md")["Metrics"]}
    exported: dict[str, tuple[str, set[str]]] = {}
    for family in text_string_to_metric_families(exposition(fixture_copy)):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {key for sample in family.samples for key in sample.labels} - {"le"}
        exported[name] = (family.type, labels)
    # prometheus_client's *_created timestamps parse as families of their own.
    exported = {
        name: found
        for name, found in exported.items()
        if name.startswith("asgi_") and not name.endswith("_created")
    }
    assert set(rows) == set(exported)
    for name, row in rows.items():
        documented_labels = set(CODE.findall(row["labels"]))
        assert (row["type"], documented_labels) == exported[name], name


def test_refusal_reasons_are_all_documented() -> None:
    """The decisions counter's reason values in the code are the ones the page lists."""
    from asgi_admission._metrics.decisions import OUTCOMES

    row = next(
        row
        for row in tables("metrics.md")["Metrics"]
        if first_code(row["metric"]) == "asgi_admission_decisions_total"
    )
    for _, _, _, label in OUTCOMES:
        assert f"`{label}`" in row["meaning"], label


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_pages_cite_no_outside_documents(page: str) -> None:
    """The pages cite the project's own docs, never the specification or the seeds."""
    text = (DOCS / page).read_text(encoding="utf-8")
    for outside in ("SPEC.md", "seeds/", "resource_capacity.py", "budget.py"):
        assert outside not in text, outside


def test_api_reference_lists_exactly_the_public_names() -> None:
    """docs/reference.md documents each name of ``asgi_admission.__all__``, and no other."""
    import asgi_admission

    listed = re.findall(r"^::: asgi_admission\.(\w+)$", (DOCS / "reference.md").read_text(), re.M)
    assert sorted(listed) == sorted(set(asgi_admission.__all__) - {"__version__"})
