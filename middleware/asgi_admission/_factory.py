"""Building what a configuration describes: the reader, the latch, the ledger, the service.

Everything is built here, in dependency order, and handed in at construction
(``docs/design.md``, "Who asks whom").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from starlette.types import Scope

from asgi_admission._admission.decision.latch import AdmissionController, ClassCeilings
from asgi_admission._admission.decision.observer import DecisionObserver
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy
from asgi_admission._admission.ledger import shared_place
from asgi_admission._admission.ledger.ledger import (
    InProcessLedger,
    LedgerBusy,
    SessionLedger,
)
from asgi_admission._admission.ledger.shared_ledger import SharedLedger
from asgi_admission._admission.ledger.shared_place import AloneCheck
from asgi_admission._admission.reservations.pending import (
    SAMPLE_INTERVAL_S,
    AppCount,
    Reservations,
    build_parts,
)
from asgi_admission._admission.reservations.probing import ProbeWaiters
from asgi_admission._admission.reservations.tickets import AdmissionTicket
from asgi_admission._admission.scheduling.priority import DEFAULT_CLASS, classes_in_force
from asgi_admission._admission.scheduling.queue import (
    FreedWatch,
    WaitQueue,
    counted_and_used,
)
from asgi_admission._admission.scheduling.shared_order import OrderBell, SharedOrder
from asgi_admission._admission.scheduling.tenants import TenantShares
from asgi_admission._admission.service import (
    AdmissionService,
    Priorities,
    SessionCounts,
    Tenants,
)
from asgi_admission._config import AdmissionConfig
from asgi_admission._config_env import SHARED_DIR_AUTO, SHARED_DIR_OFF
from asgi_admission._memory.host import HostMemoryReader
from asgi_admission._memory.reading import CgroupMemoryReader, MemoryReader, SafeReader
from asgi_admission._metrics.instrument import expose, instrument, queue_metrics

logger = logging.getLogger("asgi_admission")


def build_reader(config: AdmissionConfig) -> CgroupMemoryReader | HostMemoryReader:
    """The reader for ``config.memory_source``: the cgroup (default) or the host."""
    if config.memory_source == "host":
        return HostMemoryReader()
    return CgroupMemoryReader(config.cgroup_root, reclaimable=config.reclaimable)


def build_controller(
    config: AdmissionConfig, memory_reader: MemoryReader | None = None
) -> AdmissionController:
    """An :class:`AdmissionController` with ``config``'s thresholds, reading
    ``memory_reader`` (``None``: the reader ``config`` describes)."""
    return AdmissionController(
        high_watermark_percent=config.high_watermark_percent,
        resume_threshold_percent=config.resume_threshold_percent,
        reserve_bytes=config.reserve_bytes,
        memory_reader=build_reader(config) if memory_reader is None else memory_reader,
    )


@dataclass(frozen=True, slots=True)
class Sharing:
    """How a guard counts its sessions: the ledger, and the directory it shares."""

    ledger: SessionLedger
    #: Where the workers share their counts; ``None`` where this process counts alone.
    directory: str | None
    #: The search for other workers, where this guard counts alone by default.
    alone: AloneCheck | None = None


def build_sharing(config: AdmissionConfig, reader: object) -> Sharing:
    """The ledger for ``config.shared_dir``: ``"off"`` counts in this process, a path
    shares that directory, and ``"auto"`` shares a private place of this user and the
    memory group ``reader`` measures, or counts alone where there is none.

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


