"""Building the reader, the latch and the ledger a configuration describes."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from asgi_admission._admission.decision.latch import AdmissionController
from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.ledger.ledger import InProcessLedger, SessionLedger
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from asgi_admission._admission.ledger.shared_place import AloneCheck
from asgi_admission._config import SHARED_DIR_AUTO, SHARED_DIR_OFF, AdmissionConfig
from asgi_admission._memory.cgroup import CgroupMemoryReader
from asgi_admission._memory.host import HostMemoryReader

logger = logging.getLogger("asgi_admission")


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


def build_ledger(shared_dir: str | None) -> SessionLedger:
    """The ledger shared by the workers in ``shared_dir``, or this process's alone.

    Raises ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when that directory
    cannot be created or used.
    """
    if shared_dir is not None:
        return SharedLedger(shared_dir)
    return InProcessLedger()


@dataclass(frozen=True, slots=True)
class Sharing:
    """How a guard counts its sessions: the ledger, and the directory it shares."""

    ledger: SessionLedger
    #: Where the workers share their counts; ``None`` where this process counts alone.
    directory: str | None
    #: The look for other workers, where this guard counts alone by default.
    alone: AloneCheck | None = None


def build_sharing(config: AdmissionConfig, reader: object) -> Sharing:
    """The ledger for ``config.shared_dir``: ``"off"`` counts in this process, a path
    shares that directory, and ``"auto"`` shares a private place of this user and the
    memory group ``reader`` measures (``shared_place``), or counts alone where there
    is none, with a look for other workers that would then be counted apart.

    Raises ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when a directory it names
    cannot be used; the automatic place never stops the service.
    """
    setting = config.shared_dir
    if setting == SHARED_DIR_OFF:
        return Sharing(InProcessLedger(), None)
    if setting != SHARED_DIR_AUTO:
        return Sharing(SharedLedger(setting), setting)
    group = shared_place.group_of(reader)
    if group is None:
        return _alone(
            "its memory reader is not one whose memory group the guard can tell",
            "this process's own cgroup",
            shared_place.own_group_procs(proc=shared_place.PROC),
        )
    place = shared_place.choose_place(group)
    if place.directory is None:
        reasons = "; ".join(place.passed_over) or "no base directory to make it in"
        return _alone(f"no private directory could be made ({reasons})", group.label, group.procs)
    try:
        ledger = SharedLedger(place.directory)
    except ValueError as exc:
        logger.warning(
            "asgi-admission: the shared session ledger in %s cannot be used (%s); this "
            "process counts its sessions alone.",
            place.directory,
            exc,
        )
        return _alone(f"{place.directory} cannot be used", group.label, group.procs)
    logger.info(
        "asgi-admission: the workers in memory group %s count their sessions together in %s.",
        group.label,
        place.directory,
    )
    return Sharing(ledger, place.directory)


def _alone(reason: str, label: str, procs: tuple[str, ...] | None) -> Sharing:
    check = AloneCheck(reason=reason, label=label, procs=procs)
    return Sharing(InProcessLedger(), None, check)
