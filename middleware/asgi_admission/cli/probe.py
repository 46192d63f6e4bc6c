"""``asgi-admission probe``: what the guard sees and would decide for one more session now.

It builds the reader and the thresholds the middleware would build, takes one reading
including PSI, and asks a fresh latch about one more session given ``--sessions`` and
``--pending``. docs/operations.md gives its exit statuses and its ``--json`` object.
The parts read from the service's shared directory are built in ``probe_learned``
and ``probe_stuck``; ``probe_render`` writes the human-readable form.
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
