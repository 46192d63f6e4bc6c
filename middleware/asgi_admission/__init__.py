"""Admission control for ASGI services that open memory-hungry sessions.

The public surface is exactly ``__all__``: what a user needs to build, configure,
observe and extend the guard, the protocols of its extension points included.
Everything else lives in private modules.
"""

from importlib import metadata as _metadata

from asgi_admission._admission.decision.latch import AdmissionController, CapacityDecision
from asgi_admission._admission.decision.observer import DecisionObserver
from asgi_admission._admission.decision.retry_after import RetryAfterPolicy
from asgi_admission._admission.reservations.tickets import AdmissionTicket, admission_ticket
from asgi_admission._admission.scheduling.priority import PriorityClass
from asgi_admission._config import AdmissionConfig
from asgi_admission._memory.host import HostMemoryReader
from asgi_admission._memory.reading import CgroupMemoryReader, MemoryReader, MemoryReading
from asgi_admission._metrics.serving import metrics_app, metrics_route, serving_metrics
from asgi_admission._middleware import AdmissionMiddleware
from asgi_admission._watchdog.groups import SessionGroup
from asgi_admission._watchdog.halt import HaltAction, ProcessGroupHalt, SessionHalt
from asgi_admission._watchdog.lifespan import session_watchdog
from asgi_admission._watchdog.sampler import ProcessSample
from asgi_admission._watchdog.session import SessionPeak, WatchedSession
from asgi_admission._watchdog.watchdog import SessionWatchdog

try:
    __version__ = _metadata.version("asgi-admission")
except (
    _metadata.PackageNotFoundError
):  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionMiddleware",
    "AdmissionTicket",
    "CapacityDecision",
    "CgroupMemoryReader",
    "DecisionObserver",
    "HaltAction",
    "HostMemoryReader",
    "MemoryReader",
    "MemoryReading",
    "PriorityClass",
    "ProcessGroupHalt",
    "ProcessSample",
    "RetryAfterPolicy",
    "SessionGroup",
    "SessionHalt",
    "SessionPeak",
    "SessionWatchdog",
    "WatchedSession",
    "__version__",
    "admission_ticket",
    "metrics_app",
    "metrics_route",
    "serving_metrics",
    "session_watchdog",
]
