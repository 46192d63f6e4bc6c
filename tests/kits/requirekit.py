"""``require``: what a test needs from the machine, skipped locally and failed in CI.

A test that needs root, a writable cgroup v1 memory hierarchy, a cgroup v2 kernel, a
tool or a free port to run a server may skip on a developer's laptop, but in CI (``CI=true``) a
missing part is a broken runner, and a green run without the tests that matter
would be a lie: there the same call fails the test, saying why.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest

from kits.suitekit import V1_MEMORY, V2_ROOT

#: The markers of the tests that need a part of the machine beyond the Python running
#: them. Every other test is a unit test: scripts/check runs those (``-m unit``) on each
#: Python the package claims, in a virtualenv holding only the ``unit`` extra.
MACHINE_MARKERS = ("real_cgroup", "cgroup_v2", "real_server", "browser", "container", "tool")
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


def cgroup_v2_problem(root: str = str(V2_ROOT), mounts: str = "/proc/self/mounts") -> str | None:
    """Why the tests marked ``cgroup_v2`` cannot run here, or ``None``: they need cgroup v2
    alone at ``root`` (no v1 hierarchy mounted) with its memory controller given to the
    root's children, and root. The gate's v2 stage boots such a kernel (scripts/cgroup-v2)."""
    try:
        with open(mounts) as f:
            table = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        table = []
    if [root, "cgroup2"] not in table or any(kind == "cgroup" for _, kind in table):
        return f"no cgroup v2 hierarchy alone at {root} (scripts/cgroup-v2 boots a VM with one)"
    try:
        with open(os.path.join(root, "cgroup.subtree_control")) as f:
            controllers = f.read().split()
    except OSError:
        controllers = []
    if "memory" not in controllers:
        return f"{root} gives no memory controller to its children (cgroup.subtree_control)"
    if os.geteuid() != 0:
        return f"needs root to create memory groups under {root}"
    return None


def require_root(why: str) -> None:
    """:func:`require` that the tests run as root, for ``why``."""
    require(os.geteuid() == 0, f"needs root: {why}")


def require_markers(item: pytest.Item) -> None:
    """What a test's markers say it needs: ``real_cgroup``, root and cgroup v1;
    ``cgroup_v2``, root and cgroup v2 alone."""
    _running[:] = [item]
    if item.get_closest_marker("real_cgroup") is not None:
        require_cgroup_v1()
    if item.get_closest_marker("cgroup_v2") is not None:
        problem = cgroup_v2_problem()
        require(problem is None, str(problem))


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


def add_suite_markers(items: Iterable[pytest.Item]) -> None:
    """Mark ``tool`` each test that takes a :data:`TOOL_FIXTURES` fixture (directly or
    through another fixture), then ``unit`` each test with no :data:`MACHINE_MARKERS`."""
    for item in items:
        if TOOL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker("tool")
        if not any(item.get_closest_marker(name) for name in MACHINE_MARKERS):
            item.add_marker("unit")
