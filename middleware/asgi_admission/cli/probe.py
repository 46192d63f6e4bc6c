"""``asgi-admission probe``: what the guard sees and would decide for one more session now.

It builds the reader and the thresholds the middleware would build (from the
``ADMISSION_*`` environment, with ``--root``, ``--reclaimable`` and
``--memory-source`` overriding it), takes one reading including PSI, and asks a
fresh latch about one more session given ``--sessions`` and ``--pending``.

Exit status, so that it can serve as an exec probe: 0 normal, 1 pressured,
2 blind (memory unreadable, or no limit to take a percentage of), 3 a
configuration that can never admit a session at the limit found (the reserve
does not fit under the high watermark). Usage errors (a bad option, a
``--root`` that is no directory) exit 64 (``EX_USAGE``), anything else 70.

``--json`` prints one object (all sizes in bytes, percentages 0-100)::

    {
      "schema": 5,
      "exit_status": 0 | 1 | 2 | 3,
      "problem": str | null,           # why nothing can be admitted (exit status 3)
      "source": "cgroup-v2" | "cgroup-v1" | "host" | null,
      "cgroup": {                      # null with --memory-source host
        "how": "explicit" | "discovered" | "fallback",
        "path": str | null,            # the directory whose figures were compared
        "warnings": [str, ...],        # e.g. the moved-cgroup fallback
        "files": [str, ...]            # the files the reader read
      },
      "memory": {
        "available": bool,
        "usage_bytes": int | null,     # before reclaimable cache is subtracted
        "reclaimable_bytes": int,
        "reclaimable": "file" | "inactive",
        "working_set_bytes": int | null,
        "limit": "limited" | "unlimited" | "unreadable",
        "limit_bytes": int | null,     # null: unlimited or unreadable
        "limit_file": str | null,      # the file (level) that set the limit
        "percent": float | null,
        "pressure_some_avg10": float | null
      },
      "config": {
        "high_watermark_percent": float,
        "resume_threshold_percent": float,
        "reserve_bytes": int,          # the reserve at the limit found
        "reserve_derived": bool,       # true: derived from the limit, not configured
        "max_sessions": int | null,    # null: no count cap while memory is readable
        "memory_source": "cgroup" | "host"
      },
      "ceiling": {"bytes": int, "percent": float} | null,   # null without a limit
      "limits": {                      # which limit binds, after --sessions and --pending
        "binds": "memory" | "count_cap",
        "count_cap": int | null,       # the cap in force: max_sessions, else the fallback
                                       # while blind; null: none, memory decides alone
        "count_cap_from": "max_sessions" | "blind_fallback" | null,
        "count_room": int | null,      # more sessions the count cap allows; null: no cap
        "memory_room": int | null      # more sessions whose reserves fit under the high
                                       # watermark; null: blind, or a reserve of 0
      },
      "decision": {
        "sessions": int, "pending": int,
        "allowed": bool,
        "state": "normal" | "pressured" | "unavailable",
        "reason": "memory_pressure" | "session_limit" | "telemetry_unavailable"
                  | "no_memory_limit" | null
      },
      "learned": {                     # what the running service learned of its sessions
        "learning": "raise" | "adapt" | "off",
        "evidence": bool,              # false: no shared directory, file or observation
        "note": str,                   # why there is no evidence, or where it came from
        "reserve_bytes": int,          # the reserve the service uses with what it learned
        "routes": [{"route": str, "footprint_bytes": int, "ramp_s": float,
                    "observations": int}, ...]
      },
      "probing": {                     # routes not learned yet, probed before trusting
        "probe_sessions": int,         # sessions admitted at a time (0: no probing)
        "wait_s": float,               # the longest the others wait for their evidence
        "on": bool,                    # false: probe_sessions 0, or learning off
        "evidence": bool,              # false: no shared directory or probing file
        "note": str,
        "routes": [{"route": str, "probes": int, "waiting": int, "since_s": float,
                    "growth_bytes": int, "guess_bytes": int}, ...],   # being probed now
        "concluded": [{"route": str, "footprint_bytes": int}, ...]    # probed lately
      },
      "session_groups": {              # process sessions in memory groups of their own
        "mode": "auto" | "off" | "require",
        "enabled": bool,               # false: off, or no place for them here
        "version": "v1" | "v2" | null,
        "base": str | null,            # the directory the groups go in
        "reason": str                  # where they go, or what is missing
      },
      "stuck": {                       # the latch held by the server's own memory
        "after_s": float,              # ADMISSION_STUCK_AFTER_SECONDS
        "on": bool,                    # false: a window of 0
        "evidence": bool,              # false: off, no shared directory or status file
        "note": str,
        "stuck": bool | null,          # null: no evidence
        "held_s": float | null,        # how long it has been held; null: it is not
        "liveness_fails_in_s": float | null,   # 0: a liveness path fails now
        "sessions": [int, int] | null, # (active, pending) while it is held
        "working_set_bytes": int | null,
        "attributed_bytes": int | null,      # one reserve per session
        "unattributed_bytes": int | null     # the server's own
      }
    }

The ceiling is the working set above which one more session is refused: the
high watermark minus one reserve per pending session plus the new one. The limit
that binds is the one with less room (memory on a tie: the latch decides first).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    CapacityDecision,
    count_cap,
    count_cap_from,
    has_no_limit,
)
from asgi_admission._admission.decision.reserve import never_admits
from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.reservations.learning import (
    WINDOW,
    SessionLearner,
    effective_reserve,
)
from asgi_admission._admission.reservations.probe_window import describe
from asgi_admission._admission.reservations.shared_files import read_learned
from asgi_admission._admission.reservations.shared_probes import read_probing
from asgi_admission._config import SHARED_DIR_AUTO, SHARED_DIR_OFF, AdmissionConfig
from asgi_admission._factory import build_reader
from asgi_admission._memory.cgroup import CgroupMemoryReader
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._watchdog.groups import GroupsPlace, find_place
from asgi_admission.cli.errors import UsageError
from asgi_admission.cli.probe_stuck import stuck_lines, stuck_report

SCHEMA_VERSION = 5
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
    overrides: dict[str, Any] = {}
    if args.root is not None:
        if not os.path.isdir(args.root):
            raise UsageError(f"--root {args.root!r} is not a directory.")
        overrides["cgroup_root"] = args.root
    if args.reclaimable is not None:
        overrides["reclaimable"] = args.reclaimable
    if args.memory_source is not None:
        overrides["memory_source"] = args.memory_source
    return replace(config, **overrides)


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
    controller = AdmissionController(
        high_watermark_percent=config.high_watermark_percent,
        resume_threshold_percent=config.resume_threshold_percent,
        reserve_bytes=config.reserve_bytes,
        memory_reader=lambda: reading,
    )
    reserve = controller.reserve_for(reading.limit_bytes)
    problem = never_admits(
        limit_bytes=reading.limit_bytes if reading.available else None,
        high_watermark_percent=config.high_watermark_percent,
        reserve_bytes=reserve,
        reserve_configured=config.reserve_bytes is not None,
    )
    decision: CapacityDecision = controller.evaluate(
        args.sessions, config.max_sessions, args.pending
    )
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
        "learned": learned(config, reserve, group),
        "probing": probing(config, group),
        "session_groups": session_groups(config, args),
        "stuck": stuck_report(config, *_service_directory(config, group)),
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
    count_room = None if cap is None else max(0, cap - args.sessions - args.pending)
    memory_room = controller.memory_room(reading, args.pending)
    by_count = count_room is not None and (memory_room is None or count_room < memory_room)
    return {
        "binds": "count_cap" if by_count else "memory",
        "count_cap": cap,
        "count_cap_from": count_cap_from(max_sessions, blind),
        "count_room": count_room,
        "memory_room": memory_room,
    }


def _binding(limits: dict[str, Any]) -> str:
    """The human line for :func:`limits`."""
    cap, memory_room = limits["count_cap"], limits["memory_room"]
    if cap is None:
        cap_text = "no count cap"
    elif limits["count_cap_from"] == "max_sessions":
        cap_text = f"count cap {cap} (max_sessions)"
    else:
        cap_text = f"count cap {cap} (the fallback while blind; ADMISSION_MAX_SESSIONS sets it)"
    if limits["binds"] == "count_cap":
        memory = "" if memory_room is None else f"; memory would fit {memory_room}"
        return f"{cap_text}: {limits['count_room']} more session(s){memory}"
    if memory_room is None:
        return f"memory: below the high watermark, no reserve to count in ({cap_text})"
    other = "" if cap is None else f" would allow {limits['count_room']}"
    return f"memory: {memory_room} more session(s) fit under the ceiling ({cap_text}{other})"


def _service_directory(
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
    directory, why = _service_directory(config, group)
    if directory is None:
        report["note"] = (
            f"no evidence: {why}, so what the service learned stays in its memory "
            "(see asgi_admission_session_footprint_bytes)"
        )
        return report
    try:
        observations = read_learned(directory, window=WINDOW)
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
    report["routes"] = [
        {
            "route": e.route,
            "footprint_bytes": e.footprint_bytes,
            "ramp_s": round(e.ramp_s, 2),
            "observations": e.observations,
        }
        for e in estimates
    ]
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
    directory, why = _service_directory(config, group)
    if directory is None:
        report["note"] = (
            f"no evidence: {why}, so the probes are in the service's memory "
            "(see asgi_admission_probing_routes)"
        )
        return report
    try:
        windows = read_probing(directory)
    except (OSError, ValueError) as exc:
        report["note"] = f"no evidence: {exc}"
        return report
    if windows is None:
        report["note"] = f"no evidence: nothing probed yet in {config.shared_dir}"
        return report
    now = time.monotonic()
    report["evidence"] = True
    report["note"] = f"probed by the service's workers, from {config.shared_dir}"
    for window in windows.values():
        if window.open:
            report["routes"].append(dataclasses.asdict(describe(window, now, -1, 0)))
        elif window.footprint_bytes is not None:
            report["concluded"].append(
                {"route": window.route, "footprint_bytes": window.footprint_bytes}
            )
    return report


def _limit_state(reading: MemoryReading) -> str:
    if reading.available and reading.limit_bytes:
        return "limited"
    return "unlimited" if has_no_limit(reading) else "unreadable"


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value} B ({value / 1024**2:.1f} MiB)"


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


def run(args: argparse.Namespace) -> int:
    report = probe(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    sys.stdout.flush()
    status: int = report["exit_status"]
    return status