def build_service(
    config: AdmissionConfig,
    controller: AdmissionController,
    *,
    current_sessions: Callable[[], int] | None,
    session_limit: int | None,
    retry_after: RetryAfterPolicy,
    route_of: Callable[[Scope], str | None],
    registry: CollectorRegistry | None,
    observer: DecisionObserver | None,
    route_classes: Mapping[str, str] | None = None,
    priority: Callable[[Scope], str] | None = None,
    tenant: Callable[[Scope], str | None] | None = None,
) -> AdmissionService:
    """The admission service ``config`` describes around ``controller``, its metrics on
    ``registry`` (``None``: none) and ``observer`` told of every decision as well.

    Raises ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when a directory it names
    cannot be used, or naming a route mapped to a class that is not configured.
    """
    classes = classes_in_force(
        config.priority_classes, high_watermark_percent=controller.high_watermark_percent
    )
    names = tuple(entry.name for entry in classes)
    priorities = None
    if route_classes or priority is not None or names != (DEFAULT_CLASS,):
        priorities = Priorities(names=names, route_classes=route_classes or {}, priority=priority)
    ceilings = None
    if len(classes) > 1 or classes[0].high_watermark_percent != controller.high_watermark_percent:
        ceilings = ClassCeilings(
            classes=classes,
            high_watermark_percent=controller.high_watermark_percent,
            resume_threshold_percent=controller.resume_threshold_percent,
        )
    sharing = build_sharing(config, controller.memory_reader)
    ledger = sharing.ledger
    read = SafeReader(controller)
    app_count = AppCount(current_sessions)
    probe_waiters = ProbeWaiters()
    parts = build_parts(
        controller=controller,
        learning=config.reserve_learning,
        min_reserve_bytes=config.reserve_min_bytes,
        timeout_s=config.pending_timeout_s,
        # A body larger than the buffer may take the body timeout to arrive, and
        # keeps its reservation for that long if it does.
        request_timeout_s=max(config.pending_timeout_s, config.body_timeout_s),
        shared_dir=sharing.directory,
        ledger_is_current=getattr(ledger, "is_current", None),
        probe_sessions=config.probe_sessions,
        probe_waiters=probe_waiters,
    )
    reservations = Reservations(
        attempt=ledger.attempt(),
        attempt_own=ledger.attempt_own(),
        read=read,
        active_count=ledger.active,
        app_count=app_count,
        route_of=route_of,
        parts=parts,
    )
    counts = SessionCounts(ledger, reservations)
    metrics = queue_metrics(ledger, registry=registry)
    if metrics is not None:
        metrics.declare(names)
    order = build_order(config, sharing.directory, ledger)
    queue: WaitQueue[AdmissionTicket] | None = None
    if config.queue_timeout_s > 0:  # 0: a request that does not fit is refused at once
        queue = WaitQueue(
            classes=names,
            limit=config.queue_limit,
            timeout_s=config.queue_timeout_s,
            on_wait_end=None if metrics is None else metrics.on_wait_end,
            order=order,
        )
    if order is not None and queue is not None:
        order.tell_rings(queue.wake)  # another worker rang: this one's pass runs now
    tenants = None
    if tenant is not None and config.tenant_max_share < 1.0:
        tenants = Tenants(tenant=tenant, shares=TenantShares(max_share=config.tenant_max_share))
    elif config.tenant_max_share < 1.0:
        logger.warning(
            "asgi-admission: ADMISSION_TENANT_MAX_SHARE (tenant_max_share) is set, but the "
            "middleware has no tenant callable to tell tenants apart: no share is kept."
        )
    service = AdmissionService(
        config=config,
        controller=controller,
        ledger=ledger,
        reservations=reservations,
        probe_waiters=probe_waiters,
        app_count=app_count,
        read=read,
        counts=counts,
        session_limit=session_limit,
        retry_after=retry_after,
        # A reservation of this process given back or activated may let a waiter in.
        observer=instrument(
            ledger,
            counts,
            registry=registry,
            observer=observer,
            on_change=None if queue is None else queue.wake,
        ),
        shared_dir=sharing.directory,
        alone=sharing.alone,
        queue=queue,
        queue_watcher=metrics,
        freed=None
        if queue is None
        else FreedWatch(
            queue,
            counted_and_used(ledger.attempt(), reservations.own_count, ledger.counts, read),
            SAMPLE_INTERVAL_S,
            first=None if order is None else order.first,
        ),
        ceilings=ceilings,
        priorities=priorities,
        tenants=tenants,
        order=order,
        # Per class where classes are in force; without them, decisions_total alone counts.
        on_class_decision=None
        if metrics is None or priorities is None
        else metrics.counting_decisions(names),
    )
    expose(service, registry=registry)
    if queue is not None:
        probe_waiters.tell_wakes(queue.wake)  # a probe's evidence may let a waiter in too
    return service


def build_order(
    config: AdmissionConfig, directory: str | None, ledger: SessionLedger
) -> SharedOrder | None:
    """The workers' one waiting order in ``directory`` where they share ``ledger`` and
    requests may wait; ``None`` otherwise.

    Raises ``ValueError`` naming ``ADMISSION_SHARED_DIR`` when a directory it names
    cannot hold it; the automatic place never stops the service.
    """
    if directory is None or config.queue_timeout_s <= 0:
        return None
    attempt = ledger.attempt()

    def flush() -> bool:
        # Leaving the critical section writes this worker's pending changes.
        try:
            with attempt:
                return True
        except LedgerBusy:
            return False

    try:
        return SharedOrder(directory, bell=OrderBell(directory, flush=flush))
    except (OSError, ValueError) as exc:
        if config.shared_dir != SHARED_DIR_AUTO:
            raise
        logger.warning(
            "asgi-admission: the shared waiting order in %s cannot be used (%s); each "
            "worker serves its own waiters in its own order.",
            directory,
            exc,
        )
        return None
