"""`asgi-admission probe` run as a subprocess against fixture roots: output, JSON and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from asgi_admission import AdmissionController, HostMemoryReader, MemoryReading, cli
from asgi_admission._admission.decision.stuck import StuckDetector, StuckFile
from asgi_admission._admission.reservations.learning import (
    KEPT,
    SessionLearner,
    empty_observations,
)
from asgi_admission._admission.reservations.probing import Probes
from asgi_admission._admission.reservations.shared_files import LearnedStore, SharedProbeStore
from asgi_admission._memory.reading import UNAVAILABLE
from asgi_admission.cli import probe as probe_module
from kits.cgroup_trees import ELASTIC, copy_files
from kits.suitekit import MIB

#: Internal on purpose: the probe command's module, called in-process as well as run.
INTERNAL = "the probe command's module, called in-process as well as run"

NULLABLE_INT = {"type": ["integer", "null"]}
NULLABLE_STR = {"type": ["string", "null"]}
NULLABLE_NUM = {"type": ["number", "null"]}

# The schema documented in docs/operations.md, "The `--json` object".
SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": [
        "schema", "exit_status", "problem", "source", "cgroup", "memory", "config", "ceiling",
        "limits", "decision", "learned", "probing", "waiting", "session_groups", "stuck",
    ],
    "properties": {
        "schema": {"const": 6},
        "exit_status": {"enum": [0, 1, 2, 3]},
        "problem": NULLABLE_STR,
        "source": {"enum": ["cgroup-v2", "cgroup-v1", "host", None]},
        "cgroup": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["how", "path", "warnings", "files"],
                    "properties": {
                        "how": {"enum": ["explicit", "discovered", "fallback"]},
                        "path": NULLABLE_STR,
                        "warnings": {"type": "array", "items": {"type": "string"}},
                        "files": {"type": "array", "items": {"type": "string"}},
                    },
                },
            ]
        },
        "memory": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "available", "usage_bytes", "reclaimable_bytes", "reclaimable",
                "working_set_bytes", "limit", "limit_bytes", "limit_file", "percent",
                "pressure_some_avg10",
            ],
            "properties": {
                "available": {"type": "boolean"},
                "usage_bytes": NULLABLE_INT,
                "reclaimable_bytes": {"type": "integer", "minimum": 0},
                "reclaimable": {"enum": ["file", "inactive"]},
                "working_set_bytes": NULLABLE_INT,
                "limit": {"enum": ["limited", "unlimited", "unreadable"]},
                "limit_bytes": NULLABLE_INT,
                "limit_file": NULLABLE_STR,
                "percent": NULLABLE_NUM,
                "pressure_some_avg10": NULLABLE_NUM,
            },
        },
        "config": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "high_watermark_percent", "resume_threshold_percent", "reserve_bytes",
                "reserve_derived", "max_sessions", "memory_source",
            ],
            "properties": {
                "high_watermark_percent": {"type": "number"},
                "resume_threshold_percent": {"type": "number"},
                "reserve_bytes": {"type": "integer"},
                "reserve_derived": {"type": "boolean"},
                "max_sessions": NULLABLE_INT,
                "memory_source": {"enum": ["cgroup", "host"]},
            },
        },
        "ceiling": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["bytes", "percent"],
                    "properties": {"bytes": {"type": "integer"}, "percent": {"type": "number"}},
                },
            ]
        },
        "limits": {
            "type": "object",
            "additionalProperties": False,
            "required": ["binds", "count_cap", "count_cap_from", "count_room", "memory_room"],
            "properties": {
                "binds": {"enum": ["memory", "count_cap"]},
                "count_cap": NULLABLE_INT,
                "count_cap_from": {"enum": ["max_sessions", "blind_fallback", None]},
                "count_room": NULLABLE_INT,
                "memory_room": NULLABLE_INT,
            },
        },
        "decision": {
            "type": "object",
            "additionalProperties": False,
            "required": ["sessions", "pending", "allowed", "state", "reason"],
            "properties": {
                "sessions": {"type": "integer"},
                "pending": {"type": "integer"},
                "allowed": {"type": "boolean"},
                "state": {"enum": ["normal", "pressured", "unavailable"]},
                "reason": {
                    "enum": [
                        "memory_pressure", "session_limit", "telemetry_unavailable",
                        "no_memory_limit", None,
                    ]
                },
            },
        },
        "learned": {
            "type": "object",
            "additionalProperties": False,
            "required": ["learning", "evidence", "note", "reserve_bytes", "routes"],
            "properties": {
                "learning": {"enum": ["raise", "adapt", "off"]},
                "evidence": {"type": "boolean"},
                "note": {"type": "string"},
                "reserve_bytes": {"type": "integer"},
                "routes": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["route", "footprint_bytes", "ramp_s", "observations"],
                        "properties": {
                            "route": {"type": "string"},
                            "footprint_bytes": {"type": "integer"},
                            "ramp_s": {"type": "number"},
                            "observations": {"type": "integer"},
                        },
                    },
                },
            },
        },
        "probing": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "probe_sessions", "wait_s", "on", "evidence", "note", "routes", "concluded",
            ],
            "properties": {
                "probe_sessions": {"type": "integer"},
                "wait_s": {"type": "number"},
                "on": {"type": "boolean"},
                "evidence": {"type": "boolean"},
                "note": {"type": "string"},
                "routes": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": [
                            "route", "probes", "waiting", "since_s", "growth_bytes",
                            "guess_bytes",
                        ],
                        "properties": {
                            "route": {"type": "string"},
                            "probes": {"type": "integer"},
                            "waiting": {"type": "integer"},
                            "since_s": {"type": "number"},
                            "growth_bytes": {"type": "integer"},
                            "guess_bytes": {"type": "integer"},
                        },
                    },
                },
                "concluded": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["route", "footprint_bytes"],
                        "properties": {
                            "route": {"type": "string"},
                            "footprint_bytes": {"type": "integer"},
                        },
                    },
                },
            },
        },
        "waiting": {
            "type": "object",
            "additionalProperties": False,
            "required": ["queue_timeout_s", "queue_limit", "classes"],
            "properties": {
                "queue_timeout_s": {"type": "number"},
                "queue_limit": {"type": "integer"},
                "classes": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "ceiling_percent", "resume_percent", "ceiling_bytes"],
                        "properties": {
                            "name": {"type": "string"},
                            "ceiling_percent": {"type": "number"},
                            "resume_percent": {"type": "number"},
                            "ceiling_bytes": {"type": ["integer", "null"]},
                        },
                    },
                },
            },
        },
        "session_groups": {
            "type": "object",
            "additionalProperties": False,
            "required": ["mode", "enabled", "version", "base", "reason"],
            "properties": {
                "mode": {"enum": ["auto", "off", "require"]},
                "enabled": {"type": "boolean"},
                "version": {"enum": ["v1", "v2", None]},
                "base": NULLABLE_STR,
                "reason": {"type": "string"},
            },
        },
        "stuck": {
            "type": "object",
            "additionalProperties": False,
            "required": [
                "after_s", "on", "evidence", "note", "stuck", "held_s", "liveness_fails_in_s",
                "sessions", "working_set_bytes", "attributed_bytes", "unattributed_bytes",
            ],
            "properties": {
                "after_s": {"type": "number"},
                "on": {"type": "boolean"},
                "evidence": {"type": "boolean"},
                "note": {"type": "string"},
                "stuck": {"type": ["boolean", "null"]},
                "held_s": NULLABLE_NUM,
                "liveness_fails_in_s": NULLABLE_NUM,
                "sessions": {
                    "type": ["array", "null"],
                    "items": {"type": "integer"},
                    "minItems": 2,
                    "maxItems": 2,
                },
                "working_set_bytes": NULLABLE_INT,
                "attributed_bytes": NULLABLE_INT,
                "unattributed_bytes": NULLABLE_INT,
            },
        },
    },
}  # fmt: skip


def run_probe(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a child process with no ADMISSION_*/CODA_* settings but those given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "CODA_"))}
    return subprocess.run(
        [sys.executable, "-m", "asgi_admission.cli", "probe", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=60,
        check=False,
    )


def probe_json(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    result = run_probe("--json", *args, env=env)
    report = json.loads(result.stdout)
    jsonschema.validate(report, SCHEMA)
    assert report["exit_status"] == result.returncode
    return result.returncode, report


def test_text_output_for_a_v2_fixture(fixture_copy: Any) -> None:
    """The human output names the version, files, figures, limit file, ceiling and decision."""
    root = fixture_copy("telegraf/v2")
    result = run_probe("--root", str(root))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "source:          cgroup-v2" in out
    assert f"cgroup:          {root} (explicit)" in out
    assert f"{root}/memory.current" in out
    assert "usage:           13071106048 B" in out
    assert "working set:     4538245120 B" in out
    assert f"limit:           103079215104 B (98304.0 MiB) set by {root}/memory.max" in out
    assert "percent:         4.40 %" in out
    assert "PSI some avg10:  0.00 %" in out
    assert "ceiling:         81658065715 B" in out
    assert "one more session: admit, state normal" in out
    assert result.stderr == ""


def test_json_schema_and_figures(fixture_copy: Any) -> None:
    """--json prints one object matching the documented schema, with the reader's figures."""
    root = fixture_copy("telegraf/v2")
    status, report = probe_json("--root", str(root))
    assert status == 0
    assert report["source"] == "cgroup-v2"
    assert report["cgroup"]["how"] == "explicit"
    assert sorted(report["cgroup"]["files"]) == sorted(
        str(root / name)
        for name in ("memory.current", "memory.max", "memory.stat", "memory.pressure")
    )
    assert report["memory"]["working_set_bytes"] == 4538245120
    assert report["memory"]["reclaimable_bytes"] == 13071106048 - 4538245120
    assert report["memory"]["limit_bytes"] == 103079215104
    limit, reserve = 103079215104, 768 * MIB
    assert report["ceiling"] == {
        "bytes": int(limit * 0.8 - reserve),
        "percent": round(int(limit * 0.8 - reserve) * 100 / limit, 2),
    }
    assert report["decision"] == {
        "sessions": 0,
        "pending": 0,
        "allowed": True,
        "state": "normal",
        "reason": None,
    }


