"""``require``: a missing machine part skips a test locally and fails it under CI=true."""

from __future__ import annotations

from pathlib import Path

import pytest

from kits import requirekit
from kits.cgroupkit import memory_group
from kits.processkit import Server
from kits.requirekit import (
    add_suite_markers,
    cgroup_v1_problem,
    cgroup_v2_problem,
    require,
    require_cgroup_v1,
    require_marker,
    require_markers,
)


def test_met_requirements_do_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A condition that holds neither skips nor fails, in CI or not."""
    for value in ("true", ""):
        monkeypatch.setenv("CI", value)
        require(True, "never shown")


def test_unmet_requirement_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without CI=true a missing part skips the test, saying why."""
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no widget here"):
        require(False, "no widget here")


@pytest.mark.parametrize("value", ["true", "TRUE", "1"])
def test_unmet_requirement_fails_in_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """Under CI=true the same missing part fails the test instead of skipping it."""
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="CI=true and this test cannot run: no widget"):
        require(False, "no widget here")


def test_a_machine_without_cgroup_v1_fails_real_cgroup_tests_in_ci(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no v1 memory hierarchy is mounted, the real-cgroup requirement names it,
    and fails under CI=true."""
    monkeypatch.setattr(requirekit, "V1_MEMORY", tmp_path)
    assert cgroup_v1_problem() == f"no cgroup v1 memory hierarchy at {tmp_path}"
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no cgroup v1 memory hierarchy"):
        require_cgroup_v1()


class _Marked:
    """Just enough of a pytest item for the setup hook: is it marked real_cgroup?"""

    def __init__(self, marked: bool) -> None:
        self.marked = marked

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.marked and name == "real_cgroup" else None


def test_real_cgroup_tests_fail_in_ci_without_a_hierarchy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The suite's setup hook (require_markers) fails every real_cgroup test under
    CI=true on a machine without cgroup v1, and leaves unmarked tests alone."""
    monkeypatch.setattr(requirekit, "V1_MEMORY", tmp_path)
    monkeypatch.setenv("CI", "true")
    require_markers(_Marked(False))  # type: ignore[arg-type]
    with pytest.raises(pytest.fail.Exception, match="no cgroup v1 memory hierarchy"):
        require_markers(_Marked(True))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mounted", "controllers", "expected"),
    [
        ("cgroup2", "memory pids", None),
        ("cgroup2", "pids", "gives no memory controller to its children"),
        ("tmpfs", "memory", "no cgroup v2 hierarchy alone"),
    ],
)
def test_cgroup_v2_tests_need_v2_alone_with_memory_given_to_the_roots_children(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mounted: str,
    controllers: str,
    expected: str | None,
) -> None:
    """The v2 requirement holds where cgroup2 is mounted at the root and gives memory
    to its children, and names what is missing otherwise; a v1 hierarchy mounted
    anywhere beside it (a hybrid machine, like this project's) is missing v2 alone."""
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr(requirekit, "V1_MEMORY", tmp_path / "no-v1")
    (tmp_path / "cgroup.subtree_control").write_text(controllers + "\n")
    mounts = tmp_path / "mounts"
    mounts.write_text(f"none {tmp_path} {mounted} rw 0 0\nproc /proc proc rw 0 0\n")
    problem = cgroup_v2_problem(str(tmp_path), str(mounts))
    assert problem is None if expected is None else expected in str(problem)
    hybrid = tmp_path / "hybrid"
    hybrid.write_text(mounts.read_text() + "cgroup /sys/fs/cgroup/memory cgroup rw 0 0\n")
    assert "no cgroup v2 hierarchy alone" in str(cgroup_v2_problem(str(tmp_path), str(hybrid)))


def test_cgroup_v2_tests_fail_in_ci_without_a_v2_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setup hook fails a cgroup_v2 test under CI=true where there is no v2 kernel
    alone (the host's run leaves tests/v2 to the v2 stage's VM)."""
    monkeypatch.setattr(requirekit, "cgroup_v2_problem", lambda: "no cgroup v2 here")
    monkeypatch.setenv("CI", "true")
    require_markers(_Item())  # type: ignore[arg-type]
    with pytest.raises(pytest.fail.Exception, match="no cgroup v2 here"):
        require_markers(_Item("cgroup_v2"))  # type: ignore[arg-type]


class _Item:
    """Just enough of a pytest item for the collection hook: fixtures and markers."""

    def __init__(self, *markers: str, fixtures: tuple[str, ...] = ()) -> None:
        self.fixturenames = list(fixtures)
        self.markers = set(markers)

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name in self.markers else None

    def add_marker(self, name: str) -> None:
        self.markers.add(name)


@pytest.mark.parametrize(
    ("markers", "fixtures", "expected"),
    [
        ((), ("tmp_path",), {"unit"}),
        (("slow",), (), {"slow", "unit"}),
        ((), ("tmp_path", "helm"), {"tool"}),
        ((), ("promtool",), {"tool"}),
        ((), ("prometheus",), {"tool"}),
        (("real_cgroup",), (), {"real_cgroup"}),
        (("cgroup_v2", "real_server"), (), {"cgroup_v2", "real_server"}),
        (("real_server",), (), {"real_server"}),
        (("browser", "real_server"), (), {"browser", "real_server"}),
        (("container",), (), {"container"}),
    ],
)
def test_tests_needing_nothing_but_python_are_marked_unit(
    markers: tuple[str, ...], fixtures: tuple[str, ...], expected: set[str]
) -> None:
    """A test taking helm, promtool or prometheus is marked tool; a test with no marker
    of a machine part (slow alone is none) is marked unit, and no other."""
    item = _Item(*markers, fixtures=fixtures)
    add_suite_markers([item])  # type: ignore[list-item]
    assert item.markers == expected


def test_the_suite_adds_its_markers(request: pytest.FixtureRequest) -> None:
    """The suite's collection hook runs add_suite_markers: this test is a unit test."""
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("tool") is None


@pytest.mark.parametrize("marked", [False, True])
def test_a_part_used_by_a_test_not_marked_for_it_fails_the_test(
    monkeypatch: pytest.MonkeyPatch, marked: bool
) -> None:
    """A kit about to start a server fails a test not marked real_server, naming the
    marker; a marked test goes on, and so does a bench (no test running)."""
    item = _Item(*(["real_server"] if marked else []))
    monkeypatch.setattr(requirekit, "_running", [item])
    if marked:
        require_marker("real_server", "starts a server process")
    else:
        with pytest.raises(pytest.fail.Exception, match="not marked real_server: mark it"):
            require_marker("real_server", "starts a server process")
    monkeypatch.setattr(requirekit, "_running", [])
    require_marker("real_server", "starts a server process")


def test_a_unit_test_cannot_start_a_server_or_make_a_memory_group(tmp_path: Path) -> None:
    """Through the suite's setup hook, the kits refuse this unmarked test a server
    process and a real memory group before making either."""
    with pytest.raises(pytest.fail.Exception, match="starts a server process"):
        Server(["true"], 0, {}, tmp_path / "server.log")
    with (
        pytest.raises(pytest.fail.Exception, match="makes a real memory group"),
        memory_group(16, "unit"),
    ):
        pass
    assert list(tmp_path.iterdir()) == []
