"""The ``stuck`` part of ``asgi-admission probe``: whether the running service's pressure
is stuck, from the status file its workers keep in their shared directory."""

from __future__ import annotations

import time
from typing import Any

from asgi_admission._admission.decision.stuck import read_stuck
from asgi_admission._admission.ledger.safe_files import process_alive
from asgi_admission._config import MIB, AdmissionConfig

_FIGURES = ("working_set_bytes", "attributed_bytes", "unattributed_bytes")


def stuck_report(config: AdmissionConfig, directory: str | None, why: str) -> dict[str, Any]:
    """The report for the service sharing ``directory`` (``None``: none, for ``why``)."""
    report: dict[str, Any] = {
        "after_s": config.stuck_after_s,
        "on": config.stuck_after_s > 0,
        "evidence": False,
        "note": "",
        "stuck": None,
        "held_s": None,
        "liveness_fails_in_s": None,
        "sessions": None,
        **dict.fromkeys(_FIGURES),
    }
    if not report["on"]:
        report["note"] = "off: ADMISSION_STUCK_AFTER_SECONDS=0"
        return report
    if directory is None:
        report["note"] = (
            f"no evidence: {why}, so the service's status is in its memory "
            "(see asgi_admission_pressure_stuck)"
        )
        return report
    try:
        status = read_stuck(directory)
    except (OSError, ValueError) as exc:
        report["note"] = f"no evidence: {exc}"
        return report
    if status is None:
        report["note"] = f"no evidence: the latch has not been held in {directory} yet"
        return report
    pid = int(status["pid"])
    if not process_alive(pid):
        report["note"] = f"no evidence: the worker that wrote it (pid {pid}) has ended"
        return report
    report["evidence"] = True
    report["stuck"] = bool(status["stuck"])
    report["note"] = f"from the service's workers, in {directory}"
    since = status["held_since"]
    if since is not None:
        report["held_s"] = round(max(0.0, time.time() - float(since)), 1)
        fails_at = float(since) + float(status["after_s"]) + float(status["liveness_delay_s"])
        report["liveness_fails_in_s"] = round(max(0.0, fails_at - time.time()), 1)
        report["sessions"] = [int(n) for n in status["sessions"]]
        for key in _FIGURES:
            report[key] = int(status[key])
    return report


def stuck_lines(stuck: dict[str, Any]) -> list[str]:
    """The human lines for :func:`stuck_report`."""
    if not stuck["evidence"] or stuck["held_s"] is None:
        state = "not held by the server's own memory" if stuck["evidence"] else stuck["note"]
        return [f"stuck pressure:  {state} (stuck after {stuck['after_s']:g} s)"]
    verdict = "STUCK" if stuck["stuck"] else "not yet stuck"
    active, pending = stuck["sessions"]
    liveness = stuck["liveness_fails_in_s"]
    return [
        f"stuck pressure:  {verdict}: latch held by the server's own memory for "
        f"{stuck['held_s']:.0f} s (stuck after {stuck['after_s']:g} s); a liveness path "
        + ("fails now" if liveness == 0 else f"fails in {liveness:.0f} s"),
        f"  working set {stuck['working_set_bytes'] / MIB:.1f} MiB: {active} session(s) "
        f"({pending} pending) account for {stuck['attributed_bytes'] / MIB:.1f} MiB, "
        f"{stuck['unattributed_bytes'] / MIB:.1f} MiB is the server's own",
    ]