def test_kubelet_working_set_option(fixture_copy: Any) -> None:
    """--reclaimable inactive subtracts only inactive_file, as kubectl top does."""
    _, report = probe_json("--root", str(fixture_copy("telegraf/v2")), "--reclaimable", "inactive")
    assert report["memory"]["working_set_bytes"] == 10135646208
    assert report["memory"]["reclaimable"] == "inactive"


def test_pressured_exits_1(fixture_copy: Any) -> None:
    """A working set over the configured high watermark exits 1 with the memory_pressure reason."""
    env = {
        "ADMISSION_MEMORY_HIGH_WATERMARK_PERCENT": "4",
        "ADMISSION_MEMORY_RESUME_THRESHOLD_PERCENT": "2",
    }
    status, report = probe_json("--root", str(fixture_copy("telegraf/v2")), env=env)
    assert status == 1
    assert report["config"]["high_watermark_percent"] == 4.0
    assert report["decision"]["reason"] == "memory_pressure"
    assert report["decision"]["allowed"] is False


def test_the_wait_and_each_class_ceiling_are_shown(fixture_copy: Any) -> None:
    """The probe shows the wait for capacity and each priority class with its ceiling and
    resume point at the limit found, in JSON and in text; by default no wait and one
    class at the high watermark."""
    root = str(fixture_copy("telegraf/v2"))
    limit = 103079215104
    _, default = probe_json("--root", root)
    assert default["waiting"] == {
        "queue_timeout_s": 0.0,
        "queue_limit": 256,
        "classes": [
            {
                "name": "default",
                "ceiling_percent": 80.0,
                "resume_percent": 70.0,
                "ceiling_bytes": int(limit * 0.8),
            }
        ],
    }
    env = {
        "ADMISSION_PRIORITY_CLASSES": "critical=90,batch=65",
        "ADMISSION_QUEUE_TIMEOUT_SECONDS": "10",
    }
    _, report = probe_json("--root", root, env=env)
    assert report["waiting"]["queue_timeout_s"] == 10.0
    assert [
        (c["name"], c["ceiling_percent"], c["resume_percent"]) for c in report["waiting"]["classes"]
    ] == [
        ("critical", 90.0, 80.0),
        ("batch", 65.0, 55.0),
    ]
    text = run_probe("--root", root, env=env).stdout
    assert "waiting:         up to 256 requests, 10 s each" in text
    assert "classes:         critical 90 % (resume 80 %), batch 65 % (resume 55 %)" in text


