"""The session watchdog's metrics: peak memory per session, halts by reason, and
whether process sessions run in memory groups of their own.

Built once per registry and cached, so constructing a second watchdog (or the
app twice in one test run) on the same registry reuses them instead of failing
with "Duplicated timeseries".
"""

from __future__ import annotations

import threading
import weakref
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from asgi_admission._watchdog.halt import HALT_REASONS

#: 16 MiB to 16 GiB in powers of two: the range a session's peak plausibly spans.
SESSION_MEMORY_BUCKETS: Final = tuple(float(2**n) for n in range(24, 35))


class WatchdogMetrics:
    """``asgi_admission_session_memory_bytes``, ``asgi_admission_sessions_halted_total``
    and ``asgi_admission_session_groups_enabled``."""

    __slots__ = ("groups_enabled", "halted", "session_memory")

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.session_memory = Histogram(
            "asgi_admission_session_memory_bytes",
            "Peak memory of each watched session, observed when it ends or is halted (its "
            "memory group's own peak where it runs in one, else its highest RSS).",
            buckets=SESSION_MEMORY_BUCKETS,
            registry=registry,
        )
        self.halted = Counter(
            "asgi_admission_sessions_halted_total",
            "Sessions halted by the watchdog, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in HALT_REASONS:
            self.halted.labels(reason=reason)
        self.groups_enabled = Gauge(
            "asgi_admission_session_groups_enabled",
            "1 when process sessions with a budget run in memory groups of their own (the "
            "kernel enforces each budget), 0 when the watchdog alone does.",
            registry=registry,
            multiprocess_mode="max",
        )


_lock = threading.Lock()
_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, WatchdogMetrics] = (
    weakref.WeakKeyDictionary()
)


def watchdog_metrics(registry: CollectorRegistry | None) -> WatchdogMetrics:
    """The metrics registered on ``registry`` (``None``: unregistered, for opting out)."""
    if registry is None:
        return WatchdogMetrics(None)
    with _lock:
        metrics = _by_registry.get(registry)
        if metrics is None:
            metrics = _by_registry[registry] = WatchdogMetrics(registry)
        return metrics
