"""One session request's way through the package: few modules, each layer calling down."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import request_path

#: The most modules one session request may enter, to its answer and through the
#: settling after it (docs/design.md: one session request reads top to bottom).
MAX_MODULES = 16
#: What admission may call outside itself: the memory readings, the route names and
#: the one seam out, the observer of its decisions (the metrics).
ADMISSION_ASKS = ("_admission/", "_memory/", "_routes.py", "_metrics/decisions.py")


def test_one_session_request_enters_few_modules_and_nothing_calls_back_up() -> None:
    """A ``POST /sessions`` at the defaults, counted by a profile hook in this process
    (bench/request_path.py), enters at most 16 of the package's modules to its answer and
    through 3 s of settling; the latch calls into nothing of the reservations, nothing
    below the service calls the service, and admission calls nothing of the ASGI side."""
    report = request_path.run_in_process(3.0)
    assert report.status == 201
    assert report.to_answer.module_count <= MAX_MODULES, report.to_answer.modules
    assert report.settled.module_count <= MAX_MODULES, report.settled.modules
    upward = {
        (caller, callee)
        for caller, callee in report.settled.edges
        if (caller.startswith("_admission/decision/") and callee.startswith("_admission/res"))
        or (caller.startswith("_admission/") and not callee.startswith(ADMISSION_ASKS))
        or (caller.startswith("_admission/") and callee == "_admission/service.py")
    }
    assert upward == set()
