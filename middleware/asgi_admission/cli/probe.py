"""``asgi-admission probe``: what the guard sees and would decide for one more session now.

It builds the reader and the thresholds the middleware would build, takes one reading
including PSI, and asks a fresh latch about one more session given ``--sessions`` and
``--pending``; what the running service learned, probes and calls stuck is read from
the files its workers keep in their shared directory. docs/operations.md gives its exit
statuses and its ``--json`` object.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Any

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    ClassCeilings,
    count_cap,
    count_cap_from,
    has_no_limit,
    never_admits,
)
from asgi_admission._admission.decision.stuck import read_stuck
from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.ledger.safe_files import process_alive
from asgi_admission._admission.reservations.learning import (
    KEPT,
    SessionLearner,
    effective_reserve,
)
from asgi_admission._admission.reservations.probing import describe
from asgi_admission._admission.reservations.shared_files import read_learned, read_probing
from asgi_admission._admission.scheduling.priority import classes_in_force
from asgi_admission._config import MIB, AdmissionConfig
from asgi_admission._config_env import SHARED_DIR_AUTO, SHARED_DIR_OFF
from asgi_admission._factory import build_controller, build_reader
from asgi_admission._memory.reading import CgroupMemoryReader, MemoryReading
from asgi_admission._watchdog.groups import GroupsPlace, find_place
from asgi_admission.cli.errors import UsageError

SCHEMA_VERSION = 6
EXIT_STATUS = {"normal": 0, "pressured": 1, "unavailable": 2}
#: The configuration can never admit a session at the limit found.
EXIT_NEVER_ADMITS = 3


def _count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is negative; give 0 or more")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root", metavar="DIR", help="cgroup directory to read (default: discover our own)"
    )
    parser.add_argument(
        "--reclaimable",
        choices=("file", "inactive"),
        help="file cache subtracted from usage: both file LRUs (default) or only "
        "inactive_file, as the kubelet does",
    )
    parser.add_argument(
        "--memory-source", choices=("cgroup", "host"), help="where memory is read from"
    )
    parser.add_argument(
        "--sessions", type=_count, default=0, metavar="N", help="sessions running now"
    )
    parser.add_argument(
        "--pending", type=_count, default=0, metavar="N", help="sessions admitted, not started"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # Where discovery looks; for inspecting a captured tree rather than this process.
    parser.add_argument("--proc-cgroup", default="/proc/self/cgroup", help=argparse.SUPPRESS)
    parser.add_argument("--mountinfo", default="/proc/self/mountinfo", help=argparse.SUPPRESS)
    parser.add_argument("--hostfs", default="/", help=argparse.SUPPRESS)


def _config(args: argparse.Namespace) -> AdmissionConfig:
    config = AdmissionConfig.from_env()
    if args.root is not None and not os.path.isdir(args.root):
        raise UsageError(f"--root {args.root!r} is not a directory.")
    options = {
        "cgroup_root": args.root,
        "reclaimable": args.reclaimable,
        "memory_source": args.memory_source,
    }
    overrides = {name: value for name, value in options.items() if value is not None}
    return dataclasses.replace(config, **overrides)


def probe(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the probe reports, as the ``--json`` object."""
    config = _config(args)
    cgroup: dict[str, Any] | None = None
    if config.memory_source == "cgroup":
        reader = CgroupMemoryReader(
            config.cgroup_root,
            reclaimable=config.reclaimable,
            proc_self_cgroup=args.proc_cgroup,
            mountinfo=args.mountinfo,
            hostfs=args.hostfs,
        )
        reading = reader.read(pressure=True)
        cgroup = {
            "how": reader.location.how,
            "path": reading.path,
            "warnings": list(reader.location.warnings),
            "files": reader.files(),
        }
        group = shared_place.group_of(reader)
        reader.close()
    else:
        host = build_reader(config)
        reading = host.read(pressure=True)
        group = shared_place.group_of(host)
    shared = service_directory(config, group)
    controller = build_controller(config, lambda: reading)
    reserve = controller.reserve_for(reading.limit_bytes)
    problem = never_admits(
        limit_bytes=reading.limit_bytes if reading.available else None,
        high_watermark_percent=config.high_watermark_percent,
        reserve_bytes=reserve,
        reserve_configured=config.reserve_bytes is not None,
    )
    decision = controller.evaluate(args.sessions, config.max_sessions, args.pending)
    ceiling = None
    if reading.available and reading.limit_bytes:
        ceiling_bytes = int(controller.ceiling_bytes(reading.limit_bytes, args.pending))
        ceiling = {
            "bytes": ceiling_bytes,
            "percent": round(ceiling_bytes * 100 / reading.limit_bytes, 2),
        }
    return {
        "schema": SCHEMA_VERSION,
        "exit_status": EXIT_NEVER_ADMITS if problem else EXIT_STATUS[decision.state],
        "problem": problem,
        "source": reading.source,
        "cgroup": cgroup,
        "memory": {
            "available": reading.available,
            "usage_bytes": reading.usage_bytes,
            "reclaimable_bytes": reading.reclaimable_bytes,
            "reclaimable": config.reclaimable,
            "working_set_bytes": reading.used_bytes,
            "limit": _limit_state(reading),
            "limit_bytes": reading.limit_bytes,
            "limit_file": reading.limit_file,
            "percent": reading.percent,
            "pressure_some_avg10": reading.pressure_some_avg10,
        },
        "config": {
            "high_watermark_percent": config.high_watermark_percent,
            "resume_threshold_percent": config.resume_threshold_percent,
            "reserve_bytes": reserve,
            "reserve_derived": config.reserve_bytes is None,
            "max_sessions": config.max_sessions,
            "memory_source": config.memory_source,
        },
        "ceiling": ceiling,
        "limits": limits(controller, reading, decision, config.max_sessions, args),
        "decision": {
            "sessions": args.sessions,
            "pending": args.pending,
            "allowed": decision.allowed,
            "state": decision.state,
            "reason": decision.reason,
        },
        "learned": learned(config, reserve, *shared),
        "probing": probing(config, *shared),
        "waiting": waiting(config, reading),
        "session_groups": session_groups(config, args),
        "stuck": stuck_report(config, *shared),
    }