def test_reserve_that_can_never_fit_exits_3_naming_the_variable(fixture_copy: Any) -> None:
    """With a 512 MiB limit a 768 MiB reserve can never fit: exit 3, the variable named."""
    root = str(fixture_copy("local-firecracker-v1-hybrid"))
    env = {"ADMISSION_SESSION_RESERVE_MB": "768"}
    status, report = probe_json("--root", root, env=env)
    assert status == 3
    assert report["source"] == "cgroup-v1"
    assert report["memory"]["limit_bytes"] == 512 * MIB
    assert report["ceiling"]["bytes"] < 0
    assert report["problem"].startswith("ADMISSION_SESSION_RESERVE_MB (reserve_bytes) is 768 MiB")
    assert "no session can ever be admitted" in report["problem"]
    result = run_probe("--root", root, env=env)
    assert result.returncode == 3
    assert "refuse (memory_pressure), state pressured" in result.stdout
    assert "error:           ADMISSION_SESSION_RESERVE_MB (reserve_bytes) is 768 MiB" in (
        result.stdout
    )


def test_default_reserve_is_derived_from_a_small_limit(fixture_copy: Any) -> None:
    """Unset, the reserve is an eighth of the 512 MiB limit (64 MiB) and one more session fits."""
    root = str(fixture_copy("local-firecracker-v1-hybrid"))
    status, report = probe_json("--root", root)
    assert status == 0
    assert report["problem"] is None
    assert report["config"]["reserve_bytes"] == 64 * MIB
    assert report["config"]["reserve_derived"] is True
    assert report["ceiling"]["bytes"] == int(512 * MIB * 0.8 - 64 * MIB)
    text = run_probe("--root", root).stdout
    assert "reserve 67108864 B (64.0 MiB) per session (derived from the limit)" in text


