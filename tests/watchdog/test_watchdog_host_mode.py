"""Host mode: the headroom arithmetic, failures, one real reading, and never chosen silently."""

from __future__ import annotations

import logging
from collections import namedtuple
from typing import Any

import psutil
import pytest

from asgi_admission import AdmissionConfig, CgroupMemoryReader, HostMemoryReader
from asgi_admission._factory import build_reader
from asgi_admission._memory.host import host_headroom_bytes
from kits.suitekit import GIB, MIB

#: Internal on purpose: the host reader's headroom and the factory's reader.
INTERNAL = "the host reader's headroom and the factory's reader"

VM = namedtuple("VM", ["total", "available"])


@pytest.mark.parametrize(
    ("total", "available", "headroom", "used", "limit"),
    [
        # Below 10 GiB of RAM the 1 GiB floor is the larger.
        (2 * GIB, GIB, GIB, GIB, GIB),
        (4 * GIB, 3 * GIB, GIB, GIB, 3 * GIB),
        (8 * GIB, 0, GIB, 8 * GIB, 7 * GIB),
        # At 10 GiB the two are equal: the crossover.
        (10 * GIB, 5 * GIB, GIB, 5 * GIB, 9 * GIB),
        # Above it, 10% of RAM is the larger.
        (10 * GIB + 10 * MIB, 5 * GIB, GIB + MIB, 5 * GIB + 10 * MIB, 9 * GIB + 9 * MIB),
        (16 * GIB, 8 * GIB, int(1.6 * GIB), 8 * GIB, 16 * GIB - int(1.6 * GIB)),
        (64 * GIB, 60 * GIB, int(6.4 * GIB), 4 * GIB, 64 * GIB - int(6.4 * GIB)),
        # psutil's available can exceed a racy total; used never goes negative.
        (4 * GIB, 5 * GIB, GIB, 0, 3 * GIB),
    ],
)
def test_headroom_table(total: int, available: int, headroom: int, used: int, limit: int) -> None:
    """The limit is RAM less max(10 %, 1 GiB) and the working set is RAM less available."""
    assert host_headroom_bytes(total) == headroom
    reading = HostMemoryReader(virtual_memory=lambda: VM(total, available))()
    assert reading.available
    assert (reading.used_bytes, reading.limit_bytes, reading.source) == (used, limit, "host")
    assert reading.percent == round(used * 100 / limit, 2)


def _raises() -> Any:
    raise OSError("no /proc/meminfo")


@pytest.mark.parametrize(
    "virtual_memory",
    [
        _raises,
        lambda: VM(GIB, GIB),  # all of it is headroom: nothing usable
        lambda: VM(512 * MIB, 512 * MIB),
        lambda: VM(0, 0),
        lambda: VM("lots", 0),
        lambda: object(),
    ],
)
def test_unusable_host_is_unavailable(virtual_memory: Any) -> None:
    """psutil failing, odd values, or a host smaller than its headroom read as unavailable."""
    reading = HostMemoryReader(virtual_memory=virtual_memory).read()
    assert not reading.available
    assert reading.percent is None


def test_one_real_reading() -> None:
    """On this machine the host reader agrees with psutil within what changed in between."""
    vm = psutil.virtual_memory()
    reading = HostMemoryReader()()
    assert reading.available
    assert reading.limit_bytes == vm.total - host_headroom_bytes(vm.total)
    assert reading.used_bytes is not None
    assert abs(reading.used_bytes - (vm.total - vm.available)) < 256 * MIB
    assert reading.percent is not None
    assert reading.percent > 0


def test_host_is_never_chosen_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default and anything unrecognised read the cgroup; only "host" reads the host."""
    monkeypatch.delenv("ADMISSION_MEMORY_SOURCE", raising=False)
    assert isinstance(build_reader(AdmissionConfig()), CgroupMemoryReader)
    assert isinstance(build_reader(AdmissionConfig.from_env()), CgroupMemoryReader)
    assert isinstance(build_reader(AdmissionConfig(memory_source="host")), HostMemoryReader)
    host = AdmissionConfig.from_env({"ADMISSION_MEMORY_SOURCE": "host"})
    assert isinstance(build_reader(host), HostMemoryReader)


def test_unknown_source_warns_and_stays_cgroup(caplog: pytest.LogCaptureFixture) -> None:
    """ADMISSION_MEMORY_SOURCE=auto is not a way into host mode: it warns and keeps cgroup."""
    with caplog.at_level(logging.WARNING, logger="asgi_admission"):
        config = AdmissionConfig.from_env({"ADMISSION_MEMORY_SOURCE": "auto"})
    assert config.memory_source == "cgroup"
    assert any("ADMISSION_MEMORY_SOURCE" in r.getMessage() for r in caplog.records)
