"""The human-readable form of ``asgi-admission probe``'s report (``--json`` prints the
report itself)."""

from __future__ import annotations

from typing import Any

from asgi_admission.cli.probe_stuck import stuck_lines


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value} B ({value / 1024**2:.1f} MiB)"


def render(report: dict[str, Any]) -> str:
    """The human-readable form of ``probe.probe``'s report."""
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
    """The human lines for ``probe_learned.probing``."""
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
    """The human line for ``probe.limits``."""
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
