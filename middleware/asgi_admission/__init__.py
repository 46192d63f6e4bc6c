"""Admission control for ASGI services that open memory-hungry sessions."""

from importlib.metadata import PackageNotFoundError, version

from ._cgroup import CgroupMemoryReader, parse_cgroup_memory_value, read_cgroup_memory
from ._config import AdmissionConfig
from ._halt import ProcessGroupHalt, SessionHalt
from ._host import HostMemoryReader
from ._latch import AdmissionController, CapacityDecision
from ._metrics import AdmissionCollector, DecisionMetrics
from ._metrics_app import metrics_app, metrics_route, serving_metrics, start_metrics_server
from ._middleware import AdmissionMiddleware
from ._reading import MemoryReading
from ._responses import RetryAfterPolicy
from ._sampler import ProcessSample
from ._watchdog import SessionWatchdog, WatchedSession, session_watchdog

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
