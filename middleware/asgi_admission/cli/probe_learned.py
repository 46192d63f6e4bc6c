"""What the running service learned, for ``asgi-admission probe``: the ``learned`` part
(its sessions' footprints and ramps) with the ``probing`` one (the routes it probes now),
from the files its workers keep in their shared directory."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.reservations.learning import (
    KEPT,
    SessionLearner,
    effective_reserve,
)
from asgi_admission._admission.reservations.probing import describe
from asgi_admission._admission.reservations.shared_files import read_learned, read_probing
from asgi_admission._config import AdmissionConfig
from asgi_admission._config_env import SHARED_DIR_AUTO, SHARED_DIR_OFF


def service_directory(
    config: AdmissionConfig, group: shared_place.MemoryGroup | None
) -> tuple[str | None, str]:
    """The directory the service's workers share (with ``ADMISSION_SHARED_DIR`` unset,
    the one they made for ``group``), or ``None`` and why there is none to read."""
    if config.shared_dir == SHARED_DIR_OFF:
        return None, "ADMISSION_SHARED_DIR=off"
    directory: str | None = config.shared_dir
    if directory == SHARED_DIR_AUTO:
        directory = None if group is None else shared_place.find_place(group)
    if directory is None:
        return None, "no directory shared by the service's workers was found for this memory group"
    return directory, ""


def learned(
    config: AdmissionConfig, reserve_bytes: int, group: shared_place.MemoryGroup | None = None
) -> dict[str, Any]:
    """What the running service learned, where its shared directory makes it readable.

    ``reserve_bytes`` is the reserve at the limit read (configured or derived); with
    ``ADMISSION_SHARED_DIR`` unset, the directory is the one the service's workers
    made for ``group``, the memory group read, if there is one.
    """
    report: dict[str, Any] = {
        "learning": config.reserve_learning,
        "evidence": False,
        "note": "",
        "reserve_bytes": reserve_bytes,
        "routes": [],
    }
    if config.reserve_learning == "off":
        report["note"] = "no evidence: ADMISSION_SESSION_RESERVE_LEARNING=off"
        return report
    directory, why = service_directory(config, group)
    if directory is None:
        report["note"] = (
            f"no evidence: {why}, so what the service learned stays in its memory "
            "(see asgi_admission_session_footprint_bytes)"
        )
        return report
    try:
        observations = read_learned(directory, keep=KEPT)
    except (OSError, ValueError) as exc:
        report["note"] = f"no evidence: {exc}"
        return report
    learner = SessionLearner()
    learner.merge(observations or {})
    estimates = learner.estimates()
    if not estimates:
        report["note"] = f"no evidence: no session observed yet in {directory}"
        return report
    report["evidence"] = True
    report["note"] = f"learned by the service's workers, from {directory}"
    report["reserve_bytes"] = effective_reserve(
        reserve_bytes,
        estimates,
        mode=config.reserve_learning,
        min_bytes=config.reserve_min_bytes,
    )
    report["routes"] = [estimate.shown() for estimate in estimates]
    return report


def probing(
    config: AdmissionConfig, group: shared_place.MemoryGroup | None = None
) -> dict[str, Any]:
    """The routes the running service probes now, where its shared directory shows them
    (with ``ADMISSION_SHARED_DIR`` unset, the one its workers made for ``group``)."""
    on = config.probe_sessions > 0 and config.reserve_learning != "off"
    report: dict[str, Any] = {
        "probe_sessions": config.probe_sessions,
        "wait_s": config.probe_wait_s,
        "on": on,
        "evidence": False,
        "note": "",
        "routes": [],
        "concluded": [],
    }
    if not on:
        why = (
            "ADMISSION_SESSION_RESERVE_LEARNING=off"
            if config.reserve_learning == "off"
            else "ADMISSION_PROBE_SESSIONS=0"
        )
        report["note"] = f"off: {why}, so a route's first sessions are decided on the reserve"
        return report
    directory, why = service_directory(config, group)
    if directory is None:
        report["note"] = (
            f"no evidence: {why}, so the probes are in the service's memory "
            "(see asgi_admission_probing_routes)"
        )
        return report
    try:
        trials = read_probing(directory)
    except (OSError, ValueError) as exc:
        report["note"] = f"no evidence: {exc}"
        return report
    if trials is None:
        report["note"] = f"no evidence: nothing probed yet in {config.shared_dir}"
        return report
    now = time.monotonic()
    report["evidence"] = True
    report["note"] = f"probed by the service's workers, from {config.shared_dir}"
    for trial in trials.values():
        if trial.open:
            report["routes"].append(dataclasses.asdict(describe(trial, now, -1, 0)))
        elif trial.footprint_bytes is not None:
            report["concluded"].append(
                {"route": trial.route, "footprint_bytes": trial.footprint_bytes}
            )
    return report