def test_sessions_and_pending_inputs(fixture_copy: Any) -> None:
    """--sessions/--pending feed the count cap and the reserves in the ceiling."""
    root = str(fixture_copy("telegraf/v2"))
    env = {"ADMISSION_MAX_SESSIONS": "16"}
    status, report = probe_json("--root", root, "--sessions", "15", "--pending", "1", env=env)
    assert status == 0
    assert report["decision"]["reason"] == "session_limit"
    limit, reserve = 103079215104, 768 * MIB
    assert report["ceiling"]["bytes"] == int(limit * 0.8 - 2 * reserve)


def test_memory_binds_by_default_in_a_large_group(fixture_copy: Any) -> None:
    """With no ADMISSION_MAX_SESSIONS a 96 GiB group at 4.4 % has no count cap: memory binds,
    with room for 96 more reserves, and a 41st session is admitted."""
    root = str(fixture_copy("telegraf/v2"))
    status, report = probe_json("--root", root, "--sessions", "40")
    assert status == 0
    assert report["config"]["max_sessions"] is None
    assert report["limits"] == {
        "binds": "memory",
        "count_cap": None,
        "count_cap_from": None,
        "count_room": None,
        "memory_room": 96,
    }
    assert report["decision"]["allowed"] is True
    text = run_probe("--root", root, "--sessions", "40").stdout
    assert "reserve 805306368 B (768.0 MiB) per session (derived from the limit), no count cap" in (
        text
    )
    assert "binding limit:   memory: 96 more session(s) fit under the ceiling (no count cap)" in (
        text
    )
    assert "one more session: admit, state normal (sessions 40, pending 0)" in text


