"""The scrape-time collector: what the guards on a registry see, read at each scrape.

Notes:

- Gauges are collected at scrape time from a fresh reading, so they are current
  without traffic. The scrape never moves the latch, and a reader or view that fails
  gives fewer samples, never a failed scrape (as prometheus_client's
  ``process_collector`` does on ``OSError``).
- A registry's one collector describes every guard on it still alive (held weakly).
- Multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``): the memory gauges describe the
  container, so they come from one fresh reading in the scraping worker, not a sum.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator, Sequence
from functools import cache
from typing import Final, get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from asgi_admission._admission.decision.latch import (
    AdmissionController,
    count_cap,
    is_blind,
)
from asgi_admission._admission.decision.observer import AdmissionView
from asgi_admission._admission.decision.stuck import StuckWatch, attribute_working_set
from asgi_admission._admission.reservations.pending import FailureCause
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._metrics.decisions import KINDS, PREFIX

logger = logging.getLogger("asgi_admission")

FAILURE_CAUSES: Final = get_args(FailureCause)
STATES: Final = ("normal", "pressured", "unavailable")


@cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("asgi-admission")
    except PackageNotFoundError:  # pragma: no cover - source tree without install
        return "0.0.0"


def _read(controller: AdmissionController) -> MemoryReading | None:
    reader = controller.memory_reader
    read = getattr(reader, "read", None)
    try:
        return read(pressure=True) if callable(read) else reader()
    except Exception:
        # A reader must never fail a scrape: report fewer samples instead.
        logger.debug("asgi-admission: the scrape-time reading failed", exc_info=True)
        return None


def _gauge(name: str, documentation: str, unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, unit=unit)


class AdmissionCollector:
    """A prometheus_client collector of what the guards see, read at scrape time.

    Without a view only ``asgi_admission_build_info`` is exported.
    ``include_sessions=False`` leaves ``asgi_admission_sessions`` to a ``livesum`` gauge.
    """

    def __init__(self, view: AdmissionView | None = None, *, include_sessions: bool = True) -> None:
        # A view given here is held; the guards that add() themselves are held weakly,
        # so a guard that is gone (an app built again) drops out of the figures.
        self._held = view
        self._guards: list[weakref.ref[AdmissionView]] = []
        self._guards_lock = threading.Lock()
        self.include_sessions = include_sessions

    def add(self, view: AdmissionView) -> None:
        """Describe ``view`` too, for as long as it lives (each guard on a registry)."""
        with self._guards_lock:
            self._guards = [ref for ref in self._guards if ref() is not None]
            self._guards.append(weakref.ref(view))

    def views(self) -> list[AdmissionView]:
        """The guards described, oldest first."""
        with self._guards_lock:
            live = [view for view in (ref() for ref in self._guards) if view is not None]
        return live if self._held is None else [self._held, *live]

    def describe(self) -> list[Metric]:
        """The families this collector may export, for the registry's collision check."""
        return list(self._families([], None, describing=True))

    def collect(self) -> Iterator[Metric]:
        """Take one fresh reading and yield every family it supports.

        With several guards on one registry the memory figures and thresholds are the
        newest guard's, the counts their sums, and the state ``pressured`` while any
        guard's latch is set.
        """
        views = self.views()
        reading = _read(views[-1].controller) if views else None
        return self._families(views, reading, describing=False)

    def _families(
        self, views: list[AdmissionView], reading: MemoryReading | None, *, describing: bool
    ) -> Iterator[Metric]:
        working_set = _gauge(
            "memory_working_set_bytes",
            "Container memory in use minus reclaimable file cache, at the binding cgroup level.",
        )
        limit = _gauge(
            "memory_limit_bytes", "Effective container memory limit; absent while unlimited."
        )
        reclaimable = _gauge(
            "memory_reclaimable_bytes", "File cache subtracted from usage to get the working set."
        )
        ratio = _gauge("memory_usage_ratio", "Working set as a fraction of the limit (0-1).")
        stall = _gauge(
            "memory_pressure_stall_ratio",
            "Share of the last 10 s some task stalled on memory (PSI some avg10 / 100).",
        )
        ceiling = _gauge(
            "admission_ceiling_ratio",
            "Usage ratio above which one more session is refused: the high watermark minus "
            "the reserves of that session and of those pending.",
        )
        high = _gauge("high_watermark_ratio", "Usage ratio at which the latch sets.")
        resume = _gauge("resume_threshold_ratio", "Usage ratio at or below which the latch clears.")
        reserve = _gauge("session_reserve_bytes", "Memory held back for each admitted session.")
        state = GaugeMetricFamily(
            PREFIX + "state", "Admission state: 1 for the current one.", labels=("state",)
        )
        sessions = GaugeMetricFamily(
            PREFIX + "sessions", "Sessions admitted, by state.", labels=("state",)
        )
        session_limit = _gauge(
            "session_limit",
            "The count cap on active plus pending sessions in force now (max_sessions, or the "
            "fallback while blind); absent while memory decides alone.",
        )
        footprint = GaugeMetricFamily(
            PREFIX + "session_footprint_bytes",
            "Learned memory one session of the route adds to the working set (high percentile).",
            labels=("route",),
        )
        ramp = GaugeMetricFamily(
            PREFIX + "session_ramp_seconds",
            "Learned time from admission until a session's memory has arrived (high percentile).",
            labels=("route",),
        )
        admissible = _gauge(
            "admissible_sessions",
            "How many more sessions fit now, in sessions: the memory left under the "
            "admission ceiling in reserves, within the count cap where one applies; 0 while "
            "latched.",
        )
        expired = CounterMetricFamily(
            PREFIX + "pending_expired",
            "Held session tickets never started, released by the pending timeout.",
        )
        failed = CounterMetricFamily(
            PREFIX + "session_requests_failed",
            "Session requests that opened nothing and hold no reservation: the app answered "
            "an error (error_status), or the body did not arrive in time (body_timeout).",
            labels=("kind", "cause"),
        )
        build = GaugeMetricFamily(
            PREFIX + "build_info", "asgi-admission version; always 1.", labels=("version",)
        )
        probing = _gauge(
            "probing_routes",
            "Session routes with no learned footprint whose first sessions are being probed.",
        )
        waiting = _gauge(
            "probe_waiting_requests",
            "Session requests held back, reserving nothing, until a probe's memory is known.",
        )
        if describing:
            yield from (working_set, limit, reclaimable, ratio, stall, ceiling, high, resume)
            yield from (reserve, state, session_limit, build)
            yield from (footprint, ramp, admissible, expired, failed, probing, waiting)
            yield from stuck_families(views, None, None, describing=True)
            if self.include_sessions:
                yield sessions
            return

        build.add_metric((_version(),), 1)
        yield build
        if not views:
            return
        controller = views[-1].controller
        high.add_metric((), controller.high_watermark_percent / 100)
        resume.add_metric((), controller.resume_threshold_percent / 100)
        reserve.add_metric((), controller.reserve_for(reading.limit_bytes if reading else None))
        yield from (high, resume, reserve)

        counts: tuple[int, int] | None = None
        # None: no guard has a count cap in force (or a bound on its capacity).
        limits: int | None = None
        capacity: int | None = None
        blind = is_blind(reading)
        try:
            for view in views:
                active, pending = view_counts = view.session_counts()
                counts = (
                    (active, pending)
                    if counts is None
                    else (counts[0] + active, counts[1] + pending)
                )
                cap = count_cap(view.session_limit, blind)
                if cap is not None:
                    limits = cap + (limits or 0)
                fits = admissible_sessions(
                    view.controller,
                    reading,
                    view_counts,
                    view.session_limit,
                    held_bytes=held_by(view, pending, reading),
                )
                if fits is not None:
                    capacity = fits + (capacity or 0)
        except Exception:
            counts = None
            logger.debug("asgi-admission: the guard's session counts failed", exc_info=True)
        if counts is not None:
            if limits is not None:
                session_limit.add_metric((), limits)
                yield session_limit
            if self.include_sessions:
                sessions.add_metric(("active",), counts[0])
                sessions.add_metric(("pending",), counts[1])
                yield sessions

        reservation_sets = [
            k for k in (getattr(view, "reservations", None) for view in views) if k is not None
        ]
        if reservation_sets:
            learned: dict[str, tuple[int, float]] = {}
            for reservations in reservation_sets:
                for estimate in reservations.estimates():
                    known = learned.get(estimate.route, (0, 0.0))
                    learned[estimate.route] = (
                        max(known[0], estimate.footprint_bytes),
                        max(known[1], estimate.ramp_s),
                    )
            for route, (footprint_bytes, ramp_s) in learned.items():
                footprint.add_metric((route,), footprint_bytes)
                ramp.add_metric((route,), ramp_s)
            expired.add_metric(
                (), sum(reservations.expired_total for reservations in reservation_sets)
            )
            for kind in KINDS:
                for cause in FAILURE_CAUSES:
                    failed.add_metric(
                        (kind, cause), sum(k.failed.get((kind, cause), 0) for k in reservation_sets)
                    )
            yield from (footprint, ramp, expired, failed)
            probed = [
                status
                for reservations in reservation_sets
                for status in reservations.probe_status()
            ]
            probing.add_metric((), len({status.route for status in probed}))
            waiting.add_metric((), sum(status.waiting for status in probed))
            yield from (probing, waiting)
        if counts is not None and capacity is not None:
            admissible.add_metric((), capacity)
            yield admissible

        current = "unavailable"
        if reading is not None and reading.available and reading.used_bytes is not None:
            working_set.add_metric((), reading.used_bytes)
            reclaimable.add_metric((), reading.reclaimable_bytes)
            yield from (working_set, reclaimable)
            if reading.limit_bytes:
                limit.add_metric((), reading.limit_bytes)
                ratio.add_metric((), reading.used_bytes / reading.limit_bytes)
                pending = counts[1] if counts is not None else 0
                held = held_by(views[-1], pending, reading)
                ceiling.add_metric(
                    (),
                    max(
                        0.0, controller.ceiling_bytes(reading.limit_bytes, pending, held_bytes=held)
                    )
                    / reading.limit_bytes,
                )
                yield from (limit, ratio, ceiling)
                pressured = any(v.controller.pressure_state == "pressured" for v in views)
                current = "pressured" if pressured else "normal"
        if reading is not None and reading.pressure_some_avg10 is not None:
            stall.add_metric((), reading.pressure_some_avg10 / 100)
            yield stall
        for name in STATES:
            state.add_metric((name,), 1 if name == current else 0)
        yield state
        yield from stuck_families(views, reading, counts, describing=False)


