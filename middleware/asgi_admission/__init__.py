"""Admission control for ASGI services that open memory-hungry sessions."""

from importlib.metadata import PackageNotFoundError, version

from asgi_admission._admission.latch import AdmissionController, CapacityDecision
from asgi_admission._config import AdmissionConfig
from asgi_admission._memory.cgroup import CgroupMemoryReader, read_cgroup_memory
from asgi_admission._memory.host import HostMemoryReader
from asgi_admission._memory.parse import parse_cgroup_memory_value
from asgi_admission._memory.reading import MemoryReading
from asgi_admission._metrics.collector import AdmissionCollector, DecisionMetrics
from asgi_admission._metrics.serving import (
    metrics_app,
    metrics_route,
    serving_metrics,
    start_metrics_server,
)
from asgi_admission._middleware import AdmissionMiddleware
from asgi_admission._responses import RetryAfterPolicy
from asgi_admission._watchdog.halt import ProcessGroupHalt, SessionHalt
from asgi_admission._watchdog.sampler import ProcessSample
from asgi_admission._watchdog.watchdog import SessionWatchdog, WatchedSession, session_watchdog

try:
    __version__ = version("asgi-admission")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = [
    "AdmissionCollector",
    "AdmissionConfig",
    "AdmissionController",
    "AdmissionMiddleware",
    "CapacityDecision",
    "CgroupMemoryReader",
    "DecisionMetrics",
    "HostMemoryReader",
    "MemoryReading",
    "ProcessGroupHalt",
    "ProcessSample",
    "RetryAfterPolicy",
    "SessionHalt",
    "SessionWatchdog",
    "WatchedSession",
    "__version__",
    "metrics_app",
    "metrics_route",
    "parse_cgroup_memory_value",
    "read_cgroup_memory",
    "serving_metrics",
    "session_watchdog",
    "start_metrics_server",
]