def test_a_set_count_cap_binds_and_says_so(fixture_copy: Any) -> None:
    """ADMISSION_MAX_SESSIONS=20 binds before memory in the 96 GiB group: 17 more after 3,
    and at 20 the session is refused with session_limit."""
    root = str(fixture_copy("telegraf/v2"))
    env = {"ADMISSION_MAX_SESSIONS": "20"}
    _, report = probe_json("--root", root, "--sessions", "3", env=env)
    assert report["limits"] == {
        "binds": "count_cap",
        "count_cap": 20,
        "count_cap_from": "max_sessions",
        "count_room": 17,
        "memory_room": 96,
    }
    text = run_probe("--root", root, "--sessions", "3", env=env).stdout
    assert "max 20 sessions" in text
    assert (
        "binding limit:   count cap 20 (max_sessions): 17 more session(s); memory would fit 96"
        in (text)
    )
    _, at_cap = probe_json("--root", root, "--sessions", "20", env=env)
    assert (at_cap["decision"]["reason"], at_cap["limits"]["count_room"]) == ("session_limit", 0)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("elastic-agent-system-metrics/docker2-v2-dotdot", "no_memory_limit"),
        (None, "telemetry_unavailable"),
    ],
    ids=["unlimited", "empty"],
)
def test_blind_the_fallback_cap_binds_unless_one_is_set(
    fixture_copy: Any, tmp_path: Path, name: str | None, reason: str
) -> None:
    """Blind, the fallback cap of 16 binds and the probe names it; ADMISSION_MAX_SESSIONS=20
    replaces it there too."""
    root = str(fixture_copy(name) if name else tmp_path)
    _, report = probe_json("--root", root, "--sessions", "16")
    assert report["limits"] == {
        "binds": "count_cap",
        "count_cap": 16,
        "count_cap_from": "blind_fallback",
        "count_room": 0,
        "memory_room": None,
    }
    assert report["decision"]["reason"] == reason
    text = run_probe("--root", root, "--sessions", "4").stdout
    assert (
        "binding limit:   count cap 16 (the fallback while blind; ADMISSION_MAX_SESSIONS sets it): "
        "12 more session(s)\n"
    ) in text
    env = {"ADMISSION_MAX_SESSIONS": "20"}
    _, capped = probe_json("--root", root, "--sessions", "16", env=env)
    assert capped["decision"]["allowed"] is True
    assert (capped["limits"]["count_cap"], capped["limits"]["count_cap_from"]) == (
        20,
        "max_sessions",
    )
    _, full = probe_json("--root", root, "--sessions", "20", env=env)
    assert (full["decision"]["allowed"], full["decision"]["reason"]) == (False, reason)


@pytest.mark.parametrize(
    "name", ["elastic-agent-system-metrics/docker2-v2-dotdot", None], ids=["unlimited", "empty"]
)
def test_unavailable_exits_2(fixture_copy: Any, tmp_path: Path, name: str | None) -> None:
    """No limit to take a percentage of, or nothing readable, exits 2 and says which."""
    root = fixture_copy(name) if name else tmp_path
    status, report = probe_json("--root", str(root), "--sessions", "16")
    assert status == 2
    assert report["decision"]["state"] == "unavailable"
    assert report["ceiling"] is None
    assert report["memory"]["available"] is (name is not None)
    unlimited = name is not None
    assert report["memory"]["limit"] == ("unlimited" if unlimited else "unreadable")
    assert report["decision"]["reason"] == (
        "no_memory_limit" if unlimited else "telemetry_unavailable"
    )
    text = run_probe("--root", str(root)).stdout
    assert "ceiling:         none" in text
    if unlimited:
        assert "limit:           unlimited (no memory limit is set)" in text
    else:
        assert "limit:           unreadable (memory could not be read)" in text