# The stuck-pressure gauges: ``asgi_admission_pressure_stuck`` is 1 while any guard
# described calls its pressure stuck; ``asgi_admission_unattributed_bytes`` is the working
# set less one reserve per counted session (``_admission/decision/stuck.py``).


def stuck_families(
    views: Sequence[AdmissionView],
    reading: MemoryReading | None,
    counts: tuple[int, int] | None,
    *,
    describing: bool,
) -> Iterator[Metric]:
    """The two gauges for ``views`` (the newest last), ``reading`` and the summed
    ``counts``; both families, empty, when ``describing``."""
    stuck = GaugeMetricFamily(
        PREFIX + "pressure_stuck",
        "1 while the latch has been held by the server's own memory (no session pending, "
        "the same sessions open, their reserves not enough to clear it) for "
        "ADMISSION_STUCK_AFTER_SECONDS; 0 otherwise.",
    )
    rest = GaugeMetricFamily(
        PREFIX + "unattributed_bytes",
        "Working set no session of the guard's accounts for (the working set less one "
        "reserve per active or pending session): the server's own memory.",
    )
    if describing:
        yield from (stuck, rest)
        return
    watches = [w for w in (getattr(v, "stuck", None) for v in views) if isinstance(w, StuckWatch)]
    if watches:
        stuck.add_metric((), int(any(watch.status().stuck for watch in watches)))
        yield stuck
    if views and counts is not None:
        split = attribute_working_set(views[-1].controller, reading, counts[0] + counts[1])
        if split is not None:
            rest.add_metric((), split.unattributed_bytes)
            yield rest


def held_by(view: object, pending: int, reading: MemoryReading | None) -> int | None:
    """What a guard's ``pending`` sessions and one more hold under the reading's limit;
    ``None`` for a view without reservations, or no limit."""
    reservations = getattr(view, "reservations", None)
    if reservations is None or reading is None or not reading.limit_bytes:
        return None
    held: int = reservations.held_bytes(None, pending, reading.limit_bytes)
    return held


def admissible_sessions(
    controller: AdmissionController,
    reading: MemoryReading | None,
    counts: tuple[int, int],
    session_limit: int | None,
    *,
    held_bytes: int | None = None,
) -> int | None:
    """How many more sessions the guard would admit now, one after another: what KEDA
    or an HPA can scale on. ``None`` where nothing bounds it."""
    active, pending = counts
    cap = count_cap(session_limit, is_blind(reading))
    by_count = None if cap is None else max(0, cap - active - pending)
    by_memory = controller.admissible_by_memory(reading, pending, held_bytes=held_bytes)
    if by_memory is None or (by_count is not None and by_count < by_memory):
        return by_count
    return by_memory
