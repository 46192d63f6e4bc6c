"""Fixtures shared by the whole suite (subfolders keep their own conftest files)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asgi_admission._admission.ledger import shared_place
from asgi_admission._watchdog import groups
from kits.cgroup_trees import FIXTURES, copy_files
from kits.requirekit import add_suite_markers, require_markers

#: Internal on purpose: the suite keeps the guard's default shared place out of the
#: machine's /dev/shm and /tmp (see the fixture below).
INTERNAL = "the default shared place's bases and /proc, and where session groups go"

# By default the workers of one memory group share their ledger in a place of the
# machine's (docs/operations.md). The suite's many servers and guards would then share
# counts, settling rows and what was learned through it, test after test: servers it
# starts count alone unless a test says otherwise (ADMISSION_SHARED_DIR, inherited),
# and guards built in this process find no base to make a place in. Tests of the
# default set their own (tests/ledger/test_default_place.py and the real-server ones).
os.environ["ADMISSION_SHARED_DIR"] = "off"
# Likewise no server it starts makes memory groups for its process sessions (below the
# group the test run itself is in) unless a test asks for them.
os.environ["ADMISSION_SESSION_GROUPS"] = "off"


@pytest.fixture(autouse=True)
def no_default_shared_place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Guards built in this process find no base for a default place and no /proc to
    search for other workers in (an empty directory stands for it), and watchdogs find no
    memory group of their own to make session groups below."""
    # A MonkeyPatch of its own: the test's ``monkeypatch`` is then made after the test's
    # other fixtures, and undone before their teardown, as without this fixture.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(shared_place, "default_bases", lambda: ())
        patch.setattr(shared_place, "PROC", str(tmp_path_factory.getbasetemp() / "no-proc"))
        patch.setattr(groups, "PROC_SELF_CGROUP", str(tmp_path_factory.getbasetemp() / "no-proc"))
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests taking helm, promtool or prometheus are ``tool`` tests; tests needing no
    part of the machine beyond Python are ``unit`` tests (``pytest -m unit``)."""
    add_suite_markers(items)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``real_cgroup`` tests need root and a writable cgroup v1 memory hierarchy, and
    ``cgroup_v2`` tests root and cgroup v2 alone: they skip without one, and fail under
    ``CI=true``, where a green run must include them."""
    require_markers(item)


@pytest.fixture
def fixture_copy(tmp_path: Path) -> Callable[..., Path]:
    """Copy one captured tree's memory files into a fresh directory under ``tmp_path``."""

    def copy(name: str, *, prefix: str = "") -> Path:
        dest = tmp_path / (name.replace("/", "_") + prefix)
        return copy_files(FIXTURES / name, dest, prefix=prefix)

    return copy