# --------------------------------------------------------------------------------------
# The parts of the report.


def waiting(config: AdmissionConfig, reading: MemoryReading) -> dict[str, Any]:
    """The wait for capacity and each priority class's ceiling at the limit found."""
    high, resume = config.high_watermark_percent, config.resume_threshold_percent
    classes = classes_in_force(config.priority_classes, high_watermark_percent=high)
    ceilings = ClassCeilings(
        classes=classes, high_watermark_percent=high, resume_threshold_percent=resume
    )
    limit = reading.limit_bytes if reading.available else None
    return {
        "queue_timeout_s": config.queue_timeout_s,
        "queue_limit": config.queue_limit,
        "classes": [
            {
                "name": entry.name,
                "ceiling_percent": entry.high_watermark_percent,
                "resume_percent": ceilings.resume_percent(entry.name),
                "ceiling_bytes": None
                if not limit
                else int(limit * entry.high_watermark_percent / 100),
            }
            for entry in classes
        ],
    }


def session_groups(config: AdmissionConfig, args: argparse.Namespace) -> dict[str, Any]:
    """Whether a watchdog started here would give process sessions memory groups."""
    if config.session_groups == "off":
        place = GroupsPlace(None, None, "ADMISSION_SESSION_GROUPS is off")
    else:
        place = find_place(
            proc_self_cgroup=args.proc_cgroup, mountinfo=args.mountinfo, hostfs=args.hostfs
        )
    return {
        "mode": config.session_groups,
        "enabled": place.parent is not None,
        "version": place.version,
        "base": place.base,
        "reason": place.reason,
    }