def test_discovery_of_a_moved_cgroup_reports_the_warning(tmp_path: Path) -> None:
    """Discovery against a captured /proc shows how the path was found and the one warning."""
    fixture = ELASTIC / "docker2-v2-dotdot"
    copy_files(fixture, tmp_path / "testdata/docker2/sys/fs/cgroup")
    args = (
        "--proc-cgroup", str(fixture / "proc_2233801_cgroup"),
        "--mountinfo", str(fixture / "proc_self_mountinfo"),
        "--hostfs", str(tmp_path),
    )  # fmt: skip
    _, report = probe_json(*args)
    assert report["cgroup"]["how"] == "discovered"
    assert len(report["cgroup"]["warnings"]) == 1
    result = run_probe(*args)
    assert result.stdout.count("warning:") == 1
    assert result.stderr.count("does not resolve inside its mount") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sessions", "-1"], "argument --sessions: '-1' is negative; give 0 or more"),
        (["--pending", "many"], "argument --pending: 'many' is not a whole number"),
        (["--reclaimable", "all"], "argument --reclaimable: invalid choice: 'all'"),
        (["--root", "/nonexistent/cgroup"], "--root '/nonexistent/cgroup' is not a directory."),
    ],
)
def test_errors_are_one_clear_line(args: list[str], message: str) -> None:
    """Bad arguments exit 64 (EX_USAGE) with one line naming the option, never a traceback."""
    result = run_probe(*args)
    assert result.returncode == 64
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1
    assert errors[0].startswith("asgi-admission probe: error: ")
    assert message in errors[0]


def test_host_source_in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--memory-source host reads the host reader and reports no cgroup section."""
    total, available = 16 * 1024**3, 10 * 1024**3

    def fake_reader(config: object) -> HostMemoryReader:
        vm = SimpleNamespace(total=total, available=available)
        return HostMemoryReader(virtual_memory=lambda: vm)

    monkeypatch.setattr(probe_module, "build_reader", fake_reader)
    for name in [k for k in os.environ if k.startswith(("ADMISSION_", "CODA_"))]:
        monkeypatch.delenv(name)
    assert cli.main(["probe", "--memory-source", "host", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    jsonschema.validate(report, SCHEMA)
    assert (report["source"], report["cgroup"]) == ("host", None)
    assert report["memory"]["working_set_bytes"] == total - available
    assert cli.main(["probe", "--memory-source", "host"]) == 0
    text = capsys.readouterr().out
    for cgroup_only in ("cgroup:", "files read:", "reclaimable:", "PSI", "set by"):
        assert cgroup_only not in text
    assert "(all RAM minus the host headroom)" in text


def test_unexpected_errors_exit_70_not_a_verdict(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unexpected failure exits 70 (EX_SOFTWARE) with one line, never 2 like a verdict."""

    def broken(args: object) -> dict[str, Any]:
        raise OSError("the disk went away")

    monkeypatch.setattr(probe_module, "probe", broken)
    assert cli.main(["probe"]) == 70
    assert capsys.readouterr().err == "asgi-admission probe: error: the disk went away\n"


