"""Building the reader and the latch a configuration describes."""

from __future__ import annotations

from asgi_admission._admission.latch import AdmissionController
from asgi_admission._config import AdmissionConfig
from asgi_admission._memory.cgroup import CgroupMemoryReader
from asgi_admission._memory.host import HostMemoryReader


def build_reader(config: AdmissionConfig) -> CgroupMemoryReader | HostMemoryReader:
    """The reader for ``config.memory_source``: the cgroup (default) or the host."""
    if config.memory_source == "host":
        return HostMemoryReader()
    return CgroupMemoryReader(config.cgroup_root, reclaimable=config.reclaimable)


def build_controller(config: AdmissionConfig) -> AdmissionController:
    """An :class:`AdmissionController` with ``config``'s thresholds and reader."""
    return AdmissionController(
        high_watermark_percent=config.high_watermark_percent,
        resume_threshold_percent=config.resume_threshold_percent,
        reserve_bytes=config.reserve_bytes,
        memory_reader=build_reader(config),
    )
