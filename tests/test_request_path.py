"""One session request's way through the package: few modules, each layer calling down."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import request_path
from asgi_admission._admission.ledger import shared_place

#: Internal on purpose: the bases of the guard's default shared place, which the suite
#: turns off (tests/conftest.py) and this test makes under its tmp_path.
INTERNAL = "the bases of the default shared place"

#: The most modules one session request may enter, to its answer and through the
#: settling after it (docs/design.md: one session request reads top to bottom).
MAX_MODULES = 16
#: The most calls from one of the package's modules into another, to the answer
#: (bench/README.md, ``request_path.py``: 113 before the shared files were loaded once
#: per change and the pass-through wrappers went; 75 since).
MAX_CROSSINGS_TO_ANSWER = 100
#: What admission may call outside itself: the memory readings, the route names and
#: the one seam out, the observer of its decisions (the metrics).
ADMISSION_ASKS = ("_admission/", "_memory/", "_routes.py", "_metrics/decisions.py")


def test_one_session_request_enters_few_modules_and_nothing_calls_back_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``POST /sessions`` at the defaults, counted by a profile hook in this process
    (bench/request_path.py), enters at most 16 of the package's modules to its answer and
    through 3 s of settling, and crosses between them at most 100 times to its answer;
    the latch calls into nothing of the reservations, settling into nothing of the pending
    reservations or learning, nothing below the service calls the service, and admission
    calls nothing of the ASGI side."""
    # At its defaults the guard shares its ledger, settling queue, probes and what it
    # learned in a default place (docs/operations.md), which the suite turns off
    # (tests/conftest.py): here one is made under tmp_path, as under /dev/shm.
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)
    monkeypatch.setattr(shared_place, "default_bases", lambda: (str(base),))
    report = request_path.run_in_process(3.0)
    assert any(name.endswith("shared_files.py") for name in report.to_answer.modules)
    assert report.status == 201
    assert report.to_answer.module_count <= MAX_MODULES, report.to_answer.modules
    assert report.settled.module_count <= MAX_MODULES, report.settled.modules
    crossings = report.to_answer.crossings.calls
    assert crossings <= MAX_CROSSINGS_TO_ANSWER, report.to_answer.edge_calls
    upward = {
        (caller, callee)
        for caller, callee in report.settled.edges
        if (caller.startswith("_admission/decision/") and callee.startswith("_admission/res"))
        or (caller.endswith("/settling.py") and callee.endswith(("/pending.py", "/learning.py")))
        or (caller.startswith("_admission/") and not callee.startswith(ADMISSION_ASKS))
        or (caller.startswith("_admission/") and callee == "_admission/service.py")
    }
    assert upward == set()
