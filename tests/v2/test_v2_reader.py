"""The reader and ``asgi-admission probe`` on a real cgroup v2 kernel: in a container's
view (a cgroup namespace whose root is the server's group), in a nested group, and with
``memory.high`` below ``memory.max`` as the limit that binds.

Runs in the VM of scripts/cgroup-v2 (the ``cgroup_v2`` marker); skipped elsewhere, and
failed under ``CI=true``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from kits.cgroupkit import container, give_memory, joining, v2_group
from kits.suitekit import MIB

pytestmark = [pytest.mark.cgroup_v2, pytest.mark.timeout(600)]

LIMIT_MB = 512
HIGH_MB = 384
HELD_MB = 48

#: Holds HELD_MB, then prints what the reader finds by discovery (with PSI) and the
#: probe's JSON, on one line each: one interpreter for both (each start costs seconds).
CHILD = f"""
import contextlib, dataclasses, io, json
from asgi_admission import CgroupMemoryReader
from asgi_admission.cli import main
held = bytearray({HELD_MB} << 20)
held[::4096] = b"1" * len(range(0, len(held), 4096))
reader = CgroupMemoryReader()
reading = reader.read(pressure=True)
print(json.dumps({{"reading": dataclasses.asdict(reading), "how": reader.location.how,
                  "location": reader.location.v2}}))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(["probe", "--json"])
print(json.dumps({{"status": status, "probe": json.loads(out.getvalue())}}))
"""


def run_child(prefix: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The child's two reports, run with ``prefix`` (a group to join, a container)."""
    done = subprocess.run(
        [*prefix, sys.executable, "-c", CHILD],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "ADMISSION_SESSION_GROUPS": "auto"},
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()[-2:]
    return json.loads(first), json.loads(second)


def test_in_a_containers_view_the_reader_and_probe_read_the_groups_own_files() -> None:
    """A process in a cgroup namespace whose root is its 512 MiB group, cgroup2 mounted
    at /sys/fs/cgroup: the reader finds /sys/fs/cgroup itself, reads its memory.max and
    a working set with the child's 48 MiB in it, PSI included; probe says the same,
    admits (exit 0), and says why no session groups can be made there."""
    with v2_group(LIMIT_MB, "reader_ns") as group:
        found, probed = run_child(container(group))
    reading = found["reading"]
    assert found["how"] == "discovered"
    assert found["location"] == ["/sys/fs/cgroup", "/sys/fs/cgroup"]
    assert reading["available"] is True
    assert reading["source"] == "cgroup-v2"
    assert reading["path"] == "/sys/fs/cgroup"
    assert reading["limit_bytes"] == LIMIT_MB * MIB
    assert reading["limit_file"] == "/sys/fs/cgroup/memory.max"
    assert HELD_MB * MIB <= reading["used_bytes"] <= (HELD_MB + 64) * MIB, reading
    assert isinstance(reading["pressure_some_avg10"], float), reading

    assert probed["status"] == 0
    probe = probed["probe"]
    assert probe["source"] == "cgroup-v2"
    assert probe["cgroup"]["path"] == "/sys/fs/cgroup"
    assert probe["memory"]["limit_bytes"] == LIMIT_MB * MIB
    assert probe["memory"]["limit_file"] == "/sys/fs/cgroup/memory.max"
    assert isinstance(probe["memory"]["pressure_some_avg10"], float)
    assert probe["config"]["reserve_bytes"] == LIMIT_MB * MIB // 8  # derived from it
    assert probe["decision"]["allowed"] is True
    groups = probe["session_groups"]
    assert (groups["mode"], groups["enabled"], groups["version"]) == ("auto", False, "v2")
    assert "the top of the hierarchy it sees" in groups["reason"], groups


def test_in_a_nested_group_memory_high_of_the_parent_binds() -> None:
    """A process in a group with no limit of its own, inside a 512 MiB group whose
    memory.high is 384 MiB, seen whole (no namespace): the reader and probe walk up and
    compare the parent's working set with its memory.high, the tighter limit."""
    with v2_group(LIMIT_MB, "reader_nested") as group:
        (group / "memory.high").write_text(str(HIGH_MB * MIB))
        give_memory(group)
        inner = group / "server"
        inner.mkdir()
        found, probed = run_child(joining(inner))
    reading = found["reading"]
    assert found["how"] == "discovered"
    assert found["location"][0] == str(inner)
    assert (reading["path"], reading["limit_bytes"]) == (str(group), HIGH_MB * MIB)
    assert reading["limit_file"] == str(group / "memory.high")
    assert HELD_MB * MIB <= reading["used_bytes"] <= (HELD_MB + 64) * MIB, reading
    assert probed["status"] == 0
    assert probed["probe"]["memory"]["limit_bytes"] == HIGH_MB * MIB
    assert probed["probe"]["memory"]["limit_file"] == str(group / "memory.high")
    assert probed["probe"]["config"]["reserve_bytes"] == HIGH_MB * MIB // 8
