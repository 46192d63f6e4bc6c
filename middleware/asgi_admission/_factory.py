"""Building the reader, the latch and the ledger a configuration describes."""

from __future__ import annotations

from asgi_admission._admission.latch import AdmissionController
from asgi_admission._admission.ledger import InProcessLedger, SessionLedger
from asgi_admission._admission.shared_ledger import SharedLedger
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


def build_ledger(config: AdmissionConfig) -> SessionLedger:
    """The ledger ``config`` asks for: shared by the workers when ``shared_dir`` is set.

    Raises ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when that directory
    cannot be created or used.
    """
    if config.shared_dir is not None:
        return SharedLedger(config.shared_dir)
    return InProcessLedger()