def test_what_the_service_learned_is_shown_from_the_shared_dir(
    fixture_copy: Any, tmp_path: Path
) -> None:
    """With the service's shared directory, probe shows its learned footprints and the
    reserve in use; without one, or before any session, it says it has no evidence."""
    tree = str(fixture_copy("telegraf/v2"))
    shared = tmp_path / "shared"
    env = {"ADMISSION_SHARED_DIR": str(shared), "ADMISSION_SESSION_RESERVE_MB": "64"}
    _, report = probe_json("--root", tree)
    assert report["learned"]["evidence"] is False
    assert "no directory shared by the service's workers was found" in report["learned"]["note"]
    _, report = probe_json("--root", tree, env={"ADMISSION_SHARED_DIR": "off"})
    assert "ADMISSION_SHARED_DIR=off" in report["learned"]["note"]
    shared.mkdir(mode=0o700)
    _, report = probe_json("--root", tree, env=env)
    assert report["learned"]["evidence"] is False
    observed = empty_observations()
    observed["footprints"], observed["ramps"] = [100.0 * 1024**2], [2.0]
    LearnedStore(str(shared), keep=KEPT).add({"POST /s": observed})
    _, report = probe_json("--root", tree, env=env)
    learned = report["learned"]
    assert learned["evidence"] is True
    assert learned["reserve_bytes"] == 100 * 1024**2  # raised from 64 MiB
    assert learned["routes"] == [
        {"route": "POST /s", "footprint_bytes": 100 * 1024**2, "ramp_s": 2.0, "observations": 1}
    ]
    text = run_probe("--root", tree, env=env).stdout
    assert "POST /s: 104857600 B (100.0 MiB) per session, ramp 2.00 s" in text
    _, report = probe_json("--root", tree, env={**env, "ADMISSION_SESSION_RESERVE_LEARNING": "off"})
    assert report["learned"]["evidence"] is False


def test_the_routes_being_probed_are_shown_from_the_shared_dir(
    fixture_copy: Any, tmp_path: Path
) -> None:
    """With the service's shared directory, probe shows a route being probed (its probes,
    growth and guess) and, once its memory has stopped growing, what the probe showed;
    with probing off it says so and why."""
    tree = str(fixture_copy("telegraf/v2"))
    shared = tmp_path / "shared"
    env = {"ADMISSION_SHARED_DIR": str(shared), "ADMISSION_PROBE_WAIT_SECONDS": "3"}
    _, report = probe_json("--root", tree)
    assert (report["probing"]["on"], report["probing"]["evidence"]) == (True, False)
    assert "no directory shared by the service's workers" in report["probing"]["note"]
    probes = Probes(probe_sessions=1, timeout_s=120.0, store=SharedProbeStore(str(shared)))
    learner = SessionLearner()
    base = 100 * 1024**2
    probes.add("POST /s", 1, base, 16 * 1024**2, 0.0)
    probes.responded(1, base + 40 * 1024**2, 0.1)
    _, report = probe_json("--root", tree, env=env)
    probing = report["probing"]
    assert (probing["evidence"], probing["wait_s"], probing["concluded"]) == (True, 3.0, [])
    [route] = probing["routes"]
    assert (route["route"], route["probes"], route["growth_bytes"]) == ("POST /s", 1, 40 * 2**20)
    assert route["guess_bytes"] == 16 * 1024**2
    text = run_probe("--root", tree, env=env).stdout
    assert "POST /s: probing for" in text
    assert "others wait up to 3 s" in text
    for step in range(2, 8):
        probes.on_reading(base + 40 * 1024**2, step * 0.25, learner)
    _, report = probe_json("--root", tree, env=env)
    assert report["probing"]["routes"] == []
    assert report["probing"]["concluded"] == [{"route": "POST /s", "footprint_bytes": 40 * 2**20}]
    _, report = probe_json("--root", tree, env={**env, "ADMISSION_PROBE_SESSIONS": "0"})
    assert report["probing"]["on"] is False
    assert "ADMISSION_PROBE_SESSIONS=0" in report["probing"]["note"]