def limits(
    controller: AdmissionController,
    reading: MemoryReading,
    decision: CapacityDecision,
    max_sessions: int | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Which limit binds one more session: memory (its reserves) or the count cap."""
    blind = decision.state == "unavailable"
    cap = count_cap(max_sessions, blind)
    by_count = None if cap is None else max(0, cap - args.sessions - args.pending)
    by_memory = controller.admissible_by_memory(reading, args.pending)
    count_binds = by_count is not None and (by_memory is None or by_count < by_memory)
    # The --json keys keep their names: scripts read them (docs/operations.md).
    return {
        "binds": "count_cap" if count_binds else "memory",
        "count_cap": cap,
        "count_cap_from": count_cap_from(max_sessions, blind),
        "count_room": by_count,
        "memory_room": by_memory,
    }


def _limit_state(reading: MemoryReading) -> str:
    if reading.available and reading.limit_bytes:
        return "limited"
    return "unlimited" if has_no_limit(reading) else "unreadable"


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
    config: AdmissionConfig, reserve_bytes: int, directory: str | None, why: str
) -> dict[str, Any]:
    """What the service sharing ``directory`` learned (``None``: none, for ``why``);
    ``reserve_bytes`` is the reserve at the limit read (configured or derived)."""
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


def probing(config: AdmissionConfig, directory: str | None, why: str) -> dict[str, Any]:
    """The routes the service sharing ``directory`` probes now (``None``: none, for ``why``)."""
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
        report["note"] = f"no evidence: nothing probed yet in {directory}"
        return report
    now = time.monotonic()
    report["evidence"] = True
    report["note"] = f"probed by the service's workers, from {directory}"
    for trial in trials.values():
        if trial.open:
            report["routes"].append(dataclasses.asdict(describe(trial, now, -1, 0)))
        elif trial.footprint_bytes is not None:
            report["concluded"].append(
                {"route": trial.route, "footprint_bytes": trial.footprint_bytes}
            )
    return report


_FIGURES = ("working_set_bytes", "attributed_bytes", "unattributed_bytes")


def stuck_report(config: AdmissionConfig, directory: str | None, why: str) -> dict[str, Any]:
    """Whether the pressure of the service sharing ``directory`` is stuck (``None``: none,
    for ``why``)."""
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


# --------------------------------------------------------------------------------------
# The human-readable form (``--json`` prints the report itself).


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value} B ({value / MIB:.1f} MiB)"


def render(report: dict[str, Any]) -> str:
    """The human-readable form of :func:`probe`'s report."""
    memory, config, decision = report["memory"], report["config"], report["decision"]
    lines = [f"source:          {report['source'] or 'none readable'}"]
    cgroup = report["cgroup"]
    if cgroup is not None:
        lines.append(f"cgroup:          {cgroup['path'] or '-'} ({cgroup['how']})")
        lines.extend(f"warning:         {warning}" for warning in cgroup["warnings"])
        lines.append(f"files read:      {', '.join(cgroup['files']) or 'none'}")
    lines.append(f"usage:           {_size(memory['usage_bytes'])}")
    if cgroup is not None:
        # File cache and PSI are cgroup figures: host mode has neither.
        subtracted = (
            "inactive_file + active_file" if memory["reclaimable"] == "file" else "inactive_file"
        )
        lines.append(f"reclaimable:     {_size(memory['reclaimable_bytes'])} ({subtracted})")
    lines.append(f"working set:     {_size(memory['working_set_bytes'])}")
    if memory["limit"] == "limited":
        limit = _size(memory["limit_bytes"])
        origin = (
            f"set by {memory['limit_file']}"
            if cgroup is not None
            else "(all RAM minus the host headroom)"
        )
        lines.append(f"limit:           {limit} {origin}")
    elif memory["limit"] == "unlimited":
        lines.append("limit:           unlimited (no memory limit is set)")
    else:
        lines.append("limit:           unreadable (memory could not be read)")
    percent = memory["percent"]
    lines.append(f"percent:         {'-' if percent is None else f'{percent:.2f} %'}")
    if cgroup is not None:
        psi = memory["pressure_some_avg10"]
        lines.append(f"PSI some avg10:  {'not available' if psi is None else f'{psi:.2f} %'}")
    derived = " (derived from the limit)" if config["reserve_derived"] else ""
    max_sessions = config["max_sessions"]
    lines.append(
        f"thresholds:      high {config['high_watermark_percent']} %, "
        f"resume {config['resume_threshold_percent']} %, "
        f"reserve {_size(config['reserve_bytes'])} per session{derived}, "
        + ("no count cap" if max_sessions is None else f"max {max_sessions} sessions")
    )
    ceiling = report["ceiling"]
    if ceiling is not None:
        lines.append(
            f"ceiling:         {_size(ceiling['bytes'])} = {ceiling['percent']:.2f} % "
            f"(high minus {decision['pending'] + 1} reserve(s))"
        )
    else:
        lines.append("ceiling:         none (no limit to take a percentage of)")
    lines.append(f"binding limit:   {_binding(report['limits'])}")
    wait = report["waiting"]
    lines.append(
        "waiting:         "
        + (
            "none (a session request that does not fit is refused at once)"
            if not wait["queue_timeout_s"]
            else f"up to {wait['queue_limit']} requests, {wait['queue_timeout_s']:g} s each"
        )
    )
    lines.append(
        "classes:         "
        + ", ".join(
            f"{c['name']} {c['ceiling_percent']:g} % (resume {c['resume_percent']:g} %)"
            for c in wait["classes"]
        )
    )
    verdict = "admit" if decision["allowed"] else f"refuse ({decision['reason']})"
    lines.append(
        f"one more session: {verdict}, state {decision['state']} "
        f"(sessions {decision['sessions']}, pending {decision['pending']})"
    )
    learned = report["learned"]
    lines.append(f"learned:         {learned['note']}")
    for route in learned["routes"]:
        lines.append(
            f"  {route['route']}: {_size(route['footprint_bytes'])} per session, "
            f"ramp {route['ramp_s']:.2f} s ({route['observations']} observations)"
        )
    if learned["evidence"]:
        lines.append(f"reserve in use:  {_size(learned['reserve_bytes'])}")
    lines.extend(_probing_lines(report["probing"]))
    groups = report["session_groups"]
    lines.append(
        f"session groups:  {'on' if groups['enabled'] else 'off'} "
        f"({groups['mode']}): {groups['reason']}"
    )
    lines.extend(stuck_lines(report["stuck"]))
    if report["problem"]:
        lines.append(f"error:           {report['problem']}")
    return "\n".join(lines)


def _probing_lines(probing: dict[str, Any]) -> list[str]:
    """The human lines for :func:`probing`."""
    if not probing["on"]:
        return [f"probing:         {probing['note']}"]
    lines = [
        f"probing:         {probing['probe_sessions']} session(s) of a route not learned yet at "
        f"a time, the others wait up to {probing['wait_s']:g} s; {probing['note']}"
    ]
    for route in probing["routes"]:
        lines.append(
            f"  {route['route']}: probing for {route['since_s']:.1f} s, {route['probes']} "
            f"probe(s), {route['waiting']} waiting, grown {_size(route['growth_bytes'])} "
            f"(guessed {_size(route['guess_bytes'])})"
        )
    for route in probing["concluded"]:
        lines.append(f"  {route['route']}: probed, {_size(route['footprint_bytes'])} per session")
    return lines


def _binding(limits: dict[str, Any]) -> str:
    """The human line for :func:`limits`."""
    cap, by_memory = limits["count_cap"], limits["memory_room"]
    if cap is None:
        cap_text = "no count cap"
    elif limits["count_cap_from"] == "max_sessions":
        cap_text = f"count cap {cap} (max_sessions)"
    else:
        cap_text = f"count cap {cap} (the fallback while blind; ADMISSION_MAX_SESSIONS sets it)"
    if limits["binds"] == "count_cap":
        memory = "" if by_memory is None else f"; memory would fit {by_memory}"
        return f"{cap_text}: {limits['count_room']} more session(s){memory}"
    if by_memory is None:
        return f"memory: below the high watermark, no reserve to count in ({cap_text})"
    other = "" if cap is None else f" would allow {limits['count_room']}"
    return f"memory: {by_memory} more session(s) fit under the ceiling ({cap_text}{other})"


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


def run(args: argparse.Namespace) -> int:
    report = probe(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    sys.stdout.flush()
    status: int = report["exit_status"]
    return status
