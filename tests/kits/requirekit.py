"""``require``: what a test needs from the machine, skipped locally and failed in CI.

A test that needs root, a writable cgroup v1 memory hierarchy, a tool or a free
port to run a server may skip on a developer's laptop, but in CI (``CI=true``) a
missing part is a broken runner, and a green run without the tests that matter
would be a lie: there the same call fails the test, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

from kits.suitekit import V1_MEMORY

#: The markers of the tests that need a part of the machine beyond the Python running
#: them. Every other test is a unit test: scripts/check runs those (``-m unit``) on each
#: Python the package claims, in a virtualenv holding only the ``unit`` extra.
MACHINE_MARKERS = ("real_cgroup", "real_server", "browser", "container", "tool")
#: The fixtures that hand a test a tool scripts/setup installs outside Python.
TOOL_FIXTURES = frozenset({"helm", "promtool", "prometheus"})

# The test being set up or run (set by the suite's setup hook), for require_marker;
# empty outside pytest, where the benches use the same kits.
_running: list[pytest.Item] = []


def in_ci() -> bool:
    """Whether this is a CI run (``CI`` set to ``true`` or ``1``, as CI services do)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def require(condition: bool, why: str) -> None:
    """Skip the calling test unless ``condition``; under ``CI=true`` fail it instead."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"CI=true and this test cannot run: {why}", pytrace=False)
    pytest.skip(why)


def cgroup_v1_problem() -> str | None:
    """Why memory groups cannot be made under /sys/fs/cgroup/memory here, or ``None``."""
    if not (V1_MEMORY / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory hierarchy at {V1_MEMORY}"
    if os.geteuid() != 0 or not os.access(V1_MEMORY, os.W_OK):
        return f"needs root to create memory groups under {V1_MEMORY}"
    return None


def require_cgroup_v1() -> None:
    """:func:`require` root and a writable cgroup v1 memory hierarchy."""
    problem = cgroup_v1_problem()
    require(problem is None, str(problem))


def require_root(why: str) -> None:
    """:func:`require` that the tests run as root, for ``why``."""
    require(os.geteuid() == 0, f"needs root: {why}")


def require_markers(item: pytest.Item) -> None:
    """What a test's markers say it needs: ``real_cgroup``, root and cgroup v1."""
    _running[:] = [item]
    if item.get_closest_marker("real_cgroup") is not None:
        require_cgroup_v1()


def require_marker(name: str, why: str) -> None:
    """Fail the running test unless it is marked ``name``: it ``why`` (starts a server,
    makes a memory group), and unmarked it would count as a unit test, run where the
    machine may lack that part. Outside a test (a bench) this does nothing."""
    if _running and _running[0].get_closest_marker(name) is None:
        pytest.fail(
            f"this test {why} but is not marked {name}: mark it (pyproject.toml lists the "
            "markers), so that the unit-test runs leave it out",
            pytrace=False,
        )


def mark_units(items: Iterable[pytest.Item]) -> None:
    """Mark ``tool`` each test that takes a :data:`TOOL_FIXTURES` fixture (directly or
    through another fixture), then ``unit`` each test with no :data:`MACHINE_MARKERS`."""
    for item in items:
        if TOOL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker("tool")
        if not any(item.get_closest_marker(name) for name in MACHINE_MARKERS):
            item.add_marker("unit")
