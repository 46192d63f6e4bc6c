"""The constants the tests, their kits and the benches share, each defined once here."""

from __future__ import annotations

import struct
from pathlib import Path

#: One mebibyte: the tests write memory sizes in MiB.
MIB = 1024 * 1024
#: One gibibyte.
GIB = 1024 * MIB
#: The checkout: the folder holding pyproject.toml.
ROOT = Path(__file__).resolve().parents[2]
#: The package's source in the checkout.
PACKAGE = ROOT / "middleware" / "asgi_admission"
#: The Helm chart.
CHART = ROOT / "charts" / "asgi-admission"
#: The cgroup v1 memory hierarchy, where the tests and benches make real memory groups.
V1_MEMORY = Path("/sys/fs/cgroup/memory")
#: Where a cgroup v2 hierarchy is mounted alone (in the v2 stage's VM, scripts/cgroup-v2).
V2_ROOT = Path("/sys/fs/cgroup")
#: The shared ledger file, read by the tests on their own: a header (magic, slot capacity,
#: slots in use), then one slot per worker that decided (pid, start time, pending, active).
LEDGER_HEADER = struct.Struct("=8sII")
LEDGER_SLOT = struct.Struct("=qqqq")