def test_session_groups_show_where_they_would_go(tmp_path: Path) -> None:
    """The probe says whether process sessions would get memory groups and where: on for
    a v2 server whose parent delegates memory, off (and why) with the setting off."""
    server = tmp_path / "sys/fs/cgroup/pod/server"
    server.mkdir(parents=True)
    (server / "memory.current").write_text(f"{100 * MIB}\n")
    (server / "memory.max").write_text(f"{1024 * MIB}\n")
    (server / "memory.stat").write_text("anon 0\ninactive_file 0\nactive_file 0\n")
    (server.parent / "cgroup.subtree_control").write_text("memory\n")
    (server.parent / "cgroup.procs").write_text("")
    (tmp_path / "cgroup").write_text("0::/pod/server\n")
    (tmp_path / "mountinfo").write_text("0 0 0:1 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    where = ["--proc-cgroup", str(tmp_path / "cgroup"), "--mountinfo", str(tmp_path / "mountinfo")]
    where += ["--hostfs", str(tmp_path)]
    env = {"ADMISSION_SESSION_GROUPS": "auto"}
    _, report = probe_json(*where, env=env)
    assert report["session_groups"] == {
        "mode": "auto",
        "enabled": True,
        "version": "v2",
        "base": str(server.parent / "asgi-admission"),
        "reason": f"cgroup v2: session groups go under {server.parent}/asgi-admission",
    }
    text = run_probe(*where, env=env).stdout
    assert f"session groups:  on (auto): cgroup v2: session groups go under {server.parent}" in text
    _, off = probe_json(*where, env={"ADMISSION_SESSION_GROUPS": "off"})
    assert (off["session_groups"]["enabled"], off["session_groups"]["reason"]) == (
        False,
        "ADMISSION_SESSION_GROUPS is off",
    )


def test_stuck_pressure_is_shown_from_the_shared_dir(fixture_copy: Any, tmp_path: Path) -> None:
    """With the service's status file, probe shows a stuck pressure, its split and when the
    liveness path fails; without a file, with a writer gone, or off, it says why not."""
    tree = str(fixture_copy("telegraf/v2"))
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    env = {"ADMISSION_SHARED_DIR": str(shared), "ADMISSION_STUCK_AFTER_SECONDS": "300"}
    _, report = probe_json("--root", tree, env=env)
    assert (report["stuck"]["on"], report["stuck"]["evidence"]) == (True, False)
    assert "the latch has not been held" in report["stuck"]["note"]
    latch = AdmissionController(reserve_bytes=100 * 2**20, memory_reader=lambda: UNAVAILABLE)
    detector = StuckDetector(controller=latch, after_s=300.0, liveness_delay_s=60.0)
    used = MemoryReading(used_bytes=900 * 2**20, limit_bytes=1000 * 2**20, available=True)
    start = time.monotonic() - 320
    detector.observe(start, latched=True, memory=used, active=1, pending=0)
    detector.observe(start + 310, latched=True, memory=used, active=1, pending=0)
    status = detector.status(time.monotonic())
    StuckFile(str(shared)).write(300.0, 60.0, status)
    _, report = probe_json("--root", tree, env=env)
    stuck = report["stuck"]
    assert (stuck["evidence"], stuck["stuck"], stuck["sessions"]) == (True, True, [1, 0])
    assert 319 <= stuck["held_s"] <= 330
    assert 30 <= stuck["liveness_fails_in_s"] <= 41
    assert (stuck["attributed_bytes"], stuck["unattributed_bytes"]) == (100 * 2**20, 800 * 2**20)
    text = run_probe("--root", tree, env=env).stdout
    assert "stuck pressure:  STUCK: latch held by the server's own memory for 3" in text
    assert "s (stuck after 300 s); a liveness path fails in" in text
    assert "1 session(s) (0 pending) account for 100.0 MiB, 800.0 MiB is the server's own" in text
    data = json.loads((shared / "asgi-admission.stuck").read_text())
    (shared / "asgi-admission.stuck").write_text(json.dumps({**data, "pid": dead_pid()}))
    _, report = probe_json("--root", tree, env=env)
    assert report["stuck"]["evidence"] is False
    assert "has ended" in report["stuck"]["note"]
    _, report = probe_json("--root", tree, env={**env, "ADMISSION_STUCK_AFTER_SECONDS": "0"})
    assert (report["stuck"]["on"], report["stuck"]["evidence"]) == (False, False)


def dead_pid() -> int:
    """The pid of a child that has exited and been reaped."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(child.stdout)
