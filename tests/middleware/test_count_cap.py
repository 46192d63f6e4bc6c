"""The count cap: none by default while memory is readable, 16 while blind, a set one always.

A 64 GiB group at 8 % used takes sessions until their reserves fill the admission
ceiling, whatever their number; only a blind guard (memory unreadable, no limit) falls
back to 16; ``max_sessions`` / ``ADMISSION_MAX_SESSIONS`` binds in both. Each case runs
the whole default path once: no ``ADMISSION_*`` setting but those named, the real
reader on a fixture tree through ``ADMISSION_CGROUP_ROOT``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import pytest
from mwkit import SettableReader, TestClient
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asgi_admission import AdmissionController, AdmissionMiddleware
from kits.cgroup_trees import write_v1_tree, write_v2_tree

LIMIT_MB = 64 * 1024
USED_MB = 5243  # 8 % of 64 GiB
#: How many 768 MiB reserves (the derived reserve at 64 GiB) fit under 80 % of 64 GiB
#: above a working set of 5243 MiB: floor((52428.8 - 5243) / 768).
MEMORY_FITS = 61
#: The count cap while the guard is blind and none is set.
BLIND_CAP = 16

Memory = Literal["readable", "unlimited", "unreadable"]
BLIND_REASON = {"unlimited": "no_memory_limit", "unreadable": "telemetry_unavailable"}


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ADMISSION_*/CODA_* variable from the machine reaches the guard: its defaults."""
    for name in [k for k in os.environ if k.startswith(("ADMISSION_", "CODA_"))]:
        monkeypatch.delenv(name)
    # But no probing: its sessions' memory never shows, which a probe would learn as 0.
    monkeypatch.setenv("ADMISSION_PROBE_SESSIONS", "0")


def app(opened: list[str] | None = None) -> Starlette:
    """``POST /sessions`` opens a session that never closes, in ``opened`` (the app's count)."""

    async def open_session(request: Request) -> Response:
        if opened is not None:
            opened.append("s")
        return JSONResponse({"id": "s"}, status_code=201)

    return Starlette(routes=[Route("/sessions", open_session, methods=["POST"])])


def tree(tmp_path: Path, memory: Memory, version: str = "v2") -> Path:
    """A cgroup directory for ``memory``: 64 GiB at 8 %, the same unlimited, or empty."""
    root = tmp_path / f"cgroup-{version}"
    if memory == "unreadable":
        root.mkdir()
        return root
    if version == "v1":
        return write_v1_tree(root, used_mb=USED_MB, limit_mb=LIMIT_MB)
    write_v2_tree(root, used_mb=USED_MB, limit_mb=LIMIT_MB)
    if memory == "unlimited":
        (root / "memory.max").write_text("max\n")
    return root


def open_until_refused(guard: AdmissionMiddleware, most: int = 200) -> tuple[int, dict[str, Any]]:
    """POST /sessions until the first refusal: how many were admitted, and its body.

    Every admitted session stays open: pending while its memory has not shown (it never
    does in the fixed reading), holding a count slot and a reserve; where the guard is
    blind it settles at its response, and the app's count (``current_sessions``) holds it.
    """
    client = TestClient(guard)
    for admitted in range(most):
        response = client.post("/sessions")
        if response.status_code == 503:
            body: dict[str, Any] = response.json()
            return admitted, body
        assert response.status_code == 201, response.text
    raise AssertionError(f"{most} sessions admitted and none refused")


