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
      "schema": 6,
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
      "waiting": {                     # the bounded wait and the priority classes
        "queue_timeout_s": float,      # 0: a request that does not fit is refused at once
        "queue_limit": int,            # how many may wait at once
        "classes": [{"name": str,      # first served first; unset: one, "default"
                     "ceiling_percent": float, "resume_percent": float,
                     "ceiling_bytes": int | null}, ...]   # null without a limit
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

The parts read from the service's shared directory are built in ``probe_learned``
(``learned``, ``probing``) and ``probe_stuck`` (``stuck``); ``probe_render`` writes
the human-readable form.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
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
from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.scheduling.priority import classes_in_force
from asgi_admission._config import AdmissionConfig
from asgi_admission._factory import build_reader
from asgi_admission._memory.reading import CgroupMemoryReader, MemoryReading
from asgi_admission._watchdog.groups import GroupsPlace, find_place
from asgi_admission.cli.errors import UsageError
from asgi_admission.cli.probe_learned import learned, probing, service_directory
from asgi_admission.cli.probe_render import render
from asgi_admission.cli.probe_stuck import stuck_report

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
        "waiting": waiting(config, reading),
        "session_groups": session_groups(config, args),
        "stuck": stuck_report(config, *service_directory(config, group)),
    }


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


def _limit_state(reading: MemoryReading) -> str:
    if reading.available and reading.limit_bytes:
        return "limited"
    return "unlimited" if has_no_limit(reading) else "unreadable"


def run(args: argparse.Namespace) -> int:
    report = probe(args)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    sys.stdout.flush()
    status: int = report["exit_status"]
    return status