def gauge(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(f"asgi_admission_{name}")


def test_defaults_admit_by_memory_in_a_64_gib_group() -> None:
    """With no setting, a 64 GiB group at 8 % admits 61 sessions, refused by memory only
    once their reserves fill the ceiling; no count cap is shown, and the admissible
    sessions are memory's 61, not 16."""
    registry = CollectorRegistry()
    reader = SettableReader(used_mb=USED_MB, limit_mb=LIMIT_MB)
    guard = AdmissionMiddleware(
        app(),
        session_routes=["POST /sessions"],
        controller=AdmissionController(memory_reader=reader),
        expose_details=True,
        registry=registry,
    )
    assert guard.session_limit is None
    assert (gauge(registry, "session_limit"), gauge(registry, "admissible_sessions")) == (
        None,
        MEMORY_FITS,
    )
    admitted, refusal = open_until_refused(guard)
    assert admitted == MEMORY_FITS > 40
    assert refusal["reason"] == "memory_pressure"
    assert refusal["sessions"] == {
        "active": 0,
        "pending": MEMORY_FITS,
        "limit": None,
        "limit_from": None,
    }
    assert gauge(registry, "admissible_sessions") == 0


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_defaults_through_the_real_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """The whole default path (from_env, the cgroup reader on a 64 GiB tree named by
    ADMISSION_CGROUP_ROOT, the derived reserve) admits by memory, not up to 16."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tree(tmp_path, "readable", version)))
    guard = AdmissionMiddleware(app(), session_routes=["POST /sessions"], registry=None)
    admitted, refusal = open_until_refused(guard)
    assert (admitted, refusal["reason"]) == (MEMORY_FITS, "memory_pressure")


@pytest.mark.parametrize("memory", ["unlimited", "unreadable"])
def test_blind_the_fallback_cap_of_16_applies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: Memory
) -> None:
    """With no setting and a blind guard, 16 sessions are admitted and the 17th refused
    with the blind reason; the body and the gauge show the fallback cap."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tree(tmp_path, memory)))
    registry = CollectorRegistry()
    opened: list[str] = []
    guard = AdmissionMiddleware(
        app(opened),
        session_routes=["POST /sessions"],
        current_sessions=opened.__len__,
        expose_details=True,
        registry=registry,
    )
    assert gauge(registry, "session_limit") == BLIND_CAP
    admitted, refusal = open_until_refused(guard)
    assert (admitted, refusal["reason"]) == (BLIND_CAP, BLIND_REASON[memory])
    assert (refusal["sessions"]["limit"], refusal["sessions"]["limit_from"]) == (
        BLIND_CAP,
        "blind_fallback",
    )


def test_the_fallback_cap_is_shown_only_while_blind() -> None:
    """asgi_admission_session_limit appears (16) while memory cannot be read and is gone
    again once it can; the admissible sessions follow the limit that binds."""
    registry = CollectorRegistry()
    reader = SettableReader(used_mb=USED_MB, limit_mb=LIMIT_MB)
    # Named: the registry holds a guard weakly (an app built again replaces it), and
    # where nothing else keeps it (on Python 3.10) an unnamed guard is gone at once.
    guard = AdmissionMiddleware(
        app(),
        session_routes=["POST /sessions"],
        controller=AdmissionController(memory_reader=reader),
        registry=registry,
    )
    reader.available = False
    assert (gauge(registry, "session_limit"), gauge(registry, "admissible_sessions")) == (16, 16)
    reader.available = True
    assert (gauge(registry, "session_limit"), gauge(registry, "admissible_sessions")) == (
        None,
        MEMORY_FITS,
    )
    del guard  # held to here


@pytest.mark.parametrize("memory", ["readable", "unlimited", "unreadable"])
@pytest.mark.parametrize("given", ["argument", "environment"])
def test_a_set_cap_of_20_binds_readable_or_blind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: Memory, given: str
) -> None:
    """max_sessions=20 or ADMISSION_MAX_SESSIONS=20 admits exactly 20, in a 64 GiB group
    (session_limit, before memory binds) and blind (above the fallback of 16)."""
    monkeypatch.setenv("ADMISSION_CGROUP_ROOT", str(tree(tmp_path, memory)))
    options: dict[str, Any] = {}
    if given == "argument":
        options["max_sessions"] = 20
    else:
        monkeypatch.setenv("ADMISSION_MAX_SESSIONS", "20")
    registry = CollectorRegistry()
    opened: list[str] = []
    guard = AdmissionMiddleware(
        app(opened),
        session_routes=["POST /sessions"],
        current_sessions=opened.__len__,
        expose_details=True,
        registry=registry,
        **options,
    )
    assert gauge(registry, "session_limit") == 20
    admitted, refusal = open_until_refused(guard)
    assert (admitted, refusal["reason"]) == (20, BLIND_REASON.get(memory, "session_limit"))
    assert (refusal["sessions"]["limit"], refusal["sessions"]["limit_from"]) == (
        20,
        "max_sessions",
    )
